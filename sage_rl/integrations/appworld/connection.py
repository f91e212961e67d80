"""One connection to an AppWorld child (``worker.py``): requests, answers, and what happens when
the child is killed or dies. The parent side; ``client.py`` starts the zygote the children come
from.

``WorkerProcess`` talks JSON lines over a Unix socket. Every request has a wall-clock limit. A
worker that misses it (stuck in C code) is killed; one that dies is noticed. Either way
``WorkerTimeout`` / ``WorkerCrashed`` is raised, saying whether the worker's snapshot took over
(``restored``): then the same ``WorkerProcess`` goes on serving, in the state before the lost
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sage_rl.integrations.appworld.client import Zygote

#: One JSON answer may carry a long observation; asyncio's default line limit (64 KiB) is too small.
_LINE_LIMIT = 64 * 1024 * 1024
#: How long a killed worker's snapshot may take to say it took over.
RESTORE_TIMEOUT_S = 180.0


class WorkerError(RuntimeError):
    """The child answered ``ok: false`` (AppWorld raised); ``reason`` is its one-line error."""

    def __init__(self, op: str, reason: str) -> None:
        super().__init__(f"AppWorld {op} failed: {reason}")
        self.op, self.reason = op, reason


class WorkerLost(RuntimeError):
    """The request's process was killed or died. ``restored``: its snapshot took over, so the
    worker serves on in the state before the request; otherwise the worker is gone."""

    def __init__(self, message: str, restored: bool) -> None:
        super().__init__(message)
        self.restored = restored


class WorkerCrashed(WorkerLost):
    """The process died, or broke the protocol and was killed."""


class WorkerTimeout(WorkerLost):
    """The process did not answer in time and was killed."""


class WorkerProcess:
    """One forked child. Use ``await WorkerProcess.start(zygote)``; always ``await close()``.

    Requests carry an id that answers echo. A snapshot that took over announces itself; since
    it may or may not have received the request the dead worker was given, the parent then
    sends a ``ping`` and reads up to its answer: an answer to the request on the way means the
    snapshot ran it, none means it was lost with the worker.
    """

    def __init__(self, zygote: Zygote, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.zygote = zygote
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._gone = False  # no process serves this connection any more
        self._cancelled: int | None = None  # id of a request cancelled mid-way (its worker killed)
        self.pid = 0
        self.group = 0  # the process group of the episode: the first worker's pid

    @classmethod
    async def start(cls, zygote: Zygote) -> WorkerProcess:
        if not zygote.alive:
            raise WorkerCrashed(f"AppWorld zygote is not running{zygote.log_tail()}", False)
        reader, writer = await asyncio.open_unix_connection(str(zygote.socket_path), limit=_LINE_LIMIT)
        worker = cls(zygote, reader, writer)
        try:
            hello = await asyncio.wait_for(worker._next_message(), zygote.spec.start_timeout_s)
        except (TimeoutError, OSError, ValueError) as e:
            writer.close()
            raise WorkerCrashed(f"AppWorld worker did not start: {e!r}{zygote.log_tail()}", False) from None
        if hello is None:
            writer.close()
            raise WorkerCrashed(f"AppWorld worker exited at start{zygote.log_tail()}", False)
        worker.pid = worker.group = int(hello["pid"])
        return worker

    @property
    def alive(self) -> bool:
        return not self._gone and self.pid > 0 and _pid_alive(self.pid)

    async def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and return its answer. Raises ``WorkerError`` when AppWorld raised,
        ``WorkerTimeout`` / ``WorkerCrashed`` when the process was killed or died (see
        ``WorkerLost.restored``)."""
        op = str(payload.get("op", "?"))
        async with self._lock:
            if self._cancelled is not None:
                await self._recover()
            if self._gone:
                raise WorkerCrashed(f"AppWorld worker {self.pid} is gone", False)
            rid = next(self._ids)
            try:
                self._send({**payload, "id": rid})
                await self._writer.drain()
                answer = await self._answer(op, rid, timeout_s)
            except asyncio.CancelledError:
                # The answer would arrive later and be taken for the next request's: the state is
                # unknown, so the worker goes now (synchronously: we are being cancelled); its
                # snapshot is awaited before the next request (``recover``).
                self._kill_now()
                self._cancelled = rid
                raise
            except (BrokenPipeError, ConnectionResetError):
                raise self._lost(f"AppWorld worker {self.pid} closed its connection during {op}") from None
        if not answer.get("ok"):
            raise WorkerError(op, str(answer.get("error")))
        return answer

    async def recover(self) -> dict[str, Any] | None:
        """After a cancelled request: wait for the snapshot to take over. Returns the cancelled
        request's answer if the snapshot ran it, else None (it was lost with the worker); raises
        ``WorkerCrashed`` when no snapshot took over. A no-op (None) when nothing was cancelled."""
        async with self._lock:
            return await self._recover() if self._cancelled is not None else None

    async def _recover(self) -> dict[str, Any] | None:
        rid, self._cancelled = self._cancelled, None
        if not await self._await_restore():
            raise WorkerCrashed(f"AppWorld worker {self.pid} was killed and no snapshot took over", False)
        return await self._sync(rid or 0)

    async def _answer(self, op: str, rid: int, timeout_s: float) -> dict[str, Any]:
        try:
            message = await asyncio.wait_for(self._reply(rid), timeout_s)
        except TimeoutError:
            pid = self.pid
            self._kill_now()
            restored = await self._await_restore()
            late = await self._sync(rid) if restored else None
            if late is not None:
                return late
            raise WorkerTimeout(
                f"AppWorld worker {pid}: {op} took more than {timeout_s:g} s; killed"
                + ("; its snapshot took over" if restored else ""),
                restored,
            ) from None
        except (OSError, ValueError) as e:  # ValueError: a line beyond the limit
            raise self._lost(f"AppWorld worker {self.pid}: {op}: {e!r}") from None
        if message is None:
            raise self._lost(f"AppWorld worker {self.pid} exited during {op}")
        if message.get("restored"):
            dead, self.pid = self.pid, self._member(message)
            late = await self._sync(rid)
            if late is not None:
                return late
            raise WorkerCrashed(f"AppWorld worker {dead} died during {op}; its snapshot took over", True)
        return message

    async def _reply(self, rid: int) -> dict[str, Any] | None:
        """The answer to request ``rid``, a snapshot's announcement, or None at end of input."""
        while (message := await self._next_message()) is not None:
            if message.get("restored") or message.get("id") == rid:
                return message
        return None

    async def _await_restore(self) -> bool:
        """After the worker was killed: wait for its snapshot to say it took over. True when it
        did (the worker serves on); False when none did (the worker is gone)."""
        await self._wait_gone(self.pid)
        try:
            while (message := await asyncio.wait_for(self._next_message(), RESTORE_TIMEOUT_S)) is not None:
                if message.get("restored"):  # anything before it is the killed worker's last words
                    self.pid = self._member(message)
                    return True
        except (TimeoutError, OSError, ValueError):
            pass
        self._gone = True
        self._kill_group()
        return False

    async def _sync(self, rid: int) -> dict[str, Any] | None:
        """After a takeover: the answer to request ``rid`` if the snapshot ran it, else None."""
        ping = next(self._ids)
        found = None
        try:
            self._send({"op": "ping", "id": ping})
            await self._writer.drain()
            while (message := await asyncio.wait_for(self._next_message(), RESTORE_TIMEOUT_S)) is not None:
                if message.get("id") == rid:
                    found = message
                elif message.get("id") == ping:
                    return found
        except (TimeoutError, OSError, ValueError):
            pass
        raise self._lost(f"AppWorld worker {self.pid} took over but does not answer")

    async def _next_message(self) -> dict[str, Any] | None:
        """The next JSON line; None at end of input. Blank and non-JSON lines (a killed worker's
        half-written answer) are skipped."""
        while line := await self._reader.readline():
            with contextlib.suppress(json.JSONDecodeError):
                message = json.loads(line)
                if isinstance(message, dict):
                    return message
        return None

    def _member(self, message: dict[str, Any]) -> int:
        """The pid a snapshot announced, if it is one of the episode's processes. Agent code runs
        in the worker and can write on its connection: a pid from outside the episode's process
        group would make this process kill a stranger."""
        try:
            pid = int(message["pid"])
            if pid > 0 and os.getpgid(pid) == self.group:
                return pid
        except (KeyError, TypeError, ValueError, ProcessLookupError):
            pass
        raise self._lost(
            f"AppWorld worker {self.pid} announced a process outside its episode: {message!r:.200}"
        )

    def _send(self, payload: dict[str, Any]) -> None:
        self._writer.write((json.dumps(payload) + "\n").encode())

    def _lost(self, message: str) -> WorkerCrashed:
        """The connection ended or broke: nothing serves it any more. Returns the error to raise."""
        self._gone = True
        self._kill_group()
        return WorkerCrashed(message + self.zygote.log_tail(), False)

    def _kill_now(self) -> None:
        """SIGKILL the worker only (its snapshot is to take over), if it is still in the episode's
        process group (a pid is reused once its process is gone)."""
        with contextlib.suppress(ProcessLookupError):
            if self.pid > 0 and os.getpgid(self.pid) == self.group:
                os.kill(self.pid, signal.SIGKILL)

    def _kill_group(self) -> None:
        """SIGKILL the episode's processes: the worker, its snapshot, what its agent code forked."""
        if self.group > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, signal.SIGKILL)
        self._kill_now()

    async def _wait_gone(self, pid: int, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while pid > 0 and _pid_alive(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def close(self, wait: bool = True) -> None:
        """Kill the episode's processes (the worker keeps nothing unsaved: AppWorld saves its
        state after every cell) and drop the connection. ``wait``: until the worker is gone (an
        evaluator that answered exits by itself; nobody needs to wait for it)."""
        self._gone = True
        self._kill_group()
        if wait:
            await self._wait_gone(self.pid)
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (the zygote reaps its children, so a dead one vanishes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
