"""``str.format`` for agent code: its replacement fields keep the attribute rule (rules.py).

``str.format`` looks up the attributes a field names in C, by the name the string holds, so the
parent's check of the code never sees them: ``'{0.__globals__}'.format(skill)`` rendered the
library's namespace, and ``'{0.__context__.args[0]}'.format(e)`` in a skill read the exception the
task was handling when it called the skill (its answer: the review of session 42). So every
``x.format`` and ``x.format_map`` in agent code is compiled as ``formatting(x).format``
(``stores.StoreGuard.transform``; ``getattr(x, 'format')`` too: ``rules.agent_builtins``): for a
``str`` (or ``super()`` of one, or the type ``str`` or a subclass of it) that is an object whose ``format`` and
``format_map`` first check every field of the format string, nested ones in format specs included,
and raise ``RuleError`` for an attribute agent code may not name; anything else is ``x`` itself.
Items (``{0[key]}``) are looked up as ``x[key]`` is, and stay allowed.

This module is imported by the template process: it imports nothing of the project but ``rules``.
"""

from __future__ import annotations

from _string import formatter_field_name_split, formatter_parser
from typing import Any

from sage_rl.sandbox.rules import RuleError, attr_allowed


def check_fields(fmt: str, depth: int = 0) -> None:
    """Raise ``RuleError`` when a replacement field of ``fmt`` names an attribute agent code may not
    use. A string ``str.format`` cannot parse is left to ``str.format``'s own error."""
    try:
        parsed = list(formatter_parser(fmt))
    except ValueError:
        return
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        try:
            _, rest = formatter_field_name_split(field)
            names = [key for is_attr, key in rest if is_attr]
        except ValueError:
            return
        for name in names:
            if not attr_allowed(name):
                raise RuleError(
                    f"the attribute {name!r} is not allowed, in a format string's field {{{field}}}"
                )
        if spec and depth < 2:  # str.format nests fields in a spec once (deeper raises ValueError)
            check_fields(spec, depth + 1)


class _Checked:
    """``format`` and ``format_map`` of one string (``fmt``), or of the type ``str`` (``fmt`` None:
    the string is the first argument), with the fields checked first."""

    __slots__ = ("_fmt",)

    def __init__(self, fmt: str | None) -> None:
        self._fmt = fmt

    def _split(self, args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
        fmt, rest = (self._fmt, args) if self._fmt is not None or not args else (args[0], args[1:])
        if isinstance(fmt, str):
            check_fields(fmt)
        return fmt, rest

    def format(self, *args: Any, **kwargs: Any) -> str:
        fmt, rest = self._split(args)
        return str.format(*(() if fmt is None else (fmt,)), *rest, **kwargs)

    def format_map(self, *args: Any) -> str:
        fmt, rest = self._split(args)
        return str.format_map(*(() if fmt is None else (fmt,)), *rest)


def formatting(obj: Any) -> Any:
    """What ``obj.format`` is looked up on, for agent code (module docstring)."""
    if isinstance(obj, super):  # super().format in a str subclass, super(S, S).format: str's own
        target, own = obj.__self__, True
    else:  # a subclass that defines format or format_map keeps its own (its code is transformed too)
        target = obj
        cls = obj if isinstance(obj, type) else type(obj)
        own = (
            getattr(cls, "format", None) is str.format and getattr(cls, "format_map", None) is str.format_map
        )
    if not own:
        return obj
    if isinstance(target, type) and issubclass(target, str):  # str.format(fmt, ...), S.format(fmt, ...)
        return _Checked(None)
    if isinstance(target, str):
        return _Checked(target)
    return obj
