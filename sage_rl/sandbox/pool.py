"""The parent side: ``Sandbox`` owns the template process and hands out ``Session``s.

sandbox = Sandbox(SandboxLimits())
print(sandbox.start().line())            # the effective isolation, once at start-up
session = await sandbox.acquire(dispatch) # dispatch(app, api, kwargs) -> JSON value, in the parent
result = await session.execute("print(apis.bank.balance())", "<cell-1>")
await session.reset()                     # next episode: fresh worker, namespace and scratch
await session.close(); sandbox.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sage_rl.sandbox import memory
from sage_rl.sandbox.isolation import IsolationReport
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.sandbox.scratch import SCRATCH_PREFIX, remove_stale_scratch, scratch_tag

if TYPE_CHECKING:
    from sage_rl.sandbox.session import Session

log = logging.getLogger(__name__)

Dispatch = Callable[[str, str, dict[str, Any]], Any]
Fingerprint = Callable[[], Any]

_START_TIMEOUT_S = 60.0
_CONTROL_TIMEOUT_S = 20.0
#: Address space a worker needs beyond the template's for its own heap (applying its layers and a
#: small cell take under 1 MiB; this leaves room for ordinary code).
_WORKER_START_BYTES = 16 << 20


class SandboxError(RuntimeError):
    """The sandbox itself failed (its template process could not start or fork)."""


class Sandbox:
    """A warm template process from which workers are forked, one per live episode.

    Thread-safe for ``acquire``; ``start`` runs once, lazily, on first use. ``spares`` workers are
    forked ahead of need by a background thread, each with its own scratch folder, so that an
    episode's ``reset`` takes one at once instead of waiting for fork and the isolation layers.
    ``close`` ends the template and the spares; workers die with the template (PR_SET_PDEATHSIG).
    """

    def __init__(self, limits: SandboxLimits | None = None, spares: int = 2) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation: IsolationReport | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._stderr: Any = None
        self._lock = threading.Lock()
        self._spare_target = spares
        self._spares: list[tuple[int, socket.socket, Path]] = []
        self._refilling = False  # the spares thread is forking (or about to)
        self._refill_failed = False  # a fork failed: wait for the next take_spare before retrying
        self._wake = threading.Condition(self._lock)
        self._refiller: threading.Thread | None = None
        self._closed = False
        self._cgroup = ""  # the template's folder of worker memory cgroups, removed when it ends
        self._vm_bytes = 0  # the template's address space, which each worker starts with

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> IsolationReport:
        """Start the template (once) and probe one worker; return and log the effective isolation."""
        if not sys.platform.startswith("linux"):
            raise SandboxError(
                f"the sandbox needs Linux (this is {sys.platform}); run agent code in-process instead"
            )
        check_drop_user(self.limits.drop_user)
        with self._lock:
            if self._proc is None:
                remove_stale_scratch(self.limits.scratch_root)
                self._start_template()
            if self.isolation is None:
                self.isolation = self._probe()
                log.info(self.isolation.line())
            report = self.isolation
        self._start_refill()
        return report

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            self._discard_spares()
            self._stop_template()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def acquire(self, dispatch: Dispatch, fingerprint: Fingerprint | None = None) -> Session:
        """A session with a fresh worker. ``dispatch`` runs in the parent for each ``apis`` call;
        ``fingerprint()``, where given, tells the world's states apart (equal values: the same
        state), so that each call's reply says whether it changed the world, and which change of
        the episode it was: 1, 2, ... in order (``changes.WorldChanges``)."""
        from sage_rl.sandbox.session import Session  # noqa: PLC0415 - session imports this module

        if self.isolation is None:
            await asyncio.to_thread(self.start)
        session = Session(self, dispatch, fingerprint)
        await session.reset()
        return session

    # -- used by Session -------------------------------------------------------------------------

    def new_scratch(self) -> Path:
        """A private folder for one episode, owned by the worker's user."""
        path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{scratch_tag()}-", dir=self.limits.scratch_root)
        if os.getuid() == 0 and self.limits.drop_user:
            with contextlib.suppress(KeyError, OSError):
                pw = pwd.getpwnam(self.limits.drop_user)
                os.chown(path, pw.pw_uid, pw.pw_gid)
        return Path(path)

    def take_spare(self) -> tuple[int, socket.socket, Path] | None:
        """A worker forked ahead, with its scratch folder, or None when none is waiting."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                # The template died (e.g. the OOM killer): its spares are dying with it.
                log.warning("sandbox template exited with %s; restarting it", self._proc.returncode)
                self._discard_spares()
                self._stop_template()
            spare = self._spares.pop(0) if self._spares else None  # the oldest: surely done starting
        self._start_refill()
        return spare

    def fork_worker(self, scratch: Path) -> tuple[int, socket.socket]:
        """Fork a worker for ``scratch``: (pid, the parent's end of its socket). Restarts a dead
        template once before giving up."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            for attempt in (1, 2):
                if self._proc is None:
                    self._start_template()
                try:
                    return self._request_fork(scratch)
                except (OSError, SandboxError) as e:
                    if attempt == 2:
                        raise SandboxError(f"could not fork a sandbox worker: {e}") from e
                    log.warning("sandbox template failed (%s); restarting it", e)
                    self._discard_spares()  # forked by the dead template: dying with it
                    self._stop_template()
        raise AssertionError("unreachable")

    # -- spares ----------------------------------------------------------------------------------

    def _discard_spares(self) -> None:
        for _, sock, scratch in self._spares:
            sock.close()  # the spare sees EOF and exits
            shutil.rmtree(scratch, ignore_errors=True)
        self._spares.clear()

    def _start_refill(self) -> None:
        """Ask the spares thread for more spares. It is started once and then only woken: starting
        a thread on every ``take_spare`` made each episode's reset wait for the new thread to get
        the GIL (milliseconds on a loaded machine)."""
        with self._lock:
            if self._closed or len(self._spares) >= self._spare_target:
                return
            self._refilling, self._refill_failed = True, False
            if self._refiller is None:
                self._refiller = threading.Thread(
                    target=self._refill, name="sage-sandbox-spares", daemon=True
                )
                self._refiller.start()
            self._wake.notify()

    def _refill(self) -> None:
        """The spares thread: fork until there are ``spares`` waiting, then sleep until woken."""
        while True:
            with self._lock:
                while not self._closed and (self._refill_failed or len(self._spares) >= self._spare_target):
                    self._refilling = False
                    self._wake.wait()
                if self._closed:
                    self._refilling = False
                    return
            scratch = self.new_scratch()
            try:
                pid, sock = self.fork_worker(scratch)
            except SandboxError as e:
                shutil.rmtree(scratch, ignore_errors=True)
                if not self._closed:
                    log.warning("sandbox: could not fork a spare worker (%s)", e)
                with self._lock:
                    self._refill_failed = True
                continue
            with self._lock:
                if self._closed:
                    sock.close()
                    shutil.rmtree(scratch, ignore_errors=True)
                    continue
                self._spares.append((pid, sock, scratch))

    # -- template --------------------------------------------------------------------------------

    def _start_template(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONPATH": pkg_parent,  # no other variable of the trainer (tokens, keys) is passed
            "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MiB of address space per arena otherwise
            # One BLAS/OpenMP thread: per-core buffers would eat RLIMIT_AS on a many-core machine.
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the template
        cmd = [sys.executable, "-s", "-c", "from sage_rl.sandbox.template import main; main()"]
        self._proc = subprocess.Popen(
            [*cmd, str(theirs.fileno()), self.limits.model_dump_json()],
            pass_fds=[theirs.fileno()],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            start_new_session=True,
        )
        theirs.close()
        self._ctl = ours
        ready = self._recv_control(_START_TIMEOUT_S)
        if ready.get("op") != "ready":
            raise SandboxError(f"sandbox template sent {ready!r} instead of 'ready'")
        self._network_note = str(ready.get("note") or "")
        self._cgroup = str(ready.get("cgroup") or "")
        self._vm_bytes = int(ready.get("vm_bytes") or 0)
        need = self._vm_bytes + _WORKER_START_BYTES
        if self.limits.address_space_bytes < need:
            self._stop_template()
            raise SandboxError(
                f"sandbox.address_space_bytes = {_mib(self.limits.address_space_bytes)} is too small: the "
                f"sandbox's interpreter maps {_mib(self._vm_bytes)} before any agent code runs; "
                f"allow at least {_mib(need)} (the default is 1 GiB)"
            )

    def _stop_template(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._cgroup and not memory.remove_base(self._cgroup):
            log.warning("sandbox: could not remove the memory cgroup %s", self._cgroup)
        self._cgroup = ""
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _template_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace")

    def _recv_control(self, timeout: float) -> dict[str, Any]:
        assert self._ctl is not None
        self._ctl.settimeout(timeout)
        try:
            data, fds, _, _ = socket.recv_fds(self._ctl, 65536, 1)
        except TimeoutError:
            raise SandboxError(f"sandbox template did not answer in {timeout:g} s") from None
        if not data:
            raise SandboxError(template_exit_message(self._template_stderr()))
        msg = json.loads(data)
        msg["_fds"] = fds
        return msg

    def _request_fork(self, scratch: Path) -> tuple[int, socket.socket]:
        assert self._ctl is not None
        self._ctl.send(json.dumps({"op": "fork", "scratch": str(scratch)}).encode())
        msg = self._recv_control(_CONTROL_TIMEOUT_S)
        fds = msg["_fds"]
        if msg.get("op") != "forked" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandboxError(f"sandbox template could not fork: {msg.get('error', msg)}")
        return int(msg["pid"]), socket.socket(fileno=fds[0])

    def _probe(self) -> IsolationReport:
        """Fork one worker, read its isolation report, end it."""
        scratch = self.new_scratch()
        try:
            pid, sock = self._request_fork(scratch)
            with sock:
                sock.settimeout(_CONTROL_TIMEOUT_S)
                try:
                    head = _recv_exact(sock, 4)
                    hello = json.loads(_recv_exact(sock, int.from_bytes(head, "big")))
                except SandboxError as e:
                    raise SandboxError(f"{e} ({self._start_suspects()})") from None
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        report = IsolationReport.from_dict(hello.get("isolation", {}))
        if self._network_note:
            report = IsolationReport(**{**report.__dict__, "notes": (*report.notes, self._network_note)})
        return report

    def _start_suspects(self) -> str:
        """What can end a worker before it serves, named by its field: one line for the user."""
        return (
            f"check sandbox.address_space_bytes = {_mib(self.limits.address_space_bytes)}: the sandbox's "
            f"interpreter maps {_mib(self._vm_bytes)} before any agent code runs; and "
            f"sandbox.drop_user = {self.limits.drop_user!r}"
        )


def check_drop_user(name: str) -> None:
    """Fail closed, before anything starts: a trainer running as root switches workers to ``name``,
    so a name that is not a user here would leave agent code running as root (``SandboxError``)."""
    if os.getuid() != 0 or not name:
        return
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(
            f"sandbox.drop_user = {name!r} is not a user on this machine: the workers of a trainer "
            "running as root must switch to an existing unprivileged user (default 'nobody'; '' keeps "
            "root, with no protection from the user switch)"
        ) from None


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def template_exit_message(stderr: str) -> str:
    """Why the template died, from its stderr; a missing module gets its likely cause named."""
    msg = f"sandbox template exited: {stderr.strip() or 'no message'}"
    missing = re.search(r"No module named '([^']+)'", stderr)
    if missing:
        msg += (
            f"\n{sys.executable} cannot import {missing.group(1)!r} in the sandbox, which starts it with "
            "a clean environment (python -s; PYTHONPATH is only sage-rl's own folder). Install "
            "sage-rl's dependencies into that interpreter's site-packages (bash scripts/setup.sh, or "
            "pip install -e .), not through PYTHONPATH, pip --target or user site-packages"
        )
    return msg


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SandboxError("sandbox worker exited during start-up")
        buf += chunk
    return buf
