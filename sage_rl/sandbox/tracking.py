"""Call records for functions defined by agent code (runs inside the worker).

Each ``def`` and ``lambda`` in a cell gets one extra, innermost decorator: the tracker's ``wrap``.
The wrapper counts calls and calls that raised, per (qualified name, origin) and per cell. This
costs one extra Python frame per call of an agent function and nothing for other calls; a
``sys.setprofile`` hook would cost a callback on every call and cannot tell a raising call from one
that returned None.

Semantics, stated once:
- a generator or async function counts when its body starts running, and raised when its body
  raises (not when it is merely created);
- the records are computed inside the worker, which agent code controls: they are evidence of
  usage for the skill library, not a security boundary (docs/sandbox.md).
"""

from __future__ import annotations

import ast
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any

from sage_rl.types import SKILL_ORIGIN_PREFIX

#: Filename prefixes of code compiled from agent cells and library skills (see sage_rl/types.py).
AGENT_PREFIXES = ("<cell-", SKILL_ORIGIN_PREFIX)

#: Name under which the tracker's ``wrap`` is bound in the agent namespace.
TRACK_NAME = "__sage_track__"


class _Instrument(ast.NodeTransformer):
    """Add ``TRACK_NAME`` as the innermost decorator of every def and wrap every lambda."""

    def _decorate(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        node.decorator_list.append(ast.Name(TRACK_NAME, ast.Load()))
        return node

    visit_FunctionDef = _decorate
    visit_AsyncFunctionDef = _decorate

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.generic_visit(node)
        return ast.Call(ast.Name(TRACK_NAME, ast.Load()), [node], [])


def compile_cell(code: str, origin: str) -> Any:
    """Compile agent code as ``origin`` with call tracking. Raises SyntaxError/ValueError as compile does."""
    tree = ast.parse(code, filename=origin, mode="exec")
    tree = ast.fix_missing_locations(_Instrument().visit(tree))
    return compile(tree, origin, "exec", dont_inherit=True)


class CallTracker:
    """Counts calls of wrapped agent functions. ``counts`` maps (qualname, origin) -> [calls, errors]."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}

    def start_cell(self) -> None:
        self.counts = {}

    def records(self) -> list[list[Any]]:
        """``[name, origin, calls, errors]`` rows, sorted, for the functions called this cell."""
        return sorted([name, origin, n[0], n[1]] for (name, origin), n in self.counts.items())

    def wrap(self, fn: Any) -> Any:
        """Return ``fn`` wrapped so that its calls are counted; non-agent objects pass through."""
        code = getattr(fn, "__code__", None)
        if code is None or not code.co_filename.startswith(AGENT_PREFIXES):
            return fn
        key = (code.co_qualname, code.co_filename)
        if inspect.iscoroutinefunction(fn):
            wrapper = _wrap_async(self, key, fn)
        elif inspect.isgeneratorfunction(fn):
            wrapper = _wrap_generator(self, key, fn)
        else:
            wrapper = _wrap_plain(self, key, fn)
        return functools.update_wrapper(wrapper, fn)


def _counter(tracker: CallTracker, key: tuple[str, str]) -> list[int]:
    counts = tracker.counts
    n = counts.get(key)
    if n is None:
        n = counts[key] = [0, 0]
    n[0] += 1
    return n


def _wrap_plain(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def tracked(*args: Any, **kwargs: Any) -> Any:
        # _counter inlined: this wrapper is on the path of every call of an agent function
        counts = tracker.counts
        n = counts.get(key)
        if n is None:
            n = counts[key] = [0, 0]
        n[0] += 1
        try:
            return fn(*args, **kwargs)
        except BaseException:
            n[1] += 1
            raise

    return tracked


def _wrap_generator(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def tracked(*args: Any, **kwargs: Any) -> Any:
        n = _counter(tracker, key)
        try:
            return (yield from fn(*args, **kwargs))
        except BaseException:
            n[1] += 1
            raise

    return tracked


def _wrap_async(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    async def tracked(*args: Any, **kwargs: Any) -> Any:
        n = _counter(tracker, key)
        try:
            return await fn(*args, **kwargs)
        except BaseException:
            n[1] += 1
            raise

    return tracked


def defined_functions(namespace: dict[str, Any], origin: str) -> list[str]:
    """Names bound in ``namespace`` to functions compiled from ``origin`` under their own name."""
    out = []
    for name, value in list(namespace.items()):
        # Only real functions: getattr on arbitrary agent objects could run their __getattr__.
        if not isinstance(value, types.FunctionType):
            continue
        fn = value.__dict__.get("__wrapped__", value)
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == origin and getattr(fn, "__name__", None) == name:
            out.append(name)
    return sorted(out)
