"""The sandbox's per-cell time limits: the wall clock and the CPU seconds. A cell that hits one
times out with a message naming it, and the worker, its namespace and the next cell live on."""

from __future__ import annotations

import asyncio

import pytest
from test_sandbox_support import (
    TEST_LIMITS,
    FakeWorld,
    rules_off,  # noqa: F401  (a fixture, used by name below)
    run,
)

from sage_rl.sandbox import Sandbox

# The limits must hold for any code, below the rules agent code lives under (sandbox/rules.py).
pytestmark = pytest.mark.usefixtures("rules_off")


def test_timeout_in_python_keeps_the_namespace(sandbox):
    r = run(sandbox, ["x = 5", "import time\nwhile True:\n    time.sleep(0.01)", "print(x)"])
    assert r[1].timed_out and not r[1].ok
    assert "timed out after 1 s (wall-clock time limit per cell)" in r[1].observation
    assert r[2].observation == "5\n"


def test_an_answer_read_late_by_a_blocked_event_loop_is_not_a_timeout(sandbox):
    """The cell answers at 0.3 s; the event loop is blocked (as by a long synchronous model step)
    until past the parent's deadline (wall_timeout_s + kill_grace_s = 3 s). When it wakes, the
    answer and the deadline are both due; asyncio reads the answer first, then runs the deadline."""
    import time

    async def go():
        session = await sandbox.acquire(FakeWorld().dispatch)
        try:
            await session.execute("x = 5", "<cell-0>")

            async def block():
                await asyncio.sleep(0.15)
                time.sleep(TEST_LIMITS.wall_timeout_s + TEST_LIMITS.kill_grace_s + 0.5)

            cell, _ = await asyncio.gather(
                session.execute("import time\ntime.sleep(0.3)\nprint('done', x)", "<cell-1>"), block()
            )
            return cell, await session.execute("print(x)", "<cell-2>"), session.restarts
        finally:
            await session.close()

    cell, after, restarts = asyncio.run(go())
    assert cell.ok and not cell.timed_out and cell.observation == "done 5\n", cell.observation
    assert after.observation == "5\n" and restarts == 0


def test_cpu_limit_per_cell():
    """Each cell gets at least its own cpu_seconds, whatever fraction of a second the worker had
    already used: the park cell leaves the worker's CPU clock just short of a whole second, where a
    truncated soft limit would leave the next cell a few ms. (CI failure at 7023ed9.)"""
    limits = TEST_LIMITS.model_copy(update={"cpu_seconds": 1, "wall_timeout_s": 30.0})
    park = "import time\nwhile time.process_time() % 1 < 0.97:\n    pass"
    work = "t = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\nprint(x)"
    with Sandbox(limits) as sb:
        r = run(sb, ["x = 3", park, work, "while True:\n    pass", park, work])
    assert [c.timed_out for c in r] == [False, False, False, True, False, False]
    assert "used more than 1 CPU seconds (CPU time limit per cell)" in r[3].observation
    assert r[2].observation == r[5].observation == "3\n"
