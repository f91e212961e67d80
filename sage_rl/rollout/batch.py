"""One SAGE rollout batch: B task sequences x G chains -> rewards -> advantages -> samples.

Groups are built explicitly: group i is G chains of the *same* task sequence, each starting from
the same library (STYLE.md, principle 2; SAGE.md section 3). The GRPO group of a sample is
``(task sequence, position)`` (SAGE.md section 5), a tuple key, never a parsed string.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from sage_rl.config import Section
from sage_rl.rollout.advantages import Baseline, compute_advantages
from sage_rl.rollout.chain import ChainRunner, run_group
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards, env_failed_first
from sage_rl.skills.library import Library
from sage_rl.types import Chain, Sample


class RolloutConfig(Section):
    """Sequential rollout and credit assignment. Defaults are the paper's where it gives them."""

    chain_length: int = Field(2, ge=1, description="K: tasks per chain, from one scenario (SAGE.md 3)")
    group_size: int = Field(8, ge=1, description="G: chains per task sequence (>= 2 to train)")
    groups_per_step: int = Field(4, ge=1, description="B: task sequences per optimizer step")
    split: str = "train"
    reward: RewardKind = RewardKind.SKILL_INTEGRATED
    no_code_reward: float | None = -1.0  # replaces R of a trajectory without code; null = off
    baseline: Baseline = Baseline.MEAN
    normalize_std: bool = False  # LOOP/SAGE: no std division
    drop_below: float | None = Field(None, ge=0, description="LOOP drops |A| < 0.01; null keeps all")
    concurrency: int = Field(16, ge=1, description="chains in flight")
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: draw B more task sequences while fewer than B groups "
        "carry a learning signal (some advantage != 0), at most max_draws draws a step; only those "
        "groups are trained, every drawn token counts as sampled",
    )
    max_draws: int = Field(3, ge=1, description="draws of B task sequences per step (dynamic sampling)")


def check_group_contract(groups: Sequence[Sequence[Chain]]) -> None:
    """Every chain of a group ran the same task sequence from the same start library
    (``Chain.start_library``: the name and content hash of each skill)."""
    for i, chains in enumerate(groups):
        seqs = {c.task_ids for c in chains}
        starts = {c.start_library for c in chains}
        if len(seqs) != 1 or len(starts) != 1:
            raise AssertionError(
                f"group {i} breaks the group contract: sequences {seqs}, start libraries {starts}"
            )


def chain_rewards(chain: Chain, cfg: RolloutConfig) -> tuple[float, ...]:
    """R of each task of ``chain`` under ``cfg``'s reward (pure; SAGE.md section 4)."""
    return compute_rewards(cfg.reward, ChainOutcomes.from_chain(chain), cfg.no_code_reward)


def to_samples(groups: Sequence[Sequence[Chain]], cfg: RolloutConfig) -> list[Sample]:
    """Rewards per chain (pure), then advantages per (task sequence, position) group.

    A task whose environment failed before the policy's first turn says nothing about the policy
    and has no token to train: it is left out of its group, so its 0 does not move the others'
    baseline (the verl adapter leaves such outputs out the same way).
    """
    items = []
    for chains in groups:
        for chain in chains:
            rs = chain_rewards(chain, cfg)
            items += [
                ((chain.task_ids, k), r, traj)
                for k, (traj, r) in enumerate(zip(chain.trajectories, rs, strict=True))
                if not env_failed_first(traj)
            ]
    adv = compute_advantages(
        [(key, r) for key, r, _ in items], cfg.baseline, cfg.normalize_std, drop_below=cfg.drop_below
    )
    return [
        Sample(key, traj, r, a)
        for (key, r, traj), a, keep in zip(items, adv.values, adv.keep, strict=True)
        if keep
    ]


def has_signal(chains: Sequence[Chain], cfg: RolloutConfig) -> bool:
    """Whether the group's advantages are not all 0 (it has a gradient to give)."""
    return any(s.advantage != 0.0 for s in to_samples([chains], cfg))


@dataclass(frozen=True)
class Draws:
    """What one step sampled (``drawn``: every group, in draw order) and what it trains on."""

    drawn: list[list[Chain]]
    trained: list[list[Chain]]


async def rollout_step(runner: ChainRunner, rng: random.Random, cfg: RolloutConfig, step: int = 0) -> Draws:
    """One step's groups. Without dynamic sampling: one draw of B sequences, all trained. With
    it: draws of B sequences until B groups have a signal (or ``max_draws``); those are trained,
    all of them, so a lucky last draw may give more than B."""
    drawn: list[list[Chain]] = []
    trained: list[list[Chain]] = []
    for _ in range(cfg.max_draws if cfg.dynamic_sampling else 1):
        batch = await rollout_batch(runner, rng, cfg, step=step, first_index=len(drawn))
        drawn += batch
        trained += [g for g in batch if not cfg.dynamic_sampling or has_signal(g, cfg)]
        if len(trained) >= cfg.groups_per_step:
            break
    return Draws(drawn, trained)


async def rollout_batch(
    runner: ChainRunner,
    rng: random.Random,
    cfg: RolloutConfig,
    library: Library | None = None,
    step: int = 0,
    first_index: int = 0,
) -> list[list[Chain]]:
    """Sample B task sequences from the runner's suite and run G chains of each, all
    concurrently (bounded). ``step`` is the training step (skill provenance); the groups are
    numbered from ``first_index``."""
    sample = runner.suite.sample_chain
    sequences = [sample(rng, cfg.chain_length, cfg.split) for _ in range(cfg.groups_per_step)]
    start = library or Library()
    sem = asyncio.Semaphore(max(1, cfg.concurrency // max(1, cfg.group_size)))

    async def group(i: int, seq) -> list[Chain]:
        async with sem:
            return await run_group(runner, seq, start, first_index + i, cfg.group_size, step)

    groups = list(await asyncio.gather(*(group(i, s) for i, s in enumerate(sequences))))
    check_group_contract(groups)
    return groups
