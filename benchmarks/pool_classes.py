"""Where an RL arm's greedy score moves, by the class its first screen gave each template: the
pool (sampled success strictly between 0 and 1), solved (every sampled task) or hopeless (none).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/pool_classes.py runs/laptop35x/sage [EVAL_DIR ...] [--json FILE]

Reads the arm's first screen (``screens.jsonl``) and each of its in-run evaluations
(``evals/step_NNNNNN.json``, on its loop's split), and any finished ``sage-rl eval`` folders named
after it (their ``outcomes.json``, e.g. the kept model on ``train_heldout``); prints tasks solved of
each class's tasks, and TGC, one row per evaluation (``recipe/controls.py``: ``by_screen_class``).
An arm that loses off its pool loses where it never samples (docs/LOG.md, 2026-12-08).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sage_rl.recipe.controls import SCREEN_CLASSES, by_screen_class, screen_class
from sage_rl.rollout.pool import Screen, screens


def rows(arm: Path, folders: list[Path]) -> list[dict[str, Any]]:
    """One row per evaluation: its name, {class: [solved, tasks]} and TGC over the classed tasks."""
    made = screens(arm)
    if not made:
        raise SystemExit(f"pool_classes: {arm / 'screens.jsonl'} holds no screen: {arm} has no screened pool")
    success = dict(Screen.from_row(made[0]).success)
    named = [(f"step {int(p.stem.split('_')[1])}", p) for p in sorted((arm / "evals").glob("step_*.json"))]
    named += [(f.name, f / "outcomes.json") for f in folders]
    out = []
    for name, path in named:
        if not path.is_file():
            raise SystemExit(f"pool_classes: {path} does not exist: not a finished evaluation")
        classes = by_screen_class(success, json.loads(path.read_text(encoding="utf-8"))["outcomes"])
        solved, tasks = (sum(c[i] for c in classes.values()) for i in (0, 1))
        out.append({"eval": name, **classes, "tgc": 100.0 * solved / max(1, tasks)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arm", type=Path, help="an RL run folder with a screened pool")
    ap.add_argument("evals", type=Path, nargs="*", help="finished `sage-rl eval` folders to add")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    table_rows = rows(args.arm, args.evals)
    first = Screen.from_row(screens(args.arm)[0])
    counts = {c: sum(1 for r in first.success.values() if screen_class(r) == c) for c in SCREEN_CLASSES}
    table = Table(title=f"{args.arm}: tasks solved by the class of step {first.step}'s screen")
    table.add_column("evaluation")
    for c in SCREEN_CLASSES:
        table.add_column(f"{c} ({counts[c]} templates)", justify="right")
    table.add_column("TGC", justify="right")
    for r in table_rows:
        table.add_row(r["eval"], *(f"{r[c][0]}/{r[c][1]}" for c in SCREEN_CLASSES), f"{r['tgc']:.1f}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(table_rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
