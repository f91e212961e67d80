"""The laptop experiment's results JSON (``docs/results/laptop_recipe.json``; benchmarks/laptop_recipe.py
and gpu_recipe.py write it): the paper's table per split, every model with its intervals, the paired
differences of ``controls.PAIRS``, where RL's gain lies (its pool's templates and the others), the RL
runs' budgets and curves, and the SFT runs' sizes."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from sage_rl.eval.ci import bootstrap_ci
from sage_rl.recipe.controls import (
    MODELS,
    NO_LIBRARY,
    PAIRS,
    RL_START,
    SPLITS,
    differences,
    on_pool,
    screened_templates,
    units,
)
from sage_rl.recipe.figure import curves, paired_curves
from sage_rl.recipe.twins import SAME_AS
from sage_rl.settings import TrainConfig


def table(done: dict[str, Any], cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """The results JSON: the paper's table per split (every model, its intervals), the paired
    differences of ``PAIRS``, the RL runs' budgets and the SFT runs' sizes."""
    res = done["results"]
    models = [m for m in MODELS if m in res]
    row: dict[str, Any] = {}
    for key in SPLITS:
        for model in models:
            ev = res[model][key]
            m, task_units = ev["metrics"], units(ev)
            row[f"{key}_tgc_{model}"] = m["tgc"]
            row[f"{key}_tgc_{model}_ci"] = list(m["tgc_ci"])
            row[f"{key}_sgc_{model}"] = m["sgc"]
            row[f"{key}_sgc_{model}_ci"] = list(m["sgc_ci"])
            for metric, avg in (("steps", "avg_steps"), ("tokens", "avg_tokens")):
                row[f"{key}_{metric}_{model}"] = m[avg]
                known = [u for u in task_units if u[metric] is not None]
                values, clusters = [u[metric] for u in known], [u["scenario"] for u in known]
                ci = bootstrap_ci(values, clusters=clusters) if known else None
                row[f"{key}_{metric}_{model}_ci"] = list(ci) if ci else None
            lib = model not in NO_LIBRARY  # no library: skill usage is n/a, not 0
            row[f"{key}_skill_usage_{model}"] = m["usage_rate"] if lib else None
            row[f"{key}_success_when_used_{model}"] = m["success_when_used"] if lib else None
            row[f"{key}_tasks"] = m["tasks"]
            row[f"{key}_scenarios"] = m["scenarios"]
        for a, b in PAIRS:
            if a in res and b in res:
                row |= differences(key, a, b, res[a][key], res[b][key])
        for arm, start in RL_START.items() if key == "heldout" else ():  # dev's templates are never pooled
            pool = screened_templates(out / arm) if arm in res and start in res else None
            if pool is not None:  # where RL's gain lies: the templates it sampled, and the others
                row |= on_pool(key, arm, start, res[arm][key], res[start][key], pool)
                row[f"pool_templates_{arm}"] = sorted(pool)
    rl, sft = done["rl"], done["sft"]
    row |= {
        "sampled_token_budget": cfg.sampled_token_budget,
        **{f"sampled_tokens_{n}": rl.get(n, {}).get("sampled_tokens") for n in RL_START},
        **{f"rl_steps_{n}": rl.get(n, {}).get("steps") for n in RL_START},
        **{f"rl_kept_{n}": rl.get(n, {}).get("kept") for n in RL_START},  # eval.keep: best's choice
        "rl_start": dict(RL_START),
        "evaluations_read_back": read_back(out),
        "rl": {"B": cfg.rollout.groups_per_step, "G": cfg.rollout.group_size, "K_sage": cfg.rollout.chain_length,
               "pool": str(cfg.rollout.pool), "screen_every": cfg.rollout.screen_every,
               "screen_samples": cfg.rollout.screen_samples,
               "screen_scenarios": cfg.rollout.screen_scenarios, "screen_confirm": cfg.rollout.screen_confirm,
               "pool_memory": cfg.rollout.pool_memory, "pool_explore": cfg.rollout.pool_explore,
               "dynamic_sampling": cfg.rollout.dynamic_sampling, "lr": cfg.trainer.lr,
               "warmup_steps": cfg.trainer.warmup_steps, "temperature": cfg.sampling.temperature},
        "models": models,
        "curves": {arm: [list(p) for p in points] for arm, points in curves(done, out).items()},
        "curves_paired": paired_curves(done, out),
        "no_library": sorted(m for m in models if m in NO_LIBRARY),
        "sft": {m: _sft_summary(v) for m, v in sft.items()},
        "times_s": done["times"],
        "machine": {"cpus": os.cpu_count(), "load_at_end": list(os.getloadavg()), "python": platform.python_version()},
        "run_dir": str(out),
        "protocol": "greedy, scenario-ordered, every model on the same tasks; intervals: 95% percentile "
        "bootstrap (2,000 resamples, seed 0) over whole scenarios (TGC, steps, tokens: cluster bootstrap "
        "of the tasks' values; SGC: scenarios); differences are paired (the same scenarios drawn for both)",
    }  # fmt: skip
    return row


def read_back(out: Path) -> dict[str, str]:
    """{evaluation folder: the folder it was read back from} for the run's evaluations of a model
    that kept its start's weights (``recipe/twins.py``, ``same_as.json``): not run a second time."""
    found = {}
    for note in sorted(out.glob(f"eval/*/{SAME_AS}")):
        try:
            found[note.parent.name] = Path(str(json.loads(note.read_text(encoding="utf-8"))["evaluation"])).name
        except (OSError, ValueError, KeyError, TypeError):
            found[note.parent.name] = f"unreadable {SAME_AS}"
    return found


def _sft_summary(v: dict[str, Any]) -> dict[str, Any]:
    s, c = v["sft"], v["collect"]
    keys = (
        "steps",
        "train_examples",
        "trained_tokens_per_epoch",
        "eval_loss_before",
        "eval_loss_after",
        "best_step",
        "wall_s",
    )
    return {k: s.get(k) for k in keys} | {
        "collected": {k: c.get(k) for k in ("examples", "scenarios") if k in c}
    }
