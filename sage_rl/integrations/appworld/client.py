"""The parent side of AppWorld's worker processes (``worker.py`` under the AppWorld venv).

- ``Zygote``: one process per suite that has imported AppWorld; it forks a worker per connection.
  Started synchronously (``subprocess``), so it outlives any one asyncio loop; it exits when its
  stdin closes, so it never outlives sage-rl.
- ``WorkerProcess``: one forked worker, talked to in JSON lines over a Unix socket. Every request
  has a wall-clock limit; a worker that misses it (stuck in C code) or dies is killed and
  ``WorkerTimeout`` / ``WorkerCrashed`` is raised, so the caller can fork a fresh one.

The zygote's stderr (its workers' too) goes to a log file whose tail is quoted in errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage_rl.integrations.appworld.paths import AppWorldPaths

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
#: One JSON answer may carry a long observation; asyncio's default line limit (64 KiB) is too small.
_LINE_LIMIT = 64 * 1024 * 1024


class WorkerError(RuntimeError):
    """The worker answered ``ok: false`` (AppWorld raised); the process is still usable."""


class WorkerCrashed(RuntimeError):
    """The worker process died or broke the protocol; it has been killed."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer in time; it has been killed."""


@dataclass(frozen=True)
class WorkerSpec:
    """Where the workers run and how long to wait for them."""

    paths: AppWorldPaths
    start_timeout_s: float = 180.0
    experiment: str = "sage-rl"  # prefix of AppWorld's experiment name (one per worker)
    keep_outputs: bool = False  # keep AppWorld's experiment outputs folder after close


class Zygote:
    """The AppWorld process that forks workers. ``Zygote.start`` blocks for its start-up."""

    def __init__(self, spec: WorkerSpec, proc: subprocess.Popen, tmp: Path) -> None:
        self.spec = spec
        self._proc = proc
        self._tmp = tmp

    @classmethod
    def start(cls, spec: WorkerSpec) -> Zygote:
        tmp = Path(tempfile.mkdtemp(prefix="sage-rl-appworld-"))
        with (tmp / "appworld.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(spec.paths.python), str(WORKER_SCRIPT), str(tmp / "zygote.sock")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=spec.paths.env(),
                cwd=spec.paths.root,
                start_new_session=True,  # a Ctrl-C meant for sage-rl does not hit AppWorld mid-write
            )
        zygote = cls(spec, proc, tmp)
        ready, _, _ = select.select([proc.stdout], [], [], spec.start_timeout_s)
        line = proc.stdout.readline() if ready else b""  # type: ignore[union-attr]
        if not line:
            zygote.close()
            raise WorkerCrashed(
                f"AppWorld zygote did not start in {spec.start_timeout_s:g} s{zygote.log_tail()}"
            )
        return zygote

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def socket_path(self) -> Path:
        return self._tmp / "zygote.sock"

    def log_tail(self, n: int = 1500) -> str:
        try:
            text = (self._tmp / "appworld.log").read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""
        return f"; the AppWorld log ends with:\n{text}" if text else ""

    def close(self) -> None:
        """Stop the zygote (running workers are unaffected) and remove its folder."""
        if self._proc.stdin:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


class WorkerProcess:
    """One forked worker. Use ``await WorkerProcess.start(zygote)``; always ``await close()``."""

    def __init__(self, zygote: Zygote, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.zygote = zygote
        self.spec = zygote.spec
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        self._killed = False
        self.pid = 0

    @classmethod
    async def start(cls, zygote: Zygote) -> WorkerProcess:
        if not zygote.alive:
            raise WorkerCrashed(f"AppWorld zygote is not running{zygote.log_tail()}")
        reader, writer = await asyncio.open_unix_connection(str(zygote.socket_path), limit=_LINE_LIMIT)
        worker = cls(zygote, reader, writer)
        worker.pid = int((await worker._read_answer(zygote.spec.start_timeout_s, "start"))["pid"])
        return worker

    @property
    def alive(self) -> bool:
        return self.pid > 0 and not self._killed and _pid_alive(self.pid)

    @property
    def experiment(self) -> str:
        """AppWorld experiment name of this worker: unique, so concurrent workers running the same
        task never share an output folder."""
        return f"{self.spec.experiment}-{self.pid}"

    async def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and return its answer. Raises ``WorkerError`` when AppWorld raised,
        ``WorkerTimeout`` / ``WorkerCrashed`` when the process had to be killed."""
        async with self._lock:
            if self._killed:
                raise WorkerCrashed(f"AppWorld worker {self.pid} was killed (timeout or cancellation)")
            try:
                self._writer.write((json.dumps(payload) + "\n").encode())
                await self._writer.drain()
            except (BrokenPipeError, ConnectionResetError):
                await self.kill()
                raise WorkerCrashed(
                    f"AppWorld worker {self.pid} closed its connection{self.zygote.log_tail()}"
                ) from None
            try:
                answer = await self._read_answer(timeout_s, payload.get("op", "?"))
            except asyncio.CancelledError:
                # The answer would arrive later and be taken for the next request's: the
                # worker's state is unknown, so it goes (synchronously: we are being cancelled).
                self._kill_now()
                raise
        if not answer.get("ok"):
            raise WorkerError(f"AppWorld worker: {payload.get('op')} failed: {answer.get('error')}")
        return answer

    async def _read_answer(self, timeout_s: float, op: str) -> dict[str, Any]:
        try:
            line = await asyncio.wait_for(self._reader.readline(), timeout_s)
        except TimeoutError:
            await self.kill()
            raise WorkerTimeout(
                f"AppWorld worker {self.pid}: {op} took more than {timeout_s:g} s; killed"
            ) from None
        except (ConnectionResetError, asyncio.LimitOverrunError, ValueError) as e:
            await self.kill()
            raise WorkerCrashed(f"AppWorld worker {self.pid}: {op}: {e}") from None
        if not line:
            await self.kill()
            raise WorkerCrashed(f"AppWorld worker {self.pid} exited during {op}{self.zygote.log_tail()}")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            await self.kill()
            raise WorkerCrashed(f"AppWorld worker {self.pid} wrote a non-JSON line: {line[:200]!r}") from None

    def _kill_now(self) -> None:
        if self.pid > 0 and not self._killed:  # once only: a dead pid may be reused later
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self._killed = True
        self._writer.close()

    async def kill(self) -> None:
        """SIGKILL the worker, wait until it is gone, drop its connection and its outputs."""
        self._kill_now()
        if self.pid > 0:
            deadline = time.monotonic() + 5.0
            while _pid_alive(self.pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()
        if not self.spec.keep_outputs and self.pid > 0:
            shutil.rmtree(
                self.spec.paths.root / "experiments" / "outputs" / self.experiment, ignore_errors=True
            )

    async def close(self, timeout_s: float = 10.0) -> None:
        """Close the world, then make sure the process is gone."""
        if self.alive:
            with contextlib.suppress(WorkerError, WorkerTimeout, WorkerCrashed):
                await self.request({"op": "close"}, timeout_s)
        await self.kill()


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (the zygote reaps its workers, so a dead one vanishes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerFactory:
    """Forks workers from one zygote, started on first use (and again if it died)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._zygote: Zygote | None = None
        self._lock = threading.Lock()  # open() may run concurrently; start one zygote only

    def zygote(self) -> Zygote:
        with self._lock:
            if self._zygote is None or not self._zygote.alive:
                self._zygote = Zygote.start(self.spec)
            return self._zygote

    async def new_worker(self) -> WorkerProcess:
        return await WorkerProcess.start(await asyncio.to_thread(self.zygote))

    def close(self) -> None:
        """Stop the zygote. Workers already forked keep running until closed."""
        with self._lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
