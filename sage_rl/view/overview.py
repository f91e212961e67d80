"""The Overview tab of one run: key facts, metric tables and curves.

- train: the before/after evaluation of ``summary.json``; curves over steps from ``metrics.jsonl``;
- eval: the headline metrics of each strategy, computed with ``eval.metrics.compute_metrics`` from
  the trajectories shown (equal to ``metrics.json`` when every line could be read);
- collect: ``collect.summarize`` of the ledger's records (what ``summary.json`` holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sage_rl.collect import REASONS, summarize
from sage_rl.eval.metrics import EvalMetrics, compute_metrics
from sage_rl.eval.report import HEADLINE, headline_rows
from sage_rl.view.plots import bar_chart, line_chart
from sage_rl.view.read import RunData

#: metrics.jsonl keys shown for each training step on the Chains tab (docs/metrics.md)
STEP_KEYS = (
    "reward",
    "success",
    "skill_use_rate",
    "skill_save_rate",
    "no_code_rate",
    "gen_tokens_per_task",
    "loss",
    "grad_norm",
    "entropy",
)


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class OverviewView:
    facts: tuple[tuple[str, str], ...]
    tables: tuple[Table, ...]
    curves: tuple[tuple[str, str], ...]  # (title, data URI)
    config_text: str


def overview(run: RunData) -> OverviewView:
    build = {"train": _train, "eval": _eval, "collect": _collect}[run.kind]
    facts, tables, curves = build(run)
    return OverviewView(tuple(facts), tuple(tables), tuple(c for c in curves if c[1]), run.config_text)


def fmt(v: Any, spec: str = "{:.3g}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return spec.format(v)
    return str(v)


def mapping(v: Any) -> Mapping[str, Any]:
    """A section of config.yaml as a mapping (``{}`` when the file holds something else there)."""
    return v if isinstance(v, dict) else {}


def step_stats(run: RunData, step: int | None) -> tuple[tuple[str, str], ...]:
    row = next((r for r in run.metrics_rows if r.get("step") == step), None)
    return tuple((k, fmt(row.get(k))) for k in STEP_KEYS if row and k in row)


# --------------------------------------------------------------------------------------------


def _policy_fact(config: Mapping[str, Any]) -> str:
    p = mapping(config.get("policy"))
    return " ".join(str(x) for x in (p.get("kind", "?"), p.get("model") or "") if x)


def _train(run: RunData):
    cfg, summary = run.config, run.summary or {}
    r = mapping(cfg.get("rollout"))
    facts = [
        ("command", "sage-rl train"),
        ("policy", _policy_fact(cfg)),
        ("steps", fmt(summary.get("steps", len(run.sections)))),
        (
            "K x G x B",
            f"{r.get('chain_length', '?')} x {r.get('group_size', '?')} x {r.get('groups_per_step', '?')}",
        ),
        ("reward", str(r.get("reward", "?"))),
        ("trajectories", str(run.num_trajectories)),
        (
            "wall time",
            f"{summary['wall_s']:.0f} s" if isinstance(summary.get("wall_s"), int | float) else "-",
        ),
    ]
    kept = summary.get("kept")
    if isinstance(kept, dict):  # eval.keep: best (train/best.py): the model the run ends with
        split = mapping(cfg.get("eval")).get("split", "?")
        tgc, sgc = (fmt(kept.get(k), "{:.1f}%") for k in ("tgc", "sgc"))
        facts.append(("kept model", f"step {fmt(kept.get('step'))}: TGC {tgc}, SGC {sgc} on {split} (best/)"))
    tables = []
    before, after = (
        m if isinstance(m, dict) else None for m in (summary.get("before"), summary.get("after"))
    )
    if before or after:
        labels = {attr: (label, spec) for label, attr, spec in HEADLINE if attr}
        keys = [k for k in labels if k in (before or {}) or k in (after or {})]
        rows = tuple(
            (labels[k][0], *(fmt((m or {}).get(k), labels[k][1]) for m in (before, after))) for k in keys
        )
        split = mapping(cfg.get("eval")).get("split", "?")
        tables.append(
            Table(f"Evaluation on {split}, before and after training", ("metric", "before", "after"), rows)
        )
    elif run.metrics_rows:
        tables.append(Table("Evaluation", ("note",), (("summary.json is missing: the run did not finish",),)))
    return facts, tables, _train_curves(run.metrics_rows, summary)


def _train_curves(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]):
    steps = [r for r in rows if r.get("step", 0) > 0 and "reward" in r]

    def series(*keys: str) -> dict:
        return {k: ([r["step"] for r in steps], [r.get(k) for r in steps]) for k in keys}

    positions = sorted({k for r in steps for k in r if k.startswith("reward/k")})
    evals = [r for r in rows if "eval/tgc" in r]
    ev = {k: ([r["step"] for r in evals], [r.get(f"eval/{k}") for r in evals]) for k in ("tgc", "sgc")}
    after = summary.get("after")
    if isinstance(after, dict) and isinstance(summary.get("steps"), int):
        for k in ev:
            ev[k] = ([*ev[k][0], summary["steps"]], [*ev[k][1], after.get(k)])
    return [
        ("reward by position", line_chart("Reward by position", "step", series("reward", *positions))),
        ("TGC / SGC", line_chart("Evaluation TGC / SGC (%)", "step", ev, ylim=(0, 100))),
        (
            "success by position",
            line_chart(
                "Success by position",
                "step",
                series("success", *[p.replace("reward", "success") for p in positions]),
            ),
        ),
        ("tokens", line_chart("Generated tokens per task", "step", series("gen_tokens_per_task"))),
        ("no-code rate", line_chart("No-code rate", "step", series("no_code_rate"), ylim=(0, 1.05))),
        (
            "skill usage",
            line_chart(
                "Skill use and save rates",
                "step",
                series("skill_use_rate", "skill_save_rate"),
                ylim=(0, 1.05),
            ),
        ),
    ]


def eval_metrics(run: RunData) -> dict[str, EvalMetrics]:
    return {s.label: compute_metrics(s.chains) for s in run.sections}


def _eval(run: RunData):
    cfg, results = run.config, eval_metrics(run)
    facts = [
        ("command", "sage-rl eval"),
        ("policy", _policy_fact(cfg)),
        ("split", str(cfg.get("split", "?"))),
        ("scenarios", fmt(max((m.scenarios for m in results.values()), default=0))),
        ("trajectories", str(run.num_trajectories)),
    ]
    per_run = [dict(headline_rows(m)) for m in results.values()]
    rows = tuple((label, *(r[label] for r in per_run)) for label, _, _ in HEADLINE)
    tables = [Table("Headline metrics (docs/metrics.md)", ("metric", *results), rows)] if results else []

    def by(attr: str) -> dict:
        return {k: (list(getattr(m, attr)), list(getattr(m, attr).values())) for k, m in results.items()}

    first = next(iter(results.values()), None)
    curves = [
        (
            "TGC by position",
            line_chart("TGC by task position", "position", by("tgc_by_position"), "TGC (%)", (0, 105)),
        ),
        (
            "skill usage by position",
            line_chart(
                "Skill usage by position",
                "position",
                by("usage_rate_by_position"),
                "share of tasks",
                (0, 1.05),
            ),
        ),
        ("stop reasons", bar_chart("Stop reasons", first.stop_reasons if first else {}, "tasks")),
    ]
    return facts, tables, curves


def _collect(run: RunData):
    cfg = run.config
    s = summarize([j.record for j in run.jobs])
    facts = [
        ("command", "sage-rl collect"),
        ("policy", _policy_fact(cfg)),
        ("split", str(cfg.get("split", "?"))),
        ("jobs", str(len(run.jobs))),
        ("examples", str(s["examples"])),
        ("dataset", str(run.dataset.name if run.dataset else "-")),
    ]
    sc, tasks = s["scenarios"], s["tasks"]
    rows = (
        (
            "scenarios run / passed the screen / gave examples",
            f"{sc['run']} / {sc['accepted']} / {sc['kept']}",
        ),
        ("tasks run / kept", f"{tasks['run']} / {tasks['kept']}"),
        *((f"dropped: {r}", str(tasks["dropped"][r])) for r in REASONS),
        *((f"stop: {k}", str(v)) for k, v in s["stops"].items()),
    )
    curves = [
        (
            "success by position",
            bar_chart(
                "Expert success by position (before rejection)",
                {f"task {k}": v for k, v in s["success_by_position"].items()},
                "share of tasks",
                (0, 1.05),
            ),
        ),
        ("drop reasons", bar_chart("Dropped tasks by reason", tasks["dropped"], "tasks")),
    ]
    return facts, [Table("Collection (docs/collect.md)", ("", "value"), rows)], curves
