"""AppWorld timings on a synthetic world, for ``benchmarks/env_bench.py`` (a PocketWorld ratio).

    from sage_rl.integrations.appworld.bench import run_bench
    figures = run_bench(repeats=5)   # medians in seconds, plus rss_mb and pss_mb

Times are taken in the parent (AppWorld freezes the clock inside its process) around one worker
request, so they include the JSON pipe round trip, as the environment pays it.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldSuite
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths
from sage_rl.integrations.appworld.synthetic_world import build_world


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


async def _measure(suite: AppWorldSuite, repeats: int) -> dict:
    task = suite.split("train")[0]
    t0 = time.perf_counter()
    env = await suite.open()
    out = {"zygote_start_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    second = await suite.open()
    out["worker_fork_s"] = time.perf_counter() - t0
    await second.close()
    try:
        t0 = time.perf_counter()
        await env.reset(task)
        out["first_reset_s"] = time.perf_counter() - t0
        await _timed(out, "reset_s", repeats, lambda: env.reset(task))
        for n in (0, 10, 100):
            await _timed(out, f"execute_{n}_calls_s", repeats, lambda n=n: env.execute(_calls_cell(n)))
        await _timed(out, "evaluate_s", repeats, env.evaluate)
        info = await env.info()
        out["rss_mb"], out["pss_mb"] = info["rss_mb"], info["pss_mb"]
    finally:
        await env.close()
    return out


def run_bench(venv: Path | None = None, workdir: Path | None = None, repeats: int = 5) -> dict:
    """Build a synthetic world, then return the medians of: reset, a cell with 0/10/100 API calls,
    evaluation; plus the zygote's start-up (process, AppWorld import, API routes), the fork of
    one more worker, a worker's first reset (AppWorld's first construction in it) and its RSS in
    MB (shared copy-on-write pages counted in full) and PSS in MB (shared pages split).

    Keys: ``reset_s``, ``execute_{0,10,100}_calls_s``, ``evaluate_s`` (medians, and under
    ``best_s`` the fastest run of each), ``first_reset_s``, ``zygote_start_s``,
    ``worker_fork_s``, ``synthetic_build_s``, ``rss_mb``, ``pss_mb``, ``repeats``. Raises
    ``SetupError`` when the AppWorld venv is missing."""
    venv = venv or default_paths().venv
    with tempfile.TemporaryDirectory(prefix="sage-rl-appworld-bench-") as tmp:
        root = Path(workdir or tmp) / "appworld-root"
        paths = AppWorldPaths(venv=Path(venv).resolve(), root=root.resolve())
        t0 = time.perf_counter()
        build_world(paths)
        build_s = time.perf_counter() - t0
        suite = AppWorldSuite(AppWorldEnvConfig(venv=str(paths.venv), root=str(paths.root)))
        try:
            out = asyncio.run(_measure(suite, repeats))
        finally:
            asyncio.run(suite.close())
    return {"synthetic_build_s": build_s, "repeats": repeats, **out}
