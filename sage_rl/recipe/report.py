"""The recipe's one report: ``report.md`` (what each stage changed, with bootstrap intervals) and
``report.png`` (TGC by stage, the SFT loss curves, the RL reward curves), plus ``summary.json``.

It reads only what the stages left: the state file of ``pipeline`` (each stage's result) and the
stages' own ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sage_rl.eval.ci import format_ci, paired_outcomes
from sage_rl.files import write_atomic
from sage_rl.recipe.controls import metric_rows

#: (stage key in the state, column label) of the evaluations, in order.
EVALS = (("eval_base", "base"), ("eval_sft", "SFT"), ("eval_sage", "SAGE"))

#: (label, metrics key, format) of the comparison rows; TGC and SGC carry their intervals.
ROWS = (
    ("TGC (%)", "tgc", None),
    ("SGC (%)", "sgc", None),
    ("avg steps", "avg_steps", "{:.2f}"),
    ("avg tokens", "avg_tokens", "{:,.0f}"),
    ("avg score", "avg_score", "{:.3f}"),
    ("no-code turns", "no_code_turn_rate", "{:.1%}"),
    ("skill usage (pos >= 2)", "usage_rate", "{:.1%}"),
    ("success when used", "success_when_used", "{:.1%}"),
    ("skills generated / used", None, None),
)


def cell(m: Mapping[str, Any], key: str | None, fmt: str | None) -> str:
    """One metrics value as the report shows it."""
    if key is None:
        return f"{m['skills_generated']} / {m['skills_used']}"
    if fmt is None:
        return format_ci(m[key], tuple(m[f"{key}_ci"]))
    return fmt.format(m[key])


def paired_tgc(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, tuple[float, float]] | None:
    """TGC of ``b`` minus TGC of ``a`` over the tasks both evaluated, with its paired bootstrap
    interval (scenarios resampled); None when they share no task."""
    return paired_outcomes(a["outcomes"], b["outcomes"])


def comparison(state: Mapping[str, Any], split: str) -> list[str]:
    """The Markdown table of one split: a column per evaluated stage."""
    cols = [(label, state[key]["result"][split]) for key, label in EVALS if key in state]
    if not cols:
        return []
    first = cols[0][1]["metrics"]
    lines = [
        f"### `{split}` ({first['scenarios']} scenarios, {first['tasks']} tasks)",
        "",
        "| metric | " + " | ".join(label for label, _ in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for label, key, fmt in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(r["metrics"], key, fmt) for _, r in cols) + " |")
    by_pos = ["/".join(f"{v:.0f}" for v in r["metrics"]["tgc_by_position"].values()) or "-" for _, r in cols]
    lines.append("| TGC by position (%) | " + " | ".join(by_pos) + " |")
    changes = []
    for (la, ra), (lb, rb) in zip(cols, cols[1:], strict=False):
        d = paired_tgc(ra, rb)
        if d is not None:
            changes.append(f"{lb} - {la}: {d[0]:+.1f} [{d[1][0]:+.1f}, {d[1][1]:+.1f}]")
    if changes:
        lines += ["", "TGC change on the same tasks (paired bootstrap, 95%): " + "; ".join(changes) + "."]
    return [*lines, ""]


def stage_rows(state: Mapping[str, Any]) -> list[str]:
    """One line per stage: its time and what it did."""
    lines = ["| stage | wall | what it did |", "|---|---|---|"]
    for key, entry in state.items():
        lines.append(f"| {entry.get('title', key)} | {entry.get('wall_s', 0):.0f} s | {_what(key, entry)} |")
    return lines


def _what(key: str, entry: Mapping[str, Any]) -> str:
    r = entry.get("result") or {}
    if key == "collect":
        rates = ", ".join(f"{float(v):.0%}" for v in r.get("success_by_position", {}).values())
        return (
            f"{r.get('examples')} examples from {r.get('scenarios', {}).get('run')} scenarios "
            f"(expert success by position: {rates})"
        )
    if key == "sft":
        best = f", weights of step {r['best_step']}" if r.get("best_step") else ""
        return (
            f"{r.get('steps')} steps on {r.get('train_examples')} examples, train loss "
            f"{_f(r.get('first_loss'))} -> {_f(r.get('last_loss'))}, held-out loss "
            f"{_f(r.get('eval_loss_before'))} -> {_f(r.get('eval_loss_after'))}{best}"
            + (" (stopped early)" if r.get("stopped_early") else "")
        )
    if key == "sage":
        kept = r.get("kept")  # eval.keep: best (train/best.py); step 0 is the SFT model, evaluated once
        chose = f", keeps the weights of step {kept.get('step')}" if isinstance(kept, dict) else ""
        return f"{r.get('steps')} steps, {r.get('sampled_tokens', 0):,} sampled tokens{chose}"
    splits = ", ".join(f"{s} {v.get('wall_s', 0):.0f} s" for s, v in r.items())
    return f"greedy, scenario-ordered ({splits})"


def _f(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


#: Where the full comparison lives (all 30 train templates, SAGE against its controls, 270 held-out tasks).
LAPTOP_EXPERIMENT = "benchmarks/laptop_recipe.py (docs/results/laptop_recipe.json and .png, docs/recipe.md)"


def scope_text(cfg: Any) -> str:
    """What the run trained on, in words: the curriculum's templates or all of them."""
    scope = cfg.recipe.templates
    if scope is None:
        return f"every train template of {cfg.env}"
    return f"{len(scope)} {cfg.env} train template{'s' if len(scope) != 1 else ''} ({', '.join(scope)})"


def headline(cfg: Any, state: Mapping[str, Any]) -> str:
    """The one sentence of what was trained, on what, and what the figures mean."""
    model = cfg.policy.model or "SmolLM2-135M-Instruct (the embedded model)"
    sft = state.get("sft", {}).get("result") or {}
    collected = (state.get("collect", {}).get("result") or {}).get("examples", "the")
    examples = sft.get("train_examples", collected)  # the held-out fraction is not trained on
    sft_steps = sft.get("steps", "?")
    sage_steps = (state.get("sage", {}).get("result") or {}).get("steps", cfg.steps)
    first = next((state[k]["result"] for k, _ in EVALS if k in state), {})
    held = ", ".join(f"{v['metrics']['tasks']} {s} tasks" for s, v in first.items())
    return (
        f"{model} was fine-tuned for {sft_steps} steps on {examples} scripted-expert examples of "
        f"{scope_text(cfg)}, then trained with SAGE for {sage_steps} RL steps; each figure is the "
        f"share of tasks (TGC) or whole scenarios (SGC) that the model completes, greedy, on "
        f"{held or 'its evaluation tasks'} that no stage trained on ({_splits_text(first)}), with 95% "
        "bootstrap intervals."
    )


#: What each evaluation split holds, for the headline.
SPLIT_TEXT = {
    "train_heldout": "`train_heldout`: unseen scenarios of the trained templates",
    "dev": "`dev`: templates never trained on",
}


def _splits_text(results: Mapping[str, Any]) -> str:
    return "; ".join(SPLIT_TEXT.get(s, f"`{s}`") for s in results) or "held out"


def _budget(tokens: int | None) -> str:
    return "no limit of" if tokens is None else f"{tokens:,}"


def protocol(cfg: Any) -> list[str]:
    """The settings a reader needs to read the figures: scope, budgets, threads, the full experiment."""
    budget = cfg.recipe.eval.base_token_budget
    base = (
        f"the base model's evaluation is capped at {budget} generated tokens per task (it does not "
        f"follow the format and writes until any budget ends; the other models get {_budget(cfg.agent.token_budget)})"
        if budget is not None and budget != cfg.agent.token_budget
        else f"every model gets {_budget(cfg.agent.token_budget)} generated tokens per task"
    )
    threads = cfg.policy.threads or (
        "the cores other processes leave free (sampling: measured every step; SFT: once at its start)"
    )
    return [
        f"- Scope: {scope_text(cfg)} (`recipe.templates`; `recipe.templates=null` widens it to all 30).",
        f"- Budgets: {base}.",
        f"- torch threads: {threads} (`policy.threads`).",
        "- Every evaluation is greedy and scenario-ordered, the same prompt and limits for every model. "
        "TGC and SGC: value [95% percentile bootstrap that resamples whole scenarios (a scenario's tasks "
        "are correlated), 2,000 resamples, seed 0; docs/metrics.md]: with few scenarios it is wide.",
        f"- The full comparison (all 30 train templates, SAGE against SFT and the paper's GRPO controls at "
        f"equal sampled tokens, 270 held-out tasks and 24 of unseen templates) is the laptop experiment: "
        f"{LAPTOP_EXPERIMENT}.",
    ]


def write_report(root: Path, cfg: Any, state: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``report.md``, ``report.png`` and ``summary.json`` under ``root``; returns the summary."""
    splits = list(cfg.recipe.eval.splits)
    total = sum(e.get("wall_s", 0) for e in state.values())
    lines = [
        f"# sage-rl recipe: {root}",
        "",
        headline(cfg, state),
        "",
        f"Expert collection -> SFT -> SAGE on {cfg.env}, {total / 60:.1f} min of stages on "
        f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} when this report was written: "
        "other work on the machine stretches every stage's time).",
        "",
        *protocol(cfg),
        "",
        "## What each stage changed",
        "",
    ]
    for split in splits:
        lines += comparison(state, split)
    lines += ["## Stages", "", *stage_rows(state), "", "![stages](report.png)", ""]
    (root / "report.md").write_text("\n".join(lines))
    plot(root, state, splits, title=plot_title(cfg, state))
    summary = {
        "wall_s": round(total, 1),
        "stages": {k: e.get("wall_s") for k, e in state.items()},
        **{
            metric: {
                split: {label: state[key]["result"][split]["metrics"][metric] for key, label in EVALS if key in state}
                for split in splits
            }
            for metric in ("tgc", "sgc", "avg_steps", "avg_tokens")
        },
    }  # fmt: skip
    write_atomic(root / "summary.json", json.dumps(summary, indent=2))
    return summary




def plot_title(cfg: Any, state: Mapping[str, Any]) -> str:
    """The figure's two-line title: what was trained on what, what the bars are, where the rest is."""
    first = next((state[k]["result"] for k, _ in EVALS if k in state), {})
    tasks = " + ".join(f"{v['metrics']['tasks']} {s}" for s, v in first.items())
    model = cfg.policy.model or "SmolLM2-135M"
    return (
        f"{model}: expert SFT, then SAGE, on {scope_text(cfg)}; bars: TGC on {tasks or 'held-out'} tasks "
        "never trained on (95% CI)\nFull comparison (30 templates, SAGE vs GRPO): "
        "docs/results/laptop_recipe.png (benchmarks/laptop_recipe.py)"
    )


def plot(root: Path, state: Mapping[str, Any], splits: Sequence[str], title: str = "") -> None:
    """TGC (with intervals) by stage and split; SFT train and held-out loss; RL reward by position;
    ``title`` above them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 3.8))
    stages = [(key, label) for key, label in EVALS if key in state]
    width = 0.8 / max(1, len(splits))
    for j, split in enumerate(splits):
        ms = [state[key]["result"][split]["metrics"] for key, _ in stages]
        xs = [i + j * width for i in range(len(ms))]
        err = [[m["tgc"] - m["tgc_ci"][0] for m in ms], [m["tgc_ci"][1] - m["tgc"] for m in ms]]
        ax1.bar(xs, [m["tgc"] for m in ms], width, yerr=err, capsize=3, label=split)
    ax1.set_xticks([i + width * (len(splits) - 1) / 2 for i in range(len(stages))], [s for _, s in stages])
    ax1.set(title="TGC by stage (95% bootstrap)", ylabel="TGC (%)", ylim=(0, 100))
    ax1.legend(fontsize=8)
    sft = metric_rows(root / "sft" / "metrics.jsonl")
    train = [r for r in sft if "loss" in r]
    held = [r for r in sft if "eval_loss" in r]
    ax2.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    ax2.plot([r["step"] for r in held], [r["eval_loss"] for r in held], marker="o", label="held-out")
    for key in sorted({k for r in held for k in r if k.startswith("eval_loss/")}):
        ax2.plot([r["step"] for r in held], [r.get(key) for r in held], ls=":", label=key.split("/")[1])
    ax2.set(title="SFT loss (nats per trained token)", xlabel="step")
    ax2.legend(fontsize=7)
    rl = [r for r in metric_rows(root / "sage" / "metrics.jsonl") if r.get("step", 0) > 0 and "reward" in r]
    for key in ["reward", *sorted({k for r in rl for k in r if k.startswith("reward/k")})]:
        ax3.plot([r["step"] for r in rl], [r.get(key) for r in rl], marker="o", label=key)
    ax3.set(title="SAGE reward by position", xlabel="step")
    ax3.legend(fontsize=7)
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(root / "report.png", dpi=110)
    plt.close(fig)
