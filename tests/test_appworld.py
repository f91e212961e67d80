"""The AppWorld environment against a synthetic world built with AppWorld's own code: setup,
episodes, recorded runs that AppWorld's evaluator scores, a SAGE chain. Isolation, exact restores
and failures: tests/test_appworld_isolation.py. Fixtures: tests/appworld_support.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from appworld_support import alive, config_for
from typer.testing import CliRunner

from sage_rl.cli.appworld import app as appworld_cli
from sage_rl.integrations.appworld.env import (
    AppWorldEnvironment,
    AppWorldSuite,
)
from sage_rl.integrations.appworld.installer import sha256_of
from sage_rl.integrations.appworld.paths import AppWorldPaths
from sage_rl.integrations.appworld.synthetic_world import pack_bundle
from sage_rl.types import Task

pytestmark = pytest.mark.appworld


def test_setup_from_a_local_bundle(world: AppWorldPaths, tmp_path: Path) -> None:
    bundle = tmp_path / "data-0.1.0.bundle"
    pack_bundle(world, bundle)
    # The bundle is AppWorld's format: encrypted, so no plain path names inside.
    assert b"specs.json" not in bundle.read_bytes()
    root = tmp_path / "fresh-root"
    base = ["setup", "--venv", str(world.venv), "--root", str(root), "--bundle", str(bundle)]
    runner = CliRunner()

    bad = runner.invoke(appworld_cli, base)  # default sha256 is the real bundle's: refused
    assert bad.exit_code == 1 and "sha256" in bad.output and not (root / "data").exists()

    good = runner.invoke(appworld_cli, [*base, "--sha256", sha256_of(bundle), "--require-data"])
    assert good.exit_code == 0, good.output
    for step in ("[1/4]", "[2/4]", "[3/4]", "[4/4]", "sha256 verified", "ready:"):
        assert step in good.output
    assert (root / "data" / "tasks" / "aaa_2" / "specs.json").is_file()

    again = runner.invoke(appworld_cli, [*base, "--sha256", sha256_of(bundle)])
    assert again.exit_code == 0 and "already present" in again.output

    status = runner.invoke(appworld_cli, ["status", "--json", "--venv", str(world.venv), "--root", str(root)])
    assert status.exit_code == 0 and '"ok": true' in status.output
    suite = AppWorldSuite(config_for(AppWorldPaths(world.venv, root)))
    assert [t.task_id for t in suite.split("train")] == ["aaa_1", "aaa_2", "bbb_1"]
    assert [t.task_id for t in suite.split("train", 1)] == ["aaa_1", "aaa_2"]  # its first scenario, whole


async def _episode(env: AppWorldEnvironment, task: Task, answer: object) -> dict:
    """Run one scripted episode; return what the test checks."""
    await env.reset(task)
    out: dict = {"pid": env.worker_pid, "before": await env.evaluate()}
    out["define"] = await env.execute("def double(v):\n    return 2 * v\nbase = 20")
    out["use"] = await env.execute("print(double(base))")
    out["error"] = await env.execute("1 / 0")
    out["syntax"] = await env.execute("def broken(:")
    out["docs"] = await env.execute("print(apis.api_docs.show_api_descriptions(app_name='supervisor'))")
    out["task"] = await env.execute("print(apis.supervisor.show_active_task()['instruction'])")
    out["completed_early"] = env.completed
    out["complete"] = await env.execute(f"apis.supervisor.complete_task(answer={answer!r})")
    out["after"] = await env.evaluate()
    out["info"] = await env.info()
    return out


async def _two_workers(suite: AppWorldSuite) -> tuple[dict, dict]:
    envs = await asyncio.gather(suite.open(), suite.open())
    try:
        a_task, b_task = suite.split("train")[0], suite.split("train")[1]
        # Task aaa_1 expects 42, aaa_2 expects 43: A answers right, B answers wrong.
        a, b = await asyncio.gather(_episode(envs[0], a_task, 42), _episode(envs[1], b_task, 99))
        await envs[1].reset(a_task)
        b["pid_after_reset"] = envs[1].worker_pid
        b["fresh_ns"] = await envs[1].execute("print(base)")
        b["fresh_eval"] = await envs[1].evaluate()
    finally:
        await asyncio.gather(*(e.close() for e in envs))
    return a, b


def test_two_concurrent_workers_reset_execute_complete_evaluate_teardown(
    world: AppWorldPaths, suite: AppWorldSuite
) -> None:
    a, b = asyncio.run(_two_workers(suite))
    assert a["pid"] != b["pid"]
    for ep in (a, b):
        assert ep["before"].score == 0.0 and not ep["before"].success and len(ep["before"].checks) == 2
        assert ep["define"].ok and ep["define"].defined == ("double",) and ep["define"].calls is None
        assert ep["use"].ok and ep["use"].observation.strip() == "40"  # namespace persists across cells
        assert not ep["error"].ok and "ZeroDivisionError" in ep["error"].observation
        assert not ep["syntax"].ok and "Syntax error" in ep["syntax"].observation
        assert ep["docs"].ok and "complete_task" in ep["docs"].observation
        assert not ep["completed_early"] and ep["complete"].ok and ep["complete"].completed
        assert 50 < ep["info"]["rss_mb"] < 2000 and 0 < ep["info"]["pss_mb"] <= ep["info"]["rss_mb"]
    assert a["task"].observation.strip() == "Answer with the number 42."
    assert b["task"].observation.strip() == "Answer with the number 43."
    # A: both tests pass. B: marked complete but wrong answer -> 1 of 2 tests.
    assert a["after"].success and a["after"].score == 1.0
    assert not b["after"].success and b["after"].score == 0.5
    assert [c.passed for c in b["after"].checks] == [True, False]
    # Reset gives a fresh worker, world and namespace.
    assert b["pid_after_reset"] != b["pid"] and not alive(b["pid"])
    assert not b["fresh_ns"].ok and "NameError" in b["fresh_ns"].observation
    assert b["fresh_eval"].score == 0.0
    # Teardown: the processes are gone, and nothing was written to AppWorld's root.
    assert not alive(a["pid"]) and not alive(b["pid_after_reset"])
    assert not (world.root / "experiments").exists()
    assert list((suite._factory.tmp / "episodes").iterdir()) == []


#: Over 64 MiB printed in 1 MiB lines (the parent's line limit was 64 MiB); a long error message.
FLOOD = "line = 'x' * (1 << 20)\nfor _ in range(65):\n    print(line)"
LONG_ERROR = "raise ValueError('y' * (1 << 20))"


async def _flood(suite: AppWorldSuite) -> dict:
    env = await suite.open()
    try:
        await env.reset(suite.split("train")[0])
        out: dict = {"pid": env.worker_pid, "set": await env.execute("kept = 7")}
        out["flood"] = await env.execute(FLOOD)
        out["error"] = await env.execute(LONG_ERROR)
        out["state"] = await env.execute("print(kept)")
        out["pid_after"] = env.worker_pid
        out["log"] = (env._output_dir / "logs" / "environment_io.md").stat().st_size  # type: ignore[operator]
        out["info"] = await env.info()
        return out
    finally:
        await env.close()


def test_a_cell_printing_more_than_64_mib_is_truncated_and_the_episode_goes_on(suite: AppWorldSuite) -> None:
    out = asyncio.run(_flood(suite))
    limit = 20_000  # appworld.limits.output_chars, as the sandbox's
    flood = out["flood"]
    assert flood.ok and flood.observation.startswith("x" * 100)
    assert len(flood.observation) < limit + 500 and "[output truncated: " in flood.observation
    assert not out["error"].ok and "ValueError" in out["error"].observation
    assert len(out["error"].observation) < limit + 20_500 and "truncated" in out["error"].observation
    # Same worker, same namespace: nothing was lost or restored; AppWorld's log holds the cut text.
    assert out["state"].ok and out["state"].observation.strip() == "7" and out["pid_after"] == out["pid"]
    assert out["log"] < 1 << 20 and out["info"]["rss_mb"] < 2000


async def _prepared_evaluators(suite: AppWorldSuite, run: Path) -> dict:
    env = await suite.open()
    task = suite.split("train")[0]
    out: dict = {}
    try:
        await env.reset(task)
        await env.execute("x = 1")  # the first cell starts the evaluator's preparation
        out["unused"] = (await env.prepare_evaluation()).pid  # type: ignore[misc]
        await env.reset(task)  # never evaluated: its evaluator goes with the episode
        await env.execute("apis.supervisor.complete_task(answer=42)")
        out["used"] = (await env.prepare_evaluation()).pid  # type: ignore[misc]
        out["eval"] = await env.evaluate()
        await env.reset(task)
        await env.execute("apis.supervisor.complete_task(answer=42)")
        await env.prepare_evaluation()
        out["root"] = suite.record_to(run)  # after the preparation: the evaluation still goes there
        out["recorded"] = await env.evaluate()
    finally:
        await env.close()
        suite._recording = None
    return out


def test_an_episode_evaluator_is_prepared_while_it_runs_and_used_once(
    suite: AppWorldSuite, tmp_path: Path
) -> None:
    out = asyncio.run(_prepared_evaluators(suite, tmp_path / "run"))
    assert out["eval"].success and out["recorded"].success
    for _ in range(500):  # killed without waiting: gone within moments
        if not alive(out["unused"]) and not alive(out["used"]):
            break
        time.sleep(0.01)
    assert not alive(out["unused"]) and not alive(out["used"])
    report = out["root"] / "experiments" / "outputs" / "sage-rl_train" / "tasks" / "aaa_1" / "evaluation"
    assert (report / "report.md").is_file()
    assert not list((suite._factory.tmp / "evaluations" / "experiments" / "outputs").iterdir())


async def _evaluations_after_a_no_op(suite: AppWorldSuite) -> dict:
    """Prepared evaluators (they score a no-op episode while the episode runs) asked directly."""
    env = await suite.open()
    task, out = suite.split("train")[0], {}
    try:
        for name, code in (("untouched", "x = 1"), ("completed", "apis.supervisor.complete_task(answer=42)")):
            await env.reset(task)
            await env.execute(code)
            out[f"{name}_outcome"] = await env.evaluate()  # the environment's own path
            await env.reset(task)
            await env.execute(code)
            worker = await env.prepare_evaluation()  # type: ignore[misc]
            request = {"op": "evaluate", "source": str(env._output_dir), "save_report": False}
            out[name] = await worker.request(request, 60)  # type: ignore[union-attr]
    finally:
        await env.close()
    return out


def test_a_prepared_evaluator_loads_only_the_apps_the_episode_changed(suite: AppWorldSuite) -> None:
    out = asyncio.run(_evaluations_after_a_no_op(suite))
    # Nothing changed: every app's database is the no-op's, and the task is not done.
    assert out["untouched"]["reloaded"] == [] and out["untouched"]["kept"] >= 2
    assert out["untouched"]["num_tests"] == 2 and not out["untouched"]["success"]
    assert out["untouched_outcome"].score == 0.0
    # complete_task wrote to the supervisor app alone: that database is loaded from the episode's
    # saved state (scoring the no-op's would fail both checks); the others are kept.
    assert out["completed"]["reloaded"] == ["supervisor"] and out["completed"]["success"]
    assert out["completed"]["kept"] == out["untouched"]["kept"] - 1
    assert out["completed_outcome"].success


async def _recorded_run(world: AppWorldPaths, run: Path) -> list[Path]:
    suite = AppWorldSuite(config_for(world))
    suite.record_to(run)
    answers = {"aaa_1": 42, "aaa_2": 0, "ccc_1": 7}  # aaa_2 is answered wrong
    try:
        env = await suite.open()
        for task in (*suite.split("train")[:2], *suite.split("dev")):
            await env.reset(task)
            await env.execute(f"print({task.task_id!r})")
            await env.execute(f"apis.supervisor.complete_task(answer={answers[task.task_id]})")
            await env.evaluate()
    finally:
        await suite.close()
    return [run / "appworld" / "experiments" / "outputs" / e for e in ("sage-rl_train", "sage-rl_dev")]


def test_a_run_keeps_appworld_outputs_that_appworlds_own_evaluator_scores(
    world: AppWorldPaths, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train, dev = asyncio.run(_recorded_run(world, run))
    task = dev / "tasks" / "ccc_1"
    for part in (
        "dbs/supervisor.jsonl",
        "logs/environment_io.md",
        "logs/api_calls.jsonl",
        "evaluation/report.md",
    ):
        assert (task / part).is_file(), part
    assert "print('ccc_1')" in (task / "logs" / "environment_io.md").read_text()
    assert sorted(p.name for p in (train / "tasks").iterdir()) == ["aaa_1", "aaa_2"]

    # AppWorld's own command, in its venv, on the run folder: the whole dev split is there.
    native = subprocess.run(
        [
            str(world.venv / "bin" / "appworld"),
            "evaluate",
            "sage-rl_dev",
            "dev",
            "--root",
            str(run / "appworld"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert native.returncode == 0, native.stderr[-2000:]
    dev_report = json.loads((dev / "evaluations" / "dev.json").read_text())
    assert dev_report["aggregate"] == {"task_goal_completion": 100.0, "scenario_goal_completion": 100.0}

    # sage-rl's command: every experiment of the run; train covered 2 of its 3 tasks.
    result = CliRunner().invoke(appworld_cli, ["evaluate", str(run), "--venv", str(world.venv), "--json"])
    assert result.exit_code == 0, result.output
    reports = {r["experiment"]: r for r in json.loads(result.stdout)}
    assert set(reports) == {"sage-rl_train", "sage-rl_dev"}
    assert "partial run: 2 of the 3 tasks of train" in reports["sage-rl_train"]["output"]
    aggregate = reports["sage-rl_train"]["evaluation"]["aggregate"]
    assert aggregate == {"task_goal_completion": 50.0, "scenario_goal_completion": 0.0}
    assert reports["sage-rl_dev"]["evaluation"]["aggregate"]["task_goal_completion"] == 100.0


class _ScriptedReplies:
    """A text policy replying with fixed code per (task, step); records the prompts it saw."""

    name = "scripted-replies"
    renderer = None

    def __init__(self, replies: dict[str, list[str]]) -> None:
        self.replies = replies
        self.prompts: dict[str, str] = {}

    async def generate(self, request):
        from sage_rl.policies.base import Completion

        task_id = request.task_id
        self.prompts.setdefault(task_id, request.messages[1]["content"])
        step = sum(m["role"] == "assistant" for m in request.messages)
        return Completion(text=f"```python\n{self.replies[task_id][step]}\n```")


def test_a_sage_chain_runs_unchanged_on_appworld(suite: AppWorldSuite) -> None:
    """The agent loop and sequential rollout over AppWorld: task 1 makes a skill, task 2 gets it
    loaded into its own worker and uses it; usage is found statically (no call records)."""
    from sage_rl.integrations.appworld.prompts import prompt_builder
    from sage_rl.policies.base import SamplingParams
    from sage_rl.rollout.chain import ChainRunner, SkillsConfig
    from sage_rl.rollout.episode import AgentConfig
    from sage_rl.skills.library import Library
    from sage_rl.skills.retrieval import RetrievalConfig, make_retriever

    skill = (  # a skill that only submitted would not be credited (usage.refers_to_work)
        "def answer_with(value: int) -> None:\n"
        '    """Complete the active task, answering value."""\n'
        "    print(apis.supervisor.show_active_task()['instruction'][:10])\n"
        "    apis.supervisor.complete_task(answer=value)\n"
    )
    policy = _ScriptedReplies({"aaa_1": [skill + "\nanswer_with(42)"], "aaa_2": ["answer_with(43)"]})
    runner = ChainRunner(
        policy=policy,
        suite=suite,
        prompts=prompt_builder(max_steps=3),
        agent=AgentConfig(max_steps=3, max_tokens_per_turn=256, context_limit=8192),
        skills=SkillsConfig(),
        params=SamplingParams(temperature=0.0),
        retriever=make_retriever(RetrievalConfig()),
    )
    chain = asyncio.run(runner.run(suite.split("train")[:2], Library()))
    first, second = chain.trajectories
    assert [t.outcome.success for t in chain.trajectories] == [True, True]
    assert first.skills_saved == ("answer_with",) and second.library_in == ("answer_with",)
    assert second.skills_used == ("answer_with",) and chain.used_from == ((), (0,))
    assert "def answer_with(value: int)" in policy.prompts["aaa_2"]
    assert "apis.api_docs" not in policy.prompts["aaa_2"]  # the library sits in the task message
