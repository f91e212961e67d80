"""Files replaced whole or not at all.

A stage of a long run marks itself done by its summary file (``summary.json``, ``result.json``,
``outcomes.json``), and a resumed run trusts what it finds there. Written in place, a kill in the
middle of the write (every session's end stops the laptop experiment) leaves half a file that
the next start cannot read. Written here, a reader sees the old file or the new one.

The project's JSON Lines are read back one record per ``\n`` (``view.read.read_jsonl``,
``train.logging.read_metrics``), never with ``splitlines``, which also cuts at U+2028, U+0085 and
more that ``json.dumps(ensure_ascii=False)`` writes raw inside a string (a chain whose text holds
one read as two torn lines).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder, then
    rename it over ``path`` (atomic on POSIX file systems)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def load_failure(e: BaseException, limit: int = 200) -> str:
    """One line saying why a file could not be loaded: ``Type: first line``. torch's weights-only
    unpickler wraps its reason in paragraphs of advice (to load the file with ``weights_only=False``,
    which would run code from a damaged or foreign file): only the reason is kept."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:limit]}" if first else type(e).__name__
