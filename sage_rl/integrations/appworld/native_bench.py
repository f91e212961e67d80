"""AppWorld's own in-process costs, the baseline of ``bench.py``. Runs under the AppWorld venv.

    python native_bench.py ROOT TASK_ID REPEATS [IDLE_S]     # prints one JSON object (seconds)

What a user of AppWorld alone pays, measured in one process with AppWorld's own objects:
- ``import_s``: importing AppWorld and building its API routes (what sage-rl's zygote preloads);
- ``concurrent_first_constructions_8_s``: 8 processes forked right after that, each making its
  first ``AppWorld(task_id)``, until the last is done (one world per process is AppWorld's rule);
- ``first_construction_s``, ``construction_s``: ``AppWorld(task_id)`` first and later in one
  process (each later one closes the previous world);
- ``execute_0_calls_s``, ``execute_10_calls_s``, ``execute_100_calls_s``: ``world.execute``, back
  to back;
- ``execute_0_calls_ready_s``: the bare cell ``IDLE_S`` (default 0.2) seconds after the previous
  one, as sage-rl's ``execute_0_calls_ready_s`` is timed: a CPU that idled between two cells runs
  the next one at about half the speed of one kept busy (cold caches, a slower clock), in any
  process;
- ``evaluate_s``: ``world.evaluate()`` once per episode, as an agent loop calls it: a fresh world,
  one cell that completes the task, then the evaluation timed (ground truth loaded in the same
  process);
- ``evaluate_repeated_s``: ``world.evaluate()`` again and again on one world (about half of
  ``evaluate_s``: what the first evaluation of a world pays, later ones find cached).
Times are medians read with ``CLOCK_MONOTONIC``: AppWorld freezes ``time.perf_counter``.
Imports nothing from sage_rl.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)  # run as a script: siblings must not shadow AppWorld's imports


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _median(fn, repeats: int, before=None) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls; ``before()`` runs untimed ahead of each."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = _now()
        fn()
        times.append(_now() - t0)
    return statistics.median(times)


def _median_after_idle(fn, repeats: int, idle_s: float) -> float:
    """``_median`` of ``fn`` called ``idle_s`` seconds after the previous call returned (the wait
    untimed)."""
    return _median(fn, repeats, before=lambda: time.sleep(idle_s))


def _calls_cell(n: int) -> str:
    return f"for _ in range({n}):\n    apis.supervisor.show_active_task()" if n else "x = 1"


def _concurrent_first_constructions(task_id: str, n: int) -> float:
    from appworld.environment import AppWorld

    t0 = _now()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                AppWorld(task_id, experiment_name=f"native-bench-{i}", timeout_seconds=60)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return _now() - t0


def main(root: str, task_id: str, repeats: int, idle_s: float = 0.2) -> dict:
    os.environ["APPWORLD_ROOT"] = root
    t0 = _now()
    from appworld.apps import get_all_apps
    from appworld.common.utils import import_apis_module
    from appworld.environment import AppWorld

    for app in get_all_apps():
        import_apis_module(app)
    out = {"import_s": _now() - t0, "repeats": repeats}
    out["concurrent_first_constructions_8_s"] = _concurrent_first_constructions(task_id, 8)
    t0 = _now()
    world = AppWorld(task_id, experiment_name="native-bench", timeout_seconds=60)
    out["first_construction_s"] = _now() - t0
    worlds = [world]

    def construct() -> None:
        worlds[-1].close()
        worlds.append(AppWorld(task_id, experiment_name="native-bench", timeout_seconds=60))

    out["construction_s"] = _median(construct, repeats)
    world = worlds[-1]
    for n in (0, 10, 100):
        out[f"execute_{n}_calls_s"] = _median(lambda n=n: world.execute(_calls_cell(n)), repeats)
        if n == 0:  # before the cells with API calls, as in bench.py (the call log grows)
            bare = lambda: world.execute(_calls_cell(0))  # noqa: E731
            out["execute_0_calls_ready_s"] = _median_after_idle(bare, repeats, idle_s)
    world.execute("apis.supervisor.complete_task(answer=42)")
    out["evaluate_repeated_s"] = _median(world.evaluate, repeats)

    def episode() -> None:  # a fresh world whose task one cell completes
        construct()
        worlds[-1].execute("apis.supervisor.complete_task(answer=42)")

    out["evaluate_s"] = _median(lambda: worlds[-1].evaluate(), repeats, before=episode)
    worlds[-1].close()
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: native_bench.py ROOT TASK_ID REPEATS [IDLE_S]")
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:]))
    sys.__stdout__.write(json.dumps(result) + "\n")
    sys.__stdout__.flush()
    os._exit(0)  # AppWorld leaves non-daemon resources behind
