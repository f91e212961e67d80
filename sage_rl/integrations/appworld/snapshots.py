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
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

_fork = os.fork  # kept: the sandbox's guard later replaces os.fork with a refusal
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


class Snapshots:
    """At most one waiting copy of this process, replaced by ``take``."""

    def __init__(self) -> None:
        self._pid = 0
        self._pipe = -1
        self._zygote = os.getppid()
        self._exiting: list[int] = []  # discarded copies, reaped once they have exited

    def take(self) -> bool:
        """Replace the snapshot with a copy of this process as it is now. Returns False in the
        worker, and True in the copy once it has taken over from a dead worker."""
        self.discard()
        read_end, write_end = os.pipe()
        worker = os.getpid()
        pid = _fork()
        if pid:
            os.close(read_end)
            self._pid, self._pipe = pid, write_end
            return False
        os.close(write_end)
        try:
            told_to_exit = os.read(read_end, 1)
        except OSError:
            told_to_exit = b"!"
        if told_to_exit:
            exit_quietly()
        os.close(read_end)
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


def exit_quietly() -> None:
    """Exit at the lowest CPU priority (nice 19): tearing down this copy's page tables (~15 ms of
    CPU for a 250 MB worker) then runs when a core is free, not in the worker's next cell."""
    with contextlib.suppress(OSError):
        os.nice(19)
    os._exit(0)
