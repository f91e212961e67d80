"""Presenting evaluation results: a rich table, a Markdown report, PNG plots, and the run folder.

Nothing finished is lost (issue 30): each chain is appended to its ``trajectories.<strategy>.jsonl``
as it finishes (``ChainLog``, used by ``run_eval``), and ``write_run`` writes each part of the
folder on its own, so a part that fails (a plot, a report) costs only itself. Records are written
by ``text.dumps``, which no text can make fail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sage_rl.eval.ci import format_ci
from sage_rl.eval.metrics import EvalMetrics
from sage_rl.text import dumps
from sage_rl.types import Chain

log = logging.getLogger(__name__)

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


class ReportError(RuntimeError):
    """Parts of a run folder could not be written. The message names each, and says that the
    other parts were written."""


def write_run(
    out: Path,
    results: Mapping[str, EvalMetrics],
    chains: Mapping[str, Sequence[Chain]],
    config_yaml: str,
    title: str,
) -> None:
    """The run folder: config, trajectories (JSON Lines, one chain per line, in scenario order),
    metrics.json, report.md, plots. Every part is attempted, the records first; a part that fails
    leaves the others (and a streamed trajectories file stays until its complete replacement is
    written). Raises ``ReportError`` naming what failed."""
    out.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[str, Callable[[], Any]]] = [
        ("config.yaml", lambda: _write(out / "config.yaml", config_yaml))
    ]
    for name, cs in chains.items():
        path = out / f"trajectories.{name}.jsonl"
        parts.append((path.name, lambda path=path, cs=cs: write_jsonl(path, cs)))
    parts += [
        ("metrics.json", lambda: _write(out / "metrics.json", metrics_json(results))),
        ("report.md", lambda: _write(out / "report.md", markdown_report(results, title, config_yaml))),
        ("by_position.png", lambda: plot_results(results, out / "by_position.png")),
    ]
    failed = []
    for name, write in parts:
        try:
            write()
        except Exception as e:
            failed.append(f"{name} ({type(e).__name__}: {e})")
    if failed:
        raise ReportError(
            f"{out}: could not write {'; '.join(failed)}; the rest of the run folder was written"
        )


def metrics_json(results: Mapping[str, EvalMetrics]) -> str:
    return json.dumps({k: dataclasses.asdict(m) for k, m in results.items()}, indent=2)


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", errors="backslashreplace")


def write_jsonl(path: Path, records: Iterable[Any]) -> None:
    """``path`` as one JSON line per record, replaced only once complete (a failure leaves the
    file that was there)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(dumps(r) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class ChainLog:
    """``trajectories.<strategy>.jsonl`` written as chains finish: one line each, flushed, so what
    finished is on disk whatever happens to the run later. Starts the file with the ``keep``
    chains (a resumed evaluation's, read back from it), else empty. A chain that cannot be
    written is logged and skipped (the chains are written again, complete and in order, by
    ``write_run``); it never stops the evaluation."""

    def __init__(self, path: Path, keep: Sequence[Chain] = ()) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self._file = path, open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        for chain in keep:
            self.append(chain)

    def append(self, chain: Chain) -> None:
        try:
            self._file.write(dumps(chain) + "\n")
            self._file.flush()
        except Exception as e:
            log.warning("%s: a chain was not written as it finished: %s: %s", self.path, type(e).__name__, e)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ChainLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def print_table(results: Mapping[str, EvalMetrics], title: str, console: Console | None = None) -> None:
    (console or Console(stderr=True)).print(rich_table(results, title))
