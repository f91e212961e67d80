"""``sage-rl eval [CONFIG] [key=value ...]``: scenario-ordered evaluation with TGC, SGC, steps, tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import typer

from sage_rl.build import BuildError, build_policy, build_runner, open_suite
from sage_rl.cli.common import err, fail, load_or_exit, progress
from sage_rl.config import dump_config
from sage_rl.eval.report import print_table, write_run
from sage_rl.eval.runner import EvalResult, run_eval
from sage_rl.settings import EvalRunConfig


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/eval.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics object as JSON on stdout"),
) -> None:
    """Scenario-ordered evaluation. Overrides: key.sub=value (e.g. split=test_normal policy.kind=scripted)."""
    cfg = load_or_exit(EvalRunConfig, config, ctx.args, default="configs/eval.yaml")
    try:
        result = asyncio.run(evaluate(cfg))
    except BuildError as e:
        raise fail(str(e)) from None
    out = Path(cfg.out_dir)
    write_run(out, result.metrics, result.chains, dump_config(cfg), f"sage-rl eval: {cfg.env} {cfg.split}")
    print_table(result.metrics, f"{cfg.env} / {cfg.split} / {cfg.policy.kind} ({result.seconds:.0f} s)")
    err.print(f"run folder: {out}")
    if as_json:
        typer.echo(json.dumps({k: dataclasses.asdict(m) for k, m in result.metrics.items()}))


async def evaluate(cfg: EvalRunConfig) -> EvalResult:
    """Compose the run (suite and sandbox, policy, runner), evaluate, close what was opened."""
    async with open_suite(cfg, split=cfg.split) as suite:
        runner = build_runner(cfg, build_policy(cfg), suite)
        with progress() as bar:
            return await run_eval(runner, cfg, progress=bar, record_dir=Path(cfg.out_dir))
