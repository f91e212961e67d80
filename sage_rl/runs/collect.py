"""``sage-rl collect``'s work: expert trajectories by rejection sampling (issue 7), resumable, with
their exports and summary (docs/collect.md)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from sage_rl.build import BuildError, build_collect_policy, build_runner, open_suite
from sage_rl.collect import REASONS, collect, count_jobs, summarize
from sage_rl.collect_store import CollectStore
from sage_rl.config import dump_config
from sage_rl.data.export import export_hf, export_sharegpt
from sage_rl.files import write_atomic
from sage_rl.runs.claim import claim
from sage_rl.runs.console import err, progress
from sage_rl.settings import CollectConfig

#: What each drop reason means, for the summary table (docs/collect.md).
_MEANING = {
    "scenario_rejected": "its scenario's first N tasks did not all succeed",
    "no_code": "the trajectory has no code",
    "task_failed": "a later task of a kept scenario failed",
    "duplicate": "the same conversation is already in the dataset",
}


def run_collect(cfg: CollectConfig, opened: list[CollectStore] | None = None) -> dict[str, Any]:
    """Collect what ``cfg.out_dir`` does not hold yet, write the exports and ``summary.json``, and
    print the summary; returns it. ``opened`` receives the store once it is open (to say, after an
    error, how many jobs were saved). Errors propagate: ``BuildError`` (a missing split, too few
    scenarios), ``StoreError`` (another collection's folder), ``ExportError`` (an export cannot
    express the dataset; the JSON Lines dataset is complete), and any environment or backend
    failure (what is committed stays committed: the same call resumes)."""
    opened = [] if opened is None else opened
    with claim(cfg.out_dir):  # one process at a time in it (runs/claim.py)
        return _run_collect(cfg, opened)


def _run_collect(cfg: CollectConfig, opened: list[CollectStore]) -> dict[str, Any]:
    t0 = time.perf_counter()
    asyncio.run(_collect(cfg, opened))
    store = opened[0]
    summary = _finish(cfg, store, time.perf_counter() - t0)
    _print_summary(summary)
    err.print(f"dataset: {store.dataset}")
    return summary


async def _collect(cfg: CollectConfig, opened: list[CollectStore]) -> None:
    """Open the suite (and its sandbox), run the jobs not yet done, close what was opened."""
    async with open_suite(cfg, split=cfg.split) as suite:
        try:
            total = count_jobs(cfg, suite, cfg.seed)
        except ValueError as e:  # too few scenarios for num_scenarios
            raise BuildError(str(e)) from None
        store = CollectStore(Path(cfg.out_dir), cfg.name, cfg.identity(), resume=cfg.resume)
        opened.append(store)
        (store.folder / "config.yaml").write_text(dump_config(cfg))
        _announce(cfg, store, total)
        runner = build_runner(cfg, build_collect_policy(cfg), suite)
        with progress() as bar:
            job = bar.add_task("scenarios", total=total, completed=len(store.done))

            def done(_record) -> None:
                kept = sum(r.examples for r in store.records)
                bar.update(job, advance=1, description=f"scenarios ({kept} examples kept)")

            await collect(
                cfg, runner, store, done, cfg.seed, record_temperature=cfg.policy.kind != "scripted"
            )


def saved_jobs(opened: list[CollectStore]) -> int:
    """Jobs committed to the store ``run_collect`` opened (0 when it opened none)."""
    return len(opened[0].records) if opened else 0


def _announce(cfg: CollectConfig, store: CollectStore, total: int) -> None:
    done = len(store.done)
    if done:
        err.print(f"resuming {cfg.out_dir}: {done} of {total} jobs already done")
    if store.dropped_bytes:
        err.print(
            f"recovered: cut {store.dropped_bytes} bytes of uncommitted examples off {store.dataset.name}"
        )
    if cfg.policy.kind == "scripted" and len(cfg.temperatures) > 1:
        err.print("note: the scripted expert ignores the temperature; more temperatures only add duplicates")


def _finish(cfg: CollectConfig, store: CollectStore, wall_s: float) -> dict[str, Any]:
    """Write the optional exports and summary.json; returns the summary (``ExportError`` when an
    export cannot express the dataset)."""
    files = {"jsonl": str(store.dataset), "ledger": str(store.ledger)}
    examples = store.examples() if set(cfg.formats) - {"jsonl"} else []
    if "hf" in cfg.formats:
        import datasets

        datasets.disable_progress_bars()  # our own progress and summary are on stderr already
        files["hf"] = str(export_hf(examples, store.folder / "hf"))
    if "sharegpt" in cfg.formats:
        files["sharegpt"] = str(
            export_sharegpt(examples, store.folder / "llamafactory", cfg.name, cfg.sharegpt_mode)
        )
    summary = {
        "policy": cfg.policy.kind,
        "split": cfg.split,
        "temperatures": cfg.temperatures,
        "keep_first_n": cfg.keep_first_n,
        **summarize(store.records),
        "files": files,
        "wall_s": round(wall_s, 3),
    }
    write_atomic(store.folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _print_summary(s: dict[str, Any]) -> None:
    sc, tasks = s["scenarios"], s["tasks"]
    err.print(
        f"scenarios: {sc['run']} run, {sc['accepted']} passed the first-{s['keep_first_n']} screen, "
        f"{sc['kept']} gave examples; tasks: {tasks['run']} run, {tasks['kept']} kept "
        f"({s['examples']} examples)"
    )
    table = Table(title="dropped tasks, by reason")
    table.add_column("reason")
    table.add_column("tasks", justify="right")
    table.add_column("meaning")
    for reason in REASONS:
        table.add_row(reason, str(tasks["dropped"][reason]), _MEANING[reason])
    err.print(table)
    rates = ", ".join(f"task {p}: {r:.0%}" for p, r in s["success_by_position"].items())
    err.print(f"expert success before rejection: {rates}")
