"""Inline a reference solution's skill calls: the library-free expert's code (issue 27).

The paper's GRPO baseline (SAGE.md section 6) has no skill library, so its SFT model must learn
from expert trajectories that solve each task inline, with the same doc lookups and API calls and
no ``def``. ``inline_solution(source, call)`` rewrites a template's reference solution (its
functions ``source`` followed by the ``call`` snippet) into straight-line code:

- each call to one of ``source``'s functions is hoisted out of its statement, in evaluation order,
  and replaced by the function's body, its parameters replaced by their arguments where these are
  constants or names that the body does not rebind (``getattr(apis, "music")``, as a person writes
  it inline), else bound by assignment first (``items = [...]``);
- the body's final ``return X`` becomes ``<target> = X``, where ``<target>`` is the assigned name
  when the statement is ``name = f(...)``, else ``<function>_result``; a ``return`` inside the
  function's last top-level loop becomes that assignment followed by ``break``;
- a callee's local names that the surrounding code also uses are renamed (``items_2``).

Anything the rewrite cannot do with Python's own semantics (a skill called inside a lambda, a
comprehension's element or condition, a short-circuit operand, a ``while`` test, or a return from
elsewhere) raises ``NotInlinable``: the expert's tests check every template rewrites and solves.
Pure functions of strings: no world, no I/O.
"""

from __future__ import annotations

import ast
import copy
import itertools


class NotInlinable(ValueError):
    """The solution uses a construct the inliner does not rewrite (the message names it)."""


def inline_solution(source: str, call: str) -> str:
    """``source``'s functions inlined into ``call``: code with no ``def`` that does the same."""
    funcs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    module = ast.parse(call)
    body = _Inliner(funcs, _names_in(module)).statements(module.body)
    return ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        a.arg for a in ast.walk(node) if isinstance(a, ast.arg)
    }


class _Inliner:
    def __init__(self, funcs: dict[str, ast.FunctionDef], taken: set[str]) -> None:
        self.funcs, self.taken = funcs, set(taken)

    def statements(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in stmts:
            out.extend(self.statement(stmt))
        return out

    def statement(self, stmt: ast.stmt) -> list[ast.stmt]:
        """``stmt`` with its skill calls hoisted and inlined before it (nested blocks recursively)."""
        one_name = (
            isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        )
        if one_name and self._is_skill_call(stmt.value):  # name = f(...): the body assigns the name itself
            pre = self._hoist_args(stmt.value)
            return pre + self.expand(stmt.value, stmt.targets[0].id)
        if isinstance(stmt, ast.Expr) and self._is_skill_call(stmt.value):
            pre = self._hoist_args(stmt.value)
            return pre + self.expand(stmt.value, None)  # the value is discarded
        if isinstance(stmt, ast.While) and self._calls_in(stmt.test):
            raise NotInlinable("a skill called in a while test")
        pre: list[ast.stmt] = []
        for field in ("value", "test", "iter", "targets", "target", "items", "exc", "msg"):
            if hasattr(stmt, field):
                setattr(stmt, field, self._hoist(getattr(stmt, field), pre))
        for field in ("body", "orelse", "finalbody"):
            if getattr(stmt, field, None):  # empty else/finally blocks stay empty
                setattr(stmt, field, self.statements(getattr(stmt, field)) or [ast.Pass()])
        for handler in getattr(stmt, "handlers", []):
            handler.body = self.statements(handler.body) or [ast.Pass()]
        return pre + [stmt]

    def _is_skill_call(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.funcs

    def _calls_in(self, node: ast.AST) -> list[ast.Call]:
        return [n for n in ast.walk(node) if self._is_skill_call(n)]

    def _hoist_args(self, call: ast.Call) -> list[ast.stmt]:
        pre: list[ast.stmt] = []
        call.args = [self._hoist(a, pre) for a in call.args]
        for kw in call.keywords:
            kw.value = self._hoist(kw.value, pre)
        return pre

    def _hoist(self, node, pre: list[ast.stmt]):
        """``node`` (an expression or a list of them) with each skill call replaced by a result name
        whose computation is appended to ``pre``, innermost and leftmost first."""
        if isinstance(node, list):
            return [self._hoist(n, pre) for n in node]
        if not isinstance(node, ast.AST) or not self._calls_in(node):
            return node
        _refuse_lazy(node, self._is_skill_call)
        return _Hoister(self, pre).visit(node)

    def expand(self, call: ast.Call, target: str | None) -> list[ast.stmt]:
        """The statements that compute ``call`` (a skill call with plain arguments) into ``target``
        (None: the value is discarded, so a returned name or constant is dropped)."""
        fn = self.funcs[call.func.id]
        renames = self._renames(fn, target)
        bound = [(renames.get(name, name), value) for name, value in _bind(fn, call)]
        fn = _Renamer(renames).visit(copy.deepcopy(fn))
        stored = _bound_in(fn.body)
        # a plain argument (a name or a constant) is written where its parameter is read, as a person
        # would write it, where neither is rebound in the body; any other is bound first, as Python does
        subst = {new: value for new, value in bound if _plain(value, stored) and new not in stored}
        out = [
            _assign(new, value)
            for new, value in bound
            if new not in subst and not (isinstance(value, ast.Name) and value.id == new)  # `x = x`: bound
        ]
        fn = _Substituter(subst).visit(fn)
        for i, stmt in enumerate(fn.body):
            if i == 0 and _is_docstring(stmt):
                continue
            last = i == len(fn.body) - 1
            if isinstance(stmt, ast.Return):
                if not last:
                    raise NotInlinable(f"{call.func.id}: a return before the end")
                value = self._hoist(stmt.value, out) if stmt.value is not None else ast.Constant(None)
                out.extend(_result(target, value))
                continue
            if any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
                if not (last and isinstance(stmt, (ast.For, ast.While))):
                    raise NotInlinable(f"{call.func.id}: a return outside its last loop")
                stmt = _ReturnToBreak(target).visit(stmt)
            out.extend(self.statement(stmt))
        return out

    def _renames(self, fn: ast.FunctionDef, target: str) -> dict[str, str]:
        """A fresh name for each of ``fn``'s locals already used around it (the target excepted)."""
        local = _names_in(fn) - set(self.funcs) - {"apis"} - _free_builtins(fn)
        renames = {}
        for name in sorted(local):
            new = name
            if name in self.taken and name != target:
                new = next(f"{name}_{i}" for i in itertools.count(2) if f"{name}_{i}" not in self.taken)
                renames[name] = new
            self.taken.add(new)
        if target is not None:
            self.taken.add(target)
        return renames


class _Hoister(ast.NodeTransformer):
    """Replaces skill calls by result names, appending their inlined computation to ``pre``."""

    def __init__(self, inliner: _Inliner, pre: list[ast.stmt]) -> None:
        self.inliner, self.pre, self.count = inliner, pre, 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)  # arguments first: Python evaluates them before the call
        if not self.inliner._is_skill_call(node):
            return node
        target = _fresh(f"{node.func.id}_result", self.inliner.taken)
        self.inliner.taken.add(target)
        self.pre.extend(self.inliner.expand(node, target))
        return ast.Name(id=target, ctx=ast.Load())


class _Renamer(ast.NodeTransformer):
    def __init__(self, renames: dict[str, str]) -> None:
        self.renames = renames

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.renames.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.renames.get(node.arg, node.arg)
        return node


class _Substituter(ast.NodeTransformer):
    """Each read of a substituted parameter -> a copy of its argument."""

    def __init__(self, subst: dict[str, ast.expr]) -> None:
        self.subst = subst

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.subst:
            return copy.deepcopy(self.subst[node.id])
        return node


def _bound_in(body: list[ast.stmt]) -> set[str]:
    """The names ``body`` binds or deletes: assigned, loop and comprehension targets, parameters
    (of a function given whole, and of lambdas)."""
    names: set[str] = set()
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                names.add(n.id)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
    return names


def _plain(value: ast.expr, stored: set[str]) -> bool:
    """A constant, or a name the body does not rebind: reading it later reads the same value."""
    return isinstance(value, ast.Constant) or (isinstance(value, ast.Name) and value.id not in stored)


class _ReturnToBreak(ast.NodeTransformer):
    """``return X`` in the function's last loop -> ``target = X; break`` (no inner loop between)."""

    def __init__(self, target: str | None) -> None:
        self.target, self.depth = target, 0

    def visit_For(self, node):
        return self._loop(node)

    def visit_While(self, node):
        return self._loop(node)

    def _loop(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        return node

    def visit_Return(self, node: ast.Return):
        if self.depth != 1:
            raise NotInlinable("a return inside a nested loop")
        return [*_result(self.target, node.value or ast.Constant(None)), ast.Break()]


def _refuse_lazy(node: ast.AST, is_skill_call) -> None:
    """Refuse skill calls that Python would evaluate lazily, conditionally or repeatedly."""
    for parent in ast.walk(node):
        lazy: list[ast.AST] = []
        if isinstance(parent, ast.Lambda):
            lazy = [parent.body]
        elif isinstance(parent, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            elts = [parent.key, parent.value] if isinstance(parent, ast.DictComp) else [parent.elt]
            lazy = (
                elts + [c for g in parent.generators for c in g.ifs] + [g.iter for g in parent.generators[1:]]
            )
        elif isinstance(parent, ast.BoolOp):
            lazy = parent.values[1:]
        elif isinstance(parent, ast.IfExp):
            lazy = [parent.body, parent.orelse]
        if any(is_skill_call(n) for e in lazy for n in ast.walk(e)):
            raise NotInlinable(f"a skill called lazily in {type(parent).__name__}")


def _bind(fn: ast.FunctionDef, call: ast.Call) -> list[tuple[str, ast.expr]]:
    """``(param, argument)`` for each parameter (defaults included; ``**kw`` gets a dict)."""
    a = fn.args
    if a.vararg or a.posonlyargs or a.kwonlyargs:
        raise NotInlinable(f"{fn.name}: *args or keyword-only parameters")
    if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        raise NotInlinable(f"{fn.name}: a call with * or ** arguments")
    names = [p.arg for p in a.args]
    defaults = dict(zip(names[len(names) - len(a.defaults) :], a.defaults, strict=True))
    given = dict(zip(names, call.args, strict=False))
    extra = {}
    for kw in call.keywords:
        (given if kw.arg in names else extra)[kw.arg] = kw.value
    if len(call.args) > len(names) or (extra and not a.kwarg):
        raise NotInlinable(f"{fn.name}: arguments it does not take")
    out = []
    for name in names:
        value = given.get(name, defaults.get(name))
        if value is None:
            raise NotInlinable(f"{fn.name}: missing argument {name}")
        out.append((name, value))
    if a.kwarg:
        out.append(
            (a.kwarg.arg, ast.Dict(keys=[ast.Constant(k) for k in extra], values=list(extra.values())))
        )
    return out


def _free_builtins(fn: ast.FunctionDef) -> set[str]:
    """Names ``fn`` reads but never binds (builtins such as ``len``, ``next``): never renamed."""
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} - _bound_in([fn])


def _fresh(base: str, taken: set[str]) -> str:
    return (
        base
        if base not in taken
        else next(f"{base}_{i}" for i in itertools.count(2) if f"{base}_{i}" not in taken)
    )


def _result(target: str | None, value: ast.expr) -> list[ast.stmt]:
    """``target = value``; with no target, the value alone where evaluating it can do something."""
    if target is not None:
        return [_assign(target, value)]
    return [] if isinstance(value, (ast.Name, ast.Constant)) else [ast.Expr(value=value)]


def _assign(name: str, value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value, lineno=0)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )
