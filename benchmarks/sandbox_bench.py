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
import time

from sage_rl.sandbox import Sandbox, SandboxLimits

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
    "g = eval(compile('lambda x: x', 'plain', 'eval'))\n"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument(
        "--neighbour-rounds", type=int, default=3, help="0 skips the hostile-neighbour figure"
    )
    parser.add_argument("--only-neighbour", action="store_true", help="measure only the neighbour figure")
    args = parser.parse_args()
    if args.only_neighbour:
        result = asyncio.run(neighbour(max(1, args.neighbour_rounds)))
        result["load_avg_1m"] = os.getloadavg()[0]
        print(json.dumps(result))
        return
    t = time.perf_counter()
    with Sandbox(SandboxLimits()) as sandbox:
        result = asyncio.run(measure(sandbox, args.reps))
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
