"""Two finished evaluations of a laptop-experiment run folder, paired, as the recipe's table gives
them (``recipe/controls.py``: ``differences`` and, for an RL arm, ``on_pool``), without running or
reading back any other stage: a headline can be read while the other models' evaluations run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/paired.py runs/laptop28 sage sft [--split train_heldout] [--json FILE]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/paired.py runs/laptop35 sage@2 sage@0   # two of an arm's in-run evaluations
    PYTHONPATH=$PWD .venv/bin/python benchmarks/paired.py runs/laptop35 /tmp/ctl/eval/signflip0_train_val grpo_lib@0
        # any ``sage-rl eval`` folder (a path: it holds a /), on the split its config names

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
    readable,
    screened_templates,
)
from sage_rl.types import Chain


def load(run: Path, model: str, split: str) -> dict[str, Any]:
    """A model's finished evaluation of ``split`` in ``run`` with its per-task figures; ``arm@N``:
    the RL arm's greedy evaluation at step N during its run (``<run>/<arm>/evals/step_<N>.json``,
    on its loop's split; no per-task steps or tokens); a path (``is_folder``): that evaluation
    folder's."""
    if is_folder(model):
        return folder_record(Path(model)) | {"per_task": per_task(Path(model))}
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


def folder_record(folder: Path) -> dict[str, Any]:
    """An evaluation folder's record as the recipe saves it (``EvalResult.record``): its
    ``outcomes.json``, or for a ``sage-rl eval`` folder (which writes none) its headline strategy's
    metrics (``metrics.json``'s first) and outcome rows from that strategy's trajectories."""
    if (folder / "outcomes.json").is_file():
        return json.loads((folder / "outcomes.json").read_text(encoding="utf-8"))
    try:
        strategy, metrics = next(iter(json.loads((folder / "metrics.json").read_text(encoding="utf-8")).items()))
    except (OSError, ValueError, StopIteration, AttributeError) as e:
        raise SystemExit(f"paired: {folder} holds no finished evaluation (outcomes.json or metrics.json: {e})") from None
    chains = readable(folder / f"trajectories.{strategy}.jsonl", Chain.from_dict, "chain record")
    rows = [[t.task.task_id, t.task.scenario_id, t.outcome.success] for c in chains for t in c.trajectories]
    if len(rows) != metrics.get("tasks"):
        raise SystemExit(f"paired: {folder}: {len(rows)} tasks in its trajectories, {metrics.get('tasks')} in its metrics")
    return {"metrics": metrics, "outcomes": rows}


def is_folder(model: str) -> bool:
    """A model named by the path of its evaluation folder (``sage-rl eval``'s ``out_dir``)."""
    return "/" in model


def label(model: str) -> str:
    """How a model is named in the results: a folder by its last part, anything else as given."""
    return Path(model).name if is_folder(model) else model


def loop_split(run: Path, a: str, b: str, split: str) -> str:
    """The split of the comparison: ``split``, or the one an in-run evaluation (``arm@N``: its
    loop's, ``eval.split`` of the arm's config) or an evaluation folder (its config's ``split``)
    was made on; a named model is then read on that split."""
    found = set()
    for m in (a, b):
        if "@" in m:
            found.add(yaml.safe_load((run / m.partition("@")[0] / "config.yaml").read_text())["eval"]["split"])
        elif is_folder(m):
            try:
                found.add(yaml.safe_load((Path(m) / "config.yaml").read_text(encoding="utf-8"))["split"])
            except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
                raise SystemExit(f"paired: {m}/config.yaml does not name the split it evaluated ({e})") from None
    if len(found) > 1:
        raise SystemExit(f"paired: {a} and {b} were evaluated on different splits: {sorted(found)}")
    return found.pop() if found else split


def compare(run: Path, a: str, b: str, split: str = "train_heldout") -> dict[str, Any]:
    split = loop_split(run, a, b, split)
    key = {v: k for k, v in SPLITS.items()}.get(split, split)
    ea, eb = load(run, a, split), load(run, b, split)
    a, b = label(a), label(b)
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
    names = [label(args.a), label(args.b)]
    for m in names:
        r = row[m]
        print(f"{m}: {r['tasks']} tasks, {r['scenarios']} scenarios; TGC {format_ci(r['tgc'], r['tgc_ci'])}, "
              f"SGC {format_ci(r['sgc'], r['sgc_ci'])}, {r['avg_steps']:.2f} steps, {r['avg_tokens']:.0f} tokens")  # fmt: skip
    for k, v in row.items():
        if k.endswith("_ci") or "_minus_" not in k:
            continue
        print(f"{k}: " + (format_ci(v, row[f"{k}_ci"], "{:+.2f}") if v is not None else "n/a"))
    pool = set(row.get(f"pool_templates_{names[0]}", ()))
    print(f"templates where {names[0]} and {names[1]} differ (tasks solved by each; * in {names[0]}'s pool):")
    for t, c in row["templates_changed"].items():
        print(f"  {t}{' *' if t in pool else ''}: {c['a']} against {c['b']} of {c['tasks']} ({c['changed']} changed)")
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
    return row


if __name__ == "__main__":
    main()
