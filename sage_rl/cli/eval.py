"""``sage-rl eval [CONFIG] [key=value ...]``: scenario-ordered evaluation with TGC, SGC, steps, tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

import typer

from sage_rl.build import RunConfig, build_policy, build_runner, build_suite
from sage_rl.cli.common import err, fail, load_or_exit, progress
from sage_rl.config import dump_config
from sage_rl.eval.metrics import compute_metrics
from sage_rl.eval.report import print_table, write_run
from sage_rl.eval.runner import evaluate_chains, scenarios_of
from sage_rl.skills.library import Library
from sage_rl.skills.retrieval import STRATEGIES


class EvalConfig(RunConfig):
    split: str = "dev"
    #: retrieval strategies to compare; "all" = every strategy. The first is the headline.
    strategies: list[str] = ["same_scenario"]
    concurrency: int = 4  # scenarios in flight
    limit_scenarios: int | None = None  # evaluate only the first N scenarios (smoke runs)
    library_store: str | None = None  # start every scenario from this SQLite skill store
    out_dir: str = "runs/eval"


def main(
    ctx: typer.Context,
    config: str = typer.Argument(None, help="YAML config (default: configs/eval.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics object as JSON on stdout"),
) -> None:
    """Scenario-ordered evaluation. Overrides: key.sub=value (e.g. split=test_normal policy.kind=scripted)."""
    cfg = load_or_exit(EvalConfig, config, ctx.args, default="configs/eval.yaml")
    results, chains, secs = run_eval(cfg)
    out = Path(cfg.out_dir)
    write_run(out, results, chains, dump_config(cfg), f"sage-rl eval: {cfg.env} {cfg.split}")
    print_table(results, f"{cfg.env} / {cfg.split} / {cfg.policy.kind} ({secs:.0f} s)")
    err.print(f"run folder: {out}")
    if as_json:
        typer.echo(json.dumps({k: dataclasses.asdict(m) for k, m in results.items()}))


def run_eval(cfg: EvalConfig):
    strategies = list(STRATEGIES) if cfg.strategies == ["all"] else cfg.strategies
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise fail(
            f"unknown retrieval strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)} or all", 2
        )
    try:
        suite = build_suite(cfg)
        tasks = suite.split(cfg.split)
    except Exception as e:  # a missing split / missing data is a one-line user error
        raise fail(str(e)) from None
    scenarios = scenarios_of(tasks)[: cfg.limit_scenarios]
    tasks = [t for s in scenarios for t in s]
    library = _start_library(cfg)
    policy = build_policy(cfg)
    t0 = time.perf_counter()
    results, chains = {}, {}
    with progress() as bar:
        for strategy in strategies:
            run_cfg = cfg.model_copy(
                update={
                    "skills": cfg.skills.model_copy(
                        update={"retrieval": cfg.skills.retrieval.model_copy(update={"strategy": strategy})}
                    )
                }
            )
            runner = build_runner(run_cfg, policy, suite)
            job = bar.add_task(f"{strategy}: scenarios", total=len(scenarios))
            done = asyncio.run(
                evaluate_chains(runner, tasks, library, cfg.concurrency, lambda _c, j=job: bar.advance(j))
            )
            chains[strategy], results[strategy] = done, compute_metrics(done)
    return results, chains, time.perf_counter() - t0


def _start_library(cfg: EvalConfig) -> Library:
    if not cfg.library_store:
        return Library()
    from sage_rl.skills.store import SkillStore

    with SkillStore(cfg.library_store) as store:
        return Library.of(store.latest())
