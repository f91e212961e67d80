"""Shared helpers for the sandbox tests: a fake world owned by the test process, and a runner.

The fake world is a dict in the parent (the "trainer"); the score is computed in the parent from
it. Hostile cells try to change it by any route but the public API.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from sage_rl.sandbox import Sandbox, SandboxLimits
from sage_rl.types import ExecResult

TEST_LIMITS = SandboxLimits(
    wall_timeout_s=1.0,
    kill_grace_s=2.0,  # generous: the tests run on a loaded, shared machine
    cpu_seconds=5,
    address_space_bytes=512 << 20,
    output_chars=2000,
    file_size_bytes=1 << 20,
    api_calls_per_cell=50,
)


class WorldError(Exception):
    """Like PocketWorld's ApiError: the message is what the agent should read."""


@dataclass
class FakeWorld:
    balance: int = 100
    completed: bool = False
    log: list[tuple[str, str]] = field(default_factory=list)
    secret_answer: str = "the-hidden-answer-7c1f"

    def dispatch(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        self.log.append((app, api))
        if (app, api) == ("bank", "balance"):
            return self.balance
        if (app, api) == ("bank", "deposit"):
            amount = kwargs.get("amount")
            if not isinstance(amount, int) or amount <= 0:
                raise WorldError(f"422: amount must be a positive integer, got {amount!r}")
            self.balance += amount
            return {"balance": self.balance}
        if (app, api) == ("supervisor", "complete_task"):
            self.completed = True
            return None
        raise WorldError(f"404: no API named {app}.{api}")

    def score(self) -> float:
        """The evaluation, in the parent: success iff exactly 50 was deposited and the task completed."""
        return 1.0 if self.balance == 150 and self.completed else 0.0


def run(sandbox: Sandbox, cells: list[str], world: FakeWorld | None = None) -> list[ExecResult]:
    """Execute ``cells`` in order in one fresh session (cell i has origin <cell-i>)."""

    async def go() -> list[ExecResult]:
        session = await sandbox.acquire((world or FakeWorld()).dispatch)
        try:
            return [await session.execute(code, f"<cell-{i}>") for i, code in enumerate(cells)]
        finally:
            await session.close()

    return asyncio.run(go())


def assert_trainer_unharmed(sandbox: Sandbox, world: FakeWorld, trainer_pid: int) -> None:
    """The trainer process is alive and unchanged, the world untouched, and the sandbox still serves."""
    assert os.getpid() == trainer_pid
    assert world.balance == 100 and not world.completed
    assert world.score() == 0.0
    fresh = run(sandbox, ["print(6 * 7)"])
    assert fresh[0].ok and fresh[0].observation == "42\n"


# -- shared by the hostile batteries (test_sandbox_hostile*.py) ------------------------------------

PID = os.getpid()
RESTARTED = "The interpreter was restarted"


def hostile(sandbox: Sandbox, world: FakeWorld, code: str, then: str = "print('still here', x)"):
    """Run ``x = 1``, the hostile cell, then ``then``; return (hostile result, follow-up result)."""
    r = run(sandbox, ["x = 1", code, then], world)
    assert r[0].ok
    return r[1], r[2]


def kept(follow: ExecResult) -> bool:
    """The follow-up cell found the namespace intact."""
    return follow.ok and follow.observation == "still here 1\n"


def restarted(follow: ExecResult) -> bool:
    """The follow-up cell ran in a fresh interpreter (the hostile cell's worker was replaced)."""
    return not follow.ok and "NameError: name 'x' is not defined" in follow.observation


@pytest.fixture(scope="module")
def sandbox():
    """One sandbox with ``TEST_LIMITS`` for each test module that asks for it (``conftest.py``)."""
    with Sandbox(TEST_LIMITS) as sb:
        yield sb


@pytest.fixture
def rules_off(monkeypatch):
    """The parent's check of the rules agent code lives under (sandbox/rules.py) switched off: for
    the tests of the layers below it (the OS isolation, the parent's limits on the channel), which
    must hold for any code, including code that breaks the rules."""
    monkeypatch.setattr("sage_rl.sandbox.session.refusal", lambda code: None)
