"""Attribute stores in agent code: only on objects of the classes agent code defined.

A library skill's globals are the later task's namespace, and what it reads there the task can
write: ``run.v = answer`` on the skill's own function, ``json.v = answer`` on a module, or
``apis.v = answer``, then ``return run.v`` in a skill that made one API call, paid the skill bonus
(2.0, 2.0) for the task's own answer (session 40). Extraction already refuses a skill that reads a
task's variable (``skills/extract._self_contained``); these stores are the same channel one
attribute away. No policy cell of laptop32 (8,127) stores an attribute at all.

So every attribute store and delete in agent code (``x.a = v``, ``x.a += v``, ``del x.a``, a
``for``/``with`` target ``x.a``) is compiled as a store on ``check(x)``, which passes ``x`` when it
is a class that agent code defined (a ``class`` statement compiled from a cell or a skill: the
``__build_class__`` hook) or an instance of one, and raises ``RuleError`` otherwise: modules,
functions (library skills), ``apis``, the classes of the allowed modules and their instances are
read-only. ``setattr``/``delattr`` apply the same check (``rules.agent_builtins``). The check is a
constant of the compiled code, as the call tracker's decorator is: nothing in the namespace names
it.

The library's code also runs in a namespace of its own (``share_library_cell``): a skill's globals
were the later task's namespace, so a task that rebound a name a skill reads (``abs = lambda x:
answer``, a library helper redefined, ``json = J()``) chose what the skill returned (the second
review of session 40: (2.0, 2.0)). Library cells (``<skill:NAME>``) run in the library's namespace,
with builtins and module copies of its own; what a library cell binds is then bound in the task's
namespace too (its functions, its aliases), and its import statements run there again, so that the
task gets its own module copies, as if it had imported them.

This module is imported by the template process: it imports nothing of the project but ``rules``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import secrets
import sys
import types
from collections.abc import Callable
from typing import Any

from sage_rl.sandbox.formats import formatting
from sage_rl.sandbox.rules import FORMAT_ATTRS, RuleError

READ_ONLY = (
    "{what} is read-only: agent code may set or delete attributes only on the classes it defines and "
    "their objects (modules, functions, apis and the allowed modules' classes are shared with the "
    "library's skills)"
)


def canonical(value: Any) -> Any:
    """``value``, or for an exact ``str`` its interned copy: what agent code's ``is`` and ``id()`` see.
    The interpreter's table of interned strings is one for the task and the library, and the
    compiler interns a task's name-like literals: a skill that interned ``'z1020'`` itself and asked
    with ``is`` whether it got its own object back read the task's answer, 20 (the third review of
    session 42). With both sides interned, ``a is b`` for strings is ``a == b``, whatever the table
    held before."""
    return sys.intern(value) if type(value) is str else value


class StoreGuard:
    """The classes agent code defined, and the check its attribute stores go through."""

    def __init__(self, agent_code: Callable[[types.CodeType], bool]) -> None:
        self.agent_code = agent_code  # whether a class body's code is agent code
        self.marker = f"\x00sage-store-{secrets.token_hex(8)}\x00"
        self.format_marker = f"\x00sage-format-{secrets.token_hex(8)}\x00"
        self.identity_marker = f"\x00sage-identity-{secrets.token_hex(8)}\x00"
        self._classes: dict[int, type] = {}  # by id, the classes kept alive: no agent __eq__ runs

    def transform(self, tree: ast.AST) -> ast.AST:
        """``tree`` with each attribute store's object ``x`` as ``marker.__call__(x)``, and each
        ``x.format``/``x.format_map`` as ``format_marker.__call__(x).format`` (the markers are
        replaced by ``check`` and ``formats.formatting`` once compiled: ``markers``)."""
        return ast.fix_missing_locations(
            _Stores(self.marker, self.format_marker, self.identity_marker).visit(tree)
        )

    formatting = staticmethod(formatting)  # for ``getattr(x, 'format')`` (rules.agent_builtins)
    canonical = staticmethod(canonical)  # for ``id(x)`` (rules.agent_builtins)

    @property
    def markers(self) -> dict[str, Any]:
        """The marker constants of ``transform``'s code and what ``replace_constants`` puts there."""
        return {self.marker: self.check, self.format_marker: formatting, self.identity_marker: canonical}

    def check(self, obj: Any) -> Any:
        """``obj`` when agent code may set its attributes (module docstring); else ``RuleError``."""
        t = type(obj)
        if self._classes.get(id(t)) is t or self._classes.get(id(obj)) is obj:
            return obj
        raise RuleError(READ_ONLY.format(what=f"a {t.__name__} object"))

    def build_class(self, func: Any, name: str, *bases: Any, **kw: Any) -> Any:
        """``__build_class__`` for agent code: the class, recorded when its body is agent code."""
        cls = builtins.__build_class__(func, name, *bases, **kw)
        code = getattr(func, "__code__", None)
        module = getattr(func, "__globals__", {}).get("__name__")
        # a metaclass may return any class (``metaclass=lambda *a: type(json)``): only one whose
        # body set it up in agent code's module is agent code's
        if (
            isinstance(code, types.CodeType)
            and self.agent_code(code)
            and isinstance(cls, type)
            and type.__dict__["__module__"].__get__(cls) == module
        ):
            self._classes[id(cls)] = cls
        return cls


class _Stores(ast.NodeTransformer):
    def __init__(self, marker: str, format_marker: str, identity_marker: str) -> None:
        self.marker, self.format_marker, self.identity_marker = marker, format_marker, identity_marker

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        """Each operand of an ``is``/``is not`` that is not a constant (``x is None`` stays) as
        ``identity_marker.__call__(operand)`` (``canonical``): evaluated once, in order, as before."""
        self.generic_visit(node)
        operands = [node.left, *node.comparators]
        wrap = set()
        for i, op in enumerate(node.ops):
            pair = (operands[i], operands[i + 1])
            if isinstance(op, ast.Is | ast.IsNot) and not any(isinstance(x, ast.Constant) for x in pair):
                wrap |= {i, i + 1}
        if wrap:
            operands = [_call(self.identity_marker, x) if i in wrap else x for i, x in enumerate(operands)]
            node.left, node.comparators = operands[0], operands[1:]
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Store | ast.Del):
            node.value = _call(self.marker, node.value)
        elif node.attr in FORMAT_ATTRS:
            node.value = _call(self.format_marker, node.value)
        return node


def _call(marker: str, value: ast.expr) -> ast.expr:
    """``marker.__call__(value)``: a call of a constant would draw a SyntaxWarning when compiled."""
    fn = ast.Attribute(value=ast.Constant(marker), attr="__call__", ctx=ast.Load())
    return ast.copy_location(ast.Call(func=fn, args=[value], keywords=[]), value)


def replace_constants(
    code: types.CodeType, by: dict[str, Any], seen: dict[int, types.CodeType]
) -> types.CodeType:
    """``code`` and the code nested in it with the string constants in ``by`` replaced by their
    values; each new code object is kept in ``seen`` by id (a compiled marker is an exact ``str``)."""
    consts = tuple(
        by[c]
        if type(c) is str and c in by
        else (replace_constants(c, by, seen) if isinstance(c, types.CodeType) else c)
        for c in code.co_consts
    )
    new = code.replace(co_consts=consts)
    seen[id(new)] = new
    return new


def share_library_cell(
    code: str, origin: str, before: dict[str, Any], library: dict[str, Any], task: dict[str, Any]
) -> None:
    """A library cell ran in ``library`` (``before``: its bindings before): bind what it bound in
    ``task`` too, and run its import statements there (module docstring). Never raises."""
    try:
        tree = ast.parse(code, filename=origin, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    imported = {(a.asname or a.name).partition(".")[0] for n in imports for a in n.names}
    missing = object()
    for name, value in library.items():
        if not name.startswith("__") and name not in imported and before.get(name, missing) is not value:
            task[name] = _proxy(value) if type(value) is types.FunctionType else value
    if imports:  # they ran in the library's namespace: an error here adds nothing to tell
        with contextlib.suppress(Exception):
            exec(compile(ast.Module(body=imports, type_ignores=[]), origin, "exec"), task)  # noqa: S102


def _proxy(fn: Any) -> Any:
    """The task's handle on a library function: another function object, so that what library code
    stores on it (``collections.ChainMap.__init__(skill, v)`` sets ``skill.maps``) the library's
    own function never carries."""

    def skill(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    skill.__name__, skill.__qualname__, skill.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return skill
