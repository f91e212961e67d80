"""Static call simulation over executed cells: which functions a trajectory really called.

Used where the environment cannot report call records (AppWorld), by both usage detection and
extraction. It replays the module-level statements of each cell in order over a model of the
interpreter's global namespace, in which a name is bound to a library skill, to a function the
task defined, or to something else. The rules (docs/skills.md, "Static detection"):

- a call is an ``ast.Call`` on a plain ``Name`` (``x.name()`` is not a call of ``name``; passing a
  skill by name, e.g. ``map(skill, xs)``, is not counted either);
- a name resolves to what it is bound to *when the call executes*: a def, assignment, import,
  ``for`` target, ``with ... as``, ``except ... as`` or ``del`` at module level rebinds it, so a
  library skill redefined before the call is not used, and one redefined after the call was used;
- calling a function executes its body: calls inside it resolve at that moment, so use is
  transitive through library skills and through the task's own functions; names local to the
  function (parameters, assignments, nested defs) never resolve to globals;
- a function that is defined but never called contributes nothing, wherever the call sits inside
  it (nested defs run only if a body that runs calls them by name: the enclosing function's, or
  a sibling nested def's that is itself called);
- decorators and default values execute at definition time, so ``@skill`` counts as a call;
- calling a class runs its ``__init__``; methods are attribute calls and are not followed;
- every branch of ``if``/``try``/loops is assumed to run once, in source order, and a cell that
  failed part-way is assumed to have run entirely (the failing line is not known statically);
  ``lambda`` bodies never run (``g = lambda: skill()`` is not a use, even if ``g`` is called
  later); cells with syntax errors run nothing, and so do cells nested too deeply to analyse
  (``agent/syntax.py``: the agent loop does not run them).
"""

from __future__ import annotations

import ast
import symtable
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from sage_rl.agent.syntax import CodeError, parse_code
from sage_rl.skills.source import FunctionNode

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
#: Nodes that bind the name in their ``name`` field.
NAMED_NODES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.ExceptHandler,
    ast.MatchAs,
    ast.MatchStar,
)


@dataclass(frozen=True, eq=False)
class Binding:
    """A function bound in the namespace: a library skill (``cell`` = -1) or a task's def."""

    name: str
    node: FunctionNode
    cell: int

    @property
    def from_library(self) -> bool:
        return self.cell < 0


def parse_cell(code: str) -> ast.Module | None:
    """The cell's syntax tree, or None when it does not parse or nests too deeply (then it executed
    nothing: the agent loop does not run a cell that is too deep, ``agent/syntax.py``)."""
    tree = parse_code(code)
    return None if isinstance(tree, CodeError) else tree


class CallSimulator:
    """Replays cells in order; ``run_cell`` returns the functions each cell called (transitively)."""

    def __init__(self, library: Mapping[str, FunctionNode]) -> None:
        self.ns: dict[str, Binding | None] = {name: Binding(name, node, -1) for name, node in library.items()}
        # keyed by the node itself (not its id): holding it keeps a freed node's id from being reused
        self._calls_cache: dict[ast.AST, frozenset[str]] = {}

    def run_cell(self, index: int, tree: ast.Module | None) -> list[Binding]:
        """Execute ``tree`` (cell ``index``) in the model; the bindings called, in first-call order."""
        out: dict[int, Binding] = {}
        if tree is not None:
            self._exec(tree.body, index, out)
        return list(out.values())

    def _exec(self, stmts: Sequence[ast.stmt], cell: int, out: dict[int, Binding]) -> None:
        for s in stmts:
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
                for expr in [*s.decorator_list, *s.args.defaults, *filter(None, s.args.kw_defaults)]:
                    self._eval(expr, out)
                for d in s.decorator_list:  # ``@skill`` calls skill with the function
                    if isinstance(d, ast.Name):
                        self._call(d.id, out, set())
                self.ns[s.name] = Binding(s.name, s, cell)
            elif isinstance(s, ast.ClassDef):
                self._eval(s, out)
                init = [
                    n
                    for n in s.body
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "__init__"
                ]
                # calling a class runs its __init__ (other methods are attribute calls: not followed)
                self.ns[s.name] = Binding(s.name, init[-1], cell) if init else None
            else:
                self._exec_compound(s, cell, out)

    def _exec_compound(self, s: ast.AST, cell: int, out: dict[int, Binding]) -> None:
        """Evaluate the statement's own expressions, then bind its targets, then run its bodies
        (``body``, ``handlers``, ``orelse``, ``finalbody``, match cases) in field order."""
        bodies: list[ast.AST] = []
        exprs: list[ast.AST] = []
        for _, value in ast.iter_fields(s):
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, ast.stmt | ast.excepthandler | ast.match_case):
                    bodies.append(item)
                elif isinstance(item, ast.AST):
                    exprs.append(item)
        for e in exprs:
            self._eval(e, out)
        for e in exprs:
            self._bind(e)
        if isinstance(s, ast.Import | ast.ImportFrom):
            self._bind(s)
        if isinstance(s, ast.ExceptHandler) and s.name:
            self.ns[s.name] = None
        for b in bodies:
            if isinstance(b, ast.stmt):
                self._exec([b], cell, out)
            else:
                self._exec_compound(b, cell, out)

    def _eval(self, node: ast.AST, out: dict[int, Binding]) -> None:
        for n in scope_walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                self._call(n.func.id, out, set())

    def _bind(self, node: ast.AST) -> None:
        for name in bound_names(node):
            self.ns[name] = None

    def _call(self, name: str, out: dict[int, Binding], seen: set[int]) -> None:
        # depth-first in call order, with an explicit stack: a chain of thousands of functions
        # calling each other must not exhaust Python's recursion limit
        todo = [name]
        while todo:
            binding = self.ns.get(todo.pop())
            if binding is None or id(binding) in seen:
                continue
            seen.add(id(binding))
            out.setdefault(id(binding), binding)
            todo.extend(reversed(list(self._global_calls(binding.node))))

    def _global_calls(self, fn: FunctionNode) -> frozenset[str]:
        if fn not in self._calls_cache:
            self._calls_cache[fn] = frozenset(global_calls(fn))
        return self._calls_cache[fn]


def global_calls(
    fn: FunctionNode,
    enclosing: frozenset[str] = frozenset(),
    seen: set[int] | None = None,
    outer_defs: Mapping[str, FunctionNode] | None = None,
) -> set[str]:
    """Global names that calling ``fn`` calls, following the nested defs that its body calls
    (its own, and those of enclosing functions it can see: a sibling helper counts when called).
    Depth-first with an explicit stack of generators (``_own_calls``): thousands of sibling
    helpers calling each other must not exhaust Python's recursion limit."""
    seen = set() if seen is None else seen
    result: set[str] = set()
    stack = [_own_calls(fn, enclosing, outer_defs or {}, seen)]
    while stack:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
        elif isinstance(step, str):
            result.add(step)
        else:  # a nested def to follow now, before the rest of this body
            stack.append(_own_calls(*step, seen))
    return result


def _own_calls(
    fn: FunctionNode, enclosing: frozenset[str], outer_defs: Mapping[str, FunctionNode], seen: set[int]
) -> Iterator[str | tuple[FunctionNode, frozenset[str], Mapping[str, FunctionNode]]]:
    """One function's step of ``global_calls``: yields the global names its body calls, and
    (nested def, names local to the caller, defs it can see) for each nested def to follow."""
    seen.add(id(fn))
    own = local_names(fn)
    own_defs = {
        s.name: s for s in _scope_nodes(fn.body) if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    shadowed = own - own_defs.keys()  # bound here by something else than a def: hides outer defs
    hidden = shadowed & outer_defs.keys()
    defs = outer_defs  # shared when unchanged: linear, not quadratic, in sibling helpers
    if hidden or own_defs:
        defs = {k: v for k, v in outer_defs.items() if k not in hidden} | own_defs
    local = enclosing | own if own else enclosing
    for n in _scope_nodes(fn.body):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            continue
        name = n.func.id
        if name in defs and name not in shadowed:
            if id(defs[name]) not in seen:
                yield defs[name], local, defs
        elif name not in local:
            yield name


def local_names(fn: FunctionNode) -> set[str]:
    """Names local to ``fn``: parameters and everything its body binds, minus ``global`` ones."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
    names = {p.arg for p in params}
    declared_global: set[str] = set()
    for n in _scope_nodes(fn.body):
        names |= bound_names(n, deep=False)
        if isinstance(n, ast.Global):
            declared_global.update(n.names)
    return names - declared_global


def bound_names(node: ast.AST, deep: bool = True) -> set[str]:
    """Names that executing ``node`` binds in its own scope (targets, imports, defs, ``as``)."""
    nodes = scope_walk(node) if deep else iter([node])
    names: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            names.add(n.id)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in n.names if a.name != "*")
        elif isinstance(n, NAMED_NODES) and getattr(n, "name", None):
            names.add(n.name)  # type: ignore[union-attr]
    return names


def scope_walk(node: ast.AST) -> Iterator[ast.AST]:
    """Like ``ast.walk`` but does not enter function, lambda or class bodies (they run later or
    elsewhere); a def's decorators and defaults, which run now, are entered. A class body runs
    when the class statement does, so a class given as ``node`` itself is entered; a lambda never
    is, even as ``node`` (evaluating ``lambda: f()`` does not call ``f``)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, _SCOPES) and (n is not node or not isinstance(n, ast.ClassDef)):
            todo.extend(_definition_time_parts(n))
        else:
            todo.extend(reversed(list(ast.iter_child_nodes(n))))


def _scope_nodes(stmts: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    for s in stmts:
        yield from scope_walk(s) if not isinstance(s, _SCOPES) else _def_and_parts(s)


def _def_and_parts(s: ast.AST) -> Iterator[ast.AST]:
    yield s
    for part in _definition_time_parts(s):
        yield from scope_walk(part)


def _definition_time_parts(n: ast.AST) -> list[ast.AST]:
    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
        return [*n.decorator_list, *n.args.defaults, *filter(None, n.args.kw_defaults)]
    if isinstance(n, ast.ClassDef):
        return [*n.decorator_list, *n.bases, *n.keywords]
    if isinstance(n, ast.Lambda):
        return [*n.args.defaults, *filter(None, n.args.kw_defaults)]
    return []


def global_reads(source: str, name: str) -> frozenset[str] | None:
    """The names that the top-level function ``name`` of ``source``, and the code nested in it, read
    from the module's namespace (the compiler's own scopes: ``symtable``); None when it declares a
    ``global`` (it would write the namespace of every later task) or the text does not compile."""
    try:
        table = symtable.symtable(source, "<skill>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    tables = [t for t in table.get_children() if t.get_type() == "function" and t.get_name() == name][-1:]
    out: set[str] = set()
    while tables:
        t = tables.pop()
        for sym in t.get_symbols():
            if sym.is_declared_global():
                return None
            if sym.is_global() and sym.is_referenced():
                out.add(sym.get_name())
        tables.extend(t.get_children())
    return frozenset(out)
