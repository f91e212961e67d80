"""PocketWorld as a ``sage_rl.envs.base`` Environment and Suite.

The environment owns the World; agent code reaches it only through ``world.call`` behind the
executor's ``apis`` proxy. Evaluation compares the world with a snapshot taken at reset, which
agent code never sees. Cells go straight to the executor (the sandbox's async ``Session`` by
default): one async path, no thread in between.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.executor import IN_PROCESS, Executor, Executors
from sage_rl.envs.pocketworld.world import Db, World
from sage_rl.types import ExecResult, Outcome, Task


class PocketWorldEnv:
    """One live PocketWorld episode at a time. ``executors`` is the seam the sandbox plugs into."""

    def __init__(self, executors: Executors = IN_PROCESS) -> None:
        self._executors = executors
        self.reports_calls: bool = executors.reports_calls
        self._task: Task | None = None
        self._world: World | None = None
        self._initial: Db | None = None
        self._executor: Executor | None = None

    async def reset(self, task: Task) -> None:
        await self.close()
        self._task = task
        self._world = tasks.world_for(task)
        self._initial = self._world.snapshot()
        self._executor = await self._executors.open(self._world.call)

    async def execute(self, code: str, origin: str) -> ExecResult:
        if self._executor is None or self._world is None:
            raise RuntimeError("PocketWorldEnv.execute before reset")
        result = await self._executor.execute(code, origin)
        return dataclasses.replace(result, completed=self._world.completed)

    async def evaluate(self) -> Outcome:
        if self._task is None or self._world is None or self._initial is None:
            raise RuntimeError("PocketWorldEnv.evaluate before reset")
        return tasks.evaluate_task(self._task, self._initial, self._world)

    @property
    def completed(self) -> bool:
        return self._world is not None and self._world.completed

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await executor.close()


class PocketWorldSuite:
    """PocketWorld's tasks: fixed evaluation splits and unlimited train chains.

    It owns nothing that needs closing: the sandbox behind ``executors`` belongs to whoever made it.
    """

    name = "pocketworld"
    prompt_dir = None  # the agent's default templates

    def __init__(self, executors: Executors = IN_PROCESS) -> None:
        self._executors = executors

    def split(self, split: str) -> tuple[Task, ...]:
        return tasks.split_tasks(split)

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        return tasks.sample_chain(rng, length, split)

    def worked_example(self, template: str = "phone_count_relationship") -> tuple[str, tuple[str, ...]]:
        """(instruction, code cells) of a solved *train* task, for the prompt's worked example.

        Only train templates qualify: an example from an evaluation split would leak its solution.
        """
        tpl = tasks.BY_NAME[template]
        if tpl.split != "train":
            raise ValueError(
                f"worked examples must come from a train template, not {tpl.split!r} ({template})"
            )
        task = tasks.scenario_tasks(tpl, 1, 1)[0]
        return task.instruction, (tasks.reference_solution(task),)

    async def open(self) -> PocketWorldEnv:
        return PocketWorldEnv(self._executors)

    def record_to(self, run_dir: Path, variant: str | None = None) -> None:
        """PocketWorld keeps nothing beyond sage-rl's own trajectories."""
        return None

    async def close(self) -> None:
        """Nothing to release (environments are closed by whoever opened them)."""
