"""The laptop experiment's figure (``benchmarks/laptop_recipe.py``, ``gpu_recipe.py``): reward by
chain position and the greedy held-out TGC curve against sampled tokens for each RL arm, TGC by
model on each split, and the paired TGC differences on ``train_heldout`` against issue 27's gate,
from the stages' results and the run folder's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sage_rl.eval.ci import paired_outcomes
from sage_rl.recipe.controls import MODELS, PAIRS, RL_START, SPLITS, curve, metric_rows, paired_curve
from sage_rl.runs.console import err
from sage_rl.settings import TrainConfig
from sage_rl.train.layout import STEP_NAME, RunFolder


def _arms(done: dict[str, Any], out: Path) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each finished RL arm with its start model's and its own evaluation on the loop's split
    (``eval.split``): (arm, start's evaluation, arm's evaluation). On a split the recipe does not
    report (``train_val``, where ``eval.keep: best`` chooses), both are the run's own: its step-0
    evaluation of the start model and its last one."""
    cfg: TrainConfig = done["cfg"]
    key = next((k for k, s in SPLITS.items() if s == cfg.eval.split), None)
    res = done["results"]
    if key is None:
        own = {arm: _own_ends(RunFolder.of(out / arm)) for arm in RL_START if arm in res}
        return [(arm, *ends) for arm, ends in own.items() if ends is not None]
    return [(arm, res[start][key], res[arm][key]) for arm, start in RL_START.items() if arm in res]


def _own_ends(run: RunFolder) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A run's first (step 0) and last saved evaluations, or None without both."""
    names = [p.stem for p in run.evals.glob("step_*.json")] if run.evals.is_dir() else []
    steps = sorted(int(n.removeprefix("step_")) for n in names if STEP_NAME.match(n))
    first = _saved_eval(run, 0) if steps and steps[0] == 0 else None
    last = _saved_eval(run, steps[-1]) if len(steps) > 1 else None
    return (first, last) if first and last else None


def curves(done: dict[str, Any], out: Path) -> dict[str, list[tuple[int, float]]]:
    """Each RL arm's greedy TGC curve on the first ``eval.scenarios`` scenarios of ``eval.split``
    (``controls.curve``), from its own start model's measured TGC."""
    n = done["cfg"].eval.scenarios
    return {arm: curve(start, final, metric_rows(out / arm / "metrics.jsonl"), n) for arm, start, final in _arms(done, out)}


def paired_curves(done: dict[str, Any], out: Path) -> dict[str, list[list[float]]]:
    """Each RL arm's curve as paired differences from its own start model on the same tasks
    (``controls.paired_curve``): ``[sampled tokens, difference, low, high]`` per point, from the
    periodic evaluations' saved outcomes (``evals/step_NNNNNN.json``; runs from before they were
    saved have only the final point)."""
    table = {}
    for arm, start, final in _arms(done, out):
        run = RunFolder.of(out / arm)
        rows = [r for r in metric_rows(run.metrics) if "sampled_tokens_total" in r]
        if rows:
            # the last step's point is the final one (its after-run evaluation, where it has one)
            points = [(r["sampled_tokens_total"], ev) for r in rows[:-1] if (ev := _saved_eval(run, r.get("step")))]
            table[arm] = paired_curve(start, points, (rows[-1]["sampled_tokens_total"], final), done["cfg"].eval.scenarios)
    return table


#: The gate the paired SAGE - SFT difference must clear (issue 27): at least this, interval above 0.
GATE = 5.0


def gaps(done: dict[str, Any], key: str = "heldout") -> list[tuple[str, float, float, float]]:
    """``(a - b, difference, low, high)`` in TGC points for each pair of ``controls.PAIRS`` both of
    whose models were evaluated on split ``key``, paired (``paired_outcomes``: the same scenarios
    resampled for both), in ``PAIRS``' order; ``sft - base`` is left out (its ~60 points would set
    the scale that the others are read on)."""
    res = done["results"]
    out = []
    for a, b in PAIRS:
        if (a, b) != ("sft", "base") and key in res.get(a, {}) and key in res.get(b, {}):
            d = paired_outcomes(res[b][key]["outcomes"], res[a][key]["outcomes"])
            if d is not None:
                out.append((f"{a} - {b}", d[0], *d[1]))
    return out


def _saved_eval(run: RunFolder, step: Any) -> dict[str, Any] | None:
    """A periodic evaluation's saved outcomes, or None where that step has none; a damaged file
    is named on stderr and its point left out (the figures it feeds are not the results)."""
    path = run.eval_file(step) if isinstance(step, int) else None
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("outcomes"), list):
            return data
    except (OSError, ValueError):
        pass
    err.print(f"{path}: not a saved evaluation (damaged?); its curve point is left out", markup=False)
    return None


def plot(done: dict[str, Any], out: Path, path: Path) -> None:
    """Reward by position and the held-out TGC curve against sampled tokens, per RL arm; TGC by
    model on each split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3, ax4) = plt.subplots(1, 4, figsize=(22, 4.5))
    res = done["results"]
    models = [m for m in MODELS if m in res]
    styles = {"sage": "-", "grpo_lib": "--", "grpo_nolib": ":"}
    for name, points in curves(done, out).items():
        style = styles[name]
        steps = [r for r in metric_rows(out / name / "metrics.jsonl") if "reward" in r]
        x = [r.get("sampled_tokens_total", 0) for r in steps]
        for k in sorted({k for r in steps for k in r if k.startswith("reward/k")}):
            ax1.plot(x, [r.get(k) for r in steps], style, marker="o", label=f"{name} {k.split('/')[1]}")
        ax2.plot([p[0] for p in points], [p[1] for p in points], style, marker="o",
                 label=f"{name} (from {RL_START[name]})")  # fmt: skip
    ax1.set(title="Reward by chain position (sampled)", xlabel="sampled tokens", ylabel="mean reward")
    subset = done["cfg"].eval.scenarios
    ax2.set(
        title=f"Greedy TGC, first {subset} scenarios of {done['cfg'].eval.split}",
        xlabel="sampled tokens",
        ylabel="TGC (%)",
        ylim=(0, 100),
    )
    if not done["rl"]:  # stopped after SFT (--until sft): the SFT runs' held-out loss instead
        ax1.cla()
        for name in ("sft", "sft_inline"):
            rows = [r for r in metric_rows(out / name / "metrics.jsonl") if "eval_loss" in r]
            ax1.plot([r["step"] for r in rows], [r["eval_loss"] for r in rows], marker="o", label=name)
        ax1.set(title="SFT held-out loss", xlabel="optimizer step", ylabel="loss")
        ax2.text(0.5, 0.5, "RL stages not run", ha="center", va="center", transform=ax2.transAxes)
    width = 0.4
    for j, key in enumerate(SPLITS):
        ms = [res[m][key]["metrics"] for m in models]
        xs = [i + width * j for i in range(len(models))]
        yerr = [[m["tgc"] - m["tgc_ci"][0] for m in ms], [m["tgc_ci"][1] - m["tgc"] for m in ms]]
        ax3.bar(xs, [m["tgc"] for m in ms], width, yerr=yerr, capsize=3, label=SPLITS[key])
    ax3.set_xticks([i + width / 2 for i in range(len(models))], models, rotation=30, ha="right", fontsize=8)
    ax3.set(title="TGC by model (95% scenario bootstrap)", ylabel="TGC (%)", ylim=(0, 100))
    rows = gaps(done)[::-1]  # the first pair (the gate's) on top
    ys = range(len(rows))
    ax4.errorbar([r[1] for r in rows], ys, xerr=[[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]],
                 fmt="o", capsize=3)  # fmt: skip
    ax4.set_yticks(ys, [r[0] for r in rows], fontsize=8)
    ax4.axvline(0, color="black", lw=0.8)
    gate = f"gate: sage - sft >= +{GATE:g}, interval above 0"
    ax4.axvline(GATE, color="tab:red", ls="--", lw=0.8, label=gate)
    ax4.set(title="Paired TGC differences, train_heldout (95%)", xlabel="TGC points")
    for ax in (ax1, ax2, ax3, ax4):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
