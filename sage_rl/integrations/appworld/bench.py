"""AppWorld timings on a synthetic world: sage-rl's AppWorld environment beside AppWorld's own
in-process figures (``native_bench.py``), measured in the same run. For
``sage-rl appworld bench`` and ``benchmarks/env_bench.py``.

    from sage_rl.integrations.appworld.bench import run_bench
    figures = run_bench(repeats=5)   # medians in seconds; figures["native"], figures["ratio_over_native"]

sage-rl's times are taken in the parent around one request, so they include what the environment
pays: the socket round trip, and for ``reset`` a fresh worker (fork, AppWorld's construction, the
sandbox's layers; its snapshot is forked after the answer). ``evaluate`` copies the saved state
into a separate process and scores it there; natively the world evaluates itself in-process.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sage_rl.integrations.appworld.client import zygote_env
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldSuite
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths
from sage_rl.integrations.appworld.synthetic_world import build_world

NATIVE_SCRIPT = Path(__file__).with_name("native_bench.py")
#: sage-rl figure -> AppWorld's own in-process figure it compares with.
VERSUS_NATIVE = {
    "reset_s": "construction_s",
    "first_reset_s": "first_construction_s",
    "execute_0_calls_s": "execute_0_calls_s",
    "execute_10_calls_s": "execute_10_calls_s",
    "execute_100_calls_s": "execute_100_calls_s",
    "evaluate_s": "evaluate_s",
    "concurrent_first_resets_8_s": "concurrent_first_constructions_8_s",
}
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


async def _restores(suite: AppWorldSuite, kills: int) -> list[float]:
    """Seconds from the parent's kill to a restored worker, for ``kills`` stuck cells in a row."""
    env = await suite.open()
    try:
        await env.reset(suite.split("train")[0])
        await env.execute("x = 1")
        out = []
        for _ in range(kills):
            t0 = time.perf_counter()
            await env.execute("sum(range(10 ** 13))")
            out.append(time.perf_counter() - t0 - CELL_TIMEOUT_S - KILL_GRACE_S)
        return out
    finally:
        await env.close()


async def _concurrent_first_resets(suite: AppWorldSuite, n: int) -> float:
    task = suite.split("train")[0]
    envs = [await suite.open() for _ in range(n)]
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(env.reset(task) for env in envs))
        return time.perf_counter() - t0
    finally:
        await asyncio.gather(*(env.close() for env in envs))


async def _measure(suite: AppWorldSuite, repeats: int) -> dict:
    task = suite.split("train")[0]
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
        for n in (0, 10, 100):
            await _timed(out, f"execute_{n}_calls_s", repeats, lambda n=n: env.execute(_calls_cell(n)))
        await env.execute("apis.supervisor.complete_task(answer=42)")
        await _timed(out, "evaluate_s", repeats, env.evaluate)
        info = await env.info()
        out["rss_mb"], out["pss_mb"] = info["rss_mb"], info["pss_mb"]
    finally:
        await env.close()
    out["concurrent_first_resets_8_s"] = await _concurrent_first_resets(suite, 8)
    out["restore_after_kill_s"] = await _restores(suite, 3)
    return out


def native_figures(paths: AppWorldPaths, task_id: str, repeats: int, timeout_s: float = 900) -> dict:
    """AppWorld's own in-process figures (``native_bench.py``) on the same world."""
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-native-") as home:
        proc = subprocess.run(
            [str(paths.python), str(NATIVE_SCRIPT), str(paths.root), task_id, str(repeats)],
            env=zygote_env(paths, Path(home)),
            cwd=paths.root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"native_bench.py failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(venv: Path | None = None, workdir: Path | None = None, repeats: int = 5) -> dict:
    """Build a synthetic world; return sage-rl's figures, AppWorld's native ones (``native``) and
    the ratios (``ratio_over_native``, sage-rl / native).

    sage-rl keys: ``reset_s``, ``first_reset_s`` (the first in a suite, zygote already up),
    ``execute_{0,10,100}_calls_s``, ``evaluate_s`` (medians; ``best_s`` the fastest runs),
    ``concurrent_first_resets_8_s`` (8 environments reset at once), ``restore_after_kill_s``
    (3 stuck cells in a row: kill to restored worker, each), ``zygote_start_s``, ``rss_mb`` /
    ``pss_mb`` (a worker; PSS splits pages shared with the zygote), ``isolation`` (the layers),
    ``synthetic_build_s``, ``repeats``. Raises ``SetupError`` when the AppWorld venv is missing."""
    venv = venv or default_paths().venv
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-bench-") as tmp:
        root = Path(workdir or tmp) / "appworld-root"
        paths = AppWorldPaths(venv=Path(venv).resolve(), root=root.resolve())
        t0 = time.perf_counter()
        build_world(paths)
        build_s = time.perf_counter() - t0
        config = AppWorldEnvConfig(
            venv=str(paths.venv),
            root=str(paths.root),
            cell_timeout_s=CELL_TIMEOUT_S,
            kill_grace_s=KILL_GRACE_S,
        )
        suite = AppWorldSuite(config)
        try:
            ours = asyncio.run(_measure(suite, repeats))
        finally:
            asyncio.run(suite.close())
        native = native_figures(paths, suite.split("train")[0].task_id, repeats)
    ratios = {k: round(ours[k] / native[v], 2) for k, v in VERSUS_NATIVE.items() if native.get(v)}
    return {
        "synthetic_build_s": build_s,
        "repeats": repeats,
        **ours,
        "native": native,
        "ratio_over_native": ratios,
    }
