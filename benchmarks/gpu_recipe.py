"""The laptop experiment, larger, on one GPU, inside a wall-clock budget (issue 17's GPU part).

    PYTHONPATH=$PWD python benchmarks/gpu_recipe.py --deadline-s 540 [--config configs/gpu_recipe.yaml]
        [--out runs/gpu_recipe] [--results docs/results/gpu] [key=value ...]
    PYTHONPATH=$PWD python benchmarks/gpu_recipe.py --until sage --deadline-s 420 ...   # SAGE - SFT only
    PYTHONPATH=$PWD python benchmarks/gpu_recipe.py --quick --deadline-s 60 --out /tmp/g --results /tmp/g

The stages are ``benchmarks/laptop_recipe.py``'s (the two SFT models and base -> SAGE and the GRPO
controls, same evaluations, same table, same plot) with ``configs/gpu_recipe.yaml``'s bigger G, B
and batches. What this script adds is the RL budget: after the SFT models' evaluations it gives the
three RL arms the same ``sampled_token_budget``, the largest that :func:`rl_budget` expects to fit in
the time left; when not even one step of each fits, it stops there and reports base and SFT only. Equal sampled tokens
is what the comparison needs; how many that is depends on the machine, so it is measured, not
guessed. A budget given in the config or on the command line is used as it is.

``--until sage``: the headline alone (``laptop_recipe.py --until sage``'s stages: the library
expert, its SFT model, sft and sft_nolib evaluated, then SAGE and sage_nolib), for a lease too short
for the whole table: the one RL arm gets the time left after its own two evaluations.

Writes ``<results>/laptop_recipe.json`` (with ``deadline_s``, ``budget_rule`` and ``device``
added) and ``<results>/laptop_recipe.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import laptop_recipe  # noqa: E402  (benchmarks/ is not a package)

from sage_rl.config import load_config  # noqa: E402
from sage_rl.recipe.controls import RL_START  # noqa: E402
from sage_rl.recipe.results import table  # noqa: E402
from sage_rl.settings import TrainConfig  # noqa: E402
from sage_rl.train.sft_resume import SFTStopped  # noqa: E402

#: Share of the RL time spent sampling at the evaluation's rate: the rest pays for training, the
#: sandbox and the step that overshoots the budget. Conservative: RL samples in bigger batches.
SAMPLING_SHARE = 0.5
#: The RL models' evaluations, in units of the SFT models' ("eval sft": sft with and without its
#: library): four models (sage, sage_nolib, grpo_lib, grpo_nolib), and an RL model may write longer
#: answers (the laptop's GRPO model wrote 1.65x the SFT model's tokens).
EVAL_FACTOR = 3.0
#: --quick: laptop_recipe's toy sizes, with the budget left to the deadline rule.
QUICK = [
    *laptop_recipe.QUICK,
    "sampled_token_budget=null",
    "rollout.groups_per_step=1",
    "rollout.concurrency=4",
    "recipe.eval.concurrency=4",
]


def rl_budget(
    sft_done: dict[str, Any], left_s: float, cfg: TrainConfig, arms: int = len(RL_START)
) -> tuple[int | None, str]:
    """Sampled tokens per RL run that should let both runs and their evaluations end within
    ``left_s`` (None when not even one step of each fits), and the rule's arithmetic as text.

    The greedy evaluations of the SFT model (with and without its library) give the rate (their
    generated tokens over their wall time) and the time a task takes; the RL arms get what is left
    after their evaluations, a third each (``arms``); of a run's time, its own evaluations of
    ``eval.split`` (``loop_evals``: before and after, and every ``eval.every`` steps, 3 tasks a
    scenario) are taken off, and it samples ``SAMPLING_SHARE`` of the rest; one step's worth is
    taken off, since a run stops after the step that reaches the budget. With one arm (SAGE alone),
    its two evaluations (sage, sage_nolib) count as ``EVAL_FACTOR`` / 2 x eval sft: four models'
    worth halved.
    """
    ev_s = sft_done["times"]["eval sft"]
    metrics = [ev["metrics"] for m in ("sft", "sft_nolib") for ev in sft_done["results"][m].values()]
    tasks = sum(m["tasks"] for m in metrics)
    tokens = sum(m["avg_tokens"] * m["tasks"] for m in metrics)
    rate = tokens / max(ev_s, 1e-9)
    per_task = tokens / max(1, tasks)
    r = cfg.rollout
    step_tokens = r.group_size * r.groups_per_step * r.chain_length * per_task
    factor = EVAL_FACTOR if arms > 1 else EVAL_FACTOR / 2
    rl_s = max(0.0, left_s - factor * ev_s) / arms
    task_s = ev_s / max(1, tasks)
    sampled, own_s = loop_evals(cfg, rl_s, task_s, rate, step_tokens)
    head = (
        f"left {left_s:.0f} s - {factor} x eval sft {ev_s:.0f} s = {arms * rl_s:.0f} s for RL, "
        f"{rl_s:.0f} s each, {own_s:.0f} s of it its own evaluations; x {SAMPLING_SHARE} x {rate:.0f} tok/s "
        f"(eval sft) = {sampled:.0f} tokens"
    )
    if sampled < step_tokens:
        return None, f"{head}, less than one step ({step_tokens:.0f} tok): RL not run"
    budget = max(1, int(sampled - step_tokens))
    return budget, f"{head} - one step ({step_tokens:.0f} tok) = {budget} tokens"


def loop_evals(cfg: TrainConfig, rl_s: float, task_s: float, rate: float, step_tokens: float) -> tuple[float, float]:
    """(tokens a run of ``rl_s`` seconds samples, seconds of it that its own evaluations take):
    before and after (``eval.before_after``), then one every ``eval.every`` of the steps the time
    left would buy, counted once (their time is not given back to sampling)."""
    from sage_rl.envs.pocketworld.tasks import scenarios_of_split

    e = cfg.eval
    one_s = 3 * (e.scenarios or len(scenarios_of_split(e.split))) * task_s
    own_s = 2 * one_s if e.before_after else 0.0
    steps = SAMPLING_SHARE * max(0.0, rl_s - own_s) * rate / step_tokens
    own_s += (int(steps) // e.every) * one_s if e.every else 0.0
    return SAMPLING_SHARE * max(0.0, rl_s - own_s) * rate, own_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/gpu_recipe.yaml")
    ap.add_argument("--out", default="runs/gpu_recipe", help="run folder (stages resume from it)")
    ap.add_argument("--results", default="docs/results/gpu", help="folder for the JSON and the PNG")
    ap.add_argument("--deadline-s", type=float, required=True, help="wall-clock budget of the whole run")
    ap.add_argument("--quick", action="store_true", help="toy size with the tiny random model (tests)")
    ap.add_argument(
        "--until",
        choices=("sage", "all"),
        default="all",
        help="sage: the headline only (library SFT, sft, sft_nolib, SAGE, sage_nolib): one RL arm",
    )
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = ap.parse_args(argv)
    if (
        args.quick
        and Path(args.results).resolve() == (laptop_recipe.ROOT / "docs" / "results" / "gpu").resolve()
    ):
        ap.error(
            "--quick writes toy figures: give --results a scratch folder, not the measured docs/results/gpu"
        )
    t0 = time.perf_counter()
    out = Path(args.out)
    overrides = list(args.overrides)
    if args.quick:
        overrides = [*QUICK, f"policy.model={laptop_recipe._tiny(out)}", *overrides]
    cfg = load_config(TrainConfig, args.config, overrides)
    headline = args.until == "sage"
    try:
        first = laptop_recipe.run(cfg, out, until="sft_lib" if headline else "sft")
    except SFTStopped as e:
        laptop_recipe.stopped("gpu_recipe", e)
    budget, rule = cfg.sampled_token_budget, "given in the config"
    if budget is None:
        left = args.deadline_s - (time.perf_counter() - t0)
        budget, rule = rl_budget(first, left, cfg, arms=1 if headline else len(RL_START))
        cfg = cfg.model_copy(update={"sampled_token_budget": budget})
    print(f"[gpu_recipe] sampled_token_budget: {rule}", file=sys.stderr)
    done = first
    if budget is not None:  # else the report has base and the SFT models only, as with --until sft
        done = laptop_recipe.run(cfg, out, until=args.until)
        done["times"] |= first["times"]  # the stages this call read back took their time in the first
    row = table(done, cfg, out) | {
        "deadline_s": args.deadline_s,
        "wall_s": round(time.perf_counter() - t0, 1),
        "budget_rule": rule,
        "until": args.until,
        "device": _device(),
    }
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "laptop_recipe.json").write_text(json.dumps(row, indent=1) + "\n")
    laptop_recipe.plot(done, out, results / "laptop_recipe.png")
    print(
        json.dumps({k: v for k, v in row.items() if k.startswith("heldout_tgc_") and not k.endswith("_ci")})
    )
    return row


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
