"""The Environment protocol: what the agent loop, evaluation, collection and training talk to.

Two levels:
- a ``Suite`` is a family of tasks and the means to run them (PocketWorld, AppWorld). It lists
  fixed evaluation splits, samples unlimited training chains where it can, and opens live
  environments;
- an ``Environment`` is one live episode: reset to a task, execute code cells, evaluate.

One ``Environment`` serves one episode at a time; concurrency comes from opening several.
"""

from __future__ import annotations

import random
from typing import Protocol, runtime_checkable

from sage_rl.types import ExecResult, Outcome, Task


@runtime_checkable
class Environment(Protocol):
    #: True when ``ExecResult.calls`` is reported (sandbox call records); False means skill
    #: usage must be detected statically (SAGE.md section 2).
    reports_calls: bool

    async def reset(self, task: Task) -> None:
        """Start ``task`` in a fresh world and a fresh interpreter namespace."""
        ...

    async def execute(self, code: str, origin: str) -> ExecResult:
        """Run one code cell. ``origin`` is the filename to compile it with (``<cell-N>`` or
        ``<skill:NAME>``); it ends up in call records."""
        ...

    async def evaluate(self) -> Outcome:
        """Score the current world state against the task's checks. Agent code cannot reach it."""
        ...

    @property
    def completed(self) -> bool:
        """True once the agent called ``apis.supervisor.complete_task``."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Suite(Protocol):
    name: str

    def split(self, split: str) -> tuple[Task, ...]:
        """A fixed evaluation split, ordered by scenario then position."""
        ...

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        """``length`` tasks of one scenario, in order (a SAGE chain)."""
        ...

    async def open(self) -> Environment:
        """A new live environment (its own sandbox worker / world process)."""
        ...
