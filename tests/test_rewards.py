"""Rewards against cases worked out by hand (SAGE.md section 4, docs/algorithm.md)."""

from __future__ import annotations

import itertools

import pytest

from sage_rl.rollout.rewards import (
    ChainOutcomes,
    RewardKind,
    chain_mean_reward,
    compute_rewards,
    outcome_reward,
    skill_integrated_reward,
)
from sage_rl.types import Chain, ExecResult, Outcome, StopReason, Task, Trajectory, Turn


def co(scores, used_from, code=None, successes=None):
    code = code or (True,) * len(scores)
    successes = successes or tuple(s == 1.0 for s in scores)
    return ChainOutcomes(tuple(scores), tuple(successes), tuple(code), tuple(tuple(u) for u in used_from))


# --- K = 2: every branch of the paper's formula ---------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "use", "expected"),
    [
        ((1.0, 1.0), True, (2.0, 2.0)),  # both succeed, task 2 used task 1's skill: both paid
        ((1.0, 1.0), False, (1.0, 1.0)),  # no use: no bonus
        ((0.5, 1.0), True, (0.5, 2.0)),  # task 1 failed: no generation bonus; task 2 still paid for use
        ((1.0, 0.5), True, (1.0, 0.5)),  # task 2 failed: nobody paid
        ((0.25, 0.75), True, (0.25, 0.75)),  # both partial
        ((0.0, 0.0), False, (0.0, 0.0)),
    ],
)
def test_k2_branches(scores, use, expected):
    assert skill_integrated_reward(co(scores, [(), (0,) if use else ()])) == expected


def test_k2_matches_paper_formula_on_a_grid():
    for r1, r2, use in itertools.product((0.0, 0.5, 1.0), (0.0, 0.5, 1.0), (0, 1)):
        s1, s2 = float(r1 == 1.0), float(r2 == 1.0)
        paper = (r1 + s1 * s2 * use, r2 + s2 * use)
        assert skill_integrated_reward(co((r1, r2), [(), (0,) if use else ()])) == paper


def test_success_comes_from_the_flag_not_the_float():
    # a score of 1.0 with success=False (e.g. zero checks) earns no bonus
    c = co((1.0, 1.0), [(), (0,)], successes=(False, True))
    assert skill_integrated_reward(c) == (1.0, 2.0)


# --- K > 2 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "used_from", "expected"),
    [
        # task 0 used by two successful tasks: flat +1, not +2; task 1 both uses and is used: +2
        ((1.0, 1.0, 1.0), [(), (0,), (0, 1)], (2.0, 3.0, 2.0)),
        # task 1 used task 0 but failed: task 0 unpaid, task 1 unpaid; task 2 paid for using task 1
        ((1.0, 0.5, 1.0), [(), (0,), (1,)], (1.0, 0.5, 2.0)),
        # task 0 failed: no generation bonus even though task 2 succeeded with its skill
        ((0.5, 1.0, 1.0), [(), (), (0,)], (0.5, 1.0, 2.0)),
        # skip a position: task 2 uses task 0 directly
        ((1.0, 1.0, 1.0), [(), (), (0,)], (2.0, 1.0, 2.0)),
        # two uses by one task: one flat +1
        ((1.0, 1.0, 1.0, 0.0), [(), (), (0, 1), (2,)], (2.0, 2.0, 2.0, 0.0)),
    ],
)
def test_k_greater_than_2(scores, used_from, expected):
    assert skill_integrated_reward(co(scores, used_from)) == expected


# --- no-code penalty, ablations, selector ---------------------------------------------------------


def test_no_code_penalty_replaces_reward():
    c = co((1.0, 0.0), [(), ()], code=(True, False))
    assert skill_integrated_reward(c) == (1.0, -1.0)
    assert outcome_reward(c) == (1.0, -1.0)
    assert chain_mean_reward(c) == (0.5, -1.0)  # mean of raw r^k, then the penalty per trajectory
    assert skill_integrated_reward(c, no_code_reward=None) == (1.0, 0.0)


def test_no_code_penalty_replaces_even_a_bonus():
    c = co((1.0, 1.0), [(), (0,)], code=(False, True))
    assert skill_integrated_reward(c) == (-1.0, 2.0)


def test_outcome_and_chain_ablations():
    c = co((0.25, 1.0), [(), (0,)])
    assert outcome_reward(c) == (0.25, 1.0)
    assert chain_mean_reward(c) == (0.625, 0.625)
    assert compute_rewards(RewardKind.CHAIN, c) == (0.625, 0.625)
    assert compute_rewards(RewardKind("outcome"), c) == (0.25, 1.0)
    assert compute_rewards(RewardKind.SKILL_INTEGRATED, c) == (0.25, 2.0)


def test_invalid_inputs_are_named():
    with pytest.raises(ValueError, match="used_from"):
        co((1.0, 1.0), [(1,), ()])
    with pytest.raises(ValueError, match="outside"):
        co((1.5,), [()])
    with pytest.raises(ValueError, match="one entry per"):
        ChainOutcomes((1.0,), (True,), (True, True), ((),))
    with pytest.raises(ValueError):
        RewardKind("nope")


def _traj(task_id: str, score: float, code: bool) -> Trajectory:
    task = Task(task_id=task_id, scenario_id="s", position=1, instruction="x", split="train")
    turn = Turn(
        gen_ids=(1,),
        gen_logprobs=(-0.1,),
        text="t",
        code="print(1)" if code else None,
        result=ExecResult("", True),
    )
    return Trajectory(
        task=task,
        prompt_ids=(0,),
        turns=(turn,),
        outcome=Outcome(score, score == 1.0),
        stop=StopReason.COMPLETED,
    )


def test_from_chain():
    ch = Chain(0, 0, (_traj("s_1", 1.0, True), _traj("s_2", 1.0, False)), used_from=((), (0,)))
    c = ChainOutcomes.from_chain(ch)
    assert c == ChainOutcomes((1.0, 1.0), (True, True), (True, False), ((), (0,)))
    assert skill_integrated_reward(c) == (2.0, -1.0)
