"""Sandbox speed and memory. Prints one JSON object of medians (issue 3 targets: empty cell < 2 ms,
API round trip < 150 us).

    .venv/bin/python benchmarks/sandbox_bench.py [--reps 30]

- acquire_ms: ``await sandbox.acquire(dispatch)`` taking a spare worker forked ahead (the steady state);
- acquire_cold_ms: the same with no spare: fork from the warm template, apply the layers, hello;
- empty_cell_ms: ``execute("pass")`` round trip from the parent;
- api_call_us: one ``apis.x.y()`` round trip as agent code sees it (timed inside the worker; the
  median call; api_call_mean_us is the mean, which scheduling delays on a loaded machine inflate);
- cell_100_api_calls_ms: a cell making 100 API calls, round trip from the parent;
- worker_peak_rss_mb / worker_pss_mb: VmHWM and proportional set size of a worker after the cells
  (PSS splits pages shared with the template, so it is the memory each extra worker costs);
- tracking_overhead_ns_per_call: extra time of one call of an agent function (call records);
- env_empty_cell_ms / env_cell_10_api_calls_ms: the same cells through ``PocketWorldEnv.execute``
  (what the agent loop awaits; includes the world's dispatch and the environment's own work);
- episode_ms: one whole PocketWorld episode through the sandbox, as a chain runs it: open, reset,
  the reference solution of a task (one cell, about a dozen API calls), evaluate, close;
- episodes_x4_ms: four such episodes at once on one event loop (the wall time of all four);
- episode_thread_hop_ms / ratio_episode_direct_over_thread_hop: the same episode the way it ran
  before issue 12 (world and each call sent through ``asyncio.to_thread`` to a private event-loop
  thread that owned the session), alternated with the direct path in the same process: the
  side-by-side ratio that a loaded machine does not blur;
- socketpair_floor_us and load_avg_1m: a bare two-process ping-pong and the load, for context;
- neighbour_*: a hostile neighbour's effect on another episode's API latency (issue 11). Two
  episodes of PocketWorld share the trainer's event loop; one makes ordinary API calls
  (``supervisor.show_profile``, timed inside its worker; 400 calls or 2 s), alone and then while the other floods
  the parent with the largest frames it may send (a huge app name, an answer of ``[[]] * n``),
  over and over: ``neighbour_alone_p50_us``/``_p99_us``/``_max_us`` vs ``neighbour_flood_...``,
  interleaved over ``--neighbour-rounds`` rounds in one run (the max is the longest stall).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import threading
import time

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.env import PocketWorldEnv
from sage_rl.envs.pocketworld.sandboxed import SandboxExecutors
from sage_rl.sandbox import Sandbox, SandboxLimits

EPISODE_TASK = "music_follow_playlist_artists_1"

# Per-call times inside the worker: the round trip as agent code sees it (median and mean, in us).
API_LOOP = (
    "import time, statistics\nts = []\nfor _ in range(200):\n    t = time.perf_counter()\n"
    "    apis.bench.ping(i=1)\n    ts.append(time.perf_counter() - t)\n"
    "print(statistics.median(ts) * 1e6, statistics.mean(ts) * 1e6)"
)


def dispatch(app: str, api: str, kwargs: dict) -> dict:
    return {"ok": True}


def socketpair_floor_us(n: int = 2000) -> float:
    """The floor: a bare fork + socketpair ping-pong of 50 bytes, microseconds per round trip."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        while data := b.recv(100):
            b.sendall(data)
        os._exit(0)
    b.close()
    t = time.perf_counter()
    for _ in range(n):
        a.sendall(b"x" * 50)
        a.recv(100)
    elapsed = time.perf_counter() - t
    a.close()
    os.waitpid(pid, 0)
    return elapsed / n * 1e6


def _proc_kb(pid: int, path: str, key: str) -> float:
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(key):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


# Cost of call tracking: an agent function (wrapped) vs the same function compiled as non-agent code.
TRACKING = (
    "import time\ndef f(x):\n    return x\n"
    "g = lambda x: x\n"  # lambdas are not tracked (eval, refused since issue 30, made one before)
    "def per_call(fn):\n    t = time.perf_counter()\n    for i in range(100_000):\n        fn(i)\n"
    "    return (time.perf_counter() - t) / 100_000 * 1e9\n"
    "print(per_call(f) - per_call(g))"
)


# The quiet episode: each call's round trip, printed as it goes (a cell cut by its time limit still
# reports the calls it made).
QUIET = (
    "import time\nend = time.perf_counter() + 2.0\nfor _ in range(400):\n    t = time.perf_counter()\n"
    "    apis.supervisor.show_profile()\n    print((time.perf_counter() - t) * 1e6)\n"
    "    if time.perf_counter() > end:\n        break"
)
# The hostile episode: frames as large as the parent accepts, alternating an unknown app with a name
# that fills the frame (a fuzzy suggestion would run on it) and an answer whose JSON decodes into
# hundreds of thousands of lists.
FLOOD = (
    "for i in range(1000):\n    try:\n        if i % 2:\n            getattr(apis, 'x' * {name}).y()\n"
    "        else:\n            apis.supervisor.complete_task(answer=[[]] * {items})\n"
    "    except Exception:\n        pass"
)


def _times(observation: str) -> list[float]:
    out = []
    for line in observation.splitlines():
        with contextlib.suppress(ValueError):
            out.append(float(line))
    return out


async def _hammer(session, code: str, stop: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        await session.execute(code, f"<cell-{i}>")
        i += 1


async def neighbour(rounds: int) -> dict[str, float]:
    """API latency of a quiet episode, alone and beside a hostile one (same sandbox, same loop)."""
    from sage_rl.envs.pocketworld import tasks

    limits = SandboxLimits()
    task = tasks.task_by_id("payments_largest_payment_recipient_1")
    flood = FLOOD.format(name=limits.message_bytes - 200, items=limits.message_bytes // 3 - 100)
    alone: list[float] = []
    beside: list[float] = []
    with Sandbox(limits) as sandbox:
        quiet = await sandbox.acquire(tasks.world_for(task).call)
        loud = await sandbox.acquire(tasks.world_for(task).call)
        for r in range(rounds):
            alone += _times((await quiet.execute(QUIET, f"<cell-{2 * r}>")).observation)
            stop = asyncio.Event()
            hostile = asyncio.create_task(_hammer(loud, flood, stop))
            await asyncio.sleep(0.5)  # the flood is under way
            beside += _times((await quiet.execute(QUIET, f"<cell-{2 * r + 1}>")).observation)
            stop.set()
            await hostile
        await quiet.close()
        await loud.close()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1) if xs else float("nan")

    return {
        "neighbour_alone_p50_us": pct(alone, 0.5),
        "neighbour_alone_p99_us": pct(alone, 0.99),
        "neighbour_flood_p50_us": pct(beside, 0.5),
        "neighbour_flood_p99_us": pct(beside, 0.99),
        "neighbour_alone_max_us": round(max(alone, default=float("nan")), 1),
        "neighbour_flood_max_us": round(max(beside, default=float("nan")), 1),
        "neighbour_flood_calls": len(beside),
        "neighbour_message_bytes": limits.message_bytes,
    }


async def settle(sandbox: Sandbox) -> None:
    while sandbox._refilling:  # noqa: SLF001 - measurement only
        await asyncio.sleep(0.005)


async def cold_acquire_ms(reps: int) -> float:
    """Acquire without spares: fork from the template, apply the layers, read the hello."""
    with Sandbox(SandboxLimits(), spares=0) as sandbox:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            session = await sandbox.acquire(dispatch)
            times.append((time.perf_counter() - t) * 1e3)
            await session.close()
    return statistics.median(times)


async def measure(sandbox: Sandbox, reps: int) -> dict[str, float]:
    acquire, empty, api, api_mean, hundred, rss, pss, track = [], [], [], [], [], [], [], []
    for _ in range(reps):
        await settle(sandbox)
        t = time.perf_counter()
        session = await sandbox.acquire(dispatch)
        acquire.append((time.perf_counter() - t) * 1e3)
        await settle(sandbox)  # the spare refill forks in the background; keep it out of the cell timings
        await session.execute("pass", "<cell-0>")  # warm
        for i in range(20):
            t = time.perf_counter()
            await session.execute("pass", f"<cell-{i + 1}>")
            empty.append((time.perf_counter() - t) * 1e3)
        p50, mean = (await session.execute(API_LOOP, "<cell-9>")).observation.split()
        api.append(float(p50))
        api_mean.append(float(mean))
        t = time.perf_counter()
        await session.execute("for _ in range(100):\n    apis.bench.ping(i=1)", "<cell-10>")
        hundred.append((time.perf_counter() - t) * 1e3)
        track.append(float((await session.execute(TRACKING, "<cell-11>")).observation))
        pid = session._worker.pid  # noqa: SLF001 - measurement only
        rss.append(_proc_kb(pid, "status", "VmHWM:") / 1024)
        pss.append(_proc_kb(pid, "smaps_rollup", "Pss:") / 1024)
        await session.close()
    med = statistics.median
    return {
        "acquire_ms": round(med(acquire), 3),
        "empty_cell_ms": round(med(empty), 3),
        "api_call_us": round(med(api), 1),
        "api_call_mean_us": round(med(api_mean), 1),
        "cell_100_api_calls_ms": round(med(hundred), 3),
        "tracking_overhead_ns_per_call": round(med(track)),
        "worker_peak_rss_mb": round(med(rss), 1),
        "worker_pss_mb": round(med(pss), 1),
    }


def pocket_env(sandbox: Sandbox) -> PocketWorldEnv:
    """A PocketWorld environment whose cells run in ``sandbox``."""
    return PocketWorldEnv(SandboxExecutors(sandbox))


async def episode(sandbox: Sandbox) -> float:
    """Seconds for one episode: reset, the task's reference solution, evaluate, close."""
    task = tasks.task_by_id(EPISODE_TASK)
    t = time.perf_counter()
    env = pocket_env(sandbox)
    await env.reset(task)
    await env.execute(tasks.reference_solution(task), "<cell-0>")
    outcome = await env.evaluate()
    await env.close()
    assert outcome.success
    return time.perf_counter() - t


async def thread_hop_episode(sandbox: Sandbox, loop: asyncio.AbstractEventLoop) -> float:
    """``episode`` along the path removed in issue 12: every step in a worker thread that waits
    for the session on a private event-loop thread (two thread hops per call)."""
    task = tasks.task_by_id(EPISODE_TASK)

    def hop(coro):
        return asyncio.to_thread(lambda: asyncio.run_coroutine_threadsafe(coro, loop).result())

    def reset():
        world = tasks.world_for(task)
        initial = world.snapshot()
        return world, initial, asyncio.run_coroutine_threadsafe(sandbox.acquire(world.call), loop).result()

    t = time.perf_counter()
    world, initial, session = await asyncio.to_thread(reset)
    await hop(session.execute(tasks.reference_solution(task), "<cell-0>"))
    outcome = tasks.evaluate_task(task, initial, world)
    await hop(session.close())
    assert outcome.success
    return time.perf_counter() - t


async def env_cells_ms(sandbox: Sandbox, reps: int) -> tuple[float, float]:
    """Median ms of an empty cell and of a cell with 10 API calls, through ``PocketWorldEnv``."""
    env = pocket_env(sandbox)
    await env.reset(tasks.task_by_id(EPISODE_TASK))
    await env.execute("pass", "<cell-0>")
    empty, ten = [], []
    for i in range(reps):
        t = time.perf_counter()
        await env.execute("pass", f"<cell-{i + 1}>")
        empty.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        await env.execute("for _ in range(10):\n    apis.supervisor.show_profile()", f"<cell-{i + 1}>")
        ten.append((time.perf_counter() - t) * 1e3)
    await env.close()
    return statistics.median(empty), statistics.median(ten)


async def measure_episodes(sandbox: Sandbox, reps: int) -> dict[str, float]:
    empty, ten = await env_cells_ms(sandbox, 20)
    await episode(sandbox)  # warm
    private = asyncio.new_event_loop()
    threading.Thread(target=private.run_forever, daemon=True).start()
    one, four, hop = [], [], []
    for i in range(reps):
        for direct in (True, False) if i % 2 else (False, True):  # neither always runs first
            await settle(sandbox)
            if direct:
                one.append(await episode(sandbox) * 1e3)
            else:
                hop.append(await thread_hop_episode(sandbox, private) * 1e3)
        await settle(sandbox)
        t = time.perf_counter()
        await asyncio.gather(*(episode(sandbox) for _ in range(4)))
        four.append((time.perf_counter() - t) * 1e3)
    private.call_soon_threadsafe(private.stop)
    med = statistics.median
    return {
        "env_empty_cell_ms": round(empty, 3),
        "env_cell_10_api_calls_ms": round(ten, 3),
        "episode_ms": round(med(one), 2),
        "episodes_x4_ms": round(med(four), 2),
        "episode_thread_hop_ms": round(med(hop), 2),
        "ratio_episode_direct_over_thread_hop": round(med(one) / med(hop), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--episodes-only", action="store_true", help="only the PocketWorld episode figures")
    parser.add_argument(
        "--neighbour-rounds", type=int, default=3, help="0 skips the hostile-neighbour figure"
    )
    parser.add_argument("--only-neighbour", action="store_true", help="measure only the neighbour figure")
    args = parser.parse_args()
    if args.episodes_only or args.only_neighbour:
        if args.episodes_only:
            with Sandbox(SandboxLimits()) as sandbox:
                result = asyncio.run(measure_episodes(sandbox, args.reps))
        else:
            result = asyncio.run(neighbour(max(1, args.neighbour_rounds)))
        result["load_avg_1m"] = os.getloadavg()[0]
        print(json.dumps(result))
        return
    t = time.perf_counter()
    with Sandbox(SandboxLimits()) as sandbox:
        result = asyncio.run(measure(sandbox, args.reps))
        result |= asyncio.run(measure_episodes(sandbox, args.reps))
        assert sandbox.isolation is not None
        result["isolation"] = sandbox.isolation.level
    result["acquire_cold_ms"] = round(asyncio.run(cold_acquire_ms(max(5, args.reps // 2))), 3)
    if args.neighbour_rounds:
        result.update(asyncio.run(neighbour(args.neighbour_rounds)))
    result["socketpair_floor_us"] = round(socketpair_floor_us(), 1)
    result["load_avg_1m"] = os.getloadavg()[0]
    result["reps"] = args.reps
    result["total_s"] = round(time.perf_counter() - t, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
