"""Two finished evaluations of a laptop-experiment run folder, paired, as the recipe's table gives
them (``recipe/controls.py``: ``differences`` and, for an RL arm, ``on_pool``), without running or
reading back any other stage: a headline can be read while the other models' evaluations run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/paired.py runs/laptop28 sage sft [--split train_heldout] [--json FILE]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/paired.py runs/laptop35 sage@2 sage@0   # two of an arm's in-run evaluations

Prints each model's TGC and SGC with their intervals, steps and tokens a task, and the paired
``<a> - <b>`` differences (TGC, SGC, steps, tokens; and where ``a`` is an RL arm with a screened
pool, on the pool's templates and off them), then the templates where the two solved different
tasks (``templates_changed``); ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from sage_rl.eval.ci import format_ci
from sage_rl.recipe.controls import (
    RL_START,
    SPLITS,
    by_template,
    differences,
    on_pool,
    per_task,
    screened_templates,
)


def load(run: Path, model: str, split: str) -> dict[str, Any]:
    """A model's finished evaluation of ``split`` in ``run`` with its per-task figures; ``arm@N``:
    the RL arm's greedy evaluation at step N during its run (``<run>/<arm>/evals/step_<N>.json``,
    on its loop's split; no per-task steps or tokens)."""
    if "@" in model:
        arm, _, step = model.partition("@")
        path = run / arm / "evals" / f"step_{int(step):06d}.json"
        if not path.is_file():
            raise SystemExit(f"paired: {path} does not exist: {arm} has no evaluation at step {step}")
        return json.loads(path.read_text(encoding="utf-8")) | {"per_task": {}}
    folder = run / "eval" / f"{model}_{split}"
    path = folder / "outcomes.json"
    if not path.is_file():
        raise SystemExit(f"paired: {path} does not exist: {model} has no finished evaluation of {split}")
    return json.loads(path.read_text(encoding="utf-8")) | {"per_task": per_task(folder)}


def loop_split(run: Path, a: str, b: str, split: str) -> str:
    """The split of the comparison: ``split``, or for two in-run evaluations (``arm@N``) their
    loop's (``eval.split`` of the arm's config); one of each compares nothing."""
    steps = ["@" in m for m in (a, b)]
    if not any(steps):
        return split
    if not all(steps):
        raise SystemExit(f"paired: {a} and {b}: an in-run evaluation (arm@N) pairs only with another")
    found = {yaml.safe_load((run / m.partition("@")[0] / "config.yaml").read_text())["eval"]["split"] for m in (a, b)}
    if len(found) > 1:
        raise SystemExit(f"paired: {a} and {b} were evaluated on different splits: {sorted(found)}")
    return found.pop()


def compare(run: Path, a: str, b: str, split: str = "train_heldout") -> dict[str, Any]:
    split = loop_split(run, a, b, split)
    key = {v: k for k, v in SPLITS.items()}.get(split, split)
    ea, eb = load(run, a, split), load(run, b, split)
    row: dict[str, Any] = {"run": str(run), "split": split}
    for m, e in ((a, ea), (b, eb)):
        mt = e["metrics"]
        row[m] = {k: mt.get(k) for k in ("tasks", "scenarios", "tgc", "tgc_ci", "sgc", "sgc_ci", "avg_steps", "avg_tokens")}
    row |= differences(key, a, b, ea, eb)
    arm = a.partition("@")[0]
    pool = screened_templates(run / arm) if arm in RL_START else None
    if pool is not None:
        row |= on_pool(key, a, b, ea, eb, pool) | {f"pool_templates_{a}": sorted(pool)}
    row["templates_changed"] = by_template(ea, eb)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--split", default="train_heldout")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    row = compare(args.run, args.a, args.b, args.split)
    for m in (args.a, args.b):
        r = row[m]
        print(f"{m}: {r['tasks']} tasks, {r['scenarios']} scenarios; TGC {format_ci(r['tgc'], r['tgc_ci'])}, "
              f"SGC {format_ci(r['sgc'], r['sgc_ci'])}, {r['avg_steps']:.2f} steps, {r['avg_tokens']:.0f} tokens")  # fmt: skip
    for k, v in row.items():
        if k.endswith("_ci") or "_minus_" not in k:
            continue
        print(f"{k}: " + (format_ci(v, row[f"{k}_ci"], "{:+.2f}") if v is not None else "n/a"))
    pool = set(row.get(f"pool_templates_{args.a}", ()))
    print(f"templates where {args.a} and {args.b} differ (tasks solved by each; * in {args.a}'s pool):")
    for t, c in row["templates_changed"].items():
        print(f"  {t}{' *' if t in pool else ''}: {c['a']} against {c['b']} of {c['tasks']} ({c['changed']} changed)")
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
    return row


if __name__ == "__main__":
    main()
