"""``sage-rl train [CONFIG] [key=value ...] [--resume]``: SAGE (or GRPO baseline) training."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import typer

from sage_rl.build import BuildError, Training, build_runner, open_suite, open_training
from sage_rl.cli.common import err, fail, load_or_exit, progress
from sage_rl.config import dump_config
from sage_rl.eval.report import headline_rows
from sage_rl.settings import TrainConfig
from sage_rl.train.checkpoint import CheckpointError
from sage_rl.train.loop import TrainResult, train


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/quickstart.yaml)"),
    resume: bool = typer.Option(
        False, "--resume", help="continue the run in out_dir from its last checkpoint"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the before/after summary as JSON on stdout"),
) -> None:
    """Train with sequential rollout + skill-integrated reward + GRPO (overrides: key.sub=value)."""
    cfg = load_or_exit(TrainConfig, config, ctx.args, default="configs/quickstart.yaml")
    if cfg.policy.kind != "transformers":
        raise fail("the local trainer trains a transformers policy (policy.kind=transformers)", 2)
    from sage_rl import recipe  # the recipe runs this module's ``run`` as one of its stages

    use_recipe = recipe.applies(cfg)
    try:
        summary = recipe.run(cfg, resume) if use_recipe else run(cfg, resume)
    except FileExistsError as e:
        raise fail(f"{e} (pass --resume, or out_dir=...)", 2) from None
    except (CheckpointError, recipe.RecipeError) as e:
        raise fail(str(e), 2) from None
    except BuildError as e:
        raise fail(str(e)) from None
    if as_json:
        typer.echo(json.dumps(summary))


def run(cfg: TrainConfig, resume: bool) -> dict:
    """Train per ``cfg`` (from ``init_from`` when that checkpoint exists) and write the run folder:
    checkpoints, metrics, ``summary.json``, ``report.md``, ``curves.png``. Returns the summary.
    Raises ``FileExistsError`` (a used folder without ``resume``), ``CheckpointError``, ``BuildError``."""
    out = Path(cfg.out_dir)
    t0 = time.perf_counter()
    training = open_training(cfg, resume)
    if training.model_source != cfg.policy.model:
        err.print(f"starting from {training.model_source} (init_from)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    err.print(
        f"training {training.policy.name}: steps {training.start}->{cfg.steps}, K={cfg.rollout.chain_length}, "
        f"G={cfg.rollout.group_size}, B={cfg.rollout.groups_per_step}, reward={cfg.rollout.reward.value}; run folder {out}"
    )
    try:
        result = asyncio.run(_train(cfg, training))
    finally:
        training.logger.close()
    summary = _summary(result, time.perf_counter() - t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(_report(cfg, result, summary))
    _plot(out)
    err.print(f"done in {summary['wall_s']:.0f} s; report: {out / 'report.md'}")
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
            f"Evaluation on the first {cfg.eval.scenarios or 'all'} scenarios of `{cfg.eval.split}`:",
            "",
            "| metric | before | after |",
            "|---|---|---|",
        ]
        lines += [
            f"| {a[0]} | {a[1]} | {b[1]} |"
            for a, b in zip(headline_rows(r.before), headline_rows(r.after), strict=True)
        ]
    lines += [
        "",
        "Curves: `metrics.jsonl`, `tb/` (TensorBoard), `curves.png`. Definitions: docs/metrics.md.",
        "",
    ]
    return "\n".join(lines)


def _plot(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sage_rl.train.logging import read_metrics

    rows = [r for r in read_metrics(out) if r.get("step", 0) > 0 and "reward" in r]
    if not rows:
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, key in zip(axes, ("reward", "success", "skill_use_rate"), strict=True):
        ax.plot([r["step"] for r in rows], [r.get(key) for r in rows], marker="o")
        ax.set(title=key, xlabel="step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
