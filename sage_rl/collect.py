"""Expert experience by rejection sampling (SAGE.md section 7, issue 7): what ``sage-rl collect`` runs.

An expert policy plays every scenario of a split in the skill-library format, as one chain with
its library carried from task to task, once per temperature of a sweep. Then:

1. a scenario is kept only if its first ``keep_first_n`` tasks all succeeded (the paper kept
   scenarios whose first two or three tasks succeeded);
2. within a kept scenario, a task whose trajectory has no code is dropped, and so is a later task
   that failed (unless ``keep_failed_tasks``);
3. a conversation identical to one already in the dataset is dropped (hash of its messages).

Every task gets exactly one reason when dropped, checked in that order: ``scenario_rejected``,
``no_code``, ``task_failed``, ``duplicate``. Each finished scenario is committed to the folder at
once (``collect_store``), so a collection can be interrupted and resumed.

``collect`` receives a built ``ChainRunner`` (``sage_rl.build``); the command's whole config is
``sage_rl.settings.CollectConfig`` (these settings plus what every command shares).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from sage_rl.collect_store import CollectStore, ScenarioRecord, TaskRecord, conversation_hash
from sage_rl.config import Section
from sage_rl.data.records import ChatExample, episode_messages, example_from_trajectory
from sage_rl.envs.base import Suite
from sage_rl.eval.runner import scenarios_of
from sage_rl.policies.base import Completion, Policy, PolicyRequest
from sage_rl.rollout.chain import ChainRunner
from sage_rl.skills.library import Library
from sage_rl.types import Chain, Task, Trajectory

#: Why a task's example is not in the dataset, in the order they are checked.
REASONS = ("scenario_rejected", "no_code", "task_failed", "duplicate")

Format = Literal["jsonl", "hf", "sharegpt"]


class CollectSettings(Section):
    """The collection's own settings (``sage-rl collect`` holds these keys at its top level)."""

    split: str = "train"
    #: None = the split's listed scenarios (PocketWorld train: seed 0 of every train template).
    #: N = the first N listed ones, then (train only) more sampled with ``seed`` until N in all.
    num_scenarios: int | None = Field(None, ge=1)
    tasks_per_scenario: int = Field(3, ge=1)  # the chain: the first K tasks of each scenario
    temperatures: list[float] = Field([0.7], min_length=1)
    keep_first_n: int = Field(2, ge=0)  # 0 = no scenario-level rejection
    keep_failed_tasks: bool = False  # keep failed tasks after the first N of a kept scenario
    scripted_fail_rate: float = Field(0.0, ge=0.0, le=1.0)  # scripted expert: share of tasks it gives up
    concurrency: int = Field(4, ge=1)  # scenarios in flight
    out_dir: str = "runs/expert"
    name: str = "sage_expert"  # <out_dir>/<name>.jsonl; also the LLaMA-Factory dataset name
    formats: list[Format] = ["jsonl"]  # the chat JSON Lines are always written
    sharegpt_mode: Literal["all", "last"] = "all"
    resume: bool = True  # continue the collection in out_dir; false = start over

    @model_validator(mode="after")
    def _check(self) -> CollectSettings:
        if self.keep_first_n > self.tasks_per_scenario:
            raise ValueError(
                f"keep_first_n={self.keep_first_n} is more than tasks_per_scenario={self.tasks_per_scenario}"
            )
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise ValueError(f"temperatures must not repeat, got {self.temperatures}")
        return self


@dataclasses.dataclass(frozen=True)
class Job:
    """One chain to run: a scenario's tasks at one temperature. ``index`` seeds its sampling."""

    scenario: tuple[Task, ...]
    temperature: float
    index: int

    @property
    def key(self) -> tuple[str, float]:
        return (self.scenario[0].scenario_id, self.temperature)


def plan_scenarios(
    suite: Suite, split: str, num: int | None, length: int, seed: int
) -> list[tuple[Task, ...]]:
    """The scenarios to collect, each cut to its first ``length`` tasks.

    Prefix-stable: the plan for N scenarios starts with the plan for fewer, so a collection can be
    resumed with a larger ``num``.
    """
    listed = [s[:length] for s in scenarios_of(suite.split(split))]
    if num is None or num <= len(listed):
        return listed[:num]
    if split != "train":
        raise ValueError(
            f"split {split!r} has {len(listed)} scenarios; num_scenarios={num} needs the train split"
        )
    rng, seen, out = random.Random(seed), {s[0].scenario_id for s in listed}, list(listed)
    for _ in range(20 * num):
        if len(out) == num:
            break
        chain = tuple(suite.sample_chain(rng, length, split))
        if chain[0].scenario_id not in seen:
            seen.add(chain[0].scenario_id)
            out.append(chain)
    if len(out) < num:
        raise ValueError(
            f"could only find {len(out)} distinct {split} scenarios, asked for num_scenarios={num}"
        )
    return out


def plan_jobs(scenarios: Sequence[tuple[Task, ...]], temperatures: Sequence[float]) -> list[Job]:
    """Temperature-major: a full pass at the first temperature comes before the next one."""
    return [Job(s, float(t), i) for t in temperatures for i, s in enumerate(scenarios)]


class OpeningRecorder:
    """A ``Policy`` that passes every request through and keeps each task's opening messages.

    The opening (system prompt, task prompt with the skill-library section that task saw) is taken
    from the first request of the task's episode: it is exactly what the policy saw, whatever the
    prompt builder and retriever did. One recorder serves one chain (task ids are unique in it).
    """

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.renderer = inner.renderer
        self.openings: dict[str, tuple[dict[str, str], ...]] = {}

    def weights_changed(self) -> None:
        self.inner.weights_changed()

    async def generate(self, request: PolicyRequest) -> Completion:
        if not request.task_id:
            raise ValueError(
                "OpeningRecorder needs request.task_id to know which episode a request belongs to"
            )
        if not any(m["role"] == "assistant" for m in request.messages):
            self.openings[request.task_id] = tuple(dict(m) for m in request.messages)
        return await self.inner.generate(request)


async def run_job(runner: ChainRunner, job: Job) -> tuple[Chain, dict[str, tuple[dict[str, str], ...]]]:
    """Run one job's chain from an empty library; returns it with each task's opening messages."""
    recorder = OpeningRecorder(runner.policy)
    params = dataclasses.replace(runner.params, temperature=job.temperature)
    chain_runner = dataclasses.replace(runner, policy=recorder, params=params)
    chain = await chain_runner.run(job.scenario, Library(), group_index=job.index, chain_index=job.index)
    return chain, recorder.openings


def screen(
    trajectories: Sequence[Trajectory], keep_first_n: int, keep_failed_tasks: bool
) -> list[str | None]:
    """The drop reason of each task before deduplication (None = keep), per the module's rules."""
    head = trajectories[:keep_first_n]
    accepted = len(head) == keep_first_n and all(t.outcome.success for t in head)
    out: list[str | None] = []
    for traj in trajectories:
        if not accepted:
            out.append("scenario_rejected")
        elif not traj.produced_code:
            out.append("no_code")
        elif not traj.outcome.success and not keep_failed_tasks:
            out.append("task_failed")
        else:
            out.append(None)
    return out


def judge(
    chain: Chain,
    openings: Mapping[str, Sequence[Mapping[str, str]]],
    job: Job,
    cfg: CollectSettings,
    seen: Callable[[str], bool],
    record_temperature: bool = True,
) -> tuple[ScenarioRecord, list[ChatExample]]:
    """Apply rejection, the no-code rule and dedup (``seen`` says a hash is already in the dataset).
    ``record_temperature=False`` for a policy that ignores it (the scripted expert): the examples
    then carry none (records.ChatExample)."""
    trajs = chain.trajectories
    reasons = screen(trajs, cfg.keep_first_n, cfg.keep_failed_tasks)
    temperature = job.temperature if record_temperature else None
    kept, hashes, tasks = [], set(), []
    for traj, reason in zip(trajs, reasons, strict=True):
        if reason is None:
            messages = episode_messages(openings[traj.task.task_id], traj)
            example = example_from_trajectory(traj, messages, temperature)
            h = conversation_hash(example)
            if seen(h) or h in hashes:
                reason = "duplicate"
            else:
                kept.append(example)
                hashes.add(h)
        tasks.append(_task_record(traj, reason))
    accepted = reasons[0] != "scenario_rejected" if reasons else False
    return ScenarioRecord(job.key[0], job.temperature, accepted, tuple(tasks), len(kept)), kept


def _task_record(traj: Trajectory, reason: str | None) -> TaskRecord:
    t = traj.task
    return TaskRecord(
        t.task_id,
        t.position,
        traj.outcome.success,
        traj.outcome.score,
        traj.produced_code,
        traj.stop.value,
        len(traj.turns),
        reason,
    )


async def collect(
    cfg: CollectSettings,
    runner: ChainRunner,
    store: CollectStore,
    on_done: Callable[[ScenarioRecord], None] | None = None,
    seed: int = 0,
    record_temperature: bool = True,
) -> list[ScenarioRecord]:
    """Run every job not yet in ``store``, committing each as it finishes; returns the new records.

    Scenarios come from ``runner.suite`` (``seed`` samples the extra train scenarios). Jobs run
    ``cfg.concurrency`` at a time. Commits happen on the event loop's thread, one at a time, in the
    order jobs finish (so with concurrency 1 the dataset's order is the plan's). An error (or an
    interrupt) in any job, or in ``on_done``, cancels the rest and propagates.
    """
    scenarios = plan_scenarios(runner.suite, cfg.split, cfg.num_scenarios, cfg.tasks_per_scenario, seed)
    todo = [j for j in plan_jobs(scenarios, cfg.temperatures) if j.key not in store.done]
    sem = asyncio.Semaphore(cfg.concurrency)
    new: list[ScenarioRecord] = []
    failed = False  # a job failed: the others stop before starting (in-process jobs never yield)

    async def one(job: Job) -> None:
        nonlocal failed
        async with sem:
            if failed:
                return
            try:
                chain, openings = await run_job(runner, job)
                record, examples = judge(chain, openings, job, cfg, store.seen, record_temperature)
                new.append(store.commit(record, examples))
                if on_done:
                    on_done(new[-1])
            except BaseException:
                failed = True
                raise

    tasks = [asyncio.create_task(one(j)) for j in todo]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # Stop at once: jobs still queued or running are lost work, not lost data (nothing of
        # theirs was committed), and a resume runs them again.
        for t in tasks:
            t.cancel()
        raise
    return new


def count_jobs(cfg: CollectSettings, suite: Suite, seed: int = 0) -> int:
    """How many jobs the whole collection has (for a progress bar's total)."""
    scenarios = plan_scenarios(suite, cfg.split, cfg.num_scenarios, cfg.tasks_per_scenario, seed)
    return len(scenarios) * len(cfg.temperatures)


def summarize(records: Sequence[ScenarioRecord]) -> dict[str, Any]:
    """What was kept and why the rest was dropped, from the ledger's records (so a resumed
    collection summarises exactly like an uninterrupted one).

    Success rates are over every task run, before any rejection.
    """
    tasks = [t for r in records for t in r.tasks]
    dropped = Counter(t.reason for t in tasks if t.reason is not None)
    by_position: dict[int, list[bool]] = {}
    for t in tasks:
        by_position.setdefault(t.position, []).append(t.success)
    return {
        "scenarios": {
            "run": len(records),
            "kept": sum(r.examples > 0 for r in records),
            "accepted": sum(r.accepted for r in records),
            "rejected": sum(not r.accepted for r in records),
        },
        "tasks": {
            "run": len(tasks),
            "kept": sum(t.reason is None for t in tasks),
            "dropped": {reason: dropped.get(reason, 0) for reason in REASONS},
        },
        "examples": sum(r.examples for r in records),
        "success_by_position": {str(p): sum(v) / len(v) for p, v in sorted(by_position.items())},
        "stops": dict(sorted(Counter(t.stop for t in tasks).items())),
        "by_temperature": _by_temperature(records),
    }


def _by_temperature(records: Sequence[ScenarioRecord]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in records:
        row = out.setdefault(str(r.temperature), {"scenarios": 0, "accepted": 0, "examples": 0})
        row["scenarios"] += 1
        row["accepted"] += r.accepted
        row["examples"] += r.examples
    return out
