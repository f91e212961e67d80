"""Where a recipe run stands, read off its folder: each stage done, running, stopped or not started.

The laptop experiment runs for many hours and resumes by stage (``benchmarks/laptop_recipe.py``);
``--status`` prints this table instead of running anything. Every figure comes from the files the
stages write (``summary.json``, ``result.json``, ``outcomes.json`` when done; ``metrics.jsonl``,
the evaluations' trajectories and the collection's ledger while they run), so it can be asked of
a run in progress, from another process, at any time. A line cut short by a running writer is
skipped, never an error.

Whether a started stage's process is still alive is read off the run folder's claim
(``runs/claim.py``: the process that runs it holds a lock the kernel drops when it ends): a started,
unfinished stage reads "running" while a process on this machine holds the run, else "stopped", and
says when it was last written (and "stuck?" when its live process has written nothing for
:data:`STOPPED_AFTER`). A run folder never claimed (made before claims, or on another machine's
disk) is judged by its files alone: "running" while written to within :data:`STOPPED_AFTER`. Every phase of a stage writes well inside that time (an evaluation at each
scenario, SFT at each step, an RL step at each group it finishes). What a stop loses: an evaluation
resumes at its next scenario and RL at its next group, but SFT at its last resume point
(``output.save_every_s``), so a running SFT stage also says which step that point holds and how old
it is: stop it just after a new one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from sage_rl.recipe.pipeline import RecipeError, listed_scenarios, missing_scenarios, read_summary
from sage_rl.recipe.twins import SAME_AS
from sage_rl.runs.claim import claimed_ever, describe, holder
from sage_rl.train.sft_resume import STATE
from sage_rl.view.read import read_jsonl

#: The evaluations, in the order the experiment runs them (benchmarks/laptop_recipe.py).
SPLITS = ("train_heldout", "dev")
#: Seconds without a write after which a started, unfinished stage reads "stopped".
STOPPED_AFTER = 60 * 60


@dataclass(frozen=True)
class Stage:
    name: str
    state: str  # "done", "partial" (a split that grew since), "running", "stopped" or "pending"
    detail: str = ""


def _json(path: Path) -> dict[str, Any] | None:
    """A finished stage's summary (``pipeline.read_summary``); None when missing or unreadable."""
    try:
        return read_summary(path)
    except RecipeError:
        return None


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _object(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    return row


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines file (``view.read.read_jsonl``): torn, non-UTF-8 or
    non-object lines left out, a missing file empty."""
    return read_jsonl(path, _object, "row", problems=[])


def _pct(x: Any, scale: float = 100.0) -> str:
    """A fraction (a step's ``success``) as a percentage; ``scale=1`` for a figure already in
    percent (an evaluation's TGC and SGC, ``EvalMetrics``)."""
    return f"{scale * x:.1f}%" if isinstance(x, int | float) else "n/a"


def _num(x: Any, spec: str) -> str:
    """``x`` formatted by ``spec``, or "?" where a file held something else (None, a string)."""
    return format(x, spec) if isinstance(x, int | float) else "?"


def evaluation(folder: Path, name: str) -> Stage:
    done = _json(folder / "outcomes.json")
    if done is not None:
        m = {k: _get(done, "metrics", k) for k in ("tgc", "sgc", "tasks")}
        figures = f"TGC {_pct(m['tgc'], 1)}, SGC {_pct(m['sgc'], 1)}, {m['tasks']} tasks"
        have, listed = _coverage(folder, done)
        if have < listed:  # the split grew since (``pipeline.evaluate`` runs the new scenarios only)
            return Stage(name, "partial", f"{figures}; {have} of {listed} scenarios, the rest run on resume")
        same_as = _json(folder / SAME_AS)  # recipe/twins.py: the same weights, evaluated once
        if same_as is not None:
            figures += f"; read back from {Path(str(same_as.get('evaluation'))).name} (the same weights)"
        return Stage(name, "done", figures)
    chains = sum(len(jsonl_rows(p)) for p in folder.glob("trajectories*.jsonl"))
    return (
        Stage(name, "running", f"{chains} scenarios finished") if folder.is_dir() else Stage(name, "pending")
    )


def _coverage(folder: Path, done: dict[str, Any]) -> tuple[int, int]:
    """(scenarios evaluated, scenarios the split lists now) of a finished evaluation, by the rule the
    recipe resumes by (``pipeline.missing_scenarios``); (0, 0) where the split cannot be listed (not
    PocketWorld) or the folder's config cannot be read."""
    from sage_rl.config import load_config
    from sage_rl.settings import EvalRunConfig

    try:
        listed = listed_scenarios(load_config(EvalRunConfig, folder / "config.yaml")) or []
    except Exception:  # a status never fails on a file it only reports  # noqa: BLE001
        listed = []
    return len(listed) - len(missing_scenarios(listed, done.get("outcomes"))), len(listed)


def collection(folder: Path, name: str) -> Stage:
    done = _json(folder / "summary.json")
    if done is not None:
        return Stage(
            name, "done", f"{done.get('examples')} examples from {_get(done, 'scenarios', 'run')} scenarios"
        )
    ledger = [r for r in jsonl_rows(folder / "progress.jsonl") if r.get("kind") == "scenario"]
    if folder.is_dir():
        return Stage(
            name,
            "running",
            f"{len(ledger)} scenarios, {sum(n for r in ledger if isinstance(n := r.get('examples'), int))} examples",
        )
    return Stage(name, "pending")


def sft(folder: Path, name: str) -> Stage:
    done = _json(folder / "result.json")
    if done is not None:
        loss = f"held-out loss {_num(done.get('eval_loss_before'), '.3f')} -> {_num(done.get('eval_loss_after'), '.3f')}"
        return Stage(name, "done", f"steps {done.get('steps')}, {loss}, {done.get('dtype', 'float32')}")
    rows = jsonl_rows(folder / "metrics.jsonl")
    if not folder.is_dir():
        return Stage(name, "pending")
    trained = [r for r in rows if "loss" in r]
    held = [r for r in rows if "eval_loss" in r]
    parts = (
        [f"step {trained[-1].get('step')}, loss {_num(trained[-1]['loss'], '.3f')}"]
        if trained
        else ["starting"]
    )
    if held:
        parts.append(f"held-out {_num(held[-1]['eval_loss'], '.3f')} at step {held[-1].get('step')}")
    return Stage(name, "running", "; ".join(parts))


def rl(folder: Path, name: str) -> Stage:
    done = _json(folder / "summary.json")
    if done is not None:
        kept = done.get("kept")  # eval.keep: best (train/best.py)
        chose = f", keeps step {kept.get('step')} (TGC {_pct(kept.get('tgc'), 1)})" if isinstance(kept, dict) else ""
        return Stage(
            name, "done", f"steps {done.get('steps')}, {_num(done.get('sampled_tokens'), ',')} sampled tokens{chose}"
        )
    if not folder.is_dir():
        return Stage(name, "pending")
    config = _config(folder / "config.yaml")
    budget = _get(config, "sampled_token_budget")
    rows = [r for r in jsonl_rows(folder / "metrics.jsonl") if "sampled_tokens_total" in r]
    if not rows:
        return Stage(name, "running", "step 1 in progress")
    last = rows[-1]
    of = f" / {budget:,}" if isinstance(budget, int) else ""
    parts = [
        f"step {last.get('step')}: {_num(last['sampled_tokens_total'], ',')}{of} sampled tokens, success {_pct(last.get('success'))}"
    ]
    curve = [r for r in rows if r.get("eval/tgc") is not None]
    if curve:
        split = _get(config, "eval", "split")
        label = "held-out" if split in (None, "train_heldout") else str(split)
        parts.append(f"{label} curve TGC {_pct(curve[-1]['eval/tgc'], 1)} at step {curve[-1].get('step')}")
        if curve[-1].get("eval/best_step") is not None:
            kept = f"keeping step {_num(curve[-1]['eval/best_step'], '.0f')}"
            parts.append(f"{kept} (TGC {_pct(curve[-1].get('eval/best_tgc'), 1)})")
    return Stage(name, "running", "; ".join(parts))


def _config(config: Path) -> dict[str, Any]:
    """A run's saved settings, or {} when they cannot be read (the status only shows them)."""
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def last_written(folder: Path) -> float | None:
    """The newest modification time (epoch seconds) of ``folder`` and everything below it (a
    folder's own time moves when a file is made or renamed in it); None when it cannot be read. A
    file removed while the folder is read (a writer's rename) is skipped."""
    newest = None
    for path in (folder, *folder.rglob("*")):
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return newest


def _ago(seconds: float) -> str:
    minutes = max(0, int(seconds // 60))
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def aged(stage: Stage, folder: Path, now: float, live: bool | None = None) -> Stage:
    """A started, unfinished stage as "running" or "stopped" (module docstring): by ``live``,
    whether a process holds the run (None: not known, then by its folder's last write), with that
    write's age in its detail; other stages as they are."""
    if stage.state != "running":
        return stage
    newest = last_written(folder)
    if newest is None:
        return stage if live is not False else replace(stage, state="stopped")
    age = now - newest
    if live is None:
        state = "running" if age < STOPPED_AFTER else "stopped"
    else:
        state = "running" if live else "stopped"
    detail = f"{stage.detail}; last written {_ago(age)} ago"
    if live and age >= STOPPED_AFTER:
        detail += " (its process is alive: stuck?)"
    point = resume_point(folder / "resume", now)
    return replace(stage, state=state, detail=f"{detail}; {point}" if point else detail)


def resume_point(folder: Path, now: float) -> str | None:
    """Where a stopped SFT stage would resume (its ``resume/state.json``: train/sft_resume.py) and
    how old that point is: a stop loses the steps after it. None where there is none or it cannot
    be read."""
    path = folder / STATE
    try:
        step = _object(json.loads(path.read_text(encoding="utf-8"))).get("step")
        written = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    return f"resume point at step {step}, written {_ago(now - written)} ago"


def stages(out: Path, now: float | None = None) -> list[Stage]:
    """Every stage of the laptop experiment in ``out``, in the order it runs them; ``now`` (epoch
    seconds, default the clock) decides which started stages read "stopped"."""
    return _stages(out, time.time() if now is None else now, _live(out, holder(out)))


def _live(out: Path, who: dict[str, Any] | None) -> bool | None:
    """Whether a process holds ``out`` (None when no process ever claimed it, so nothing is known)."""
    return (who is not None) if claimed_ever(out) else None


def _stages(out: Path, now: float, live: bool | None) -> list[Stage]:
    def evals(*models: str) -> list[Stage]:
        folders = {f"eval {m} {s}": out / "eval" / f"{m}_{s}" for m in models for s in SPLITS}
        return [aged(evaluation(folder, name), folder, now, live) for name, folder in folders.items()]

    def arm(name: str) -> list[Stage]:
        return [aged(rl(out / name, f"rl {name}"), out / name, now, live), *evals(*_evaluated(name))]

    def step(kind: Any, folder: str, name: str) -> Stage:
        return aged(kind(out / folder, name), out / folder, now, live)

    return [
        step(collection, "expert", "collect"),
        step(sft, "sft", "sft"),
        *evals("sft", "sft_nolib"),
        *arm("sage"),
        *arm("grpo_lib"),
        step(collection, "expert_inline", "collect inline"),
        step(sft, "sft_inline", "sft inline"),
        *evals("sft_inline"),
        *arm("grpo_nolib"),
        *evals("base"),
    ]


def _evaluated(arm: str) -> tuple[str, ...]:
    """The models evaluated after an RL arm: its own, and SAGE's also without its library."""
    return (arm, "sage_nolib") if arm == "sage" else (arm,)


def show(out: Path) -> list[Stage]:
    """Print ``stages(out)`` as a table (stdout) and return them."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    who = holder(out)  # read once: the table's states and its title say the same of the run
    live = _live(out, who)
    rows = _stages(out, time.time(), live)
    held = f"; run by {describe(who)}" if who is not None else "; no process in it" if live is False else ""
    table = Table(title=f"{out}: {sum(s.state == 'done' for s in rows)} of {len(rows)} stages done{held}")
    for column in ("stage", "state", "detail"):
        table.add_column(column)
    colour = {"done": "green", "partial": "cyan", "running": "yellow", "stopped": "red", "pending": "dim"}
    for s in rows:
        table.add_row(s.name, f"[{colour[s.state]}]{s.state}[/]", escape(s.detail))  # file text, not markup
    Console(width=160).print(table)
    return rows
