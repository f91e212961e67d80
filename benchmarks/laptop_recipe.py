"""The laptop experiment of issue 17: base model, SFT, SAGE from SFT and GRPO from SFT at equal
sampled tokens, evaluated on ``train_heldout`` and ``dev`` in the paper's table shape.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/laptop_recipe.py [--config configs/laptop_recipe.yaml]
        [--out runs/laptop_recipe] [--results docs/results] [key=value ...]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/laptop_recipe.py --quick --out /tmp/lr   # toy size, tiny model

Stages (each skipped when its output exists in ``--out``, so a stopped run resumes):
1. evaluate the base model; 2. collect scripted-expert trajectories; 3. SFT; 4. evaluate SFT;
5. SAGE from SFT (K = 2, skill-integrated reward, library); 6. GRPO from SFT (no library, K = 1,
outcome reward); 7. evaluate both. Stages 1-4 are the recipe's own (``sage_rl.recipe``).

Equal sampled tokens: both RL runs get the same ``sampled_token_budget``: each stops after the
step at which its rollouts' generated tokens (prompts, observations and evaluations excluded)
reach the budget, so each overshoots by less than one step; both totals are reported. GRPO's
``groups_per_step`` is K times SAGE's, so both take the same number of task samples per step.
Both train from the same SFT checkpoint with the same trainer settings and seed.

Every evaluation is greedy and scenario-ordered with the same agent limits; GRPO is evaluated in
its own format (no library section, as trained). Bootstrap intervals (95%, percentile, seed 0;
sage_rl/eval/ci.py) go beside every TGC/SGC, over tasks and scenarios; the paired TGC differences
resample the same tasks for both models.

Writes ``<results>/laptop_recipe.json`` and ``<results>/laptop_recipe.png`` (learning curves:
reward by position and held-out TGC against sampled tokens, SAGE vs GRPO; TGC by model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from sage_rl.config import load_config
from sage_rl.eval.ci import paired_outcomes
from sage_rl.recipe.pipeline import (
    Layout,
    collect_config,
    eval_config,
    evaluate,
    final_model,
    run_once,
    sft_config,
    train_config,
    train_once,
)
from sage_rl.runs.collect import run_collect
from sage_rl.runs.sft import run_sft
from sage_rl.settings import TrainConfig

MODELS = ("base", "sft", "sage", "grpo")
SPLITS = {"heldout": "train_heldout", "dev": "dev"}

#: --quick: the tiny random model, toy sizes, in-process executor: the pipeline in well under a minute.
QUICK = [
    "pocketworld.sandbox=false",
    "agent.max_steps=2",
    "agent.max_tokens_per_turn=12",
    "agent.token_budget=null",
    "rollout.group_size=2",
    "steps=3",
    "sampled_token_budget=300",
    "eval.every=1",
    "eval.scenarios=1",
    "recipe.collect.num_scenarios=3",
    "recipe.sft.optim.max_steps=2",
    "recipe.sft.optim.epochs=4",
    "recipe.sft.eval_every=1",
    "recipe.sft.data.eval_fraction=0.3",
    "recipe.eval.scenarios=1",
]


def grpo_config(sage: TrainConfig) -> TrainConfig:
    """The GRPO baseline of SAGE.md section 6 from the same start: no library and no skill
    instructions, K = 1, outcome reward; K times the groups per step (same task samples per step)."""
    data = sage.model_dump(mode="json")
    k = sage.rollout.chain_length
    data["skills"] = {**data["skills"], "use_skills": False}
    data["rollout"] = {
        **data["rollout"],
        "chain_length": 1,
        "reward": "outcome",
        "groups_per_step": k * sage.rollout.groups_per_step,
    }
    data["out_dir"] = str(Path(sage.out_dir).parent / "grpo")
    return TrainConfig.model_validate(data)


def run(cfg: TrainConfig, out: Path, until: str = "grpo", parallel: bool = False) -> dict[str, Any]:
    """Every stage not done yet, up to the evaluation of model ``until`` (``sft``: no RL);
    returns {model: {split: evaluation}}, RL summaries and times. ``parallel``: evaluations run
    two at a time in two processes, each with ``policy.threads`` (1 unless set): on 2 cores this
    beats one 2-thread process after another. Training stays one run at a time: each RL trainer
    peaks near 12 GB at these sizes, and two side by side were OOM-killed on 24 GB (docs/LOG.md)."""
    assert cfg.recipe is not None
    r, lay = cfg.recipe, Layout(out)
    out.mkdir(parents=True, exist_ok=True)
    collect_cfg = collect_config(cfg, r, lay.expert)
    sft_cfg = sft_config(cfg, r, lay.expert / f"{collect_cfg.name}.jsonl", lay.sft)
    ev_cfg = _one_thread if parallel else (lambda c: c)
    sage_cfg = train_config(cfg, lay.sft / "final", lay.sage)
    grpo_cfg = grpo_config(sage_cfg)
    times: dict[str, float] = {}

    def timed(name: str, fn):
        t0 = time.perf_counter()
        result = fn()
        times[name] = round(time.perf_counter() - t0, 1)
        print(f"[laptop_recipe] {name}: {times[name]:.0f} s", file=sys.stderr)
        return result

    def evals(models: dict[str, tuple[TrainConfig, str | None]]) -> dict[str, Any]:
        """{model: {split: evaluation}} of ``{name: (run config, weights)}``, every split."""
        jobs = [
            (m, k, eval_config(ev_cfg(c), model, split, r.eval.scenarios, r.eval.concurrency, lay.eval(m, split)))
            for m, (c, model) in models.items()
            for k, split in SPLITS.items()
        ]  # fmt: skip
        done = _side_by_side(evaluate, [j[2] for j in jobs]) if parallel else [evaluate(j[2]) for j in jobs]
        out: dict[str, Any] = {}
        for (m, k, _), ev in zip(jobs, done, strict=True):
            out.setdefault(m, {})[k] = ev
        return out

    results = timed("eval base", lambda: evals({"base": (cfg, cfg.policy.model)}))
    timed("collect", lambda: run_once(lay.expert / "summary.json", run_collect, collect_cfg))
    sft = timed("sft", lambda: run_once(lay.sft / "result.json", run_sft, sft_cfg))
    results |= timed("eval sft", lambda: evals({"sft": (cfg, str(lay.sft / "final"))}))
    if until == "sft":
        return {"results": results, "sft": sft, "rl": {}, "times": times}
    rl = {
        "sage": timed("sage", lambda: train_once(sage_cfg)),
        "grpo": timed("grpo", lambda: train_once(grpo_cfg)),
    }
    trained = {
        "sage": (sage_cfg, final_model(lay.sage)),
        "grpo": (grpo_cfg, final_model(Path(grpo_cfg.out_dir))),
    }
    results |= timed("eval sage + grpo", lambda: evals(trained))
    return {"results": results, "sft": sft, "rl": rl, "times": times}


def _one_thread(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with one torch thread per process, unless ``policy.threads`` says otherwise."""
    return cfg.model_copy(
        update={"policy": cfg.policy.model_copy(update={"threads": cfg.policy.threads or 1})}
    )


def _side_by_side(fn, items: list) -> list:
    """``[fn(x) for x in items]``, two processes at a time (spawned: each loads its own torch)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(fn, items))


def table(done: dict[str, Any], cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """The results JSON: the paper's table per split, with intervals and paired differences."""
    res = done["results"]
    row: dict[str, Any] = {}
    for key in SPLITS:
        for model in (m for m in MODELS if m in res):
            m = res[model][key]["metrics"]
            row[f"{key}_tgc_{model}"] = m["tgc"]
            row[f"{key}_tgc_{model}_ci"] = list(m["tgc_ci"])
            row[f"{key}_sgc_{model}"] = m["sgc"]
            row[f"{key}_sgc_{model}_ci"] = list(m["sgc_ci"])
            row[f"{key}_steps_{model}"] = m["avg_steps"]
            row[f"{key}_tokens_{model}"] = m["avg_tokens"]
            row[f"{key}_skill_usage_{model}"] = m["usage_rate"]
            row[f"{key}_success_when_used_{model}"] = m["success_when_used"]
            row[f"{key}_tasks"] = m["tasks"]
        for a, b in (("base", "sft"), ("sft", "sage"), ("sft", "grpo"), ("grpo", "sage")):
            if a not in res or b not in res:
                continue
            diff, ci = _paired(res[a][key], res[b][key])
            row[f"{key}_tgc_{b}_minus_{a}"] = diff
            row[f"{key}_tgc_{b}_minus_{a}_ci"] = list(ci)
    rl = done["rl"]
    row |= {
        "sampled_token_budget": cfg.sampled_token_budget,
        "sampled_tokens_sage": rl.get("sage", {}).get("sampled_tokens"),
        "sampled_tokens_grpo": rl.get("grpo", {}).get("sampled_tokens"),
        "rl_steps_sage": rl.get("sage", {}).get("steps"),
        "rl_steps_grpo": rl.get("grpo", {}).get("steps"),
        "models": [m for m in MODELS if m in res],
        "sft": {k: done["sft"].get(k) for k in ("steps", "train_examples", "eval_loss_before", "eval_loss_after", "best_step", "wall_s")},
        "times_s": done["times"],
        "machine": {"cpus": os.cpu_count(), "load_at_end": list(os.getloadavg()), "python": platform.python_version()},
        "run_dir": str(out),
        "protocol": "greedy, scenario-ordered; TGC/SGC intervals: 95% percentile bootstrap over scenarios "
        "(2,000 resamples, seed 0; TGC resamples whole scenarios); paired differences resample the same scenarios",
    }  # fmt: skip
    return row


def _paired(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, tuple[float, float]]:
    return paired_outcomes(a["outcomes"], b["outcomes"]) or (0.0, (0.0, 0.0))


def plot(done: dict[str, Any], out: Path, path: Path) -> None:
    """Reward by position and held-out TGC against sampled tokens (SAGE vs GRPO); TGC by model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    sft_tgc = done["results"]["sft"]["heldout"]["metrics"]["tgc"]
    models = [m for m in MODELS if m in done["results"]]
    for name, style in ((m, s) for m, s in (("sage", "-"), ("grpo", "--")) if m in models):
        rows = _rows(out / name / "metrics.jsonl")
        steps = [r for r in rows if "reward" in r]
        x = [r.get("sampled_tokens_total", 0) for r in steps]
        for key in sorted({k for r in steps for k in r if k.startswith("reward/k")}):
            ax1.plot(x, [r.get(key) for r in steps], style, marker="o", label=f"{name} {key.split('/')[1]}")
        evals = [(r.get("sampled_tokens_total", 0), r["eval/tgc"]) for r in rows if "eval/tgc" in r]
        final = done["results"][name]["heldout"]["metrics"]["tgc"]
        if steps:
            evals.append((x[-1], final))
        ax2.plot(
            [0, *(e[0] for e in evals)], [sft_tgc, *(e[1] for e in evals)], style, marker="o", label=name
        )
    ax1.set(title="Reward by chain position", xlabel="sampled tokens", ylabel="mean reward")
    ax2.set(title="Held-out TGC while training", xlabel="sampled tokens", ylabel="TGC (%)", ylim=(0, 100))
    if "sage" not in models:  # stopped after SFT (--until sft): its held-out loss by position instead
        ax1.cla()
        sft_rows = [r for r in _rows(out / "sft" / "metrics.jsonl") if "eval_loss" in r]
        for key in sorted({k for r in sft_rows for k in r if k.startswith("eval_loss")}):
            ax1.plot([r["step"] for r in sft_rows], [r.get(key) for r in sft_rows], marker="o", label=key)
        ax1.set(title="SFT held-out loss", xlabel="optimizer step", ylabel="loss")
        ax2.text(0.5, 0.5, "RL stages not run", ha="center", va="center", transform=ax2.transAxes)
    for j, (key, split) in enumerate(SPLITS.items()):
        ms = [done["results"][m][key]["metrics"] for m in models]
        xs = [i + 0.4 * j for i in range(len(models))]
        yerr = [[m["tgc"] - m["tgc_ci"][0] for m in ms], [m["tgc_ci"][1] - m["tgc"] for m in ms]]
        ax3.bar(xs, [m["tgc"] for m in ms], 0.4, yerr=yerr, capsize=3, label=split)
    ax3.set_xticks([i + 0.2 for i in range(len(models))], [m.upper() if m != "base" else m for m in models])
    ax3.set(title="TGC by model (95% bootstrap)", ylabel="TGC (%)", ylim=(0, 100))
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/laptop_recipe.yaml")
    ap.add_argument("--out", default="runs/laptop_recipe", help="run folder (stages resume from it)")
    ap.add_argument(
        "--results",
        default=None,
        help="folder for laptop_recipe.json/.png (default: docs/results; --quick: --out)",
    )
    ap.add_argument("--quick", action="store_true", help="toy size with the tiny random model (tests)")
    ap.add_argument(
        "--until",
        choices=("sft", "grpo"),
        default="grpo",
        help="sft: stop after the SFT model's evaluations and report base and SFT only",
    )
    ap.add_argument(
        "--parallel",
        action="store_true",
        help="evaluate two models or splits at a time (two processes, one torch thread each); training "
        "stays one run at a time (an RL trainer peaks near 12 GB at these sizes)",
    )
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = ap.parse_args(argv)
    out = Path(args.out)
    overrides = list(args.overrides)
    if args.quick:
        overrides = [*QUICK, f"policy.model={_tiny(out)}", *overrides]
    cfg = load_config(TrainConfig, args.config, overrides)
    done = run(cfg, out, args.until, args.parallel)
    results = Path(args.results or (out if args.quick else "docs/results"))
    results.mkdir(parents=True, exist_ok=True)
    row = table(done, cfg, out)
    (results / "laptop_recipe.json").write_text(json.dumps(row, indent=1) + "\n")
    plot(done, out, results / "laptop_recipe.png")
    print(
        json.dumps({k: v for k, v in row.items() if k.startswith("heldout_tgc_") and not k.endswith("_ci")})
    )
    return row


def _tiny(out: Path) -> Path:
    """The tiny random model, saved once under ``out``."""
    from sage_rl.models import save_plain, tiny_model

    folder = out / "tiny_model"
    if not (folder / "config.json").is_file():
        model, tok = tiny_model(seed=0)
        save_plain(model, folder)
        tok.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    main()
