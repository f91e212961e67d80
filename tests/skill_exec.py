"""A tiny in-process stand-in for the sandbox, for skill tests only: it executes cells in one
namespace with the sandbox's filenames (``<skill:NAME>`` for library preamble cells, ``<cell-N>``
for the task's cells) and produces real ``ExecResult.calls`` / ``ExecResult.defined``.

Call records come from ``sys.settrace`` (``sys.setprofile`` cannot tell a normal return of None
from an exception unwinding the frame):
- a call is the first entry of a frame whose code was compiled from an agent filename and whose
  name is not ``<module>``/``<lambda>``/``<listcomp>``...; generator and coroutine resumptions are
  not new calls;
- an error is a frame left by an exception: an ``exception`` event directly followed by ``return``.

``defined`` lists the cell's top-level defs whose name is bound to a new object after the cell
(so a cell failing part-way defines only the defs before the failure; a decorated def counts).
"""

from __future__ import annotations

import ast
import sys
import types
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sage_rl.skills.library import Library
from sage_rl.types import SKILL_ORIGIN_PREFIX, CallRecord, ExecResult, cell_origin


class _Tracer:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self._seen: dict[int, types.FrameType] = {}
        self._raising: set[int] = set()

    def global_trace(self, frame: types.FrameType, event: str, arg: Any):
        code = frame.f_code
        agent = code.co_filename.startswith(("<cell-", SKILL_ORIGIN_PREFIX))
        if not agent or code.co_name.startswith("<"):
            return None
        if id(frame) not in self._seen:
            self._seen[id(frame)] = frame  # keep it alive so the id is not reused within the cell
            self.calls[(code.co_name, code.co_filename)] += 1
        return self.local_trace

    def local_trace(self, frame: types.FrameType, event: str, arg: Any):
        key = id(frame)
        if event == "exception":
            self._raising.add(key)
        elif event == "return" and key in self._raising:
            self.errors[(frame.f_code.co_name, frame.f_code.co_filename)] += 1
            self._raising.discard(key)
        else:
            self._raising.discard(key)
        return self.local_trace

    def records(self) -> tuple[CallRecord, ...]:
        return tuple(
            CallRecord(name, origin, n, self.errors[(name, origin)])
            for (name, origin), n in sorted(self.calls.items())
        )


def new_namespace(apis: Any) -> dict[str, Any]:
    return {"__name__": "__agent__", "apis": apis}


def load_library(library: Library, ns: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Execute the library's preamble into ``ns``; returns (loaded, failed) names."""
    loaded, failed = [], []
    for cell in library.preamble():
        try:
            exec(compile(cell.code, cell.origin, "exec"), ns)
            loaded.append(cell.name)
        except Exception:
            failed.append(cell.name)
    return loaded, failed


def run_cell(code: str, origin: str, ns: dict[str, Any]) -> ExecResult:
    """Execute one cell like the sandbox would, with call records and definitions."""
    try:
        compiled = compile(code, origin, "exec")
    except SyntaxError as e:
        return ExecResult(f"SyntaxError: {e.msg}", ok=False, calls=(), defined=())
    def_names = [
        n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    before = {n: ns.get(n) for n in def_names}
    tracer = _Tracer()
    sys.settrace(tracer.global_trace)
    try:
        exec(compiled, ns)
        ok, obs = True, ""
    except Exception as e:
        ok, obs = False, f"{type(e).__name__}: {e}"
    finally:
        sys.settrace(None)
    defined = tuple(dict.fromkeys(n for n in def_names if n in ns and ns[n] is not before[n]))
    return ExecResult(obs, ok=ok, calls=tracer.records(), defined=defined)


def run_cells(cells: Sequence[str], library: Library, apis: Any) -> list[ExecResult]:
    """A fresh interpreter: the library's preamble, then ``cells`` as ``<cell-0>``, ``<cell-1>``..."""
    ns = new_namespace(apis)
    load_library(library, ns)
    return [run_cell(code, cell_origin(i), ns) for i, code in enumerate(cells)]
