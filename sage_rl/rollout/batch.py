"""One SAGE rollout batch: B task sequences x G chains -> rewards -> advantages -> samples.

Groups are built explicitly: group i is G chains of the *same* task sequence, each starting from
the same library (STYLE.md, principle 2; SAGE.md section 3). The GRPO group of a sample is
``(task sequence, position)`` (SAGE.md section 5), a tuple key, never a parsed string.

A training step's data is built once, here: ``rollout_step`` returns a ``StepBatch`` whose groups
carry their samples (rewards and advantages computed once, when the group is drawn), the samples
to train on and ``num_chains``, the loss normaliser, beside them. Nothing downstream recomputes
them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field, model_validator

from sage_rl.config import Section
from sage_rl.rollout.advantages import Baseline, compute_advantages
from sage_rl.rollout.chain import ChainRunner
from sage_rl.rollout.journal import StepJournal, run_group_kept
from sage_rl.rollout.pool import PoolKind
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards, nothing_sampled
from sage_rl.skills.library import Library
from sage_rl.types import Chain, Sample, Task

#: draws n task sequences of a length from a split: (rng, n, length, split) -> sequences
Draw = Callable[[random.Random, int, int, str], list[tuple[Task, ...]]]


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
    pool: PoolKind = Field(
        PoolKind.ALL,
        description="all: draw from every train template; screened: only from templates whose sampled "
        "success under the current model lies strictly between 0 and 1 (rollout/pool.py)",
    )
    screen_every: int = Field(4, ge=1, description="steps between screens of the pool (pool: screened)")
    screen_samples: int = Field(
        2, ge=1, description="chains sampled per scenario in a screen (pool: screened)"
    )
    screen_scenarios: int = Field(
        1, ge=1, description="fresh scenarios per template in a screen (pool: screened)"
    )
    screen_confirm: int = Field(
        0,
        ge=0,
        description="more scenarios for each template a screen found all solved or all failed, pooled "
        "with its first (pool: screened); 0 = none",
    )
    pool_memory: int | None = Field(
        None,
        ge=1,
        description="track the pool between screens (pool: screened): a template's success is the share "
        "of its last N sampled tasks, the screens' and the steps' own, and the pool is re-derived after "
        "every step (rollout/tracking.py); null = the pool changes only at screens",
    )
    pool_explore: int = Field(
        0,
        ge=0,
        description="of each draw of B task sequences, this many from the train templates outside the "
        "pool, so that one that left it is looked at again (pool: screened); 0 = none",
    )

    @model_validator(mode="after")
    def _tracking_needs_a_pool(self) -> RolloutConfig:
        if (self.pool_memory is not None or self.pool_explore) and self.pool is not PoolKind.SCREENED:
            raise ValueError("rollout.pool_memory and rollout.pool_explore need rollout.pool=screened")
        if self.pool_explore >= self.groups_per_step:
            raise ValueError(
                f"rollout.pool_explore={self.pool_explore} leaves no draw to the pool: it must be below "
                f"rollout.groups_per_step={self.groups_per_step}"
            )
        return self


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

    A task that ended before a turn of the policy's was recorded (``rewards.nothing_sampled``: the
    environment or the backend failed first) says nothing about the policy and has no token to
    train: it is left out of its group, so its reward does not move the others' baseline (the
    verl adapter leaves such outputs out the same way).
    """
    items = []
    for chains in groups:
        for chain in chains:
            rs = chain_rewards(chain, cfg)
            items += [
                ((chain.task_ids, k), r, traj)
                for k, (traj, r) in enumerate(zip(chain.trajectories, rs, strict=True))
                if not nothing_sampled(traj)
            ]
    adv = compute_advantages(
        [(key, r) for key, r, _ in items], cfg.baseline, cfg.normalize_std, drop_below=cfg.drop_below
    )
    return [
        Sample(key, traj, r, a)
        for (key, r, traj), a, keep in zip(items, adv.values, adv.keep, strict=True)
        if keep
    ]


@dataclass(frozen=True)
class Group:
    """One GRPO group: G chains of one task sequence from one start library, and their samples
    (``to_samples`` of the group: rewards and advantages within it, computed once)."""

    chains: tuple[Chain, ...]
    samples: tuple[Sample, ...]

    @classmethod
    def of(cls, chains: Sequence[Chain], cfg: RolloutConfig) -> Group:
        return cls(tuple(chains), tuple(to_samples([chains], cfg)))

    @property
    def has_signal(self) -> bool:
        """Whether some advantage is not 0 (the group has a gradient to give)."""
        return any(s.advantage != 0.0 for s in self.samples)


@dataclass(frozen=True)
class StepBatch:
    """One training step's data, built once (``rollout_step``).

    ``drawn``: every group the step sampled, in draw order (written and counted as sampled);
    ``trained``: the groups trained on. ``samples`` are the trained groups' samples, or, when no
    group has a signal, the drawn ones (the step then runs and makes no update); ``num_chains``
    is their chains' count, the loss normaliser of those samples (``Trainer.step``).
    ``drawn_samples``: every drawn group's samples (the step's rollout metrics).
    """

    drawn: tuple[Group, ...]
    trained: tuple[Group, ...]
    samples: tuple[Sample, ...]
    num_chains: int
    drawn_samples: tuple[Sample, ...]

    @classmethod
    def of(cls, drawn: Sequence[Group], trained: Sequence[Group]) -> StepBatch:
        used = trained or drawn
        return cls(
            drawn=tuple(drawn),
            trained=tuple(trained),
            samples=tuple(s for g in used for s in g.samples),
            num_chains=sum(len(g.chains) for g in used),
            drawn_samples=tuple(s for g in drawn for s in g.samples),
        )

    @property
    def drawn_chains(self) -> list[Chain]:
        return [c for g in self.drawn for c in g.chains]


def trained_groups(groups: Sequence[Group], cfg: RolloutConfig) -> list[Group]:
    """The groups a step trains on: all of them, or with dynamic sampling those with a signal."""
    return [g for g in groups if not cfg.dynamic_sampling or g.has_signal]


async def rollout_step(
    runner: ChainRunner,
    rng: random.Random,
    cfg: RolloutConfig,
    step: int = 0,
    journal: StepJournal | None = None,
    draw: Draw | None = None,
) -> StepBatch:
    """One step's groups. Without dynamic sampling: one draw of B sequences, all trained. With
    it: draws of B sequences until B groups have a signal (or ``max_draws``); those are trained,
    all of them, so a lucky last draw may give more than B. ``journal``: the step's groups kept
    on disk as they finish (a resumed step samples only those it lacks; rollout/journal.py);
    ``draw``: how the task sequences are drawn (a screened pool's), else from the runner's suite."""
    drawn: list[Group] = []
    trained: list[Group] = []
    for _ in range(cfg.max_draws if cfg.dynamic_sampling else 1):
        batch = await rollout_batch(
            runner, rng, cfg, step=step, first_index=len(drawn), journal=journal, draw=draw
        )
        groups = [Group.of(chains, cfg) for chains in batch]
        drawn += groups
        trained += trained_groups(groups, cfg)
        if len(trained) >= cfg.groups_per_step:
            break
    return StepBatch.of(drawn, trained)


async def rollout_batch(
    runner: ChainRunner,
    rng: random.Random,
    cfg: RolloutConfig,
    library: Library | None = None,
    step: int = 0,
    first_index: int = 0,
    journal: StepJournal | None = None,
    draw: Draw | None = None,
) -> list[list[Chain]]:
    """Sample B task sequences from the runner's suite and run G chains of each, all
    concurrently (bounded). ``step`` is the training step (skill provenance); the groups are
    numbered from ``first_index``; ``journal`` (optional) keeps and gives back finished groups;
    ``draw`` (optional) draws the B sequences instead of the suite."""
    if draw is None:
        sample = runner.suite.sample_chain
        sequences = [sample(rng, cfg.chain_length, cfg.split) for _ in range(cfg.groups_per_step)]
    else:
        sequences = draw(rng, cfg.groups_per_step, cfg.chain_length, cfg.split)
    start = library or Library()
    sem = asyncio.Semaphore(max(1, cfg.concurrency // max(1, cfg.group_size)))

    async def group(i: int, seq) -> list[Chain]:
        async with sem:
            return await run_group_kept(runner, seq, start, first_index + i, cfg.group_size, step, journal)

    groups = list(await asyncio.gather(*(group(i, s) for i, s in enumerate(sequences))))
    check_group_contract(groups)
    return groups
