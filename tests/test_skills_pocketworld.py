"""The skill library against the real PocketWorld executor (its call tracer, not tests/skill_exec.py):
for every train template, task 1's reference solution is extracted, the library is loaded into task
2's interpreter, and task 2's call is credited to the template's skills by both detectors."""

from __future__ import annotations

import dataclasses

import pytest
from pocket import SyncEnv

from sage_rl.envs.pocketworld.scenarios import templates
from sage_rl.envs.pocketworld.tasks import reference_solution, scenario_tasks
from sage_rl.skills import (
    Library,
    Provenance,
    Tier,
    extract_skills,
    used_skills_from_calls,
    used_skills_static,
)
from sage_rl.types import cell_origin


@pytest.mark.parametrize("template", templates("train"), ids=lambda t: t.name)
def test_reference_skills_saved_loaded_and_credited(template):
    t1, t2 = scenario_tasks(template, 1, 2)
    env = SyncEnv()
    env.reset(t1)
    cell = reference_solution(t1)
    result = env.execute(cell, cell_origin(0))
    outcome = env.evaluate()
    assert result.ok and outcome.success, result.observation
    prov = Provenance(t1.task_id, t1.scenario_id, "reference", 0, 1.0)
    saved = extract_skills([(cell, result)], task_success=outcome.success, provenance=prov)
    names = {s.name for s in saved}
    assert set(template.skill_names) <= names
    assert all(s.tier is Tier.TASK_SUCCESS for s in saved)
    blind = extract_skills(
        [(cell, dataclasses.replace(result, calls=None, defined=None))], task_success=True, provenance=prov
    )
    assert [(s.name, s.source, s.depends_on) for s in blind] == [
        (s.name, s.source, s.depends_on) for s in saved
    ]

    lib = Library(saved)
    env.reset(t2)
    for pc in lib.preamble():
        assert env.execute(pc.code, pc.origin).ok
    call = template.call_code(t2.spec["params"])
    r2 = env.execute(call, cell_origin(0))
    assert r2.ok and env.evaluate().success, r2.observation
    used = used_skills_from_calls([r2], lib.names())
    assert set(template.skill_names) <= used
    assert used_skills_static([call], lib) == used
