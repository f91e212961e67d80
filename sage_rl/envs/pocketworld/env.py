"""PocketWorld as a ``sage_rl.envs.base`` Environment and Suite.

The environment owns the World; agent code reaches it only through ``world.call`` behind the
executor's ``apis`` proxy. Evaluation compares the world with a snapshot taken at reset, which
agent code never sees. Cells go straight to the executor (the sandbox's async ``Session`` by
default): one async path, no thread in between.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sage_rl.envs.pocketworld import checks, tasks
from sage_rl.envs.pocketworld.api import ApiError
from sage_rl.envs.pocketworld.executor import IN_PROCESS, Executor, Executors
from sage_rl.envs.pocketworld.scenarios.base import TASKS_PER_SCENARIO
from sage_rl.envs.pocketworld.world import Db, World
from sage_rl.types import SKILL_ORIGIN_PREFIX, ExecResult, Outcome, Task

#: What a library skill's definition gets for an API call while the library loads: a default value,
#: a decorator or an annotation that calls ``apis`` would run before every later task's first turn
#: (``def f(x=apis.supervisor.complete_task(answer='planted'))`` completed the task unseen).
LOADING = "a library skill's definition may not call apis (it would run before every later task)"


class PocketWorldEnv:
    """One live PocketWorld episode at a time. ``executors`` is the seam the sandbox plugs into."""

    def __init__(self, executors: Executors = IN_PROCESS) -> None:
        self._executors = executors
        self.reports_calls: bool = executors.reports_calls
        self._task: Task | None = None
        self._world: World | None = None
        self._initial: Db | None = None
        self._executor: Executor | None = None
        self._state = b""  # the world's fingerprint after the last successful call
        self._steps: list[dict[checks.Field, Any]] = []  # the fields each change set, and to what
        self._loading = False  # a library skill's definition is running (its origin is <skill:...>)

    async def reset(self, task: Task) -> None:
        await self.close()
        self._task = task
        self._world = tasks.world_for(task)
        self._initial = self._world.snapshot()
        self._state, self._steps = self._world.fingerprint(), []
        self._executor = await self._executors.open(self._call, self._changes)

    def _call(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        """``world.call``, noting the fields a call that changed the world set, and to what (a
        failed call changes nothing), so that ``evaluate`` can say which changes lasted."""
        assert self._world is not None
        if self._loading:
            raise ApiError(403, LOADING)
        value = self._world.call(app, api, kwargs)
        state = self._world.fingerprint()
        if state != self._state:  # both states as copies: later calls mutate the world in place
            self._steps.append(checks.touched(pickle.loads(self._state), pickle.loads(state)))
            self._state = state
        return value

    def _changes(self) -> int:
        """The executors' fingerprint: the number of changes so far (equal: the same state), so
        that their n-th change is ``_steps[n - 1]``."""
        return len(self._steps)

    async def execute(self, code: str, origin: str) -> ExecResult:
        if self._executor is None or self._world is None:
            raise RuntimeError("PocketWorldEnv.execute before reset")
        self._loading = origin.startswith(SKILL_ORIGIN_PREFIX)
        try:
            result = await self._executor.execute(code, origin)
        finally:
            self._loading = False
        return dataclasses.replace(result, completed=self._world.completed)

    async def evaluate(self) -> Outcome:
        if self._task is None or self._world is None or self._initial is None:
            raise RuntimeError("PocketWorldEnv.evaluate before reset")
        outcome = tasks.evaluate_task(self._task, self._initial, self._world)
        return dataclasses.replace(
            outcome, lasting=checks.lasting(self._steps, self._initial, self._world.db)
        )

    @property
    def completed(self) -> bool:
        return self._world is not None and self._world.completed

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await executor.close()


#: The splits a template scope narrows: the train templates' own (``dev`` and the test splits hold
#: other templates, which a scope of train templates leaves as they are).
SCOPED_SPLITS = ("train", *tasks.SEEDED_SPLITS)


def check_scope(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a scope of train templates; a ``ValueError`` naming the first one that is not a
    train template (or a repeat, or an empty scope)."""
    train = [t.name for t in tasks.templates("train")]
    if not names:
        raise ValueError("a template scope needs at least one train template (null = all of them)")
    for name in names:
        if name not in train:
            raise ValueError(
                f"{name!r} is not a train template of pocketworld; choose from {', '.join(train)}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"templates repeat in {list(names)}")
    return tuple(names)


class PocketWorldSuite:
    """PocketWorld's tasks: fixed evaluation splits and unlimited train chains.

    ``templates`` (a scope of train templates, None = all) narrows ``train``, ``train_heldout`` and
    ``train_val`` to those templates: collection, RL rollouts, validation and held-out evaluation
    then draw only them (the main job's laptop curriculum, docs/recipe.md). It owns nothing that
    needs closing: the sandbox behind ``executors`` belongs to whoever made it.
    """

    name = "pocketworld"
    prompt_dir = None  # the agent's default templates

    def __init__(self, executors: Executors = IN_PROCESS, templates: Sequence[str] | None = None) -> None:
        self._executors = executors
        self._scope = None if templates is None else check_scope(templates)

    @property
    def train_templates(self) -> tuple[str, ...]:
        """The train templates this suite draws from (its scope, else all of them)."""
        return self._scope or tuple(t.name for t in tasks.templates("train"))

    def scoped(self, templates: Sequence[str]) -> PocketWorldSuite:
        """This suite narrowed to ``templates`` (same executors): a screened RL pool (issue 27)."""
        return PocketWorldSuite(self._executors, templates)

    @staticmethod
    def template_name(task: Task) -> str:
        """The template ``task`` was made from (a tracked RL pool counts outcomes by template)."""
        return tasks.template_of(task).name

    def split(self, split: str, limit: int | None = None) -> tuple[Task, ...]:
        return tasks.split_tasks(split, self._scope_of(split), limit)

    def scenario_ids(self, split: str, limit: int | None = None) -> tuple[str, ...]:
        """The ids of the scenarios ``split(split, limit)`` holds, in order, none built."""
        return tasks.scenarios_of_split(split, self._scope_of(split))[:limit]

    def _scope_of(self, split: str) -> tuple[str, ...] | None:
        """The scope narrows the train splits only (evaluation templates are never scoped)."""
        return self._scope if split in SCOPED_SPLITS else None

    def sample_chain(self, rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
        if self._scope is None or split not in SCOPED_SPLITS:
            return tasks.sample_chain(rng, length, split)
        if split == "train":  # as tasks.sample_chain, from the scope's templates only
            template = tasks.BY_NAME[self._scope[rng.randrange(len(self._scope))]]
            seed = rng.randrange(tasks.TRAIN_SEEDS.start, tasks.TRAIN_SEEDS.stop)
            return tasks.scenario_tasks(template, seed, length)
        if length > TASKS_PER_SCENARIO:
            raise ValueError(
                f"evaluation scenarios have {TASKS_PER_SCENARIO} tasks; asked for length={length}"
            )
        listed = tasks.listed_scenarios(split, self._scope)
        return tasks.scenario_tasks(*listed[rng.randrange(len(listed))], length)

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
