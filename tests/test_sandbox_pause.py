"""A parent stopped and continued (``kill -STOP`` / ``-CONT``, Ctrl-Z and ``fg``) while a cell waits
for its answer: the stop is no one's time (sage_rl/sandbox/pauses.py). Before, the parent's deadline
expired during the stop and killed the worker (its namespace lost), and the worker's own clock charged
its wait on the stopped parent to the cell."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The cell asks the parent to have itself stopped 0.2 s later for STOP_S seconds, then waits 0.5 s
# (its own time), then calls the API again: that call waits on the stopped parent. The limits: 1 s a
# cell, the parent's kill deadline at most 2 x 1 + 2 s: both long past when the parent continues.
SCRIPT = """
import os, subprocess, sys
from test_sandbox_support import TEST_LIMITS, FakeWorld, run
from sage_rl.sandbox.pool import Sandbox

stop_s = float(sys.argv[1])

class PausingWorld(FakeWorld):
    def dispatch(self, app, api, kwargs):
        if (app, api) == ("clock", "pause"):
            pid = os.getpid()
            subprocess.Popen(["sh", "-c", f"sleep 0.2; kill -STOP {pid}; sleep {stop_s}; kill -CONT {pid}"])
            return None
        return super().dispatch(app, api, kwargs)

cell = "apis.clock.pause()\\nimport time\\ntime.sleep(0.5)\\nprint(x, apis.bank.balance())"
with Sandbox(TEST_LIMITS) as sb:
    first, second, third = run(sb, ["x = 7", cell, "print(x + 1)"], PausingWorld())
print(repr((second.ok, second.timed_out, second.observation, third.observation)))
"""


def _run(stop_s: float) -> tuple[bool, bool, str, str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(stop_s)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])  # a repr of strs and bools


def test_a_stopped_parent_does_not_time_out_the_cell_in_flight():
    ok, timed_out, observation, after = _run(6.0)
    assert (ok, timed_out, observation) == (True, False, "7 100\n"), observation
    assert after == "8\n"  # the same worker: its namespace lives on


def test_the_limit_still_holds_without_a_stop():
    # the control: the same cell with a 1 s limit and no stop (0.5 s of its own time); code past its
    # limit still times out (tests/test_sandbox_limits.py)
    ok, timed_out, observation, _ = _run(0.0)
    assert (ok, timed_out, observation) == (True, False, "7 100\n")
