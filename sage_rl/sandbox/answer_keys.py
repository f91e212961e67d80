"""Atoms as the PocketWorld checker compares answers (``envs/pocketworld/checks.py``: ``normalize``,
``answers_match``), mirrored for ``flow.py``: a value a skill returned is not its own when the
checker would take it for one of the call's arguments (``echo(x)``, ``x.upper()``, ``x + 0.001``).

This module is imported by the template process: it imports nothing of the project.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterable
from typing import Any

Atom = tuple[str, Any]  # ("s", text) | ("n", float) | ("b", bool), as flow.py reads them
Key = tuple[str, Any]  # ("s", normalised text) | ("n", cents: an int; a float past 1e15)
MAX_PARTS = 4096  # parts of a comma-separated text read
_NUM = re.compile(r"^\$?\s*(-?\d+(?:\.\d+)?)\s*(?:\$|dollars?|usd)?$")  # checks._NUM


def _cents(x: float) -> Any:
    r = round(x, 2)
    return round(r * 100) if abs(r) < 1e15 else r  # past 1e15 a cent is below a float's step


@functools.lru_cache(maxsize=1 << 14)  # a skill called in a loop over the same rows meets the same atoms
def key(atom: Atom) -> Key:
    """``atom`` as the checker compares it: a string lower-cased, whitespace collapsed, " ."
    stripped, and numeric text ("$12.50", "1,200") as its number; a number rounded to cents; a
    bool as "true"/"false"."""
    kind, v = atom
    if kind == "b":
        return ("s", "true" if v else "false")
    if kind == "n":
        return ("n", _cents(v))
    text = " ".join(v.lower().split()).strip(" .")
    m = _NUM.match(text.replace(",", ""))
    if m and math.isfinite(n := float(m.group(1))):
        return ("n", _cents(n))
    return ("s", text)


@functools.lru_cache(maxsize=1 << 14)
def text_parts(atom: Atom) -> tuple[Key, ...]:
    """The parts of a comma-separated text, as keys (the checker reads one as a list answer)."""
    kind, v = atom
    if kind != "s" or "," not in v:
        return ()
    return tuple(key(("s", p)) for p in itertools.islice(v.split(","), MAX_PARTS))


def keys_of(found: Iterable[Atom]) -> set[Key]:
    """The keys of ``found``, with the parts of each comma-separated text."""
    out: set[Key] = set()
    for a in found:
        out.add(key(a))
        out.update(text_parts(a))
    return out


def among(atom: Atom, keys: set[Key]) -> bool:
    """Whether the checker would take ``atom`` for one of ``keys`` (numbers within a cent; a
    comma-separated text whose every part is one)."""
    if not keys:
        return False
    kind, v = key(atom)
    if kind == "n":
        if type(v) is int:
            return any(("n", v + d) in keys for d in (-1, 0, 1))
        return (kind, v) in keys
    parts = text_parts(atom)
    return (kind, v) in keys or (bool(parts) and all(p in keys for p in parts))
