"""The Environment protocol: what the agent loop, evaluation, collection and training talk to.

Two levels:
- a ``Suite`` is a family of tasks and the means to run them (PocketWorld, AppWorld). It lists
  fixed evaluation splits, samples unlimited training chains where it can, and opens live
  environments. It has a lifetime: whoever makes one closes it (``await suite.close()``; the
  composition root does this with ``build.open_suite``);
- an ``Environment`` is one live episode: reset to a task, execute code cells, evaluate.

One ``Environment`` serves one episode at a time; concurrency comes from opening several.
Capabilities are declared here, not probed: ``Environment.reports_calls``, ``Suite.prompt_dir``,
``Suite.worked_example``.
"""

from __future__ import annotations

import random
from pathlib import Path
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
        ``<skill:NAME>``); it ends up in call records. Agent-code failures come back in the
        result; an exception means the environment itself failed."""
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
    #: The folder of the agent's prompt templates for this suite's tasks (the same files and
    #: variables as ``sage_rl/agent/prompts``), or None for those defaults.
    prompt_dir: Path | None

    def split(self, split: str, limit: int | None = None) -> tuple[Task, ...]:
        """A fixed evaluation split, ordered by scenario then position; ``limit``: only its first N
        scenarios (a suite that builds its tasks builds only those)."""
        ...

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        """``length`` tasks of one scenario, in order (a SAGE chain)."""
        ...

    def worked_example(self) -> tuple[str, tuple[str, ...]] | None:
        """(instruction, code cells) of a solved *train* task to show in the prompt, or None."""
        ...

    async def open(self) -> Environment:
        """A new live environment (its own sandbox worker / world process)."""
        ...

    def record_to(self, run_dir: Path, variant: str | None = None) -> Path | None:
        """From now on, keep the environment's own per-task outputs of evaluated episodes under
        ``run_dir`` (AppWorld: the layout its evaluator reads), as ``variant`` when several runs
        share the folder. Returns where they go, or None when the environment has none to keep."""
        ...

    async def close(self) -> None:
        """Release what the suite holds (worker zygotes, temporary folders). Environments it
        opened must be closed first."""
        ...
