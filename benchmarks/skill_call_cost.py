"""What a library skill's call costs agent code under the ``flow`` credit, against the same function
defined by the cell (call records only). Prints one JSON object.

    .venv/bin/python benchmarks/skill_call_cost.py [--rows 1000] [--calls 300] [--reps 3]

A library skill's call reads the atoms of its arguments when it starts (not the skill's to
provide) and of its value when it returns (``sandbox/flow.py``); a cell's own function only counts
its calls. The cell below calls ``lookup(rows, name)`` ``--calls`` times over ``--rows`` dict rows
(ids, names, e-mails, notes with commas), timed inside the worker (the time agent code sees, which
counts against the cell's limit): ``skill_ms`` (compiled as ``<skill:lookup>``), ``cell_ms`` (the
same source in the cell), their ``ratio_skill_over_cell``, and the per-call ``skill_us_per_call``.
Medians over ``--reps`` fresh sessions. Session 39: 2.53 s for 300 calls over 1,000 rows when every
argument atom was normalised per call, 1.09 s with the keys memoised and built only when the value
holds atoms, 0.55 s before the argument rule (docs/LOG.md). Session 42's check of the shared state
(``sandbox/shared.py``) at each call's start was not measurable here (``--rows 10 --calls 3000``: about
100 us a call with it and without it, beside an experiment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from sage_rl.sandbox import Sandbox, SandboxLimits
from sage_rl.types import skill_origin

SOURCE = "def lookup(rows, name):\n    return [r for r in rows if r['name'] == name]\n"
CELL = """import time
rows = [{{"id": 1000 + i, "name": f"Person {{i}}", "email": f"p{{i}}@x.com",
         "note": f"met on day {{i}}, at the cafe, with Bob"}} for i in range({rows})]
t = time.perf_counter()
found = sum(len(lookup(rows, f"Person {{i % {rows}}}")) for i in range({calls}))
print(found, time.perf_counter() - t)
"""


async def _time(sandbox: Sandbox, as_skill: bool, rows: int, calls: int) -> float:
    session = await sandbox.acquire(lambda app, api, kwargs: None)
    try:
        prefix = ""
        if as_skill:
            assert (await session.execute(SOURCE, skill_origin("lookup"))).ok
        else:
            prefix = SOURCE
        r = await session.execute(prefix + CELL.format(rows=rows, calls=calls), "<cell-0>")
        found, seconds = r.observation.split()
        assert r.ok and int(found) == calls, r.observation
        return float(seconds)
    finally:
        await session.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    limits = SandboxLimits(wall_timeout_s=120, kill_grace_s=5, cpu_seconds=120)
    with Sandbox(limits) as sandbox:
        skill = [asyncio.run(_time(sandbox, True, a.rows, a.calls)) for _ in range(a.reps)]
        cell = [asyncio.run(_time(sandbox, False, a.rows, a.calls)) for _ in range(a.reps)]
    s, c = statistics.median(skill), statistics.median(cell)
    out = {
        "rows": a.rows,
        "calls": a.calls,
        "skill_ms": round(s * 1e3, 1),
        "cell_ms": round(c * 1e3, 1),
        "ratio_skill_over_cell": round(s / c, 2),
        "skill_us_per_call": round(s / a.calls * 1e6, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
