"""Exact restore of a killed episode worker: a forked copy of it, taken after every state change.
Runs under the AppWorld venv (standard library only).

After the worker answers a request that changed its world (reset, a cell), it forks a copy of
itself that waits, blocked on a pipe that only the worker holds open for writing. The copy is the
whole process: AppWorld's in-memory databases, the interpreter namespace, the frozen clock, the
random state. Then either
- the worker takes the next snapshot: one byte on the pipe tells the copy to exit; the worker
  forks a new one at once, and reaps the old one once it has exited. The exiting copy first drops
  to the lowest priority: its exit unmaps a copy of the whole worker (as much CPU as the fork), work
  nobody waits for, which would otherwise take a core from the worker's next cell; or
- the worker dies (the parent killed it because a cell was stuck in C code, or it crashed): the
  pipe reaches end-of-file and the copy takes over. It is the worker again, in the state after
  the last request that completed, and says so to the parent on the worker's connection, which it
  inherited.

Restoring costs the same whatever happened earlier in the episode: nothing is replayed, and the
killed cell's partial effects are gone. The parent of a copy that took over is the zygote, a
child subreaper; the copy dies with it.

After a fork every page the worker writes is first copied (copy-on-write): a cell that writes
~1,400 pages (the interpreter's, IPython's and AppWorld's own bookkeeping, whatever the code) ran
twice as long after a fork as without one. So the worker copies those pages ahead, while it waits
for the next request (``HotPages``): it learns which pages a cell wrote from the kernel's page map
after a cell that ran without that help (the first, then every ``RELEARN``-th), and after each
fork asks the kernel to break their sharing (``MADV_POPULATE_WRITE``, which writes nothing),
looking between runs of pages for the next request, which stops it: a cell sent back to back
(no policy turn between) pays its copies itself, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import time
from collections.abc import Callable

_fork = os.fork  # kept: the sandbox's guard later replaces os.fork with a refusal
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_POPULATE_WRITE = 23  # Linux 5.14; older kernels refuse it (EINVAL) and nothing is copied ahead
PAGE = os.sysconf("SC_PAGE_SIZE")
#: Cells between two that run without pages copied ahead, so that the page map shows their writes.
RELEARN = 8
#: A page map entry's last byte: bit 7 "present", bit 0 "exclusively mapped" (written since the
#: last fork, or new). Translated to b"1" where both are set, else b"0".
_WRITTEN = bytes(0x31 if b & 0x81 == 0x81 else 0x30 for b in range(256))
#: Runs copied between two looks for the next request (~0.5 ms).
_BETWEEN_LOOKS = 64
#: Pages between two written runs copied too, to make one call of them (a call costs ~3 pages).
_GAP = 2


class Snapshots:
    """At most one waiting copy of this process, replaced by ``take``."""

    def __init__(self) -> None:
        self._pid = 0
        self._pipe = -1
        self._zygote = os.getppid()
        self._exiting: list[int] = []  # discarded copies, reaped once they have exited
        self.hot = HotPages()

    def take(self, waiting: Callable[[], bool] = lambda: False) -> bool:
        """Replace the snapshot with a copy of this process as it is now. Returns False in the
        worker, and True in the copy once it has taken over from a dead worker. In the worker,
        then copies ahead the pages the next request will likely write, until ``waiting()``
        says that request has come."""
        self.discard()
        self.hot.before_fork()
        read_end, write_end = os.pipe()
        worker = os.getpid()
        pid = _fork()
        if pid:
            os.close(read_end)
            self._pid, self._pipe = pid, write_end
            self.hot.after_fork(waiting)
            return False
        os.close(write_end)
        try:
            told_to_exit = os.read(read_end, 1)
        except OSError:
            told_to_exit = b"!"
        if told_to_exit:
            exit_quietly()
        os.close(read_end)
        self.hot.close()  # its files read the dead worker's memory
        self._adopt(worker)
        return True

    def discard(self) -> None:
        """Tell the waiting copy to exit. It is reaped later (``_reap``), not waited for: its
        exit unmaps a copy of the whole worker, which would delay the next request."""
        self._reap()
        if not self._pid:
            return
        pid, pipe = self._pid, self._pipe
        self._pid, self._pipe = 0, -1
        try:
            os.write(pipe, b"x")
        except OSError:
            os.kill(pid, signal.SIGKILL)
        os.close(pipe)
        self._exiting.append(pid)

    def _reap(self) -> None:
        """Reap the discarded copies that have exited (at most one or two are still exiting)."""
        for pid in list(self._exiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._exiting.remove(pid)

    def _adopt(self, dead_worker: int) -> None:
        """Become the worker: wait to be re-parented to the zygote (the pipe closes before the
        kernel re-parents), then die with the zygote as the worker did."""
        for _ in range(5000):  # counted, not timed: AppWorld freezes time.monotonic()
            if os.getppid() != dead_worker:
                break
            time.sleep(0.001)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self._zygote:  # the zygote is gone too: nobody to serve
            os._exit(0)


class HotPages:
    """The pages the worker's requests write, copied ahead of the next one (module docstring)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []  # (address, bytes)
        self._forks = 0
        self._helped = False  # whether the request since the last fork ran on pages copied ahead
        self._fds: tuple[int, int] | None = None  # /proc/self/maps and /proc/self/pagemap
        self._files: list[tuple[int, int]] = []  # their (device, inode)

    def open(self) -> None:
        """Open this process's page map, before the sandbox's layers: a worker that dropped to
        ``nobody`` is no longer dumpable, and may not open its own. It is opened without
        ``CAP_SYS_ADMIN`` in effect, so that it shows no physical page numbers to agent code that
        reads the open file. (An open file keeps this process's memory, not a later copy's: a
        snapshot that takes over copies nothing ahead.)"""
        with contextlib.suppress(OSError), _without_sys_admin():
            self._fds = (os.open("/proc/self/maps", os.O_RDONLY), os.open("/proc/self/pagemap", os.O_RDONLY))
            self._files = [_identity(fd) for fd in self._fds]

    def close(self) -> None:
        for fd in self._fds or ():
            with contextlib.suppress(OSError):  # agent code may have closed it
                os.close(fd)
        self._fds, self.ranges = None, []

    def before_fork(self) -> None:
        """After a request that ran without help (never the first fork's: its page map holds the
        whole world, made since the worker began), learn what it wrote."""
        if self._fds and self._forks and not self._helped:
            try:
                # Agent code runs in this process: it may have closed these descriptors, or put
                # another file under their numbers. Only the files opened here are read.
                if [_identity(fd) for fd in self._fds] != self._files:
                    raise OSError("the page map's descriptors changed")
                self.ranges = written_ranges(*self._fds)
            except Exception:  # noqa: BLE001 - only an optimization: stop it, never the worker
                self._fds = None  # not closed: the numbers may be agent code's files now
                self.ranges = []
        self._helped = False

    def after_fork(self, waiting: Callable[[], bool]) -> None:
        self._forks += 1
        if not self.ranges or self._forks % RELEARN == 0:
            return
        self._helped = True  # even in part: the page map would show the pages copied ahead
        for i, (address, size) in enumerate(self.ranges):
            if i % _BETWEEN_LOOKS == 0 and waiting():
                return
            _libc.madvise(address, size, _MADV_POPULATE_WRITE)  # fails only where nothing is left to copy


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CAP_V3, _CAP_SYS_ADMIN = 0x20080522, 21


@contextlib.contextmanager
def _without_sys_admin():
    """``CAP_SYS_ADMIN`` out of this thread's effective set for the block (kept permitted, and put
    back after). The kernel decides from the opener's effective set whether a page map file shows
    physical page numbers. Raises OSError where the capabilities cannot be read or set."""
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    effective = data[0].effective
    data[0].effective &= ~(1 << _CAP_SYS_ADMIN)
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    try:
        yield
    finally:
        data[0].effective = effective
        _libc.capset(ctypes.byref(header), data)


def written_ranges(maps: int, pagemap: int) -> list[tuple[int, int]]:
    """(address, bytes) runs of this process's private writable pages written since its last fork
    (or new), read from its open ``/proc/self/maps`` and ``pagemap``; runs ``_GAP`` pages apart
    are one."""
    os.lseek(maps, 0, os.SEEK_SET)
    text = b"".join(iter(lambda: os.read(maps, 1 << 16), b""))
    out: list[tuple[int, int]] = []
    for line in text.decode().splitlines():
        fields = line.split()
        if fields[1] != "rw-p" or fields[-1] in ("[stack]", "[vvar]", "[vsyscall]"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        entries = os.pread(pagemap, (end - start) // PAGE * 8, start // PAGE * 8)
        for run in re.finditer(rb"1+", entries[7::8].translate(_WRITTEN)):
            address, size = start + run.start() * PAGE, (run.end() - run.start()) * PAGE
            if out and address - sum(out[-1]) <= _GAP * PAGE:
                out[-1] = (out[-1][0], address + size - out[-1][0])
            else:
                out.append((address, size))
    return out


def exit_quietly() -> None:
    """Exit at the lowest CPU priority (nice 19): tearing down this copy's page tables (~15 ms of
    CPU for a 250 MB worker) then runs when a core is free, not in the worker's next cell."""
    with contextlib.suppress(OSError):
        os.nice(19)
    os._exit(0)
