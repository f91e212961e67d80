"""Presenting evaluation results: a rich table, a Markdown report, PNG plots, and the run folder."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sage_rl.eval.ci import format_ci
from sage_rl.eval.metrics import EvalMetrics
from sage_rl.types import Chain, dumps

#: (label, attribute, format) of the headline rows, in the paper's order (SAGE.md section 9).
HEADLINE = (
    ("TGC (%)", "tgc", "{:.1f}"),
    ("SGC (%)", "sgc", "{:.1f}"),
    ("avg steps", "avg_steps", "{:.1f}"),
    ("avg tokens", "avg_tokens", "{:,.0f}"),
    ("avg score", "avg_score", "{:.3f}"),
    ("no-code turns", "no_code_turn_rate", "{:.2%}"),
    ("completed", "completed_rate", "{:.2%}"),
    ("skill usage (pos >= 2)", "usage_rate", "{:.2%}"),
    ("success when used", "success_when_used", "{:.2%}"),
    ("library size", "library_size", "{:.1f}"),
    ("skills generated / used", None, None),
)


def headline_rows(m: EvalMetrics) -> list[tuple[str, str]]:
    """(label, value) in HEADLINE order; TGC and SGC carry their 95% bootstrap interval."""
    rows = []
    for label, attr, fmt in HEADLINE:
        if attr is None:
            value = f"{m.skills_generated} / {m.skills_used}"
        elif attr in ("tgc", "sgc"):
            value = format_ci(getattr(m, attr), getattr(m, f"{attr}_ci"))
        else:
            value = fmt.format(getattr(m, attr))
        rows.append((label, value))
    return rows


def rich_table(results: Mapping[str, EvalMetrics], title: str) -> Table:
    """One column per run (e.g. per retrieval strategy)."""
    table = Table(title=title)
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    per_run = [dict(headline_rows(m)) for m in results.values()]
    for label, _, _ in HEADLINE:
        table.add_row(label, *[r[label] for r in per_run])
    return table


def markdown_report(results: Mapping[str, EvalMetrics], title: str, config_yaml: str) -> str:
    names = list(results)
    lines = [f"# {title}", "", "| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    per_run = [dict(headline_rows(m)) for m in results.values()]
    for label, _, _ in HEADLINE:
        lines.append(f"| {label} | " + " | ".join(r[label] for r in per_run) + " |")
    for name, m in results.items():
        lines += [
            "",
            f"## {name}",
            "",
            "TGC by position: " + _fmt_map(m.tgc_by_position, "{:.1f}"),
            "",
            "Skill usage by position: " + _fmt_map(m.usage_rate_by_position, "{:.2f}"),
            "",
            "TGC by difficulty: " + _fmt_map(m.tgc_by_difficulty, "{:.1f}"),
            "",
            "Stop reasons: " + ", ".join(f"{k} {v}" for k, v in m.stop_reasons.items()),
        ]
    lines += [
        "",
        "TGC and SGC: value [95% percentile-bootstrap interval over tasks / scenarios, 2,000 resamples, "
        "seed 0] (sage_rl/eval/ci.py). Metric definitions: docs/metrics.md.",
        "",
        "## Config",
        "",
        "```yaml",
        config_yaml.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _fmt_map(d: Mapping[int, float], fmt: str) -> str:
    return ", ".join(f"{k}: {fmt.format(v)}" for k, v in d.items()) or "-"


def plot_results(results: Mapping[str, EvalMetrics], path: Path) -> None:
    """TGC by position and skill usage by position, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, m in results.items():
        ax1.plot(list(m.tgc_by_position), list(m.tgc_by_position.values()), marker="o", label=name)
        ax2.plot(
            list(m.usage_rate_by_position), list(m.usage_rate_by_position.values()), marker="o", label=name
        )
    ax1.set(title="TGC by task position", xlabel="position in scenario", ylabel="TGC (%)", ylim=(0, 100))
    ax2.set(
        title="Skill usage by task position",
        xlabel="position in scenario",
        ylabel="share of tasks",
        ylim=(0, 1),
    )
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_run(
    out: Path,
    results: Mapping[str, EvalMetrics],
    chains: Mapping[str, Sequence[Chain]],
    config_yaml: str,
    title: str,
) -> None:
    """The run folder: config, trajectories (JSON Lines), metrics.json, report.md, plots."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(config_yaml)
    for name, cs in chains.items():
        with open(out / f"trajectories.{name}.jsonl", "w") as f:
            for c in cs:
                f.write(dumps(c) + "\n")
    (out / "metrics.json").write_text(
        json.dumps({k: dataclasses.asdict(m) for k, m in results.items()}, indent=2)
    )
    (out / "report.md").write_text(markdown_report(results, title, config_yaml))
    plot_results(results, out / "by_position.png")


def print_table(results: Mapping[str, EvalMetrics], title: str, console: Console | None = None) -> None:
    (console or Console(stderr=True)).print(rich_table(results, title))
