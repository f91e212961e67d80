"""``sage-rl eval [CONFIG] [key=value ...]``: scenario-ordered evaluation with TGC, SGC, steps, tokens."""

from __future__ import annotations

import dataclasses
import json

import typer

from sage_rl.runs.console import err, fail, load_or_exit
from sage_rl.settings import EvalRunConfig


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/eval.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics object as JSON on stdout"),
    resume: bool = typer.Option(
        False, "--resume", help="continue the evaluation a stopped run left in out_dir (same settings)"
    ),
) -> None:
    """Scenario-ordered evaluation. Overrides: key.sub=value (e.g. split=test_normal policy.kind=scripted)."""
    cfg = load_or_exit(EvalRunConfig, config, ctx.args, default="configs/eval.yaml")
    from sage_rl.build import BuildError  # torch and the run's modules, once the config is good
    from sage_rl.eval.report import ReportError
    from sage_rl.eval.resume import ResumeError
    from sage_rl.runs.claim import RunInUse
    from sage_rl.runs.eval import run_evaluation

    try:
        result = run_evaluation(cfg, resume=resume)
    except (BuildError, ReportError, ResumeError) as e:  # ReportError: the rest of the run folder was written
        raise fail(str(e)) from None
    except RunInUse as e:
        raise fail(str(e), 2) from None
    err.print(f"run folder: {cfg.out_dir}")
    if as_json:
        typer.echo(json.dumps({k: dataclasses.asdict(m) for k, m in result.metrics.items()}))
