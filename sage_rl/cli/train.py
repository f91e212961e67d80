"""``sage-rl train [CONFIG] [key=value ...] [--resume]``: SAGE (or GRPO baseline) training."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import typer

from sage_rl.cli.common import err, fail, load_or_exit, progress
from sage_rl.config import dump_config
from sage_rl.eval.report import headline_rows
from sage_rl.train.loop import TrainConfig, TrainResult, train


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
    from sage_rl.build import build_policy
    from sage_rl.models import load_model
    from sage_rl.train.checkpoint import CheckpointError, open_run
    from sage_rl.train.trainer import Trainer

    out = Path(cfg.out_dir)
    t0 = time.perf_counter()
    start_model = cfg.policy.model
    if cfg.init_from and Path(cfg.init_from).is_dir():
        start_model = cfg.init_from
        err.print(f"starting from {start_model} (init_from)")
    model, tokenizer = load_model(start_model, device=cfg.policy.device)
    trainer = Trainer(model, tokenizer, cfg.trainer)
    try:
        logger, start = open_run(
            trainer,
            out,
            resume,
            tensorboard=cfg.tensorboard,
            wandb_project=cfg.wandb_project,
            trackio_project=cfg.trackio_project,
        )
    except FileExistsError as e:
        raise fail(f"{e} (pass --resume, or out_dir=...)", 2) from None
    except CheckpointError as e:
        raise fail(str(e), 2) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    policy = build_policy(cfg, model=trainer.model, tokenizer=tokenizer)
    err.print(
        f"training {policy.name}: steps {start}->{cfg.steps}, K={cfg.rollout.chain_length}, "
        f"G={cfg.rollout.group_size}, B={cfg.rollout.groups_per_step}, reward={cfg.rollout.reward.value}; run folder {out}"
    )
    with progress() as bar:
        result = asyncio.run(train(cfg, trainer, policy, logger, start, bar))
    logger.close()
    summary = _summary(result, time.perf_counter() - t0)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "report.md").write_text(_report(cfg, result, summary))
    _plot(out)
    err.print(f"done in {summary['wall_s']:.0f} s; report: {out / 'report.md'}")
    if as_json:
        typer.echo(json.dumps(summary))


def _summary(r: TrainResult, wall: float) -> dict:
    pick = ("tgc", "sgc", "avg_score", "avg_steps", "avg_tokens", "usage_rate", "no_code_turn_rate")
    return {
        "steps": r.steps_done,
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
