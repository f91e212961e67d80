"""The parent side of AppWorld's processes (``worker.py`` under the AppWorld venv).

- ``Zygote``: one process per suite that has imported AppWorld; it forks a child per connection.
  Started synchronously (``subprocess``), with an environment of its own (nothing of the
  parent's: API keys stay here), so it outlives any one asyncio loop; it exits when its stdin
  closes, so it never outlives sage-rl.
- ``WorkerProcess`` (``connection.py``): one forked child (an episode worker or an evaluator).
- ``WorkerFactory``: the zygote, started on first use, and the suite's temporary folder (the
  zygote's socket and log, the episodes' scratch folders); ``close`` removes them all.

The zygote's stderr (its children's too) goes to a log file whose tail is quoted in errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage_rl.integrations.appworld.connection import WorkerCrashed, WorkerProcess
from sage_rl.integrations.appworld.paths import AppWorldPaths

WORKER_SCRIPT = Path(__file__).with_name("worker.py")


@dataclass(frozen=True)
class WorkerSpec:
    """Where the children run and how long to wait for them to start."""

    paths: AppWorldPaths
    start_timeout_s: float = 180.0


def zygote_env(paths: AppWorldPaths, tmp: Path) -> dict[str, str]:
    """The zygote's whole environment: AppWorld's locations and nothing of sage-rl's (where API
    keys live). Its children's agent code sees an even smaller one (``worker.py``)."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp / "home"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "APPWORLD_ROOT": str(paths.root),
        "APPWORLD_CACHE": str(paths.cache),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


class Zygote:
    """The AppWorld process that forks children. ``Zygote.start`` blocks for its start-up."""

    def __init__(self, spec: WorkerSpec, proc: subprocess.Popen, tmp: Path) -> None:
        self.spec = spec
        self._proc = proc
        self.tmp = tmp
        self.network = "none"

    @classmethod
    def start(cls, spec: WorkerSpec, tmp: Path) -> Zygote:
        with (tmp / "appworld.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(spec.paths.python), str(WORKER_SCRIPT), str(tmp / "zygote.sock")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=zygote_env(spec.paths, tmp),
                cwd=spec.paths.root,
                start_new_session=True,  # a Ctrl-C meant for sage-rl does not hit AppWorld mid-write
            )
        zygote = cls(spec, proc, tmp)
        ready, _, _ = select.select([proc.stdout], [], [], spec.start_timeout_s)
        line = proc.stdout.readline() if ready else b""  # type: ignore[union-attr]
        if not line:
            zygote.close()
            raise WorkerCrashed(
                f"AppWorld zygote did not start in {spec.start_timeout_s:g} s{zygote.log_tail()}", False
            )
        zygote.network = json.loads(line).get("network", "none")
        return zygote

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def socket_path(self) -> Path:
        return self.tmp / "zygote.sock"

    def log_tail(self, n: int = 1500) -> str:
        try:
            text = (self.tmp / "appworld.log").read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""
        return f"; the AppWorld log ends with:\n{text}" if text else ""

    def close(self) -> None:
        """Stop the zygote; it kills its children (workers, snapshots) as it exits."""
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


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and PSS of a process, in MB, read from here (its own /proc is closed to it). PSS splits
    pages shared copy-on-write with the zygote fairly; RSS counts them in full."""

    def kb(name: str, key: str) -> float:
        try:
            with open(f"/proc/{pid}/{name}") as f:
                return next((float(line.split()[1]) for line in f if line.startswith(key)), 0.0)
        except OSError:
            return 0.0

    return {"rss_mb": kb("status", "VmRSS:") / 1024, "pss_mb": kb("smaps_rollup", "Pss:") / 1024, "pid": pid}


class WorkerFactory:
    """Forks children from one zygote, started on first use (and again if it died), and owns the
    suite's temporary folder."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._zygote: Zygote | None = None
        self._tmp: Path | None = None
        self._lock = threading.Lock()  # open() may run concurrently; start one zygote only

    @property
    def tmp(self) -> Path:
        with self._lock:
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="sage-rl-appworld-"))
                self._tmp.chmod(0o711)  # workers that dropped to nobody reach their scratch inside
                (self._tmp / "episodes").mkdir(mode=0o711)
            return self._tmp

    def zygote(self) -> Zygote:
        tmp = self.tmp
        with self._lock:
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = Zygote.start(self.spec, tmp)
            return self._zygote

    async def new_worker(self) -> WorkerProcess:
        return await WorkerProcess.start(await asyncio.to_thread(self.zygote))

    def new_scratch(self) -> Path:
        """A private folder for one episode worker (it hands it to its user itself)."""
        return Path(tempfile.mkdtemp(prefix="ep-", dir=self.tmp / "episodes"))

    async def run_once(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """A fresh child that answers one request (an evaluation) and is then closed."""
        worker = await self.new_worker()
        try:
            return await worker.request(payload, timeout_s)
        finally:
            await worker.close()

    def close(self) -> None:
        """Stop the zygote (and so every child) and remove the suite's temporary folder."""
        with self._lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
