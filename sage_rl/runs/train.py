"""``sage-rl train``'s work: train one model and write its run folder (``train/layout.py``).

``run_train(cfg, resume)``: ``open_training`` (the model: ``init_from``, else ``policy.model``; the
trainer; the run folder's logger; the policy over the trained model), then ``open_suite`` and
``build_runner``, then the loop (``train(..., sync=training.sync)``, ``train/loop.py``), then
``summary.json``, ``report.md`` and ``curves.png``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

from sage_rl.build import Training, build_runner, open_suite, open_training
from sage_rl.config import dump_config
from sage_rl.eval.report import headline_rows
from sage_rl.files import write_atomic
from sage_rl.runs.claim import claim
from sage_rl.runs.console import err, progress
from sage_rl.settings import TrainConfig
from sage_rl.train.layout import RunFolder
from sage_rl.train.loop import TrainResult, train
from sage_rl.train.same_run import check_same_run


class NoStartModel(ValueError):
    """``init_from`` names a model folder that does not exist (one line for the user)."""


def check_start(cfg: TrainConfig) -> None:
    """``sage-rl train`` trains one model: ``init_from`` when set, else ``policy.model``. A missing
    ``init_from`` is an error, never a silent fallback to another model or to the recipe."""
    if cfg.init_from and not Path(cfg.init_from).is_dir():
        raise NoStartModel(
            f"init_from={cfg.init_from} does not exist: make it with `sage-rl sft`, or run the whole "
            "recipe (collect -> SFT -> SAGE) with `sage-rl recipe`, or set init_from=null to train "
            "policy.model"
        )


def run_train(cfg: TrainConfig, resume: bool) -> dict:
    """Train per ``cfg`` and write the run folder: config, checkpoints, metrics, rollouts,
    ``summary.json``, ``report.md``, ``curves.png``. Returns the summary. Raises ``NoStartModel``,
    ``FileExistsError`` (a used folder without ``resume``), ``SettingsChanged`` (``resume`` with other
    settings than the folder's run), ``CheckpointError``, ``BuildError``."""
    check_start(cfg)
    if resume:  # the folder's run, under its own settings (train/same_run.py), before anything is written
        check_same_run(RunFolder.of(cfg.out_dir).config, cfg)
    with claim(cfg.out_dir):  # one process at a time in it (runs/claim.py)
        return _run_train(cfg, resume)


def _run_train(cfg: TrainConfig, resume: bool) -> dict:
    folder = RunFolder.of(cfg.out_dir)
    t0 = time.perf_counter()
    training = open_training(cfg, resume)
    if training.model_source != cfg.policy.model:
        err.print(f"starting from {training.model_source} (init_from)")
    folder.root.mkdir(parents=True, exist_ok=True)
    folder.config.write_text(dump_config(cfg))
    r = cfg.rollout
    err.print(
        f"training {training.policy.name}: steps {training.start}->{cfg.steps}, K={r.chain_length}, "
        f"G={r.group_size}, B={r.groups_per_step}, reward={r.reward.value}; run folder {folder.root}"
    )
    try:
        result = asyncio.run(_train(cfg, training))
    finally:
        training.logger.close()
    summary = _summary(result, time.perf_counter() - t0)
    write_atomic(folder.summary, json.dumps(summary, indent=2))
    folder.report.write_text(_report(cfg, result, summary))
    _plot(folder)
    err.print(f"done in {summary['wall_s']:.0f} s; report: {folder.report}")
    return summary


async def _train(cfg: TrainConfig, run: Training) -> TrainResult:
    """Open the suite (and its sandbox), train, close what was opened."""
    async with open_suite(cfg) as suite:
        runner = build_runner(cfg, run.policy, suite)
        with progress() as bar:
            return await train(runner, run.trainer, run.logger, cfg, cfg.seed, run.start, bar, sync=run.sync)


def _summary(r: TrainResult, wall: float) -> dict:
    pick = ("tgc", "sgc", "avg_score", "avg_steps", "avg_tokens", "usage_rate", "no_code_turn_rate")
    return {
        "steps": r.steps_done,
        "sampled_tokens": r.sampled_tokens,
        "wall_s": wall,
        "rollout_s": r.rollout_s,
        "train_s": r.train_s,
        "before": {k: getattr(r.before, k) for k in pick} if r.before else None,
        "after": {k: getattr(r.after, k) for k in pick} if r.after else None,
        # eval.keep: best: the model the run ends with (train/best.py); null: its last weights
        "kept": dataclasses.asdict(r.best) if r.best else None,
    }


def _report(cfg: TrainConfig, r: TrainResult, summary: dict) -> str:
    lines = [
        f"# sage-rl train: {cfg.out_dir}",
        "",
        f"{r.steps_done} steps in {summary['wall_s']:.0f} s "
        f"(rollout {r.rollout_s:.0f} s, train {r.train_s:.0f} s).",
        "",
    ]
    if r.before and r.after:
        lines += [
            f"Greedy evaluation on the first {cfg.eval.scenarios or 'all'} scenarios of `{cfg.eval.split}`:",
            "",
            "| metric | before | after |",
            "|---|---|---|",
        ]
        lines += [
            f"| {a[0]} | {a[1]} | {b[1]} |"
            for a, b in zip(headline_rows(r.before), headline_rows(r.after), strict=True)
        ]
    if r.best:
        lines += [
            "",
            f"The run's model is the best of its evaluations on `{cfg.eval.split}` (`eval.keep: best`): "
            f"step {r.best.step} of {r.steps_done}, TGC {r.best.tgc:.1f}, SGC {r.best.sgc:.1f} (`best/`).",
        ]
    lines += _noise_lines(RunFolder.of(cfg.out_dir))
    lines += [
        "",
        "Curves: `metrics.jsonl`, `tb/` (TensorBoard), `curves.png`. Definitions: docs/metrics.md.",
        "",
    ]
    return "\n".join(lines)


def _noise_lines(folder: RunFolder) -> list[str]:
    """The gradient noise scale over the run's measured steps (``trainer.noise_scale``), or nothing."""
    from sage_rl.train.logging import read_metrics

    rows = [r for r in read_metrics(folder.root) if r.get("noise/groups")]
    if not rows:
        return []
    share = sum(r["noise/signal_share"] for r in rows) / len(rows)
    signal = sum(r["noise/signal"] for r in rows) / len(rows)
    trace = sum(r["noise/trace"] for r in rows) / len(rows)
    groups = sum(r["noise/groups"] for r in rows)
    run = (
        f"over the run B_simple = mean trace / mean signal = {trace / signal:.0f} groups, and it trained "
        f"{groups:.0f} groups: {groups * signal / trace:.1f} B_simple"
        if signal > 0
        else f"no signal resolved over the run's {groups:.0f} groups (mean signal <= 0)"
    )
    return [
        "",
        f"Gradient noise scale (`trainer.noise_scale`, {len(rows)} steps): the reward's signal was on average "
        f"{share:.2f} of a step's gradient; {run} (docs/metrics.md).",
    ]


def _plot(folder: RunFolder) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sage_rl.train.logging import read_metrics

    rows = [r for r in read_metrics(folder.root) if r.get("step", 0) > 0 and "reward" in r]
    if not rows:
        return
    keys = ["reward", "success", "skill_use_rate"]
    if any("noise/signal_share" in r for r in rows):  # trainer.noise_scale
        keys.append("noise/signal_share")
    fig, axes = plt.subplots(1, len(keys), figsize=(11 * len(keys) / 3, 3.2))
    for ax, key in zip(axes, keys, strict=True):
        ax.plot([r["step"] for r in rows], [r.get(key) for r in rows], marker="o")
        ax.set(title=key, xlabel="step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder.curves, dpi=110)
    plt.close(fig)
