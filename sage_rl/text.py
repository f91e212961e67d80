"""Text as Python and the outside world see it: lines as Python counts them, text that UTF-8 can
encode (what sage-rl's tokenizers and pages need), and records as JSON lines that no text can make
fail (``dumps``)."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with each surrogate code point replaced by U+FFFD. A lone surrogate (``"\\ud800"``,
    from a malformed reply of a server) is not a character: UTF-8 cannot encode it, nor can a
    tokenizer or a web page. Text from outside is cleaned with this where it enters (the OpenAI
    policy) and where it leaves for a reader (the viewer's page); records keep it (``dumps``)."""
    return _SURROGATE.sub("\ufffd", text)


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def source_lines(code: str) -> list[str]:
    """``code`` cut at Python's own line breaks (``\\n``, ``\\r\\n``, ``\\r``): the lines a syntax
    tree's ``lineno`` counts. ``str.splitlines`` also cuts at form feeds, ``\\x85``, ``\\u2028``
    and more, which Python allows in strings and comments: sliced by line number, such lines give
    the wrong text (a saved skill without its body)."""
    return _LINE_BREAK.split(code)


def to_jsonable(obj: Any) -> Any:
    """Convert a (nested) dataclass / enum / tuple structure into plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def dumps(obj: Any) -> str:
    """One JSON line for a dataclass (or plain value), always encodable as UTF-8.

    Text is kept as UTF-8 except what UTF-8 cannot encode: a lone surrogate (``"\\ud800"``, from a
    malformed model reply or agent output) is written as its JSON escape, ``\\ud800``, so the line
    reads back as the same string and no text can make writing it fail (docs/metrics.md)."""
    text = json.dumps(to_jsonable(obj), ensure_ascii=False, sort_keys=True)
    # Surrogates only occur inside JSON strings, where backslashreplace's \udXXX is a valid escape.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def brief(value: Any, limit: int = 40) -> str:
    """``value`` as JSON, cut to ``limit`` characters: a damaged value named in an error message."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
