"""``sage-rl choose STEP=EVAL_FOLDER ...``: the model a run keeps, chosen from finished
evaluations of its saved models by the rule of ``eval.keep: best`` (``sage_rl/runs/choose.py``)."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from sage_rl.runs.choose import Candidate, ChooseError, choose, read_candidate
from sage_rl.runs.console import err, fail


def main(
    pairs: list[str] = typer.Argument(..., help="STEP=FOLDER: a finished `sage-rl eval` folder of the model after STEP updates (0: the start)"),
    strategy: str = typer.Option("same_scenario", help="which of the evaluations' strategies to judge"),
    as_json: bool = typer.Option(False, "--json", help="print the choice as JSON on stdout"),
) -> None:
    """Choose among a run's saved models by their evaluations on a validation split."""
    try:
        candidates = [read_candidate(*_pair(p), strategy=strategy) for p in pairs]
        kept = choose(candidates)
    except ChooseError as e:
        raise fail(str(e), code=2) from None
    table = Table(title=f"{kept.split}, {strategy}: higher TGC, then SGC; a tie keeps the earlier step")
    for col in ("step", "TGC", "SGC", "tasks", "model", ""):
        table.add_column(col)
    for c in sorted(candidates, key=lambda c: c.step):
        m = c.metrics
        table.add_row(str(c.step), f"{m['tgc']:.1f}", f"{m['sgc']:.1f}", str(m["tasks"]), str(c.model),
                      "kept" if c is kept else "")  # fmt: skip
    err.print(table)
    err.print(f"kept: step {kept.step} ({kept.model}), evaluated in {kept.folder}")
    if as_json:
        typer.echo(json.dumps(_row(kept, candidates, strategy), indent=1))


def _pair(text: str) -> tuple[int, str]:
    step, sep, folder = text.partition("=")
    if not sep or not step.strip().isdigit() or not folder:
        raise ChooseError(f"{text!r}: give STEP=FOLDER (a step number, then a finished evaluation's folder)")
    return int(step), folder


def _row(kept: Candidate, candidates: list[Candidate], strategy: str) -> dict:
    def one(c: Candidate) -> dict:
        keys = ("tgc", "tgc_ci", "sgc", "sgc_ci", "tasks", "avg_steps", "avg_tokens")
        return {"step": c.step, "model": c.model, "folder": str(c.folder), **{k: c.metrics.get(k) for k in keys}}

    return {"split": kept.split, "strategy": strategy, "kept": one(kept),
            "candidates": [one(c) for c in sorted(candidates, key=lambda c: c.step)]}  # fmt: skip
