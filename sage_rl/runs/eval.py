"""``sage-rl eval``'s work: compose the run, evaluate scenario by scenario, write the run folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sage_rl.build import build_policy, build_runner, open_suite
from sage_rl.config import dump_config
from sage_rl.eval.report import print_table, write_run
from sage_rl.eval.resume import start
from sage_rl.eval.runner import EvalResult, run_eval
from sage_rl.runs.claim import claim
from sage_rl.runs.console import progress
from sage_rl.settings import EvalRunConfig


async def evaluate(cfg: EvalRunConfig, resume: bool = False) -> EvalResult:
    """Compose the run (suite and sandbox, policy, runner), evaluate, close what was opened.
    Trajectories stream into ``cfg.out_dir`` as they finish; ``resume`` continues the evaluation
    a stopped run left there (``eval/resume.py``). Raises ``BuildError``, ``ResumeError``."""
    start(Path(cfg.out_dir), cfg, resume)
    async with open_suite(cfg, split=cfg.split) as suite:
        runner = build_runner(cfg, build_policy(cfg), suite)
        with progress() as bar:
            return await run_eval(runner, cfg, progress=bar, record_dir=Path(cfg.out_dir), resume=resume)


def run_evaluation(cfg: EvalRunConfig, title: str | None = None, resume: bool = False) -> EvalResult:
    """Evaluate per ``cfg`` (``resume``: continuing a stopped evaluation in its folder), print the
    metrics table, headed ``title`` (default: environment, split and policy) and the wall time,
    and write the run folder (``eval/report.py``: config, metrics, report, plots, trajectories).
    Raises ``BuildError``, ``ResumeError``, and what ``write_run`` raises (the table is printed
    before)."""
    with claim(cfg.out_dir):  # one process at a time in it (runs/claim.py)
        return _run_evaluation(cfg, title, resume)


def _run_evaluation(cfg: EvalRunConfig, title: str | None, resume: bool) -> EvalResult:
    result = asyncio.run(evaluate(cfg, resume))
    title = title or f"{cfg.env} / {cfg.split} / {cfg.policy.kind}"
    print_table(result.metrics, f"{title} ({result.seconds:.0f} s)")
    header = f"sage-rl eval: {cfg.env} {cfg.split}"
    write_run(Path(cfg.out_dir), result.metrics, result.chains, dump_config(cfg), header)
    return result
