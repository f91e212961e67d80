"""The rules agent code lives under in the sandbox (issue 30, item 4; docs/sandbox.md).

The call records that pay the skill bonus are counted inside the worker, and anything inside the
worker's process is reachable by code that may introspect it (``gc``, frames, closures, code
constants) or write to its file descriptors (the channel to the parent). No secret kept there can
stop that. So agent code is held to a smaller language, checked in two places:

- ``refusal(code)``, in the PARENT, before a cell or a library skill is sent to the worker: the
  cell is parsed and refused as a whole (nothing of it runs) when it
  - imports a module outside ``ALLOWED_MODULES`` (``from m import *`` included);
  - uses an attribute whose name starts with ``_`` (except ``__init__``, ``__name__``,
    ``__doc__``) or is in ``DENIED_ATTRS`` (frame, traceback, generator, coroutine and code
    attributes; names under which allowed modules expose other modules, such as ``datetime.sys``;
    ``get_type_hints`` and ``singledispatch``, which evaluate strings; ``get_field``, a getattr by
    string), whether as
    ``x.name``, in ``from m import name`` or in a ``case C(name=...)`` pattern;
  - names a dunder (``__builtins__``, ``__import__``) or a builtin in ``DENIED_BUILTINS``
    (``eval``, ``exec``, ``compile``, ``globals``, ``locals``, ``vars``, ``open``, ...).
  The parent runs this check: agent code cannot change it.
- ``agent_builtins()``, in the WORKER, the builtins of the agent's namespace: ``getattr``,
  ``hasattr``, ``setattr`` and ``delattr`` apply the attribute rule to names computed at run time
  (``getattr(apis, '_' + 'bridge')``). The real functions are reachable only through what
  ``refusal`` forbids (``__closure__``, ``__builtins__``, the ``builtins`` module).

This module is imported by the template process: it imports nothing of the project.
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Iterator
from typing import Any

#: Modules agent code may import (exact dotted names). Pure computation only: nothing that reads
#: frames or the heap, evaluates strings, gets attributes by string in C, or opens descriptors.
ALLOWED_MODULES = frozenset(
    {
        "abc", "base64", "bisect", "calendar", "cmath", "collections", "collections.abc", "copy",
        "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fractions", "functools",
        "hashlib", "heapq", "html", "itertools", "json", "math", "numbers", "pprint", "random", "re",
        "statistics", "string", "textwrap", "time", "typing", "unicodedata", "zoneinfo",
    }
)  # fmt: skip

#: Dunder attributes agent code may use (``super().__init__(...)``, ``f.__name__``).
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__"})


def _prefixed(obj: object, *prefixes: str) -> set[str]:
    return {a for a in dir(obj) if a.startswith(prefixes)}


def _gen() -> Iterator[int]:
    yield 0


async def _coro() -> None:
    pass


async def _agen() -> Any:
    yield 0


def _introspection_attrs() -> frozenset[str]:
    """Attributes of frames, tracebacks, generators, coroutines and code objects, as this Python
    has them (``f_back``, ``tb_frame``, ``gi_frame``, ``cr_frame``, ``ag_frame``, ``co_consts``...)."""
    coro, agen = _coro(), _agen()
    try:
        return frozenset(
            _prefixed(types.FrameType, "f_")
            | _prefixed(types.TracebackType, "tb_")
            | _prefixed(_gen(), "gi_")
            | _prefixed(coro, "cr_")
            | _prefixed(agen, "ag_")
            | _prefixed(types.CodeType, "co_")
            | {"cell_contents"}
        )
    finally:
        coro.close()


#: Attribute names agent code may not use (besides private ones). The module names are those under
#: which an allowed module exposes a module that is not allowed (tests/test_sandbox_rules.py checks
#: this list against the modules themselves on the running Python).
DENIED_ATTRS = _introspection_attrs() | {
    "get_type_hints",  # typing: evaluates strings as code
    "singledispatch", "singledispatchmethod",  # functools: register() evaluates string annotations
    "get_field",  # string.Formatter: an attribute lookup by string, in C
    # modules reachable as attributes of allowed modules
    "argparse", "binascii", "bltns", "builtins", "codecs", "contextlib", "copyreg", "gc", "inspect", "keyword",
    "operator", "os", "platform", "struct", "sys", "types", "warnings",
}  # fmt: skip

#: Builtins agent code may not name: they evaluate strings, expose namespaces, open descriptors
#: (``open(5, 'wb')`` writes to the parent's channel) or start a debugger.
DENIED_BUILTINS = frozenset(
    {"breakpoint", "compile", "eval", "exec", "globals", "help", "input", "locals", "open", "vars"}
)

RULE = (
    "agent code may import only these modules: {modules}; it may not use attributes whose names "
    "start with '_' (other than __init__, __name__, __doc__) or frame, traceback, generator, "
    "coroutine or code attributes, nor eval, exec, compile, globals, locals, vars, open, input, "
    "help or breakpoint"
).format(modules=", ".join(sorted(ALLOWED_MODULES)))


class RuleError(Exception):
    """A name agent code may not use (raised at run time by the guarded builtins)."""


RuleError.__module__ = "builtins"  # shown to the agent as "RuleError: ..."


def attr_allowed(name: str) -> bool:
    """Whether agent code may use the attribute ``name``."""
    if name.startswith("_"):
        return name in ALLOWED_DUNDERS
    return name not in DENIED_ATTRS


def module_allowed(name: str) -> bool:
    return name in ALLOWED_MODULES


def refusal(code: str) -> str | None:
    """None when ``code`` keeps the rules, else the observation the agent gets instead of running it.

    A cell that does not parse is passed on (the worker reports its SyntaxError; nothing of it can
    run). A cell the parser cannot handle otherwise (nested too deeply) is refused: fail closed.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        return _refused(None, "the code is nested too deeply to be checked")
    found = []  # every breach, to report the first in reading order (ast.walk goes breadth-first)
    for node in ast.walk(tree):
        why = _why(node)
        if why is not None:
            found.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0), why))
    if not found:
        return None
    line, _, why = min(found)
    return _refused(line, why)


def _refused(line: int | None, why: str) -> str:
    where = f"line {line}: " if line else ""
    return f"RuleError: {where}{why}. The cell was refused before running; nothing in it ran. ({RULE}.)\n"


def _why(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        bad = [a.name for a in node.names if not module_allowed(a.name)]
        return f"import of {bad[0]!r} is not allowed" if bad else None
    if isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        if node.level or not module_allowed(module):
            return f"import from {module!r} is not allowed"
        for a in node.names:
            if a.name == "*":
                return f"'from {module} import *' is not allowed"
            if not attr_allowed(a.name):
                return f"importing {a.name!r} from {module!r} is not allowed"
        return None
    if isinstance(node, ast.Attribute) and not attr_allowed(node.attr):
        return f"the attribute {node.attr!r} is not allowed"
    if isinstance(node, ast.MatchClass):
        bad = [a for a in node.kwd_attrs if not attr_allowed(a)]
        return f"the attribute {bad[0]!r} is not allowed" if bad else None
    if isinstance(node, ast.Name):
        if node.id in DENIED_BUILTINS:
            return f"{node.id!r} is not allowed"
        if node.id.startswith("__") and node.id not in ALLOWED_DUNDERS:
            return f"the name {node.id!r} is not allowed"
    return None


# -- the worker side: builtins that apply the same rules to computed names --------------------------


def _checked(name: object) -> str:
    # an exact str: a str subclass could lie in its __eq__ or __hash__ to the lookup that follows
    if type(name) is not str:
        raise TypeError(f"attribute name must be a str, not {type(name).__name__}")
    if not attr_allowed(name):
        raise RuleError(f"the attribute {name!r} is not allowed ({RULE})")
    return name


def agent_builtins() -> dict[str, Any]:
    """The ``__builtins__`` of the agent's namespace in the worker: the builtins, with ``getattr``,
    ``hasattr``, ``setattr`` and ``delattr`` refusing the attributes ``refusal`` refuses when written
    out. (The builtins ``refusal`` refuses by name stay: naming them is refused, and without
    ``__builtins__`` or the ``builtins`` module nothing else reaches them.)"""
    real_getattr, real_hasattr, real_setattr, real_delattr = getattr, hasattr, setattr, delattr

    def guarded_getattr(obj: object, name: str, *default: object) -> Any:
        return real_getattr(obj, _checked(name), *default)

    def guarded_hasattr(obj: object, name: str) -> bool:
        return real_hasattr(obj, _checked(name))

    def guarded_setattr(obj: object, name: str, value: object) -> None:
        real_setattr(obj, _checked(name), value)

    def guarded_delattr(obj: object, name: str) -> None:
        real_delattr(obj, _checked(name))

    out = dict(vars(builtins))
    for fn in (guarded_getattr, guarded_hasattr, guarded_setattr, guarded_delattr):
        fn.__name__ = fn.__qualname__ = fn.__name__.removeprefix("guarded_")
        out[fn.__name__] = fn
    out["RuleError"] = RuleError
    return out
