"""Rewards of a task chain: pure functions from outcomes and skill usage to one R^k per position.

SAGE.md section 4. Inputs per chain of K tasks (position k counted from 0):

- ``scores[k]``: r^k in [0, 1], task k's ``Outcome.score`` (the fraction of its checks that passed;
  PocketWorld counts "no collateral changes" only once the task's own checks pass, docs/algorithm.md);
- ``successes[k]``: 1[r^k = 1] (taken from ``Outcome.success``, never from a float comparison);
- ``produced_code[k]``: whether trajectory k produced any code;
- ``used_from[k]``: the positions j < k whose skills task k used (``Chain.used_from``; what counts
  as a use is decided when the chain runs, under ``skills.credit``: docs/algorithm.md).

Skill-integrated reward, K = 2 (the paper's formula, with use = 1 iff ``used_from[1]`` holds 0)::

    R^1 = r^1 + 1[r^1 = 1] * 1[r^2 = 1] * use(q^2 | q^1)
    R^2 = r^2 + 1[r^2 = 1] * use(q^2 | q^1)

K > 2 (our generalisation, docs/algorithm.md)::

    R^k = r^k + gen_k + use_k
    gen_k = 1  iff task k succeeded and some later task m > k succeeded using a skill task k made
    use_k = 1  iff task k succeeded using a skill from any earlier task

Each bonus is a flat +1, not summed over several uses or several users, so R^k <= r^k + 2.
No-code penalty: R^k = -1.0 replaces the reward of a trajectory that produced no code, whatever
the reward kind. The penalty does not reach other positions: a no-code task used no skill, so it
gives no bonus to anyone. A task whose environment failed before the policy's first turn
(``StopReason.ENV_ERROR``, no turns) is scored r = 0 like any failure, without the penalty.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sage_rl.types import Chain, StopReason, Trajectory

NO_CODE_REWARD = -1.0


class RewardKind(enum.StrEnum):
    SKILL_INTEGRATED = "skill_integrated"  # the paper's reward (default)
    OUTCOME = "outcome"  # ablation: R^k = r^k
    CHAIN = "chain"  # ablation: mean of the chain's r^k, given to every task


@dataclass(frozen=True)
class ChainOutcomes:
    """What the rewards of one chain depend on, one entry per position (see module docstring)."""

    scores: tuple[float, ...]
    successes: tuple[bool, ...]
    produced_code: tuple[bool, ...]
    used_from: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        k = len(self.scores)
        lengths = (len(self.successes), len(self.produced_code), len(self.used_from))
        if any(n != k for n in lengths):
            raise ValueError(
                f"ChainOutcomes: scores, successes, produced_code, used_from must have one entry per "
                f"position; got lengths {k}, {lengths[0]}, {lengths[1]}, {lengths[2]}"
            )
        for pos, users in enumerate(self.used_from):
            bad = [j for j in users if not 0 <= j < pos]
            if bad:
                raise ValueError(
                    f"ChainOutcomes: used_from[{pos}] = {users} names positions {bad} not before {pos}"
                )
        for pos, r in enumerate(self.scores):
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"ChainOutcomes: scores[{pos}] = {r} is outside [0, 1]")

    @classmethod
    def from_chain(cls, chain: Chain) -> ChainOutcomes:
        trajs = chain.trajectories
        used = chain.used_from or tuple(() for _ in trajs)
        return cls(
            scores=tuple(t.outcome.score for t in trajs),
            successes=tuple(t.outcome.success for t in trajs),
            # An episode that ended before the policy's first turn was recorded is a failure
            # (score 0), not the policy's no-code failure: no penalty.
            produced_code=tuple(t.produced_code or nothing_sampled(t) for t in trajs),
            used_from=tuple(tuple(u) for u in used),
        )


def nothing_sampled(t: Trajectory) -> bool:
    """The episode ended before a turn of the policy's was recorded: the environment failed first
    (a reset, the library's load), or the backend did (an exception, a completion ``checked``
    refused, a prompt longer than the engine holds). It says nothing about what the policy
    writes and has no token to train on; scored as "no code" (-1) it would sit in its group's
    baseline and raise the advantage of the other chains' failures."""
    return t.stop in (StopReason.ENV_ERROR, StopReason.POLICY_ERROR) and not t.turns


def _apply_no_code(rs: Sequence[float], c: ChainOutcomes, no_code_reward: float | None) -> tuple[float, ...]:
    if no_code_reward is None:
        return tuple(rs)
    return tuple(r if code else no_code_reward for r, code in zip(rs, c.produced_code, strict=True))


def skill_integrated_reward(
    c: ChainOutcomes, no_code_reward: float | None = NO_CODE_REWARD
) -> tuple[float, ...]:
    """R^k = r^k + gen_k + use_k (module docstring); equals the paper's formula for K = 2."""
    ok = c.successes
    out = []
    for k, r in enumerate(c.scores):
        # use_k: task k succeeded and used some earlier task's skill.
        use_bonus = 1.0 if ok[k] and c.used_from[k] else 0.0
        # gen_k: task k succeeded and a later successful task used one of its skills.
        later_users = (m for m in range(k + 1, len(c.scores)) if ok[m] and k in c.used_from[m])
        gen_bonus = 1.0 if ok[k] and any(later_users) else 0.0
        out.append(r + use_bonus + gen_bonus)
    return _apply_no_code(out, c, no_code_reward)


def outcome_reward(c: ChainOutcomes, no_code_reward: float | None = NO_CODE_REWARD) -> tuple[float, ...]:
    """Ablation: R^k = r^k (then the no-code penalty)."""
    return _apply_no_code(c.scores, c, no_code_reward)


def chain_mean_reward(c: ChainOutcomes, no_code_reward: float | None = NO_CODE_REWARD) -> tuple[float, ...]:
    """Ablation: every task gets mean_k r^k (the paper's chain reward is not public; this is our
    definition). The mean uses the raw scores; the no-code penalty then replaces R per trajectory."""
    mean = sum(c.scores) / len(c.scores) if c.scores else 0.0
    return _apply_no_code([mean] * len(c.scores), c, no_code_reward)


def compute_rewards(
    kind: RewardKind, c: ChainOutcomes, no_code_reward: float | None = NO_CODE_REWARD
) -> tuple[float, ...]:
    """The chain's rewards under ``kind`` (an explicit match, not a registry)."""
    match RewardKind(kind):
        case RewardKind.SKILL_INTEGRATED:
            return skill_integrated_reward(c, no_code_reward)
        case RewardKind.OUTCOME:
            return outcome_reward(c, no_code_reward)
        case RewardKind.CHAIN:
            return chain_mean_reward(c, no_code_reward)
