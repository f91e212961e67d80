"""Running agent code cells: the async seam between the Environment and whatever executes code.

An ``Executors`` opens one ``Executor`` per episode over a ``dispatch(app, api, kwargs)`` callable
(the world's ``call``). Two implementations, one seam, awaited directly by ``PocketWorldEnv``:

- the sandbox (``sandboxed.SandboxExecutors``, the default): a worker process per episode, whose
  ``apis`` calls come back over a socket and run ``dispatch`` on the event loop;
- ``IN_PROCESS`` (debugging only, ``pocketworld.sandbox=false``): ``InProcessExecutor`` runs cells
  with ``exec`` in a persistent namespace that holds only ``apis`` and the builtins. It is NOT a
  security boundary - agent code shares the process. The world is reachable only through the
  dispatch closure, never through the namespace directly. Call records come from
  ``calltrace.CallTracer``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import sys
import time
import traceback
import types
from collections.abc import Mapping
from typing import Protocol

from sage_rl.envs.pocketworld.api import ApiError
from sage_rl.envs.pocketworld.calltrace import AGENT_ORIGINS, CallTracer
from sage_rl.envs.pocketworld.proxy import Apis, Dispatch
from sage_rl.sandbox.changes import WorldChanges
from sage_rl.sandbox.flow import FlowTracker
from sage_rl.sandbox.pool import Fingerprint
from sage_rl.sandbox.rules import refusal
from sage_rl.sandbox.stores import StoreGuard, replace_constants, share_library_cell
from sage_rl.text import source_lines
from sage_rl.types import SKILL_ORIGIN_PREFIX, ExecResult

#: Observations longer than this are cut (the model's context is the scarce resource).
MAX_OBSERVATION_CHARS = 20_000


class Executor(Protocol):
    """One episode's interpreter."""

    async def execute(self, code: str, origin: str) -> ExecResult:
        """Run one cell compiled with filename ``origin``. ``completed`` is left False: the
        Environment knows whether the task was completed."""
        ...

    async def close(self) -> None: ...


class Executors(Protocol):
    """Where an environment's cells run: opens one ``Executor`` per episode."""

    #: True when the executors fill ``ExecResult.calls`` with call records.
    reports_calls: bool

    async def open(self, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> Executor: ...


class InProcess:
    """``Executors`` running cells in this process (debugging only: no isolation)."""

    reports_calls = True

    async def open(self, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> InProcessExecutor:
        return InProcessExecutor(dispatch, fingerprint)


IN_PROCESS = InProcess()


class InProcessExecutor:
    """Executes cells in this process, in one namespace that persists across cells, with call records."""

    def __init__(self, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> None:
        self._tracer: CallTracer | None = None
        self._flow = FlowTracker()  # across cells, as in the sandbox's worker
        self.changes = WorldChanges(fingerprint)  # numbered as the sandbox's Session numbers them
        self._api_ok = 0
        # attribute stores as the sandbox checks them (sandbox/stores.py)
        self._stores = StoreGuard(lambda code: code.co_filename.startswith(AGENT_ORIGINS))
        checked = self._stores.check
        own_builtins = dict(vars(builtins), __build_class__=self._stores.build_class)
        own_builtins["setattr"] = lambda obj, name, value: setattr(checked(obj), name, value)
        own_builtins["delattr"] = lambda obj, name: delattr(checked(obj), name)
        own_builtins["id"] = lambda obj: id(self._stores.canonical(obj))
        self._ns: dict[str, object] = {
            "__builtins__": own_builtins,
            "__name__": "__agent__",
            "apis": Apis(_untraced(self._counted(dispatch))),
        }
        self._library = dict(self._ns)  # library cells run apart (sandbox/stores.share_library_cell)
        self._sources: dict[str, list[str]] = {}

    def _counted(self, dispatch: Dispatch) -> Dispatch:
        """``dispatch`` that counts each successful call and reports it, with whether it changed
        the world, to the cell's tracer (as the sandbox's parent and worker do)."""
        changes = self.changes

        def call(app: str, api: str, kwargs: dict) -> object:
            changes.before()
            value = dispatch(app, api, kwargs)
            self._api_ok += 1
            changed = changes.after()
            if self._tracer is not None:
                self._tracer.api_done(app, api, kwargs, value, changed)
            return value

        return call

    def _compile(self, code: str, origin: str) -> types.CodeType:
        tree = self._stores.transform(ast.parse(code, filename=origin, mode="exec"))
        return replace_constants(compile(tree, origin, "exec"), self._stores.markers, {})

    async def execute(self, code: str, origin: str) -> ExecResult:
        refused = refusal(code)  # the sandbox's rules, so that both executors show the same observations
        if refused is not None:
            return ExecResult(refused, ok=False, calls=(), defined=(), api_ok=0)
        self._sources[origin] = source_lines(code)
        ns = self._library if origin.startswith(SKILL_ORIGIN_PREFIX) else self._ns
        before = dict(ns)  # holds references, so a redefined function's id cannot be reused
        out = io.StringIO()
        start = time.perf_counter()
        ok = True
        self._api_ok = 0
        self._flow.start_cell()
        with contextlib.redirect_stdout(out), CallTracer(self._flow) as tracer:
            self._tracer = tracer
            try:
                exec(self._compile(code, origin), ns)  # noqa: S102 - executing agent code is the point
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - any failure of agent code (SystemExit too) is an observation
                ok = False
                print(format_error(e, self._sources), end="")
        if ns is self._library:
            share_library_cell(code, origin, before, ns, self._ns)
        defined = tuple(
            k
            for k, v in ns.items()
            if isinstance(v, types.FunctionType)
            and v.__code__.co_filename == origin
            and before.get(k) is not v
        )
        return ExecResult(
            observation=_truncate(out.getvalue()),
            ok=ok,
            calls=tracer.records(),
            defined=defined,
            duration_s=time.perf_counter() - start,
            api_ok=self._api_ok,
        )

    async def close(self) -> None:
        self._ns.clear()
        self._library.clear()


def format_error(e: BaseException, sources: Mapping[str, list[str]]) -> str:
    """A traceback trimmed to the agent's own frames (cells and skills) plus the error line.

    ``sources`` maps an origin (``<cell-N>``, ``<skill:NAME>``) to its source lines, for context.
    """
    lines = []
    for fr in traceback.extract_tb(e.__traceback__):
        if fr.filename.startswith(AGENT_ORIGINS):
            lines.append(f'  File "{fr.filename}", line {fr.lineno}, in {fr.name}\n')
            src = sources.get(fr.filename, [])
            if fr.lineno and 0 < fr.lineno <= len(src):
                lines.append(f"    {src[fr.lineno - 1].strip()}\n")
    head = "Traceback (most recent call last):\n" if lines else ""
    if isinstance(e, ApiError):
        tail = f"ApiError: {e.status}: {e.message}\n"
    else:
        tail = "".join(traceback.format_exception_only(type(e), e))
    return head + "".join(lines) + tail


def _untraced(dispatch: Dispatch) -> Dispatch:
    """``dispatch`` with call tracing switched off inside: the world's own functions are not agent
    code, and tracing every one of their calls made API-heavy cells about 4x slower."""

    def call(app: str, api: str, kwargs: dict) -> object:
        tracer = sys.gettrace()
        sys.settrace(None)
        try:
            return dispatch(app, api, kwargs)
        finally:
            sys.settrace(tracer)

    return call


def _truncate(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[:MAX_OBSERVATION_CHARS] + f"\n... [output truncated: {len(text)} characters in all]\n"
