"""The local SAGE / GRPO training loop (issue 6), top to bottom.

    for each step:
        B task sequences x G chains of K tasks   (sequential rollout, rollout/batch.py)
        -> skill-integrated rewards -> advantages per (sequence, position), once: a StepBatch
        -> one optimizer step on exactly the sampled tokens      (train/trainer.py)
        -> sync(): the policy re-reads the new weights
        -> metrics, checkpoint, periodic greedy evaluation       (eval/runner.py)
           (eval.keep: best keeps the best-scoring model, the start's included: train/best.py)

The loop receives built objects (``sage_rl.build`` makes them): a chain runner whose policy
samples with the very model object the trainer updates, the trainer, the metrics logger, and
``sync``: the call that tells the policy its weights changed, made after every optimizer step (so
rollouts are on-policy; nothing else notices an in-place update). Task sampling uses a per-step seeded RNG, so ``--resume`` continues the
same task stream.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sage_rl.eval.metrics import EvalMetrics
from sage_rl.eval.runner import run_eval
from sage_rl.files import write_atomic
from sage_rl.rollout.batch import rollout_step
from sage_rl.rollout.chain import ChainRunner
from sage_rl.rollout.journal import StepJournal, drop_others, journal_path, weights_digest
from sage_rl.rollout.pool import PoolKind, ScreenedPool
from sage_rl.text import dumps
from sage_rl.train.best import Best, KeepBest
from sage_rl.train.checkpoint import CheckpointError, save_checkpoint
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.layout import RunFolder
from sage_rl.train.logging import MetricsLogger, batch_metrics, read_metrics
from sage_rl.train.same_run import MAY_DIFFER
from sage_rl.train.trainer import Trainer
from sage_rl.types import Chain


@dataclasses.dataclass
class TrainResult:
    steps_done: int
    before: EvalMetrics | None
    after: EvalMetrics | None
    rollout_s: float
    train_s: float
    sampled_tokens: int = 0  # generated rollout tokens over the whole run (resumed steps included)
    best: Best | None = None  # eval.keep: best: the kept model's evaluation


def step_rng(seed: int, step: int) -> random.Random:
    return random.Random(f"{seed}:{step}")


async def train(
    runner: ChainRunner,
    trainer: Trainer,
    logger: MetricsLogger,
    cfg: LoopConfig,
    seed: int,
    start: int,
    progress: Any = None,
    *,
    sync: Callable[[], None],
) -> TrainResult:
    """Run steps ``start .. cfg.steps-1``, or fewer: the run stops after the step at which its
    sampled rollout tokens reach ``cfg.sampled_token_budget`` (how runs are compared at equal
    sampled tokens). ``runner.policy`` samples from ``trainer.model``; ``sync()`` is called after
    every step that updated the weights (``Training.sync``: the policy's ``weights_changed``)."""
    out = RunFolder.of(cfg.out_dir)
    keep = KeepBest(out.root, cfg.eval.split) if cfg.eval.keep == "best" else None
    before = None
    if cfg.eval.before_after and start == 0 and logger.offset() > 0:
        before = _read_eval(out, 0)  # resumed during step 1: the start model was evaluated
    elif cfg.eval.before_after and start == 0:
        before = await _evaluate(runner, cfg.eval, 0, progress, out)
        logger.log(0, _eval_row(before) | (keep.judge(trainer, 0, before) if keep else {}))
    job = progress.add_task("RL steps", total=cfg.steps, completed=start) if progress else None
    rollout_s = train_s = 0.0
    sampled, done = _sampled_so_far(out, start), start
    screened = cfg.rollout.pool is PoolKind.SCREENED
    pool = ScreenedPool(runner, cfg.rollout, seed, Path(cfg.out_dir), start) if screened else None
    drop_others(journal_path(out.rollout_file(start + 1)))  # other steps': sampled from other weights
    # what the groups were sampled under; not how many chains were in flight (a resume may change that)
    rollout = {k: v for k, v in cfg.rollout.model_dump(mode="json").items() if k not in MAY_DIFFER["rollout"]}
    settings = dumps({"seed": seed, "rollout": rollout, "params": runner.params})
    for step in range(start, cfg.steps):
        if cfg.sampled_token_budget is not None and sampled >= cfg.sampled_token_budget:
            break  # a resumed run that had already spent its budget
        t0 = time.perf_counter()
        # the step's groups kept as they finish: a run stopped mid-step resamples only the rest
        key = f"{weights_digest(getattr(trainer, 'model', None))} {settings}"
        journal = StepJournal(journal_path(out.rollout_file(step + 1)), key)
        # the screened pool (rollout/pool.py): its screens' tokens are this step's sampled tokens too
        step_runner, pool_row = await pool.runner_for(step, journal) if pool else (runner, {})
        draw = pool.draw if pool else None
        batch = await rollout_step(
            step_runner, step_rng(seed, step), cfg.rollout, step=step, journal=journal, draw=draw
        )
        if pool:
            pool.observe(step, batch.drawn_chains)  # rollout.pool_memory: the next step's pool follows
        t1 = time.perf_counter()
        stats = trainer.step(batch.samples, batch.num_chains)
        if stats["updated"]:
            sync()  # the policy samples the next rollouts (and evaluations) from the new weights
        t2 = time.perf_counter()
        rollout_s, train_s = rollout_s + t1 - t0, train_s + t2 - t1
        _write_rollouts(out.rollout_file(step + 1), batch.drawn_chains)
        step_tokens = sum(t.num_generated_tokens for c in batch.drawn_chains for t in c.trajectories)
        step_tokens += int(pool_row.get("pool/screen_tokens", 0))
        sampled += step_tokens
        last = step + 1 == cfg.steps or (
            cfg.sampled_token_budget is not None and sampled >= cfg.sampled_token_budget
        )
        row = {**batch_metrics(batch.drawn_samples), **stats}
        row |= {"groups_drawn": len(batch.drawn), "groups_trained": len(batch.trained)} | pool_row
        row |= {"time/rollout_s": t1 - t0, "time/train_s": t2 - t1, "groups_reused": journal.reused}
        row |= {"sampled_tokens": step_tokens, "sampled_tokens_total": sampled}
        if cfg.eval.every and (step + 1) % cfg.eval.every == 0 and not last:
            m = await _evaluate(runner, cfg.eval, step + 1, progress, out)
            row |= _eval_row(m) | (keep.judge(trainer, step + 1, m) if keep else {})
        logger.log(step + 1, row)
        if (step + 1) % cfg.checkpoint_every == 0 or last:
            save_checkpoint(trainer, out.root, logger.offset(), keep_last=cfg.keep_last)
        journal.close()  # the step has ended: a resumed run starts after it
        if progress:
            progress.advance(job)
        done = step + 1
        if last:
            break
    after = await _evaluate(runner, cfg.eval, done, progress, out) if cfg.eval.before_after else None
    if keep and after:
        keep.judge(trainer, done, after)
    return TrainResult(done, before, after, rollout_s, train_s, sampled, keep.kept if keep else None)


def _sampled_so_far(out: RunFolder, start: int) -> int:
    """Sampled tokens of the steps before ``start`` (a resumed run), from its metrics rows."""
    if start == 0:
        return 0
    try:
        rows = [r for r in read_metrics(out.root) if 0 < r["step"] <= start and "sampled_tokens" in r]
        if any(r["sampled_tokens"] is None for r in rows):
            raise ValueError(f"{out.metrics}: a row's 'sampled_tokens' is null")
    except (OSError, ValueError) as e:  # damaged after it was written: the budget cannot be kept
        raise CheckpointError(f"{e}: the sampled tokens of steps 1-{start} cannot be counted") from None
    return sum(int(r["sampled_tokens"]) for r in rows)


async def _evaluate(
    runner: ChainRunner, cfg: TrainEvalConfig, step: int, progress: Any, out: RunFolder
) -> EvalMetrics:
    """The periodic evaluation: greedy (temperature 0), as ``sage-rl eval`` and the recipe's
    evaluations, whatever the rollouts' sampling temperature; logged as ``eval/*``, apart from the
    sampled rollout metrics, and saved with its per-task outcomes in ``out.eval_file(step)``."""
    greedy = dataclasses.replace(runner, params=dataclasses.replace(runner.params, temperature=0.0))
    protocol = cfg.protocol(runner.skills.retrieval.strategy)
    result = await run_eval(greedy, protocol, step, progress, label=f"eval {cfg.split} @ step {step}, ")
    out.evals.mkdir(parents=True, exist_ok=True)
    write_atomic(out.eval_file(step), json.dumps(result.record()))
    return result.headline


def _read_eval(out: RunFolder, step: int) -> EvalMetrics:
    path = out.eval_file(step)
    try:
        return EvalMetrics.from_record(json.loads(path.read_text(encoding="utf-8"))["metrics"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{path}, the evaluation of step {step}, cannot be read back: {e!r}") from None


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


def _write_rollouts(path: Path, chains: Sequence[Chain]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for c in chains:
            f.write(dumps(c) + "\n")
