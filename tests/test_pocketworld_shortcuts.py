"""Shortcuts RL would find before the skill (issue 30, items 6-7): a no-op and a constant answer.

Every template of every split is enumerated. The no-op is played through the environment (doing
nothing; ``complete_task()`` without an answer) on every listed task; the constant answer is
measured on the oracle (``audit``) over many scenarios per template, since an evaluation split
lists only one scenario (3 tasks) of each.
"""

from __future__ import annotations

import random

import pytest
from pocket import SyncEnv

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.audit import MAX_GUESS_SHARE, MAX_NOOP_SCORE, audit_template, best_constant
from sage_rl.envs.pocketworld.scenarios import TEMPLATES
from sage_rl.types import Task

NOOPS = {"nothing": None, "complete_task()": "apis.supervisor.complete_task()"}


def _noop_score(env: SyncEnv, task: Task, code: str | None) -> float:
    env.reset(task)
    if code is not None:
        assert env.execute(code, "<cell-1>").ok
    return env.evaluate().score


def _listed_and_sampled(split: str) -> tuple[Task, ...]:
    if split != "train":
        return tasks.split_tasks(split)
    rng = random.Random(30)  # train: its listed seed-0 scenarios and chains as training draws them
    return tasks.split_tasks("train") + tuple(t for _ in range(10) for t in tasks.sample_chain(rng, 3))


@pytest.mark.parametrize("split", tasks.split_names())
def test_a_noop_scores_at_most_a_tenth_on_every_task(split):
    """Before issue 30 "no collateral changes" counted as half of a one-check task: 0.5 each."""
    env = SyncEnv()
    worst = {}
    for task in _listed_and_sampled(split):
        for name, code in NOOPS.items():
            worst[(task.task_id, name)] = _noop_score(env, task, code)
    bad = {k: v for k, v in worst.items() if v > MAX_NOOP_SCORE}
    assert not bad, f"{len(bad)} no-op scores above {MAX_NOOP_SCORE}: {sorted(bad.items())[:5]}"


def test_best_constant_counts_normalised_matches():
    assert best_constant([]) == (None, 0.0)
    assert best_constant([3, "3", 4.0, "$4.00", 4, "x"]) == (4.0, 0.5)
    assert best_constant([["a", "b"], ["B", "A"], ["a"]])[1] == pytest.approx(2 / 3)
