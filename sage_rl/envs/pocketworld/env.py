"""PocketWorld as a ``sage_rl.envs.base`` Environment and Suite.

The environment owns the World; agent code reaches it only through ``world.call`` behind the
executor's ``apis`` proxy. Evaluation compares the world with a snapshot taken at reset, which
agent code never sees.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.executor import Executor, InProcessExecutor
from sage_rl.envs.pocketworld.proxy import Dispatch
from sage_rl.envs.pocketworld.world import Db, World
from sage_rl.types import ExecResult, Outcome, Task

ExecutorFactory = Callable[[Dispatch], Executor]


class PocketWorldEnv:
    """One live PocketWorld episode. ``executor_factory`` is the seam the sandbox plugs into."""

    def __init__(self, executor_factory: ExecutorFactory = InProcessExecutor) -> None:
        self._factory = executor_factory
        #: whether ``ExecResult.calls`` holds call records: the executor class says so
        self.reports_calls: bool = bool(getattr(executor_factory, "reports_calls", False))
        #: sandbox sessions block on I/O and are thread-safe: run them off the event loop so that
        #: concurrent episodes (and the policy's batching) keep going while a cell runs
        self._offload: bool = bool(getattr(executor_factory, "blocking", False))
        self._task: Task | None = None
        self._world: World | None = None
        self._initial: Db | None = None
        self._executor: Executor | None = None

    async def reset(self, task: Task) -> None:
        if self._offload:
            await asyncio.to_thread(self.reset_sync, task)
        else:
            self.reset_sync(task)

    def reset_sync(self, task: Task) -> None:
        """Synchronous ``reset`` (for the CLI, tests and benchmarks)."""
        if self._executor is not None:
            self._executor.close()
        self._task = task
        self._world = tasks.world_for(task)
        self._initial = self._world.snapshot()
        self._executor = self._factory(self._world.call)

    async def execute(self, code: str, origin: str) -> ExecResult:
        if self._offload:
            return await asyncio.to_thread(self.execute_sync, code, origin)
        return self.execute_sync(code, origin)

    def execute_sync(self, code: str, origin: str) -> ExecResult:
        if self._executor is None or self._world is None:
            raise RuntimeError("PocketWorldEnv.execute before reset")
        result = self._executor.execute(code, origin)
        return dataclasses.replace(result, completed=self._world.completed)

    async def evaluate(self) -> Outcome:
        return self.evaluate_sync()

    def evaluate_sync(self) -> Outcome:
        if self._task is None or self._world is None or self._initial is None:
            raise RuntimeError("PocketWorldEnv.evaluate before reset")
        return tasks.evaluate_task(self._task, self._initial, self._world)

    @property
    def completed(self) -> bool:
        return self._world is not None and self._world.completed

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.close) if self._offload else executor.close()


class PocketWorldSuite:
    """PocketWorld's tasks: fixed evaluation splits and unlimited train chains."""

    name = "pocketworld"

    def __init__(self, executor_factory: ExecutorFactory = InProcessExecutor) -> None:
        self._factory = executor_factory

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
        return PocketWorldEnv(self._factory)
