"""How many torch threads sampling uses (the policy's sampling task, on the event loop's thread): a fixed count, or "auto", which gives up cores
that other processes are using.

Why: a decode step is a thousand small operations, each an OpenMP parallel region whose threads
wait for each other at its end. When another process holds a core, one of ours is descheduled in
the middle of a region and the other spins until it comes back: a 2-thread step on a 2-core
machine beside a 2-thread job took 10-25 s against about 1 s on one thread (docs/LOG.md,
2026-11-27). One thread never waits for another.

"auto" measures instead of guessing: it samples how many threads of *other* processes are running
(the kernel's count of runnable threads in ``/proc/loadavg`` minus this process's own threads in
state R, read from ``/proc/self/task``), averages the last :data:`WINDOW` samples, and uses the
cores left free, between 1 and the process's thread count when sampling started. Where ``/proc``
cannot be read (not Linux), "auto" keeps the process's thread count.
"""

from __future__ import annotations

import collections
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

WINDOW = 16  # samples averaged: one per scheduler step
SPARE = 0.25  # another process using more than this share of a core takes that core away


def threads_setting(value: int | str | None) -> int | str | None:
    """Check a ``threads`` setting: a positive int, "auto", or None (leave torch's setting)."""
    if value is None or value == "auto":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"threads must be a positive integer, 'auto' or None, got {value!r}")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def others_running(proc: Path = Path("/proc")) -> float | None:
    """Threads of other processes running or runnable right now (None where /proc is unreadable)."""
    try:
        running = int((proc / "loadavg").read_text().split()[3].split("/")[0])
        own = 0
        for task in (proc / "self" / "task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            own += stat[stat.rindex(")") + 2] == "R"  # the state follows the parenthesised name
        return float(max(0, running - own))
    except (OSError, ValueError, IndexError):
        return None


def auto_threads(others: float, cores: int, ceiling: int) -> int:
    """Threads to use when ``others`` threads of other processes share ``cores`` cores: the cores
    left free (a core counts as taken once others use more than :data:`SPARE` of it), between 1
    and ``ceiling``."""
    free = cores - max(0, math.ceil(others - SPARE))
    return max(1, min(ceiling, free))


def pick_threads(
    samples: int = 10, interval_s: float = 0.05, probe: Callable[[], float | None] | None = None
) -> int:
    """A thread count for one long job (SFT) started now: the cores other processes leave free,
    averaged over ``samples`` probes ``interval_s`` apart; all usable cores where /proc is unreadable."""
    probe = probe or others_running
    seen = []
    for i in range(samples):
        value = probe()
        if value is not None:
            seen.append(value)
        if i + 1 < samples:
            time.sleep(interval_s)
    cores = usable_cores()
    return auto_threads(sum(seen) / len(seen), cores, cores) if seen else cores


class ThreadPolicy:
    """Sets torch's thread count while sampling (see the module docstring).

    ``start()`` when sampling starts (remembers the process's count), ``step()`` before each
    scheduler step (returns the count it runs with), ``stop()`` when sampling goes idle (restores
    the process's count, which a trainer in the same process then uses). ``probe`` returns the
    number of other processes' running threads, or None when it cannot tell.
    """

    def __init__(self, setting: int | str | None, probe: Callable[[], float | None] | None = None) -> None:
        self.setting = threads_setting(setting)
        self.probe = probe or others_running  # looked up now, not when the module loaded
        self.cores = usable_cores()
        self._samples: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self._saved: int | None = None

    def start(self) -> None:
        self._saved = torch.get_num_threads()
        self._samples.clear()

    def step(self) -> int:
        assert self._saved is not None, "start() first"
        if self.setting is None:
            want = self._saved
        elif self.setting == "auto":
            sample = self.probe()
            if sample is not None:
                self._samples.append(sample)
            if self._samples:
                others = sum(self._samples) / len(self._samples)
                want = auto_threads(others, self.cores, self._saved)
            else:
                want = self._saved
        else:
            want = int(self.setting)
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)
        return want

    def stop(self) -> None:
        if self._saved is not None and torch.get_num_threads() != self._saved:
            torch.set_num_threads(self._saved)
        self._saved = None
