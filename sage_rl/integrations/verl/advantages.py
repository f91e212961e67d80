"""SAGE's advantage step on a verl batch, pure: rows in, per-row advantages and metrics out.

A verl batch holds, for each dataset row (``uid``: one task sequence), G sessions (chains) of K
outputs, plus verl's synthetic padding rows. The GRPO group of an output is (uid, position): the
G samples of task k of one task sequence (SAGE.md section 5). Its advantage comes from
sage-rl's own ``compute_advantages`` with the run's baseline, std and drop options, exactly as the
local trainer computes it (``rollout/batch.py: to_samples``).

Loss scale. With ``loss_agg_mode=seq-mean-token-mean`` verl minimises

    L_verl = (1 / D) sum_i tokenmean_t l_it(A_i),   D = ppo_mini_batch_size * rollout.n = K*B*G

while the paper (and the local trainer) divide by the number of chains N = B*G (each chain's K
token means summed). The clipped surrogate is positively homogeneous in the advantage,
l(c*A) = c*l(A) for c > 0 (dual clip included), so writing A_i * D / N makes verl's loss the
paper's exactly (``loss_scale=paper``, default). ``loss_scale=verl`` keeps verl's (paper / K).
``token-mean`` divides by the batch's generated tokens in both trainers, so its scale is 1.

Padding rows (verl's ``is_padding`` tag) copy a real row's fields, so they are recognised by the
tag, never by their contents, and get advantage 0. So do the outputs of a chain that could not
run (``ok=False``), which also stay out of their groups' baselines and of N.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sage_rl.integrations.verl.config import LossScale
from sage_rl.rollout.advantages import compute_advantages
from sage_rl.rollout.batch import RolloutConfig
from sage_rl.train.loss import LossAgg

#: extra_fields keys that the agent loop writes on each output (agent_loop.py) and the trainer reads.
EXTRA_KEYS = (
    "sage_uid",
    "sage_session",
    "sage_position",
    "sage_task_id",
    "sage_reward",
    "sage_ok",
    "sage_success",
    "sage_used_skill",
    "sage_produced_code",
)


@dataclass(frozen=True)
class OutputRow:
    """One row of a verl batch as the advantage step sees it."""

    uid: str
    session: int
    position: int
    task_id: str
    reward: float
    ok: bool = True
    padding: bool = False
    success: bool = False
    used_skill: bool = False
    produced_code: bool = True

    @classmethod
    def of(cls, extra: Mapping[str, object], padding: bool) -> OutputRow:
        """From an output's ``extra_fields``; a clear error names a missing key."""
        missing = [k for k in EXTRA_KEYS if k not in extra]
        if missing:
            raise KeyError(
                f"output lacks extra_fields {missing}: was it produced by sage-rl's agent loop "
                "(actor_rollout_ref.rollout.agent.default_agent_loop=sage_chain)?"
            )
        return cls(
            uid=str(extra["sage_uid"]),
            session=int(extra["sage_session"]),  # type: ignore[call-overload]
            position=int(extra["sage_position"]),  # type: ignore[call-overload]
            task_id=str(extra["sage_task_id"]),
            reward=float(extra["sage_reward"]),  # type: ignore[arg-type]
            ok=bool(extra["sage_ok"]),
            padding=padding,
            success=bool(extra["sage_success"]),
            used_skill=bool(extra["sage_used_skill"]),
            produced_code=bool(extra["sage_produced_code"]),
        )


@dataclass(frozen=True)
class BatchAdvantages:
    """Per row, in batch order: the advantage to train with (scaled), the unscaled one, the reward."""

    values: tuple[float, ...]
    unscaled: tuple[float, ...]
    rewards: tuple[float, ...]
    scale: float
    num_chains: int
    metrics: dict[str, float]


def loss_scale(mode: LossScale, agg: LossAgg, verl_divisor: int, num_chains: int) -> float:
    """The factor on the advantages that turns verl's loss normalisation into ``mode``'s."""
    if LossAgg(agg) is LossAgg.TOKEN_MEAN or LossScale(mode) is LossScale.VERL or num_chains < 1:
        return 1.0
    return verl_divisor / num_chains


def _check_groups(rows: Sequence[OutputRow], live: Sequence[int]) -> None:
    tasks: dict[tuple[str, int], set[str]] = defaultdict(set)
    for i in live:
        tasks[(rows[i].uid, rows[i].position)].add(rows[i].task_id)
    broken = {key: ids for key, ids in tasks.items() if len(ids) > 1}
    if broken:
        raise AssertionError(f"groups (uid, position) with several task ids: {broken}")


def batch_advantages(
    rows: Sequence[OutputRow],
    rollout: RolloutConfig,
    mode: LossScale,
    agg: LossAgg,
    verl_divisor: int,
) -> BatchAdvantages:
    """Advantages per (uid, position) group from ``compute_advantages``, scaled for verl's loss."""
    live = [i for i, r in enumerate(rows) if r.ok and not r.padding]
    _check_groups(rows, live)
    adv = compute_advantages(
        [((rows[i].uid, rows[i].position), rows[i].reward) for i in live],
        rollout.baseline,
        rollout.normalize_std,
        drop_below=rollout.drop_below,
    )
    num_chains = len({(rows[i].uid, rows[i].session) for i in live})
    scale = loss_scale(mode, agg, verl_divisor, num_chains)
    unscaled, rewards = [0.0] * len(rows), [0.0] * len(rows)
    for i, a, keep in zip(live, adv.values, adv.keep, strict=True):
        unscaled[i], rewards[i] = (a if keep else 0.0), rows[i].reward
    values = tuple(a * scale for a in unscaled)
    metrics = _metrics(rows, live, unscaled, num_chains, scale, sum(not k for k in adv.keep))
    return BatchAdvantages(values, tuple(unscaled), tuple(rewards), scale, num_chains, metrics)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _metrics(
    rows: Sequence[OutputRow],
    live: Sequence[int],
    adv: Sequence[float],
    chains: int,
    scale: float,
    dropped: int,
) -> dict[str, float]:
    """``sage/*`` metrics of one batch (defined in docs/verl.md)."""
    failed = {(r.uid, r.session) for r in rows if not r.ok and not r.padding}
    out = {
        "sage/chains": float(chains),
        "sage/failed_chains": float(len(failed)),
        "sage/loss_scale": scale,
        "sage/reward/mean": _mean([rows[i].reward for i in live]),
        "sage/success/mean": _mean([float(rows[i].success) for i in live]),
        "sage/no_code_rate": _mean([float(not rows[i].produced_code) for i in live]),
        "sage/advantage/abs_mean": _mean([abs(adv[i]) for i in live]),
        "sage/dropped": float(dropped),
    }
    for k in sorted({rows[i].position for i in live}):
        at = [i for i in live if rows[i].position == k]
        out[f"sage/reward/pos{k + 1}"] = _mean([rows[i].reward for i in at])
        out[f"sage/success/pos{k + 1}"] = _mean([float(rows[i].success) for i in at])
        if k > 0:
            out[f"sage/skill_use/pos{k + 1}"] = _mean([float(rows[i].used_skill) for i in at])
    return out
