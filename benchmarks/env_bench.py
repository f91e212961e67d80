"""PocketWorld speed: medians (and best runs) of world build, task reset, one cell with 0/10/100 API calls, evaluation.

Prints one JSON object (seconds, plus milliseconds for reading). Run:
    .venv/bin/python benchmarks/env_bench.py [--repeats N]

The AppWorld comparison (issue 2: the same figures on a synthetic AppWorld world, as a ratio) is
owned by the AppWorld integration; it needs ``appworld`` in its own virtual environment, so this
script leaves ``"appworld": null`` with the reason until that hook is filled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.env import PocketWorldEnv
from sage_rl.envs.pocketworld.generator import build_world

TASK_ID = "music_follow_playlist_artists_1"
LOGIN = (
    "pw = {p['account_name']: p['password'] for p in apis.supervisor.show_account_passwords()}\n"
    "token = apis.music.login(username=apis.supervisor.show_profile()['email'], password=pw['music'])['access_token']\n"
)


def _times(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _cell(n_calls: int) -> str:
    if n_calls == 0:
        return "x = 1\n"
    return f"for i in range({n_calls}):\n    apis.music.show_song(access_token=token, song_id=1 + i % 60)\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=50)
    n = parser.parse_args().repeats
    task = tasks.task_by_id(TASK_ID)
    env = PocketWorldEnv()
    out: dict[str, object] = {"task": TASK_ID, "repeats": n}
    timings = {"world_build": _times(lambda: build_world(int(task.spec["seed"])), n)}
    timings["task_reset"] = _times(lambda: env.reset_sync(task), n)
    env.execute_sync(LOGIN, "<cell-0>")
    for k in (0, 10, 100):
        timings[f"cell_{k}_calls"] = _times(lambda k=k: env.execute_sync(_cell(k), "<cell-1>"), n)
    env.reset_sync(task)
    env.execute_sync(tasks.reference_solution(task), "<cell-1>")
    timings["evaluate"] = _times(env.evaluate_sync, n)
    for name, ts in timings.items():
        out[f"{name}_s"] = statistics.median(ts)
    out["ms"] = {name: round(statistics.median(ts) * 1000, 3) for name, ts in timings.items()}
    # the dev machine is shared: the best run shows the cost without other processes' noise
    out["ms_best"] = {name: round(min(ts) * 1000, 3) for name, ts in timings.items()}
    out["appworld"] = None
    out["appworld_reason"] = (
        "AppWorld runs in its own venv/process (sage_rl.integrations.appworld); its figures and the ratio "
        "are to be filled by that integration's benchmark hook"
    )
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
