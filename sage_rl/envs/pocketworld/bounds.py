"""What agent input may cost the trainer: caps on names, arguments and the world's growth (issue 11).

Everything an API call carries is written by agent code, and the world runs in the trainer
process, beside every other episode. So before an API runs, ``World.call`` checks, in time linear
in the input and without recursion:

- app, API and parameter names: at most ``MAX_NAME_CHARS`` (no fuzzy suggestion or echo of a
  megabyte name);
- the arguments of one call: nested at most ``MAX_DEPTH`` deep, at most ``MAX_CALL_CHARS`` of
  JSON, integers within 64 bits, floats finite (NaN and infinity are refused);
- the episode: at most ``MAX_EPISODE_CHARS`` of arguments in all, which bounds how much the world
  (notes, files, emails, ...) can grow;
- the task's answer (``supervisor.complete_task``): at most ``MAX_ANSWER_CHARS`` of JSON.

Each cap is an ``ApiError`` the agent reads, never an exception in the trainer. ``brief`` is the
one way to echo agent values in messages.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

MAX_NAME_CHARS = 64
MAX_DEPTH = 32
MAX_CALL_CHARS = 64 * 1024
MAX_EPISODE_CHARS = 4 * 1024 * 1024
MAX_ANSWER_CHARS = 16 * 1024
_INT_LIMIT = 2**63

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40
_REPR.maxlist = _REPR.maxtuple = 8
_REPR.maxdict, _REPR.maxlevel = 6, 3


class InputError(ValueError):
    """An argument breaks a cap. ``str(e)`` is the message for the agent; ``status`` is HTTP-like."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def brief(value: Any) -> str:
    """``repr(value)`` cut to about 60 characters; safe for huge ints, strings and deep nesting."""
    try:
        return _REPR.repr(value)
    except (ValueError, RecursionError):  # an int past Python's 4300-digit str limit
        if isinstance(value, int):
            return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
        return f"<a {type(value).__name__}>"


def check_name(kind: str, name: str) -> None:
    """Refuse an app, API or parameter name longer than ``MAX_NAME_CHARS`` (404)."""
    if len(name) > MAX_NAME_CHARS:
        raise InputError(
            404, f"{kind} names have at most {MAX_NAME_CHARS} characters; got {len(name)}: {brief(name)}"
        )


def measure(where: str, kwargs: dict[str, Any]) -> int:
    """The JSON size of ``kwargs`` (roughly, in characters), checking every cap of one call.

    Raises ``InputError`` (413 too large, 422 a bad value) naming the parameter.
    """
    size = 2
    for key, value in kwargs.items():
        check_name("parameter", key)
        size += len(key) + 4 + json_size(f"{where}: parameter {key!r}", value, MAX_CALL_CHARS - size)
        if size > MAX_CALL_CHARS:
            raise InputError(
                413, f"{where}: arguments too large (more than {MAX_CALL_CHARS} characters of JSON)"
            )
    return size


def json_size(where: str, value: Any, room: int) -> int:
    """About the JSON size of ``value``, counted up to just past ``room`` (then it stops early).
    Raises ``InputError`` for values past the depth, integer or float caps."""
    size = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo and size <= room:
        v, depth = todo.pop()
        size += 2
        if isinstance(v, str):
            size += len(v)
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not -_INT_LIMIT < v < _INT_LIMIT:
                raise InputError(422, f"{where} must hold integers within 64 bits, got {brief(v)}")
            size += 18
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InputError(
                    422, f"{where} must be a finite number, got {v!r} (NaN and infinity are refused)"
                )
            size += 18
        elif isinstance(v, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise InputError(422, f"{where} is nested more than {MAX_DEPTH} levels deep")
            size += len(v)
            if size <= room:  # never copy a container that is already too large
                items = [x for kv in v.items() for x in kv] if isinstance(v, dict) else v
                todo.extend((item, depth + 1) for item in items)
        else:
            raise InputError(422, f"{where} must be JSON-able, got {type(v).__name__} {brief(v)}")
    return size
