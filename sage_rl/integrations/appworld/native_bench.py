"""AppWorld's own in-process costs, the baseline of ``bench.py``. Runs under the AppWorld venv.

    python native_bench.py ROOT TASK_ID REPEATS     # prints one JSON object (seconds)

What a user of AppWorld alone pays, measured in one process with AppWorld's own objects:
- ``import_s``: importing AppWorld and building its API routes (what sage-rl's zygote preloads);
- ``concurrent_first_constructions_8_s``: 8 processes forked right after that, each making its
  first ``AppWorld(task_id)``, until the last is done (one world per process is AppWorld's rule);
- ``first_construction_s``, ``construction_s``: ``AppWorld(task_id)`` first and later in one
  process (each later one closes the previous world);
- ``execute_0_calls_s``, ``execute_10_calls_s``, ``execute_100_calls_s``: ``world.execute``;
- ``evaluate_s``: ``world.evaluate()`` (ground truth loaded in the same process).
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


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = _now()
        fn()
        times.append(_now() - t0)
    return statistics.median(times)


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


def main(root: str, task_id: str, repeats: int) -> dict:
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
    world.execute("apis.supervisor.complete_task(answer=42)")
    out["evaluate_s"] = _median(world.evaluate, repeats)
    world.close()
    return out


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: native_bench.py ROOT TASK_ID REPEATS")
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    sys.__stdout__.write(json.dumps(result) + "\n")
    sys.__stdout__.flush()
    os._exit(0)  # AppWorld leaves non-daemon resources behind
