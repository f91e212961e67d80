"""The local SAGE / GRPO training loop (issue 6), top to bottom.

    for each step:
        B task sequences x G chains of K tasks   (sequential rollout, rollout/batch.py)
        -> skill-integrated rewards -> advantages per (sequence, position)
        -> one optimizer step on exactly the sampled tokens      (train/trainer.py)
        -> metrics, checkpoint, periodic evaluation

The policy samples with the very model object the trainer updates, so rollouts are on-policy.
Task sampling uses a per-step seeded RNG, so ``--resume`` continues the same task stream.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

from pydantic import Field

from sage_rl.build import RunConfig, build_runner, build_suite
from sage_rl.config import Section
from sage_rl.eval.metrics import EvalMetrics, compute_metrics
from sage_rl.eval.runner import evaluate_chains, scenarios_of
from sage_rl.rollout.batch import RolloutConfig, rollout_batch, to_samples
from sage_rl.skills.library import Library
from sage_rl.train.trainer import TrainerConfig
from sage_rl.types import dumps


class TrainEvalConfig(Section):
    split: str = "dev"
    every: int = Field(0, ge=0, description="evaluate every N steps; 0 = only before and after")
    scenarios: int | None = Field(2, description="first N scenarios of the split; null = all")
    before_after: bool = True


class TrainConfig(RunConfig):
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: TrainEvalConfig = TrainEvalConfig()
    #: start from this checkpoint when it exists (e.g. the SFT model), else from ``policy.model``
    init_from: str | None = None
    steps: int = Field(4, ge=1)
    checkpoint_every: int = Field(1, ge=1)
    keep_last: int | None = 2
    out_dir: str = "runs/train"
    tensorboard: bool = True
    wandb_project: str | None = None
    trackio_project: str | None = None


@dataclasses.dataclass
class TrainResult:
    steps_done: int
    before: EvalMetrics | None
    after: EvalMetrics | None
    rollout_s: float
    train_s: float


def step_rng(seed: int, step: int) -> random.Random:
    return random.Random(f"{seed}:{step}")


async def evaluate(cfg: TrainConfig, policy, suite, step: int, progress=None) -> EvalMetrics:
    scenarios = scenarios_of(suite.split(cfg.eval.split))[: cfg.eval.scenarios]
    tasks = [t for s in scenarios for t in s]
    runner = build_runner(cfg, policy, suite, step)
    job = (
        progress.add_task(f"eval {cfg.eval.split} @ step {step}", total=len(scenarios)) if progress else None
    )
    on_done = (lambda _chain: progress.advance(job)) if progress else None
    return compute_metrics(await evaluate_chains(runner, tasks, Library(), len(scenarios), on_done))


async def train(cfg: TrainConfig, trainer, policy, logger, start: int, progress=None) -> TrainResult:
    """Run steps ``start .. cfg.steps-1``. ``trainer`` holds the model ``policy`` samples from."""
    from sage_rl.train.checkpoint import save_checkpoint
    from sage_rl.train.logging import batch_metrics

    out = Path(cfg.out_dir)
    suite = build_suite(cfg)
    before = (
        await evaluate(cfg, policy, suite, start, progress) if cfg.eval.before_after and start == 0 else None
    )
    if before is not None:
        logger.log(0, _eval_row(before))
    job = progress.add_task("SAGE steps", total=cfg.steps, completed=start) if progress else None
    rollout_s = train_s = 0.0
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        groups = await rollout_batch(
            build_runner(cfg, policy, suite, step), suite, step_rng(cfg.seed, step), cfg.rollout
        )
        samples = to_samples(groups, cfg.rollout)
        t1 = time.perf_counter()
        stats = trainer.step(samples, num_chains=sum(len(g) for g in groups))
        t2 = time.perf_counter()
        rollout_s, train_s = rollout_s + t1 - t0, train_s + t2 - t1
        _write_rollouts(out / "rollouts" / f"step_{step + 1:06d}.jsonl", groups)
        row = {**batch_metrics(samples), **stats, "time/rollout_s": t1 - t0, "time/train_s": t2 - t1}
        if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and step + 1 < cfg.steps:
            row.update(_eval_row(await evaluate(cfg, policy, suite, step + 1, progress)))
        logger.log(step + 1, row)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(trainer, out, logger.offset(), keep_last=cfg.keep_last)
        if progress:
            progress.advance(job)
    after = await evaluate(cfg, policy, suite, cfg.steps, progress) if cfg.eval.before_after else None
    return TrainResult(cfg.steps, before, after, rollout_s, train_s)


def _eval_row(m: EvalMetrics) -> dict[str, float]:
    return {
        "eval/tgc": m.tgc,
        "eval/sgc": m.sgc,
        "eval/avg_score": m.avg_score,
        "eval/avg_steps": m.avg_steps,
        "eval/avg_tokens": m.avg_tokens,
        "eval/usage_rate": m.usage_rate,
        "eval/no_code_turn_rate": m.no_code_turn_rate,
    }


def _write_rollouts(path: Path, groups) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for chains in groups:
            for c in chains:
                f.write(dumps(c) + "\n")
