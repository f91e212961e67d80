"""Text as Python and the outside world see it: lines as Python counts them, and text that UTF-8 can
encode (what sage-rl's records, tokenizers and pages need)."""

from __future__ import annotations

import re

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
