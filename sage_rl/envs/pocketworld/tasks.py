"""Tasks from templates: fixed evaluation splits, unlimited train chains, ids, worlds, evaluation.

Task ids:
- evaluation splits: ``<template>_<n>`` (the scenario is the template, seed 0), n = 1, 2, 3;
- train: ``<template>-s<seed>_<n>`` (the scenario is the template with a scenario seed).
"""

from __future__ import annotations

import functools
import logging
import random
import re
from typing import Any

from sage_rl.envs.pocketworld.checks import evaluate
from sage_rl.envs.pocketworld.generator import build_world
from sage_rl.envs.pocketworld.scenarios import BY_NAME, templates
from sage_rl.envs.pocketworld.scenarios.base import SPLITS, TASKS_PER_SCENARIO, Template, make_task
from sage_rl.envs.pocketworld.world import Db, World
from sage_rl.types import CheckResult, Outcome, Task

log = logging.getLogger(__name__)

_TRAIN_ID = re.compile(r"^(?P<template>[a-z0-9_]+)-s(?P<seed>\d+)_(?P<n>\d+)$")
_EVAL_ID = re.compile(r"^(?P<template>[a-z0-9_]+)_(?P<n>\d+)$")


def scenario_tasks(template: Template, seed: int, length: int = TASKS_PER_SCENARIO) -> tuple[Task, ...]:
    """The first ``length`` tasks of scenario (template, seed). Seed 0 of an evaluation template is
    its fixed scenario ``<template>``; anything else is ``<template>-s<seed>``."""
    fixed = template.split != "train" and seed == 0
    sid = template.name if fixed else f"{template.name}-s{seed}"
    return tuple(make_task(template, sid, seed, n, template.split) for n in range(1, length + 1))


@functools.cache
def split_tasks(split: str) -> tuple[Task, ...]:
    """A fixed evaluation split (3 tasks per template, ordered by scenario then position).
    For ``train`` it returns scenario seed 0 of every train template (a sample, not the whole split)."""
    return tuple(t for tpl in templates(split) for t in scenario_tasks(tpl, 0))


def sample_chain(rng: random.Random, length: int, split: str = "train") -> tuple[Task, ...]:
    """``length`` tasks of one scenario. Train: a random template and scenario seed (unlimited);
    evaluation splits: one of the fixed scenarios (``length`` <= 3)."""
    pool = templates(split)
    template = pool[rng.randrange(len(pool))]
    if split == "train":
        return scenario_tasks(template, rng.randrange(1, 2**31), length)
    if length > TASKS_PER_SCENARIO:
        raise ValueError(f"evaluation scenarios have {TASKS_PER_SCENARIO} tasks; asked for length={length}")
    return scenario_tasks(template, 0, length)


def task_by_id(task_id: str) -> Task:
    """Rebuild a task from its id (``<template>_<n>`` or ``<template>-s<seed>_<n>``)."""
    m = _TRAIN_ID.match(task_id) or _EVAL_ID.match(task_id)
    if m is None or m.group("template") not in BY_NAME:
        raise KeyError(
            f"unknown task id {task_id!r}; ids are <template>_<n> or <template>-s<seed>_<n> (see `world list`)"
        )
    template, n = BY_NAME[m.group("template")], int(m.group("n"))
    seed = int(m.groupdict().get("seed") or 0)
    if seed == 0 and template.split == "train" and "seed" not in m.groupdict():
        raise KeyError(f"train task ids need a scenario seed: {template.name}-s<seed>_<n>")
    if n < 1:
        raise KeyError(f"task id {task_id!r}: positions count from 1")
    return make_task(template, task_id.rsplit("_", 1)[0], seed, n, template.split)


def template_of(task: Task) -> Template:
    return BY_NAME[task.spec["template"]]


def world_for(task: Task) -> World:
    """A fresh world for ``task`` (deterministic from its spec)."""
    return build_world(int(task.spec["seed"]))


def evaluate_task(task: Task, initial: Db, world: World) -> Outcome:
    """Score ``world`` (after the agent ran) against ``task``'s oracle computed on ``initial``.

    Never raises for anything agent code did: the oracle reads only the initial state, and a final
    state or answer that the checks cannot digest is a failing check that says why (it is also
    logged with its traceback, in case the cause is a bug of the checks rather than the agent)."""
    expect = template_of(task).expect(initial, task.spec["params"])
    try:
        return evaluate(expect, initial, world.db, world.answer)
    except Exception as e:  # noqa: BLE001 - whatever the agent left behind is scored, not raised
        log.warning("task %s: evaluation failed on the final state", task.task_id, exc_info=True)
        detail = f"the final state or answer could not be evaluated: {type(e).__name__}: {str(e)[:200]}"
        return Outcome.from_checks((CheckResult("evaluation", False, detail),))


def reference_solution(task: Task) -> str:
    return template_of(task).solution(task.spec["params"])


def split_names() -> tuple[str, ...]:
    return SPLITS


def stats() -> dict[str, Any]:
    from sage_rl.envs.pocketworld.apps import APPS

    return {
        "apps": {name: len(app.apis) for name, app in APPS.items()},
        "num_apis": sum(len(a.apis) for a in APPS.values()),
        "scenarios": {s: len(templates(s)) for s in SPLITS},
        "tasks": {
            s: ("unlimited" if s == "train" else TASKS_PER_SCENARIO * len(templates(s))) for s in SPLITS
        },
    }
