"""Choose an RL run's model after the fact, as ``eval.keep: best`` does during one: evaluate saved
models on the validation split, keep the best by the same rule (``sage-rl choose``'s, over the
evaluations it writes: ``sage_rl/runs/choose.py``), and optionally evaluate the chosen one on
``train_heldout`` for the table.

For runs that kept their last weights (laptop30): their checkpoints, saved aside, are judged on
``train_val``, which no result reports, so the chosen model's ``train_heldout`` figures stay free
of the choice.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/choose_by_validation.py runs/laptop30 \\
        --model 0=runs/laptop30/sft/final --model 5=/work/laptop30_models/step_000005 ... \\
        [--name sage_val] [--scenarios 30] [--heldout] [--json FILE]

Each evaluation goes to ``<run>/eval/<name>_step<N>_train_val`` (the recipe's evaluation
settings, from ``--config``; a finished one is read back), the chosen model's held-out one to
``<run>/eval/<name>_train_heldout``, so that ``benchmarks/paired.py <run> <name> sft`` pairs it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sage_rl.config import load_config
from sage_rl.eval.ci import format_ci
from sage_rl.recipe.pipeline import eval_config, evaluate
from sage_rl.runs.choose import ChooseError, choose, read_candidate
from sage_rl.settings import TrainConfig


def _models(pairs: list[str]) -> dict[int, str]:
    models: dict[int, str] = {}
    for pair in pairs:
        step, sep, path = pair.partition("=")
        if not sep or not step.isdigit() or not Path(path, "config.json").is_file():
            raise SystemExit(f"choose_by_validation: --model {pair!r}: give STEP=FOLDER, a model folder with config.json")
        if int(step) in models:
            raise SystemExit(f"choose_by_validation: step {step} is given twice")
        models[int(step)] = path
    if len(models) < 2:
        raise SystemExit("choose_by_validation: give at least two --model STEP=FOLDER to choose from")
    return models


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="the run folder whose eval/ receives the evaluations")
    ap.add_argument("--model", action="append", default=[], help="STEP=FOLDER (0: the start model)")
    ap.add_argument("--config", default="configs/laptop_recipe.yaml", help="the recipe's config (its evaluation settings)")
    ap.add_argument("--split", default="train_val")
    ap.add_argument("--scenarios", type=int, default=30, help="the split's first N scenarios")
    ap.add_argument("--name", default="sage_val")
    ap.add_argument("--heldout", action="store_true", help="then evaluate the chosen model on all of train_heldout")
    ap.add_argument("--json", type=Path)
    ap.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = ap.parse_intermixed_args(argv)
    models = _models(args.model)
    cfg = load_config(TrainConfig, args.config, args.overrides)
    r = cfg.recipe
    if args.split in cfg.reported_splits():
        raise SystemExit(f"choose_by_validation: the results report {args.split}: choosing on it fits them (use train_val)")
    concurrency = r.eval.concurrency if r else 8
    found, folders = {}, {}
    for step, path in models.items():
        folders[step] = args.run / "eval" / f"{args.name}_step{step}_{args.split}"
        ev = eval_config(cfg, path, args.split, args.scenarios, concurrency, folders[step])
        found[step] = evaluate(ev)["metrics"]
    try:  # keep-best's rule, once the evaluations are checked to differ only in the model
        chosen = choose([read_candidate(step, folder) for step, folder in folders.items()]).step
    except ChooseError as e:
        raise SystemExit(f"choose_by_validation: {e}") from None
    for step, m in sorted(found.items()):
        mark = "  <- chosen" if step == chosen else ""
        print(f"step {step:3d}: {args.split} TGC {format_ci(m['tgc'], m['tgc_ci'])}, SGC {m['sgc']:.1f}, "
              f"{m['tasks']} tasks  {models[step]}{mark}")  # fmt: skip
    row: dict[str, Any] = {
        "run": str(args.run), "split": args.split, "scenarios": args.scenarios, "chosen_step": chosen,
        "chosen_model": models[chosen], "models": {str(s): models[s] for s in sorted(models)},
        "scores": {str(s): {k: found[s][k] for k in ("tgc", "tgc_ci", "sgc", "sgc_ci", "tasks")} for s in sorted(found)},
    }  # fmt: skip
    if args.heldout:
        folder = args.run / "eval" / f"{args.name}_train_heldout"
        ev = eval_config(cfg, models[chosen], "train_heldout", r.eval.scenarios if r else None, concurrency, folder)
        m = evaluate(ev)["metrics"]
        row["heldout"] = {k: m[k] for k in ("tgc", "tgc_ci", "sgc", "sgc_ci", "tasks")}
        print(f"chosen step {chosen} on train_heldout: TGC {format_ci(m['tgc'], m['tgc_ci'])} ({m['tasks']} tasks); "
              f"pair it: benchmarks/paired.py {args.run} {args.name} sft")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(row, indent=1))
    return row


if __name__ == "__main__":
    main()
