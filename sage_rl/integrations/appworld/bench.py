"""AppWorld timings on a synthetic world: sage-rl's AppWorld environment beside AppWorld's own
in-process figures (``native_bench.py``), measured in the same run. For
``sage-rl appworld bench`` and ``benchmarks/env_bench.py``.

    from sage_rl.integrations.appworld.bench import run_bench
    figures = run_bench(repeats=5)   # medians in seconds; figures["native"], figures["ratio_over_native"]
    figures = run_bench(root=Path(".cache/appworld"))   # an installed world instead of a synthetic one

sage-rl's times are taken in the parent around one request, so they include what the environment
pays: the socket round trip, and for ``reset`` a fresh worker (fork, AppWorld's construction, the
sandbox's layers; its snapshot is forked after the answer). Cells are timed back to back
(``execute_*_calls_s``: each waits for the previous cell's snapshot fork) and with the worker idle
(``execute_0_calls_ready_s``, as after a policy's turn). ``evaluate`` scores the saved state in a
separate process, prepared while the episode ran (``evaluate_s``) or started by the call
(``evaluate_cold_s``); natively the world evaluates itself in-process. Each is compared with AppWorld
doing the same the same way (``VERSUS_NATIVE``): the idle cell with a native cell after the same
idle gap, an evaluation with ``world.evaluate()`` once per episode (``native_bench.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sage_rl.integrations.appworld.client import zygote_env
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldEnvironment, AppWorldSuite
from sage_rl.integrations.appworld.paths import (
    SPLITS,
    AppWorldPaths,
    SetupError,
    default_paths,
    require_ready,
)
from sage_rl.integrations.appworld.synthetic_world import build_world
from sage_rl.types import Task

NATIVE_SCRIPT = Path(__file__).with_name("native_bench.py")
#: sage-rl figure -> AppWorld's own in-process figure it compares with.
VERSUS_NATIVE = {
    "reset_s": "construction_s",
    "first_reset_s": "first_construction_s",
    "execute_0_calls_s": "execute_0_calls_s",
    "execute_0_calls_ready_s": "execute_0_calls_ready_s",
    "execute_10_calls_s": "execute_10_calls_s",
    "execute_100_calls_s": "execute_100_calls_s",
    "evaluate_s": "evaluate_s",
    "evaluate_cold_s": "evaluate_s",
    "concurrent_first_resets_8_s": "concurrent_first_constructions_8_s",
}
#: Seconds between a cell's answer and the next cell in ``execute_0_calls_ready_s``: shorter than any
#: policy's turn (a turn samples tens of tokens at least).
IDLE_S = 0.2
#: AppWorld's alarm and the parent's grace in the bench: a stuck cell costs their sum, plus the restore.
CELL_TIMEOUT_S, KILL_GRACE_S = 1, 1.0


def _calls_cell(n: int) -> str:
    return f"for _ in range({n}):\n    apis.supervisor.show_active_task()" if n else "x = 1"


async def _timed(out: dict, name: str, repeats: int, op: Callable[[], Awaitable[object]]) -> None:
    """``out[name]`` = median seconds; ``out["best_s"][name]`` = the fastest run (a shared
    machine's noise only ever adds time)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await op()
        times.append(time.perf_counter() - t0)
    out[name] = statistics.median(times)
    out.setdefault("best_s", {})[name] = min(times)


async def _restores(suite: AppWorldSuite, task: Task, kills: int) -> list[float]:
    """Seconds from the parent's kill to a restored worker, for ``kills`` stuck cells in a row."""
    env = await suite.open()
    try:
        await env.reset(task)
        await env.execute("x = 1")
        out = []
        for _ in range(kills):
            t0 = time.perf_counter()
            await env.execute("sum(range(10 ** 13))")
            out.append(time.perf_counter() - t0 - CELL_TIMEOUT_S - KILL_GRACE_S)
        return out
    finally:
        await env.close()


async def _concurrent_first_resets(suite: AppWorldSuite, task: Task, n: int) -> float:
    envs = [await suite.open() for _ in range(n)]
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(env.reset(task) for env in envs))
        return time.perf_counter() - t0
    finally:
        await asyncio.gather(*(env.close() for env in envs))


async def _ready_cells(out: dict, env: AppWorldEnvironment, repeats: int) -> None:
    """``execute_0_calls_ready_s``: a cell sent once the worker is idle, as after a policy's turn:
    ``IDLE_S`` after the previous answer, time enough for the worker to fork its snapshot and copy
    ahead the pages a cell writes (``snapshots.py``; a request that comes sooner stops that)."""
    times = []
    for _ in range(repeats):
        await asyncio.sleep(IDLE_S)
        t0 = time.perf_counter()
        await env.execute("x = 1")
        times.append(time.perf_counter() - t0)
    out["execute_0_calls_ready_s"] = statistics.median(times)
    out.setdefault("best_s", {})["execute_0_calls_ready_s"] = min(times)


async def _evaluations(out: dict, env: AppWorldEnvironment, task: Task, repeats: int) -> None:
    """``evaluate_s``: one evaluation per episode, its evaluator prepared while the episode ran
    (awaited untimed, as an episode longer than the preparation finds it); ``evaluate_cold_s``: a
    second evaluation of the same state, which starts and prepares its own evaluator."""
    prepared, cold = [], []
    for _ in range(repeats):
        await env.reset(task)
        await env.execute("apis.supervisor.complete_task(answer=42)")
        await env.prepare_evaluation()  # type: ignore[misc]
        t0 = time.perf_counter()
        await env.evaluate()
        prepared.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await env.evaluate()
        cold.append(time.perf_counter() - t0)
    for name, times in (("evaluate_s", prepared), ("evaluate_cold_s", cold)):
        out[name] = statistics.median(times)
        out.setdefault("best_s", {})[name] = min(times)


async def _measure(suite: AppWorldSuite, task: Task, repeats: int) -> dict:
    t0 = time.perf_counter()
    await asyncio.to_thread(suite._factory.zygote)
    out: dict = {"zygote_start_s": time.perf_counter() - t0}
    env = await suite.open()
    try:
        t0 = time.perf_counter()
        await env.reset(task)
        out["first_reset_s"] = time.perf_counter() - t0
        out["isolation"] = env.isolation
        await _timed(out, "reset_s", repeats, lambda: env.reset(task))
        await _timed(out, "execute_0_calls_s", repeats, lambda: env.execute(_calls_cell(0)))
        # Before the cells with API calls, as natively: AppWorld rewrites its whole API-call log
        # after every cell, so a bare cell after 990 calls costs more than on a fresh world.
        await _ready_cells(out, env, repeats)
        for n in (10, 100):
            await _timed(out, f"execute_{n}_calls_s", repeats, lambda n=n: env.execute(_calls_cell(n)))
        info = await env.info()
        out["rss_mb"], out["pss_mb"] = info["rss_mb"], info["pss_mb"]
        await _evaluations(out, env, task, repeats)
    finally:
        await env.close()
    out["concurrent_first_resets_8_s"] = await _concurrent_first_resets(suite, task, 8)
    out["restore_after_kill_s"] = await _restores(suite, task, 3)
    return out


def native_figures(paths: AppWorldPaths, task_id: str, repeats: int, timeout_s: float = 900) -> dict:
    """AppWorld's own in-process figures (``native_bench.py``) on the same world. It runs in a
    private AppWorld root whose ``data`` links to ``paths.data``: nothing is written to
    ``paths.root`` (it may be a real installation)."""
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-native-") as home:
        private = Path(home) / "root"
        private.mkdir()
        (private / "data").symlink_to(paths.data.resolve(), target_is_directory=True)
        proc = subprocess.run(
            [str(paths.python), str(NATIVE_SCRIPT), str(private), task_id, str(repeats), str(IDLE_S)],
            env=zygote_env(paths, Path(home)),
            cwd=private,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"native_bench.py failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bench_task(suite: AppWorldSuite) -> Task:
    """The first task of the first split the world has (train, else dev, ...)."""
    for split in SPLITS:
        with contextlib.suppress(SetupError):
            if tasks := suite.split(split, 1):
                return tasks[0]
    raise SetupError(f"the AppWorld data at {suite.paths.data} has no tasks in any split")


def run_bench(
    venv: Path | None = None, workdir: Path | None = None, repeats: int = 5, root: Path | None = None
) -> dict:
    """Build a synthetic world (or use the AppWorld root ``root``: its ``data`` is read, nothing
    is written there); return sage-rl's figures, AppWorld's native ones (``native``) and the
    ratios (``ratio_over_native``, sage-rl / native).

    sage-rl keys: ``reset_s``, ``first_reset_s`` (the first in a suite, zygote already up),
    ``execute_{0,10,100}_calls_s``, ``evaluate_s`` (medians; ``best_s`` the fastest runs),
    ``concurrent_first_resets_8_s`` (8 environments reset at once), ``restore_after_kill_s``
    (3 stuck cells in a row: kill to restored worker, each), ``zygote_start_s``, ``rss_mb`` /
    ``pss_mb`` (a worker; PSS splits pages shared with the zygote), ``isolation`` (the layers),
    ``synthetic_build_s`` (null with ``root``), ``root``, ``task_id``, ``repeats``. Raises
    ``SetupError`` when the AppWorld venv, or the data under ``root``, is missing."""
    venv = Path(venv or default_paths().venv).resolve()
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-bench-") as tmp:
        build_s = None
        if root is None:
            paths = AppWorldPaths(venv=venv, root=(Path(workdir or tmp) / "appworld-root").resolve())
            t0 = time.perf_counter()
            build_world(paths)
            build_s = time.perf_counter() - t0
        else:
            paths = require_ready(AppWorldPaths(venv=venv, root=Path(root).resolve()))
        config = AppWorldEnvConfig(
            venv=str(paths.venv),
            root=str(paths.root),
            cell_timeout_s=CELL_TIMEOUT_S,
            kill_grace_s=KILL_GRACE_S,
        )
        suite = AppWorldSuite(config)
        task = _bench_task(suite)
        try:
            ours = asyncio.run(_measure(suite, task, repeats))
        finally:
            asyncio.run(suite.close())
        native = native_figures(paths, task.task_id, repeats)
    ratios = {k: round(ours[k] / native[v], 2) for k, v in VERSUS_NATIVE.items() if native.get(v)}
    return {
        "synthetic_build_s": build_s,
        "root": str(paths.root),
        "task_id": task.task_id,
        "repeats": repeats,
        **ours,
        "native": native,
        "ratio_over_native": ratios,
    }


def ratio_table(result: dict) -> str:
    """The figures that have a native counterpart, as a table: milliseconds and sage-rl / native."""
    rows = [f"{'figure':<28} {'sage-rl ms':>11} {'native ms':>10} {'ratio':>6}"]
    for ours, theirs in VERSUS_NATIVE.items():
        if ours in result and result["native"].get(theirs):
            rows.append(
                f"{ours:<28} {result[ours] * 1000:>11.1f} {result['native'][theirs] * 1000:>10.1f} "
                f"{result['ratio_over_native'][ours]:>6.2f}"
            )
    return "\n".join(rows)
