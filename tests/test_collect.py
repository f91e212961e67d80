"""``sage-rl collect``: rejection sampling of expert chains, the no-code rule, dedup, resume, CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import typer

from sage_rl.build import build_runner
from sage_rl.collect import (
    REASONS,
    collect,
    plan_jobs,
    plan_scenarios,
    run_job,
    screen,
    summarize,
)
from sage_rl.collect_store import CollectStore, StoreError
from sage_rl.data.export import read_hf, read_sharegpt
from sage_rl.data.records import read_jsonl
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.envs.pocketworld.expert import ScriptedExpert
from sage_rl.envs.pocketworld.scenarios import templates
from sage_rl.envs.pocketworld.tasks import task_by_id
from sage_rl.policies.base import Completion, PolicyRequest
from sage_rl.settings import CollectConfig
from sage_rl.types import ExecResult, Outcome, StopReason, Task, Trajectory, Turn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def suite() -> PocketWorldSuite:
    return PocketWorldSuite()  # in-process executor: the expert's code is ours and the tests stay fast


def config(tmp_path: Path, **kw) -> CollectConfig:
    return CollectConfig(out_dir=str(tmp_path / "expert"), **{"concurrency": 1, **kw})


def run(cfg: CollectConfig, policy, suite, on_done=None) -> CollectStore:
    store = CollectStore(cfg.out_dir, cfg.name, cfg.identity(), resume=cfg.resume)
    asyncio.run(_collect(cfg, policy, suite, store, on_done))
    return store


async def _collect(cfg: CollectConfig, policy, suite, store, on_done=None):
    """What ``sage-rl collect`` runs once the root has built its runner."""
    runner = build_runner(cfg, policy, suite)
    return await collect(
        cfg, runner, store, on_done, cfg.seed, record_temperature=cfg.policy.kind != "scripted"
    )


class Spy:
    """Passes requests through and keeps them (what the policy actually saw)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.renderer = inner, inner.name, None
        self.requests: list[PolicyRequest] = []

    async def generate(self, request: PolicyRequest) -> Completion:
        self.requests.append(request)
        return await self.inner.generate(request)


class NoCodeAt:
    """The scripted expert, except that it answers without code at the given task positions."""

    def __init__(self, inner, positions: set[int]) -> None:
        self.inner, self.positions, self.name, self.renderer = inner, positions, inner.name, None

    async def generate(self, request: PolicyRequest) -> Completion:
        if task_by_id(request.task_id).position in self.positions:
            return Completion(text="I am not sure how to do this.")
        return await self.inner.generate(request)


class NoCodeFirst:
    """Answers the first turn of every episode without code, then plays the scripted expert (which
    is shown the conversation without that turn, so it follows its usual plan)."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.renderer = inner, inner.name, None

    async def generate(self, request: PolicyRequest) -> Completion:
        if not any(m["role"] == "assistant" for m in request.messages):
            return Completion(text="Let me think about this first.")
        return await self.inner.generate(
            dataclasses.replace(request, messages=request.messages[:2] + request.messages[4:])
        )


# --------------------------------------------------------------------------------------------
# collection and rejection
# --------------------------------------------------------------------------------------------


def test_scripted_expert_covers_every_train_template_with_exact_messages(tmp_path, suite):
    spy = Spy(ScriptedExpert(seed=0))
    store = run(config(tmp_path), spy, suite)
    examples = store.examples()
    train = {t.name for t in templates("train")}
    assert {ex.scenario_id.rsplit("-s", 1)[0] for ex in examples} == train
    # the expert solves every task, so every task of every scenario is kept
    assert len(examples) == 3 * len(train) == summarize(store.records)["tasks"]["kept"]
    assert all(ex.success and ex.score == 1.0 and ex.policy == spy.name for ex in examples)
    assert all(ex.temperature is None for ex in examples)  # the scripted expert ignores it
    # the dataset's conversations are exactly what the policy saw and wrote: every request of an
    # episode is a prefix of its example, and the example continues with the reply to it
    by_task = defaultdict(list)
    for r in spy.requests:
        by_task[r.task_id].append(r)
    for ex in examples:
        chat = ex.chat()
        requests = by_task[ex.task_id]
        assert len(requests) == ex.num_trained_messages
        for r in requests:
            assert chat[: len(r.messages)] == [dict(m) for m in r.messages]
            assert chat[len(r.messages)]["role"] == "assistant"
        assert len(chat) == len(requests[-1].messages) + 2
    # the opening of a first task is the prompt builder's, with an empty library section
    first = next(ex for ex in examples if ex.position == 1)
    prompts = build_runner(config(tmp_path), spy, suite).prompts
    assert first.library == () and prompts.messages(_task(first, suite), "") == tuple(first.chat()[:2])
    # a later task saw the skills the first one saved, in its library section
    later = next(ex for ex in examples if ex.position == 2 and ex.scenario_id == first.scenario_id)
    assert later.library and all(f"def {name}(" in later.messages[1].content for name in later.library)


def _task(ex, suite) -> Task:
    return next(t for t in suite.split("train") if t.task_id == ex.task_id)


def test_rejection_drops_exactly_the_scenarios_whose_first_tasks_failed(tmp_path, suite):
    cfg = config(tmp_path, num_scenarios=12, scripted_fail_rate=0.3, keep_first_n=2)
    expert = ScriptedExpert(seed=0, fail_rate=0.3)
    store = run(cfg, expert, suite)
    # the oracle: run the same chains again and read their outcomes
    runner = build_runner(cfg, expert, suite)
    jobs = plan_jobs(plan_scenarios(suite, "train", 12, 3, 0), [0.7])
    chains = {j.key[0]: asyncio.run(run_job(runner, j))[0] for j in jobs}
    success = {sid: [t.outcome.success for t in c.trajectories] for sid, c in chains.items()}
    want = {sid for sid, s in success.items() if s[0] and s[1]}
    assert 0 < len(want) < len(success)  # the test exercises both sides
    kept_scenarios = {ex.scenario_id for ex in store.examples()}
    assert kept_scenarios == want
    want_tasks = {t.task.task_id for sid in want for t in chains[sid].trajectories if t.outcome.success}
    assert {ex.task_id for ex in store.examples()} == want_tasks
    s = summarize(store.records)
    failed_late = sum(not success[sid][2] for sid in want)
    assert s["tasks"]["dropped"] == {
        "scenario_rejected": 3 * (len(success) - len(want)),
        "no_code": 0,
        "task_failed": failed_late,
        "duplicate": 0,
    }
    assert s["scenarios"]["accepted"] == len(want) and s["scenarios"]["rejected"] == len(success) - len(want)
    # every failure is one the expert chose (it gives up at fail_rate): the oracle agrees with it
    gave_up = {
        t.task_id
        for c in chains.values()
        for t in (x.task for x in c.trajectories)
        if expert.plan(t, ()) == ["apis.supervisor.complete_task()"]
    }
    assert gave_up == {
        t.task.task_id for c in chains.values() for t in c.trajectories if not t.outcome.success
    }


def test_no_code_traces_are_dropped_and_keep_failed_tasks(tmp_path, suite):
    cfg = config(
        tmp_path,
        num_scenarios=4,
        keep_first_n=2,
        keep_failed_tasks=True,
        agent={"max_steps": 2, "max_tokens_per_turn": 384, "context_limit": 8192},
    )
    store = run(cfg, NoCodeAt(ScriptedExpert(seed=0), {3}), suite)
    assert {ex.position for ex in store.examples()} == {1, 2}
    reasons = [(t.position, t.reason, t.produced_code, t.stop) for r in store.records for t in r.tasks]
    assert {(3, "no_code", False, "step_limit")} == {x for x in reasons if x[0] == 3}
    assert summarize(store.records)["tasks"]["dropped"]["no_code"] == 4


def test_a_no_code_turn_inside_a_kept_trace_is_kept_untrained(tmp_path, suite):
    store = run(config(tmp_path, num_scenarios=2), NoCodeFirst(ScriptedExpert(seed=0)), suite)
    examples = store.examples()
    assert len(examples) == 6 and all(ex.success for ex in examples)
    for ex in examples:
        first, rest = ex.messages[2], [m for m in ex.messages[3:] if m.role == "assistant"]
        assert first.role == "assistant" and first.content == "Let me think about this first."
        assert first.train is False and rest and all(m.train for m in rest)


def test_screen_rules_on_hand_made_trajectories():
    def traj(pos: int, success: bool, code: bool) -> Trajectory:
        task = Task(f"s_{pos}", "s", pos, "do it", "train")
        turn = Turn((), (), "x", "print(1)" if code else None, ExecResult("1", True))
        return Trajectory(task, (), (turn,), Outcome(float(success), success), StopReason.COMPLETED)

    ok, bad, nocode_ok, nocode_bad = (
        traj(1, True, True),
        traj(2, False, True),
        traj(3, True, False),
        traj(3, False, False),
    )
    assert screen([ok, ok, bad], 2, False) == [None, None, "task_failed"]
    assert screen([ok, ok, bad], 2, True) == [None, None, None]
    assert screen([ok, bad, ok], 2, False) == ["scenario_rejected"] * 3
    assert screen([ok, bad, ok], 1, False) == [None, "task_failed", None]
    assert screen([ok, ok, nocode_ok], 2, True) == [None, None, "no_code"]
    assert screen([ok, ok, nocode_bad], 2, False) == [None, None, "no_code"]
    assert screen([bad, bad], 0, True) == [None, None]  # 0 = no scenario-level rejection
    assert screen([ok], 2, False) == ["scenario_rejected"]  # fewer tasks than N cannot pass


def test_dedup_across_temperatures(tmp_path, suite):
    # the scripted expert ignores the temperature: the second pass only repeats the first
    store = run(config(tmp_path, num_scenarios=3, temperatures=[0.3, 1.0]), ScriptedExpert(seed=0), suite)
    s = summarize(store.records)
    assert s["examples"] == 9 == len(store.examples())
    assert s["tasks"]["dropped"]["duplicate"] == 9
    assert s["by_temperature"] == {
        "0.3": {"scenarios": 3, "accepted": 3, "examples": 9},
        "1.0": {"scenarios": 3, "accepted": 3, "examples": 0},
    }
    # another expert seed writes other conversations (names, doc lookups): nothing is a duplicate
    other = run(config(tmp_path / "b", num_scenarios=3, temperatures=[0.3]), ScriptedExpert(seed=1), suite)
    assert {e.task_id for e in other.examples()} == {e.task_id for e in store.examples()}
    assert [e.chat() for e in other.examples()] != [e.chat() for e in store.examples()]


# --------------------------------------------------------------------------------------------
# interruption and resume
# --------------------------------------------------------------------------------------------


class Interrupt(Exception):
    pass


def _resume_cfg(tmp_path: Path, name: str) -> CollectConfig:
    return config(tmp_path / name, num_scenarios=6, scripted_fail_rate=0.3, temperatures=[0.5, 1.0])


def test_resume_after_interrupt_equals_uninterrupted(tmp_path, suite):
    expert = ScriptedExpert(seed=0, fail_rate=0.3)
    full = run(_resume_cfg(tmp_path, "full"), expert, suite)
    cfg = _resume_cfg(tmp_path, "cut")

    def stop_after_5(_record) -> None:
        if len(partial.records) == 5:
            raise Interrupt

    partial = CollectStore(cfg.out_dir, cfg.name, cfg.identity())
    with pytest.raises(Interrupt):
        asyncio.run(_collect(cfg, expert, suite, partial, stop_after_5))
    again = CollectStore(cfg.out_dir, cfg.name, cfg.identity())
    assert len(again.done) == 5 and again.dropped_bytes == 0
    new = asyncio.run(_collect(cfg, expert, suite, again))
    assert len(new) == 12 - 5
    assert again.dataset.read_bytes() == full.dataset.read_bytes()
    assert summarize(again.records) == summarize(full.records)
    assert summarize(full.records)["tasks"]["dropped"]["duplicate"] > 0  # dedup survived the restart


def test_resume_after_crash_mid_write_truncates_partial_lines(tmp_path, suite):
    expert = ScriptedExpert(seed=0, fail_rate=0.3)
    full = run(_resume_cfg(tmp_path, "full"), expert, suite)
    cfg = _resume_cfg(tmp_path, "crash")
    crash = Path(cfg.out_dir)
    shutil.copytree(full.folder, crash)
    # a crash while committing job 4: its examples were partly written, its ledger line half
    lines = full.ledger.read_bytes().split(b"\n")  # header + 12 records + ""
    records = [json.loads(x) for x in lines[1:-1]]
    job = next(i for i in range(3, 12) if records[i]["examples"] > 0)
    (crash / "progress.jsonl").write_bytes(b"\n".join(lines[: 1 + job]) + b"\n" + lines[1 + job][:40])
    before = records[job - 1]["jsonl_bytes"]
    data = full.dataset.read_bytes()
    (crash / full.dataset.name).write_bytes(data[: before + (records[job]["jsonl_bytes"] - before) // 2])
    store = CollectStore(cfg.out_dir, cfg.name, cfg.identity())
    assert len(store.done) == job and store.dropped_bytes > 0
    assert store.dataset.stat().st_size == before and store.ledger.read_bytes().endswith(b"\n")
    asyncio.run(_collect(cfg, expert, suite, store))
    assert store.dataset.read_bytes() == data
    assert summarize(store.records) == summarize(full.records)
    assert len(read_jsonl(store.dataset)) == summarize(full.records)["examples"]


def test_resume_refuses_another_config_and_lost_data(tmp_path, suite):
    cfg = config(tmp_path, num_scenarios=2)
    store = run(cfg, ScriptedExpert(seed=0), suite)
    changed = config(tmp_path, num_scenarios=2, keep_first_n=3)
    with pytest.raises(StoreError, match="differs in: keep_first_n"):
        CollectStore(changed.out_dir, changed.name, changed.identity())
    # more scenarios and temperatures are fine: only the new jobs run
    more = config(tmp_path, num_scenarios=3, temperatures=[0.7, 0.9])
    grown = CollectStore(more.out_dir, more.name, more.identity())
    assert len(asyncio.run(_collect(more, ScriptedExpert(seed=0), suite, grown))) == 4
    store.dataset.write_bytes(b"")
    with pytest.raises(StoreError, match="edited or lost"):
        CollectStore(cfg.out_dir, cfg.name, cfg.identity())
    fresh = CollectStore(cfg.out_dir, cfg.name, cfg.identity(), resume=False)
    assert fresh.records == [] and not fresh.dataset.exists()


def test_plan_is_prefix_stable_and_covers_fixed_splits(suite):
    small = plan_scenarios(suite, "train", 35, 2, seed=3)
    big = plan_scenarios(suite, "train", 45, 2, seed=3)
    assert big[:35] == small and len({s[0].scenario_id for s in big}) == 45
    assert all(len(s) == 2 and [t.position for t in s] == [1, 2] for s in big)
    dev = plan_scenarios(suite, "dev", None, 3, seed=0)
    assert [t for s in dev for t in s] == list(suite.split("dev"))
    with pytest.raises(ValueError, match="needs the train split"):
        plan_scenarios(suite, "dev", len(dev) + 1, 3, seed=0)


# --------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = ROOT / ".venv" / "bin" / "sage-rl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sage_rl.cli"]
    return subprocess.run([*cmd, "collect", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _words(text: str) -> str:
    return " ".join(text.split())  # rich wraps lines at the terminal width


def test_cli_smoke_writes_dataset_exports_and_summary(tmp_path):
    out = tmp_path / "cli"
    proc = _cli(
        "policy.kind=scripted",
        "num_scenarios=3",
        "pocketworld.sandbox=false",
        f"out_dir={out}",
        "scripted_fail_rate=0.3",
        "formats=[jsonl,hf,sharegpt]",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    examples = read_jsonl(out / "sage_expert.jsonl")
    assert summary["examples"] == len(examples) > 0
    assert summary["tasks"]["run"] == 9 and set(summary["tasks"]["dropped"]) == set(REASONS)
    assert sum(summary["tasks"]["dropped"].values()) + summary["tasks"]["kept"] == 9
    assert len(read_hf(out / "hf")) == len(examples)
    assert len(read_sharegpt(out / "llamafactory", "sage_expert")) == len(examples)
    assert "dropped tasks, by reason" in _words(proc.stderr)


def _in_process(*args: str):
    from typer.testing import CliRunner

    from sage_rl.cli.collect import main

    app = typer.Typer()
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(main)
    return CliRunner().invoke(app, list(args))


def test_cli_resumes_a_finished_collection_and_rejects_bad_config(tmp_path):
    args = [
        "policy.kind=scripted",
        "num_scenarios=2",
        "pocketworld.sandbox=false",
        f"out_dir={tmp_path}",
        "--json",
    ]
    first = _in_process(*args)
    assert first.exit_code == 0, first.output
    again = _in_process(*args)  # everything is done: nothing runs, and the summary is the same
    assert again.exit_code == 0 and "2 of 2 jobs already done" in _words(again.stderr)
    drop = ("wall_s",)
    s1, s2 = json.loads(first.stdout), json.loads(again.stdout)
    assert {k: v for k, v in s1.items() if k not in drop} == {k: v for k, v in s2.items() if k not in drop}
    bad = _in_process("keep_first_n=4", f"out_dir={tmp_path / 'bad'}")
    assert bad.exit_code == 2
    assert "keep_first_n=4 is more than tasks_per_scenario=3" in _words(bad.stderr)
    other = _in_process(*args[:3], "keep_first_n=1", f"out_dir={tmp_path}")
    assert other.exit_code == 2 and "differs in: keep_first_n" in _words(other.stderr)
