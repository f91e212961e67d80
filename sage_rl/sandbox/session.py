"""One live episode's worker, seen from the parent: execute cells, serve ``apis`` calls, enforce limits.

Everything read from the worker is untrusted: frame sizes are checked before buffering, messages
are JSON checked for shape, and any breach ends the worker (a fresh one takes its place). The
parent-side limits (wall-clock deadline, API calls per cell, message size) hold even when agent
code has rewritten the whole worker; so does a bound on the call records the skill credit is paid
from: they may claim no working API call, answer or world change the parent did not serve in that
cell (``_Served``; a breach ends the worker, and the cell reports no records).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sage_rl.sandbox import pauses
from sage_rl.sandbox.changes import WorldChanges
from sage_rl.sandbox.channel import WorkerChannel, WorkerHandle
from sage_rl.sandbox.flow import COMPLETE
from sage_rl.sandbox.isolation import IsolationReport
from sage_rl.sandbox.protocol import ProtocolError, encode
from sage_rl.sandbox.rules import refusal
from sage_rl.sandbox.tracking import does_work
from sage_rl.types import CallRecord, ExecResult

if TYPE_CHECKING:
    from sage_rl.sandbox.pool import Dispatch, Fingerprint, Sandbox

#: Longest app or API name passed to ``dispatch``; longer ones are refused unseen (and not echoed).
MAX_NAME_CHARS = 64

RESTARTED = (
    "The interpreter was restarted: variables, functions and imports from earlier cells are gone; "
    "define them again."
)


@dataclass(frozen=True)
class _Failure:
    """Why a cell did not finish normally in the worker; the worker is replaced after any of these."""

    observation: str
    timed_out: bool


class Session:
    """One episode's interpreter. Not safe for concurrent ``execute`` calls (one cell at a time).

    ``restarts`` counts workers replaced mid-episode (timeouts, crashes); each one lost the
    namespace, and the observation of the cell that caused it says so.
    """

    def __init__(self, sandbox: Sandbox, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> None:
        self.sandbox, self.dispatch, self.fingerprint = sandbox, dispatch, fingerprint
        self.changes = WorldChanges(fingerprint)  # this episode's, numbered for the worker's flow tracker
        self.limits = sandbox.limits
        self.scratch: Path | None = None
        self.isolation: IsolationReport | None = None
        self.restarts = 0
        self._worker: WorkerHandle | None = None
        self._busy = False
        self._calls = 0  # API calls in the current cell
        self._api_ok = 0  # of which succeeded (counted here, where the world is: ExecResult.api_ok)
        self._worked = self._answered = False  # a successful call that works / complete_task, this cell
        self._deadline: asyncio.Timeout | None = None  # the running cell's kill deadline
        self._latest = 0.0  # the latest it may be moved to (loop time)

    async def reset(self) -> None:
        """A fresh worker, namespace and scratch folder (the next episode)."""
        self.changes = WorldChanges(self.fingerprint)
        self._end_worker()
        self._remove_scratch()
        spare = self.sandbox.take_spare()
        if spare is not None:
            pid, sock, self.scratch = spare
            try:
                await self._connect(pid, sock)
                return
            except (EOFError, ProtocolError, TimeoutError, OSError):
                pass  # the spare died (e.g. its template was restarted): fork a fresh one
        else:
            self.scratch = self.sandbox.new_scratch()
        await self._spawn()

    async def close(self) -> None:
        self._end_worker()
        self._remove_scratch()

    async def execute(self, code: str, origin: str) -> ExecResult:
        """Run one cell. Never raises for anything the code does; a worker that has to be killed
        (timeout, crash, protocol breach) is replaced and the observation says so."""
        if not isinstance(code, str) or not isinstance(origin, str):
            raise TypeError("Session.execute takes code: str and origin: str")
        if self._busy:
            raise RuntimeError("Session.execute called while another cell of this session is running")
        if self.scratch is None:
            raise RuntimeError("Session is closed; call reset() first")
        refused = refusal(code)  # the rules agent code lives under, checked here, not in the worker
        if refused is not None:
            return ExecResult(refused, ok=False, calls=(), defined=(), api_ok=0)
        self._busy = True
        start = time.perf_counter()
        try:
            if self._worker is None:
                await self._spawn()
            outcome = await self._run(code, origin)
        finally:
            self._busy = False
        if isinstance(outcome, _Failure):
            self._end_worker()
            self.restarts += 1
            return ExecResult(outcome.observation, ok=False, timed_out=outcome.timed_out, calls=(), defined=(),
                              duration_s=time.perf_counter() - start)  # fmt: skip
        return dataclasses.replace(outcome, duration_s=time.perf_counter() - start, api_ok=self._api_ok)

    # -- internals -------------------------------------------------------------------------------

    async def _spawn(self) -> None:
        """A new worker in the current scratch folder (the first, or one replacing a killed one)."""
        assert self.scratch is not None
        pid, sock = await asyncio.to_thread(self.sandbox.fork_worker, self.scratch)
        await self._connect(pid, sock)

    async def _connect(self, pid: int, sock: socket.socket) -> None:
        channel = WorkerChannel(self._answer, self.limits.message_bytes)
        worker = await WorkerHandle.connect(pid, sock, channel)
        try:
            hello = await pauses.wait_running(channel.pending(), 30)
        except BaseException:
            worker.kill()
            raise
        self.isolation = IsolationReport.from_dict(hello.get("isolation") or {})
        self._worker = worker

    async def _run(self, code: str, origin: str) -> ExecResult | _Failure:
        lim, worker = self.limits, self._worker
        assert worker is not None
        msg = {
            "op": "exec",
            "code": code,
            "origin": origin,
            "timeout": lim.wall_timeout_s,
            "cpu": lim.cpu_seconds,
        }
        self._calls = self._api_ok = 0
        self._worked = self._answered = False
        changes_before = self.changes.count

        def round_started(deadline: asyncio.Timeout) -> None:
            # The worker's clock stops while it waits for an answer (up to as much again as the
            # limit), so the deadline moves with each answer, never past twice the limit plus the
            # grace; a round starts again, whole, after this process was stopped (pauses.py).
            self._deadline = deadline
            self._latest = asyncio.get_running_loop().time() + 2 * lim.wall_timeout_s + lim.kill_grace_s

        try:
            worker.signal(signal.SIGCONT)
            worker.channel.start_cell(encode(msg))
            # An answer read in the same pass as the expired deadline (an event loop blocked by a
            # long synchronous model step) still counts: the cell finished, its worker lives on.
            done = await pauses.wait_running(
                worker.channel.pending(), lim.wall_timeout_s + lim.kill_grace_s, round_started
            )
            # Frozen between cells: threads the code left running take no CPU while the policy thinks.
            worker.signal(signal.SIGSTOP)
            served = _Served(
                self._worked, self._answered, range(changes_before + 1, self.changes.count + 1),
                unnumbered=self.fingerprint is None,
            )  # fmt: skip
            return _result(done, lim.output_chars, served)
        except TimeoutError:
            return _Failure(
                f"Timed out after {lim.wall_timeout_s:g} s, and the code did not stop when interrupted "
                f"(for example it was stuck in a C call), so its process was killed and replaced. {RESTARTED}",
                timed_out=True,
            )
        except (EOFError, ConnectionError, OSError):
            return _Failure(
                "The code ended its interpreter process (for example os._exit(), a crash in C code such as a "
                "stack overflow from very deep recursion, the memory it may hold, shared memory and "
                f"files in memory included, or the CPU-time budget of the episode). {RESTARTED}",
                timed_out=False,
            )
        except ProtocolError as e:
            return _Failure(f"The code broke the sandbox's channel ({e}). {RESTARTED}", timed_out=False)
        except BaseException:
            self._end_worker()  # cancelled mid-cell: its state is unknown
            raise
        finally:
            self._deadline = None

    def _answer(self, msg: dict[str, Any]) -> bytes:
        """The reply frame to one API call. Runs in the event loop, inside the channel's callback;
        the worker may run a whole limit's time more after it, so the kill deadline moves."""
        frame = self._reply(msg)
        deadline = self._deadline
        if deadline is not None and not deadline.expired():
            lim, now = self.limits, asyncio.get_running_loop().time()
            later = max(deadline.when() or now, now + lim.wall_timeout_s + lim.kill_grace_s)
            deadline.reschedule(min(self._latest, later))
        return frame

    def _reply(self, msg: dict[str, Any]) -> bytes:
        app, api, kwargs = msg.get("app"), msg.get("api"), msg.get("kwargs")
        if not (_public_name(app) and _public_name(api) and isinstance(kwargs, dict)):
            return _error(
                f"malformed API call: apis.<app>.<api>(**kwargs), where app and API names are public "
                f"identifiers of at most {MAX_NAME_CHARS} characters"
            )
        self._calls += 1
        limit = self.limits.api_calls_per_cell
        if self._calls > 2 * limit + 100:  # ignoring the refusals: a flood that would hog the event loop
            raise ProtocolError(f"more than {2 * limit + 100} API calls in one cell")
        if self._calls > limit:
            return _error(f"API call limit reached: at most {limit} calls per cell")
        self.changes.before()
        try:
            value = self.dispatch(app, api, kwargs)
        except Exception as e:  # any API failure is the agent's to read; BaseException propagates
            return _error(_message(e))
        changed = self.changes.after()
        try:
            frame = encode({"op": "ret", "ok": True, "value": value, "changed": changed, **_continued()})
        except (TypeError, ValueError) as e:
            return _error(f"apis.{app}.{api} returned a non-JSON value ({e})")
        if len(frame) > self.limits.message_bytes:
            return _error(f"apis.{app}.{api}: result too large to return")
        self._api_ok += 1
        self._worked |= does_work(app, api)
        self._answered |= (app, api) == COMPLETE
        return frame

    def _end_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def _remove_scratch(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def _message(e: Exception) -> str:
    try:
        return str(e) or type(e).__name__
    except Exception:  # an exception whose __str__ fails still has a name
        return type(e).__name__


def _error(message: str) -> bytes:
    return encode({"op": "ret", "ok": False, "error": message, **_continued()})


def _continued() -> dict[str, float]:
    """When this process was last continued after a stop, for the worker's clock (pauses.py)."""
    last = pauses.last_continued()
    return {"continued_at": last} if last else {}


def _public_name(x: Any) -> bool:
    """App and API names are untrusted: short identifiers only, nothing private (``_x``,
    ``__class__``). Checked before ``dispatch`` sees them, in constant time for any length."""
    return isinstance(x, str) and len(x) <= MAX_NAME_CHARS and x.isidentifier() and not x.startswith("_")


@dataclass(frozen=True)
class _Served:
    """What the parent served in one cell, which bounds the call records the worker may report:
    records are counted in the worker, where agent code that got past the language rules
    (sandbox/rules.py) could write them. ``changes``: the episode's change numbers made in the cell;
    ``unnumbered``: the environment cannot number changes (every working call is event 0)."""

    worked: bool  # a successful API call that does work (tracking.does_work)
    answered: bool  # a successful supervisor.complete_task
    changes: range
    unnumbered: bool = False

    def allows(self, record: CallRecord, events: list[int]) -> bool:
        if record.errors + record.with_api > record.calls or (record.with_api and not self.worked):
            return False
        zero = self.answered or (self.unnumbered and self.worked)
        return all(e in self.changes if e else zero for e in events)


def _result(msg: dict[str, Any], output_chars: int, served: _Served) -> ExecResult:
    """Check the shape of a worker's 'done' message and build the ExecResult. Raises ProtocolError,
    also for call records that claim more than ``served`` (work, an answer, changes) the parent
    served in the cell."""
    obs, ok, timed_out = msg.get("observation"), msg.get("ok"), msg.get("timed_out")
    calls, defined = msg.get("calls"), msg.get("defined")
    if not (isinstance(obs, str) and isinstance(ok, bool) and isinstance(timed_out, bool)):
        raise ProtocolError("malformed 'done' message")
    if not (
        isinstance(calls, list) and isinstance(defined, list) and all(isinstance(d, str) for d in defined)
    ):
        raise ProtocolError("malformed 'done' message")
    records = tuple(_record(c) for c in calls)
    if not all(served.allows(r, c[5]) for r, c in zip(records, calls, strict=True)):
        raise ProtocolError("call records claim API work, an answer or changes this cell did not make")
    cap = output_chars + 20_000  # printed output plus room for a traceback
    if len(obs) > cap:
        obs = obs[:cap] + "\n[observation truncated]\n"
    obs = obs.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot reach a tokenizer
    return ExecResult(obs, ok=ok, timed_out=timed_out, calls=records, defined=tuple(defined))


def _record(row: Any) -> CallRecord:
    ok = isinstance(row, list) and len(row) == 6 and isinstance(row[5], list)
    if not (ok and isinstance(row[0], str) and isinstance(row[1], str) and all(_count(n) for n in row[2:5])):
        raise ProtocolError("malformed call record")
    events = row[5]
    if len(events) > MAX_EVENTS or not all(_count(e) for e in events):
        raise ProtocolError("malformed call record")
    return CallRecord.of_row(row)


#: Events one record may list: no more than the world changes an episode can make, and the answer.
MAX_EVENTS = 100_000


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
