"""Scenario-ordered evaluation (SAGE.md section 8): the one evaluation of sage-rl.

Each scenario's tasks run in order as one chain, with the library carried from task to task;
scenarios run concurrently. The same ``ChainRunner`` drives training rollouts, so evaluation
measures exactly the agent that is trained. ``sage-rl eval`` and the training loop's periodic
evaluations both call ``run_eval``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from sage_rl.config import Section
from sage_rl.eval.metrics import EvalMetrics, compute_metrics
from sage_rl.eval.report import ChainLog
from sage_rl.eval.resume import finished
from sage_rl.rollout.chain import ChainRunner
from sage_rl.skills.library import Library
from sage_rl.skills.retrieval import STRATEGIES, make_retriever
from sage_rl.types import Chain, Task


class EvalConfig(Section):
    """What to evaluate on, and how."""

    split: str = "dev"
    #: retrieval strategies to compare; "all" = every strategy. The first is the headline.
    strategies: list[str] = ["same_scenario"]
    concurrency: int | None = Field(4, ge=1, description="scenarios in flight; null = all at once")
    limit_scenarios: int | None = Field(None, ge=1, description="only the first N scenarios (smoke runs)")
    library_store: str | None = None  # start every scenario from this SQLite skill store

    @field_validator("strategies")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        if value == ["all"]:
            return list(STRATEGIES)
        unknown = [s for s in value if s not in STRATEGIES]
        if unknown or not value:
            raise ValueError(
                f"unknown retrieval strategy {unknown[0] if unknown else None!r}; "
                f"choose from {', '.join(STRATEGIES)} or all"
            )
        return value


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Metrics and chains per strategy (in ``EvalConfig.strategies`` order), and the wall time."""

    metrics: dict[str, EvalMetrics]
    chains: dict[str, list[Chain]]
    seconds: float

    @property
    def headline(self) -> EvalMetrics:
        return next(iter(self.metrics.values()))

    def record(self) -> dict[str, Any]:
        """The headline strategy's evaluation as saved (``outcomes.json``, a training run's
        ``evals/step_NNNNNN.json``): ``{"metrics": <EvalMetrics as a dict>, "outcomes": [[task_id,
        scenario_id, success], ...], "wall_s"}``, what paired comparisons read back."""
        strategy = next(iter(self.metrics))
        return {
            "metrics": dataclasses.asdict(self.metrics[strategy]),
            "outcomes": [
                [t.task.task_id, t.task.scenario_id, t.outcome.success]
                for c in self.chains[strategy]
                for t in c.trajectories
            ],
            "wall_s": round(self.seconds, 1),
        }


async def run_eval(
    runner: ChainRunner,
    cfg: EvalConfig,
    step: int = 0,
    progress: Any = None,
    label: str = "",
    record_dir: Path | None = None,
    resume: bool = False,
) -> EvalResult:
    """Evaluate ``runner``'s policy on ``cfg.split`` of its suite, once per retrieval strategy.

    ``progress`` is a rich ``Progress`` (one bar per strategy, labelled ``label + strategy``);
    ``step`` is the training step recorded in the provenance of skills saved meanwhile;
    ``record_dir`` is the run folder: each chain is appended to its
    ``trajectories.<strategy>.jsonl`` there as it finishes (``report.ChainLog``; ``write_run``
    later rewrites it in scenario order), and the suite keeps its own per-task outputs there
    (``Suite.record_to``), one variant per strategy when there are several. ``resume``: the
    scenarios whose chains that file already holds are read back, not run again (``resume.py``).
    """
    scenarios = scenarios_of(runner.suite.split(cfg.split, cfg.limit_scenarios))
    tasks = [t for s in scenarios for t in s]
    library = start_library(cfg.library_store)
    t0 = time.perf_counter()
    metrics, chains = {}, {}
    for strategy in cfg.strategies:
        log, done = None, {}
        if record_dir is not None:
            runner.suite.record_to(record_dir, strategy if len(cfg.strategies) > 1 else None)
            path = record_dir / f"trajectories.{strategy}.jsonl"
            done = finished(path, scenarios) if resume else {}
            log = ChainLog(path, keep=[done[i] for i in sorted(done)])
        job = progress.add_task(f"{label}{strategy}: scenarios", total=len(scenarios)) if progress else None
        if progress is not None and done:
            progress.advance(job, len(done))

        def on_done(chain: Chain, log: ChainLog | None = log, job: Any = job) -> None:
            if log is not None:
                log.append(chain)
            if progress is not None:
                progress.advance(job)

        with log or contextlib.nullcontext():
            ran = await evaluate_chains(
                with_strategy(runner, strategy), tasks, library, cfg.concurrency, on_done, step, done
            )
        chains[strategy], metrics[strategy] = ran, compute_metrics(ran)
    return EvalResult(metrics, chains, time.perf_counter() - t0)


def with_strategy(runner: ChainRunner, strategy: str) -> ChainRunner:
    """``runner`` retrieving with ``strategy`` (the rest of its retrieval settings kept)."""
    retrieval = runner.skills.retrieval.model_copy(update={"strategy": strategy})
    if retrieval == runner.skills.retrieval:
        return runner
    skills = runner.skills.model_copy(update={"retrieval": retrieval})
    return dataclasses.replace(runner, skills=skills, retriever=make_retriever(retrieval))


def start_library(store: str | None) -> Library:
    """The library every scenario starts from: empty, or the latest skills of a SQLite store."""
    if not store:
        return Library()
    from sage_rl.skills.store import SkillStore

    with SkillStore(store) as s:
        return Library.of(s.latest())


def scenarios_of(tasks: Sequence[Task]) -> list[tuple[Task, ...]]:
    """Split an ordered task list into scenarios (consecutive runs of one scenario id), each in
    position order."""
    return [
        tuple(sorted(g, key=lambda t: t.position)) for _, g in groupby(tasks, key=lambda t: t.scenario_id)
    ]


async def evaluate_chains(
    runner: ChainRunner,
    tasks: Sequence[Task],
    library: Library,
    concurrency: int | None = 4,
    on_done: Callable[[Chain], None] | None = None,
    step: int = 0,
    done: Mapping[int, Chain] | None = None,
) -> list[Chain]:
    """Run every scenario of ``tasks`` as one chain starting from ``library``; results in order.
    ``concurrency`` bounds the scenarios in flight (None: all at once); ``done``: chains of
    scenarios (by index) already run, taken as they are."""
    scenarios = scenarios_of(tasks)
    done = done or {}
    sem = asyncio.Semaphore(concurrency or max(1, len(scenarios)))

    async def one(i: int, scenario: tuple[Task, ...]) -> Chain:
        if i in done:
            return done[i]
        async with sem:
            chain = await runner.run(scenario, library, group_index=i, chain_index=0, step=step)
        if on_done:
            on_done(chain)
        return chain

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(scenarios))))
