"""Scenario templates and splits: reference solutions pass, no-op and wrong answers fail, ids are stable."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys

import pytest
from pocket import SyncEnv

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.generator import build_world
from sage_rl.envs.pocketworld.scenarios import TEMPLATES, templates
from sage_rl.envs.pocketworld.scenarios.base import SPLITS
from sage_rl.envs.pocketworld.world import world_hash
from sage_rl.text import dumps
from sage_rl.types import Outcome, Task, skill_origin

EVAL_SPLITS = ("dev", "test_normal", "test_challenge")


def _run(task: Task, *cells: str) -> tuple[Outcome, bool]:
    env = SyncEnv()
    env.reset(task)
    result = None
    for i, code in enumerate(cells, start=1):
        result = env.execute(code, f"<cell-{i}>")
        assert result.ok, f"{task.task_id}: {result.observation}"
    return env.evaluate(), bool(result and result.completed)


def test_template_inventory_and_split_rules():
    assert len(TEMPLATES) >= 48 and len({t.name for t in TEMPLATES}) == len(TEMPLATES)
    assert len(templates("train")) >= 24
    assert all(len(templates(s)) >= 8 for s in EVAL_SPLITS)
    train_apps = {a for t in templates("train") for a in t.apps}
    for t in templates("dev") + templates("test_normal"):
        assert set(t.apps) <= train_apps, t.name
    for t in templates("test_challenge"):
        assert set(t.apps) - train_apps, f"{t.name} uses only train apps"
    for t in TEMPLATES:
        assert t.split in SPLITS and 1 <= t.difficulty <= 3 and len(t.phrasings) >= 3, t.name
        assert t.skill_names and all(f"def {n}(" in t.skill_source for n in t.skill_names), t.name


@pytest.mark.parametrize("split", EVAL_SPLITS)
def test_evaluation_split_reference_passes_all_noop_and_wrong_answer_pass_none(split):
    ts = tasks.split_tasks(split)
    assert len(ts) == 3 * len(templates(split))
    assert [t.task_id for t in ts[:3]] == [f"{templates(split)[0].name}_{n}" for n in (1, 2, 3)]
    for t in ts:
        ok, completed = _run(t, tasks.reference_solution(t))
        assert ok.success and completed, (t.task_id, ok)
        assert not _run(t)[0].success, t.task_id
        assert not _run(t, "apis.supervisor.complete_task(answer='wrong')")[0].success, t.task_id


def test_reference_passes_on_200_sampled_train_instances():
    rng = random.Random(2024)
    seen = set()
    for _ in range(67):
        for t in tasks.sample_chain(rng, 3):
            seen.add(t.spec["template"])
            outcome, completed = _run(t, tasks.reference_solution(t))
            assert outcome.success and completed, (t.task_id, outcome)
    assert len(seen) >= 20  # the sample covers most train templates


def test_skill_defined_once_solves_the_other_tasks_of_the_scenario():
    """The scripted expert's pattern: define the skills (as a library would), then only call them."""
    for template in TEMPLATES:
        task = tasks.scenario_tasks(template, 0 if template.split != "train" else 5, length=2)[1]
        env = SyncEnv()
        env.reset(task)
        lib = env.execute(template.full_skill_source, skill_origin(template.skill_names[-1]))
        assert lib.ok and set(template.all_skill_names) <= set(lib.defined), template.name
        result = env.execute(template.call_code(task.spec["params"]), "<cell-1>")
        assert result.ok and env.evaluate().success, (task.task_id, result.observation)
        used = {c.name for c in result.calls if c.from_library}
        assert template.skill_names[-1] in used, (template.name, result.calls)


def test_tasks_are_deterministic_and_ids_round_trip():
    a = tasks.split_tasks("dev")
    b = tuple(tasks.task_by_id(t.task_id) for t in a)
    assert [dumps(x) for x in a] == [dumps(x) for x in b]
    chain = tasks.sample_chain(random.Random(5), 2)
    assert [dumps(t) for t in chain] == [dumps(tasks.task_by_id(t.task_id)) for t in chain]
    assert chain[0].scenario_id == chain[1].scenario_id and [t.position for t in chain] == [1, 2]
    assert (
        len({t.instruction for t in tasks.split_tasks("test_normal")[:3]}) == 3
    )  # different phrasings/params
    with pytest.raises(KeyError, match="unknown task id"):
        tasks.task_by_id("no_such_template_1")
    with pytest.raises(KeyError, match="need a scenario seed"):
        tasks.task_by_id(f"{templates('train')[0].name}_1")


def test_worlds_and_tasks_do_not_depend_on_the_process_hash_seed():
    script = (
        "import hashlib; from sage_rl.text import dumps; from sage_rl.envs.pocketworld import tasks;"
        "from sage_rl.envs.pocketworld.generator import build_world; from sage_rl.envs.pocketworld.world import world_hash;"
        "print(world_hash(build_world(99)), hashlib.sha256(''.join(dumps(t) for t in tasks.split_tasks('dev')).encode()).hexdigest())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout  # fmt: skip
        for seed in ("1", "2")
    }
    here = hashlib.sha256("".join(dumps(t) for t in tasks.split_tasks("dev")).encode()).hexdigest()
    assert outs == {f"{world_hash(build_world(99))} {here}\n"}
