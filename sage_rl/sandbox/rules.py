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
    ``GADGET_ATTRS``: functions and classes that evaluate strings, or look an attribute up by a
    name their caller gives and hand the object to agent code, and ``AttributeError.obj``), whether
    as ``x.name``, in ``from m import name`` or in a ``case C(name=...)`` pattern;
  - assigns or deletes ``__init__`` (``READ_ONLY_ATTRS``: ``apis.<app>`` runs ``_App(bridge, app)``);
  - has a positional pattern in a class pattern (``case C(p)`` looks up the names in
    ``C.__match_args__``, which agent code sets, with the real getattr);
  - names a dunder (``__builtins__``, ``__import__``) or a builtin in ``DENIED_BUILTINS``
    (``eval``, ``exec``, ``compile``, ``globals``, ``locals``, ``vars``, ``open``, ...).
  The parent runs this check: agent code cannot change it.
- ``agent_builtins()``, in the WORKER, the builtins of the agent's namespace: ``getattr``,
  ``hasattr``, ``setattr`` and ``delattr`` apply the attribute rule to names computed at run time
  (``getattr(apis, '_' + 'bridge')``). The real functions are reachable only through what
  ``refusal`` forbids (``__closure__``, ``__builtins__``, the ``builtins`` module). Its
  ``__import__`` gives agent code its own copies of the allowed modules (``copies.py``): the
  worker's code uses them too, and agent code may assign their public attributes.

This restricts the language with deny lists over a large language and standard library; it is not
a proof. Each name in ``GADGET_ATTRS`` was found by reading the allowed modules (the audit in
docs/sandbox.md) or by a reviewer, and a gadget nobody has found would reach the records again.

This module is imported by the template process: it imports nothing of the project.
"""

from __future__ import annotations

import ast
import builtins
import types
from collections.abc import Callable, Iterator
from typing import Any

#: Modules agent code may import (exact dotted names). Pure computation only: nothing that reads
#: frames or the heap, evaluates strings, gets attributes by string in C, or opens descriptors.
ALLOWED_MODULES = frozenset(
    {
        "abc", "base64", "bisect", "calendar", "cmath", "collections", "collections.abc", "csv",
        "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq", "html",
        "itertools", "json", "math", "numbers", "pprint", "random", "re", "statistics", "string",
        "textwrap", "time", "typing", "unicodedata", "zoneinfo",
    }
)  # fmt: skip
# Not allowed, though pure computation, because each is a way to the records (the gadget audit in
# docs/sandbox.md): ``copy`` (deepcopy's memo keeps the originals of what it copied and is handed to
# the copied objects' ``__deepcopy__``; ``copy.copy`` rebuilds an object with ``setattr(y, name, value)``
# on whatever the object's ``__reduce_ex__`` names: any object, any attribute); ``dataclasses``
# (``dataclass()`` writes field names into the source of the methods it ``exec``s, and a field name
# is any string a class's ``__annotations__`` holds: code injection with the real builtins;
# ``asdict``/``astuple`` deep-copy).

#: Dunder attributes agent code may use (``super().__init__(...)``, ``f.__name__``).
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__"})

#: Attributes agent code may read but not assign or delete: ``__init__`` of a class agent code did
#: not write is called by that class's own code (``apis.<app>`` makes ``_App(bridge, app)``).
READ_ONLY_ATTRS = frozenset({"__init__"})


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


#: Names of functions and classes of allowed modules that evaluate strings, or look an attribute up
#: (or write one) by a name their caller gives and hand the result to agent code: each was a way to
#: the records (``apis._bridge``: the channel, and ``.on_ok.__self__``: the tracker). From the gadget
#: audit of the allowed modules (docs/sandbox.md, "What agent code may do"); the probes are in
#: tests/test_sandbox_rules.py.
GADGET_ATTRS = frozenset(
    {
        "get_type_hints",  # typing: evaluates strings as code
        "singledispatch", "singledispatchmethod",  # functools: register() evaluates string annotations
        "get_field",  # string.Formatter: an attribute lookup by string, in C
        "Formatter",  # string: get_field's result goes to a subclass's format_field / convert_field
        "update_wrapper", "wraps",  # functools: setattr(wrapper, name, getattr(wrapped, name)), any name
        "cached_property",  # functools: reads and writes instance.__dict__[attrname], any attrname
        "global_enum",  # enum: sys.modules[cls.__module__].__dict__.update(cls.__members__)
        "UserDict",  # collections: UserDict.copy() runs copy.copy (why copy is not allowed: above)
        "UserString",  # collections: its format() runs str.format on its data in stdlib code (formats.py)
        "obj",  # AttributeError.obj: what a failed lookup ran on ('{0._x.y}'.format(o) looks up _x)
    }
)  # fmt: skip

#: Ways a task moves, or a skill reads, state both namespaces share that ``shared.py`` cannot watch
#: (the review of session 42; each paid a skill for the task's answer): ``abc.get_cache_token()``
#: counts every ``ABC.register`` in the process (one ``_abc`` for both module copies; a first ``import
#: collections`` registers dozens); ``register`` makes a type a virtual subclass of a shared ABC
#: (``type(decimal.Context().flags).register(bytes)``, read by ``issubclass``); ``mro`` hands agent
#: code the worker's own base classes.
SHARED_ATTRS = frozenset({"get_cache_token", "register", "mro"})

#: The methods of ``str`` that look attributes up by the names a format string's fields hold
#: (``formats.py`` checks those names; ``agent_builtins``' ``getattr`` routes them there).
FORMAT_ATTRS = frozenset({"format", "format_map"})

#: Attribute names agent code may not use (besides private ones). The module names are those under
#: which an allowed module exposes a module that is not allowed (tests/test_sandbox_rules.py checks
#: this list against the modules themselves on the running Python).
DENIED_ATTRS = _introspection_attrs() | GADGET_ATTRS | SHARED_ATTRS | {
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
    "start with '_' (other than __init__, __name__, __doc__; __init__ may not be assigned) or frame, "
    "traceback, generator, coroutine or code attributes, nor {denied}, nor positional patterns in a "
    "class pattern (case C(x=p), not case C(p)), nor a bare raise outside an except block, nor eval, "
    "exec, compile, globals, locals, vars, open, input, help or breakpoint"
).format(
    modules=", ".join(sorted(ALLOWED_MODULES)),
    denied=", ".join(sorted(GADGET_ATTRS | SHARED_ATTRS)),
)


class RuleError(Exception):
    """A name agent code may not use (raised at run time by the guarded builtins)."""


RuleError.__module__ = "builtins"  # shown to the agent as "RuleError: ..."


def attr_allowed(name: str) -> bool:
    """Whether agent code may use the attribute ``name``."""
    if name.startswith("_"):
        return name in ALLOWED_DUNDERS
    return name not in DENIED_ATTRS


def attr_writable(name: str) -> bool:
    """Whether agent code may assign or delete the attribute ``name``."""
    return attr_allowed(name) and name not in READ_ONLY_ATTRS


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
    found += [(n.lineno, n.col_offset, BARE_RAISE) for n in _bare_raises(tree.body, False)]
    if not found:
        return None
    line, _, why = min(found)
    return _refused(line, why)


BARE_RAISE = "a bare 'raise' outside an 'except' block is not allowed (raise an exception by name)"


def _bare_raises(body: list[ast.AST], handling: bool) -> Iterator[ast.Raise]:
    """The bare ``raise`` statements not lexically inside an ``except`` block of their own function:
    such a ``raise`` re-raises whatever exception its caller is handling, so a skill called inside
    the task's ``except`` read the task's exception (``e.args[0]``: its answer)."""
    for node in body:
        if isinstance(node, ast.Raise) and node.exc is None and not handling:
            yield node
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            inner = handling
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                inner = False  # a function's body runs wherever it is called from
            elif isinstance(node, ast.ExceptHandler) and field == "body":
                inner = True
            elif isinstance(node, ast.Try | ast.TryStar) and field == "finalbody":
                inner = False  # after an except block too, and with no exception at all
            yield from _bare_raises([c for c in children if isinstance(c, ast.AST)], inner)


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
    if isinstance(node, ast.Attribute):
        if not attr_allowed(node.attr):
            return f"the attribute {node.attr!r} is not allowed"
        if not isinstance(node.ctx, ast.Load) and not attr_writable(node.attr):
            return f"assigning or deleting the attribute {node.attr!r} is not allowed"
    if isinstance(node, ast.MatchClass):
        if node.patterns:  # matched by the names in the class's __match_args__, looked up in C
            return (
                "positional patterns in a class pattern are not allowed "
                "(use case C(name=pattern), or case int() as n for a built-in type)"
            )
        bad = [a for a in node.kwd_attrs if not attr_allowed(a)]
        return f"the attribute {bad[0]!r} is not allowed" if bad else None
    if isinstance(node, ast.Name):
        if node.id in DENIED_BUILTINS:
            return f"{node.id!r} is not allowed"
        if node.id.startswith("__") and node.id not in ALLOWED_DUNDERS:
            return f"the name {node.id!r} is not allowed"
    for name in _bound(node):
        if name == "__builtins__" or (
            name.startswith("__") and name not in ALLOWED_DUNDERS and not isinstance(node, _DEFS)
        ):
            return f"binding the name {name!r} is not allowed"
    return None


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _bound(node: ast.AST) -> list[str]:
    """Names a node binds that the tree holds as plain strings, not ``ast.Name`` nodes: ``except E
    as n``, ``import m as n``, ``case ... as n`` / ``*n`` / ``**n``, ``global n``, ``def n``.
    ``except E as __builtins__`` deleted the name when its block ended, and the next frames got
    the real builtins (an unguarded ``getattr``). A def may bear a dunder name (a class's
    ``__eq__``), never ``__builtins__``."""
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
        return [node.name] if node.name else []
    if isinstance(node, ast.alias):
        return [node.asname or node.name.partition(".")[0]]
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    if isinstance(node, ast.Global | ast.Nonlocal):
        return list(node.names)
    if isinstance(node, _DEFS):
        return [node.name]
    return []


# -- the worker side: builtins that apply the same rules to computed names --------------------------


def _checked(name: object, write: bool = False) -> str:
    # an exact str: a str subclass could lie in its __eq__ or __hash__ to the lookup that follows
    if type(name) is not str:
        raise TypeError(f"attribute name must be a str, not {type(name).__name__}")
    if not attr_allowed(name):
        raise RuleError(f"the attribute {name!r} is not allowed ({RULE})")
    if write and not attr_writable(name):
        raise RuleError(f"assigning or deleting the attribute {name!r} is not allowed ({RULE})")
    return name


def agent_builtins(stores: Any, agent_import: Callable[..., Any]) -> dict[str, Any]:
    """The ``__builtins__`` of an agent namespace in the worker: ``getattr``, ``hasattr``, ``setattr``,
    ``delattr`` refusing what ``refusal`` refuses written out, ``setattr``/``delattr``/``__build_class__``
    keeping ``stores`` (a ``stores.StoreGuard``; ``getattr(x, 'format')`` through
    ``stores.formatting``, ``id(x)`` through ``stores.canonical``), and ``__import__`` giving the
    namespace its own module copies (``agent_import``: ``copies.private_import()``). The builtins
    ``refusal`` refuses by name stay (unreachable)."""
    real_getattr, real_hasattr, real_setattr, real_delattr = getattr, hasattr, setattr, delattr

    def guarded_getattr(obj: object, name: str, *default: object) -> Any:
        if name in FORMAT_ATTRS:  # its fields checked (formats.py)
            obj = stores.formatting(obj)
        return real_getattr(obj, _checked(name), *default)

    def guarded_hasattr(obj: object, name: str) -> bool:
        return real_hasattr(obj, _checked(name))

    def guarded_setattr(obj: object, name: str, value: object) -> None:
        name = _checked(name, write=True)
        real_setattr(stores.check(obj), name, value)

    def guarded_delattr(obj: object, name: str) -> None:
        name = _checked(name, write=True)
        real_delattr(stores.check(obj), name)

    out = dict(vars(builtins))
    for fn in (guarded_getattr, guarded_hasattr, guarded_setattr, guarded_delattr):
        fn.__name__ = fn.__qualname__ = fn.__name__.removeprefix("guarded_")
        out[fn.__name__] = fn
    out["id"] = lambda obj: id(stores.canonical(obj))  # a string's identity tells nothing (stores.py)
    out["__import__"] = agent_import
    out["__build_class__"] = stores.build_class
    out["RuleError"] = RuleError
    return out
