"""The AppWorld environment against a synthetic world built here with AppWorld's own code.

Needs the AppWorld virtualenv made by ``scripts/setup_appworld.sh`` (``sage-rl appworld setup``).
Fails (does not skip) when it is missing, unless ``SAGE_RL_SKIP_APPWORLD=1``. No task data is
needed: the world is synthetic (see ``sage_rl/integrations/appworld/synthetic.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sage_rl.cli.appworld import app as appworld_cli
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldEnvironment, AppWorldSuite
from sage_rl.integrations.appworld.installer import sha256_of
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths, venv_status
from sage_rl.integrations.appworld.synthetic_world import build_world, pack_bundle
from sage_rl.types import Task

pytestmark = pytest.mark.appworld


@pytest.fixture(scope="session")
def venv() -> Path:
    if os.environ.get("SAGE_RL_SKIP_APPWORLD") == "1":
        pytest.skip("SAGE_RL_SKIP_APPWORLD=1")
    paths = default_paths()
    ok, msg = venv_status(paths)
    if not ok:
        pytest.fail(
            f"{msg}. Run scripts/setup_appworld.sh, or set SAGE_RL_SKIP_APPWORLD=1 to skip.", pytrace=False
        )
    return paths.venv


@pytest.fixture(scope="session")
def world(venv: Path, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> AppWorldPaths:
    """A synthetic world: api docs from source, empty-schema dbs, task folders for 4 tasks.

    Built once per test run: under pytest-xdist, the first worker builds it in the run's shared
    temp folder (under a file lock) and the others reuse it."""
    shared = (
        tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    )
    paths = AppWorldPaths(venv=venv, root=shared / "appworld-synthetic")
    with (shared / "appworld-synthetic.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (paths.root / "built").exists():
            build_world(paths)
            (paths.root / "built").write_text("ok")
    return paths


def _config(world: AppWorldPaths, **kw: float) -> AppWorldEnvConfig:
    return AppWorldEnvConfig(venv=str(world.venv), root=str(world.root), **kw)


@pytest.fixture(scope="session")
def suite(world: AppWorldPaths):
    """One suite (one AppWorld zygote) for the environment tests; short cell limits."""
    s = AppWorldSuite(_config(world, cell_timeout_s=3, kill_grace_s=3))
    yield s
    asyncio.run(s.close())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


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
    suite = AppWorldSuite(_config(AppWorldPaths(world.venv, root)))
    assert [t.task_id for t in suite.split("train")] == ["aaa_1", "aaa_2", "bbb_1"]


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
    out["outdir"] = env.config.paths().root / "experiments" / "outputs" / f"sage-rl-{env.worker_pid}"
    out["outdir_existed"] = out["outdir"].is_dir()
    return out


async def _two_workers(suite: AppWorldSuite) -> tuple[dict, dict]:
    envs = await asyncio.gather(suite.open(), suite.open())
    try:
        a_task, b_task = suite.split("train")[0], suite.split("train")[1]
        # Task aaa_1 expects 42, aaa_2 expects 43: A answers right, B answers wrong.
        a, b = await asyncio.gather(_episode(envs[0], a_task, 42), _episode(envs[1], b_task, 99))
        b["reset_again"] = await envs[1].reset(a_task)
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
        assert 100 < ep["info"]["rss_mb"] < 2000
    assert a["task"].observation.strip() == "Answer with the number 42."
    assert b["task"].observation.strip() == "Answer with the number 43."
    # A: both tests pass. B: marked complete but wrong answer -> 1 of 2 tests.
    assert a["after"].success and a["after"].score == 1.0
    assert not b["after"].success and b["after"].score == 0.5
    assert [c.passed for c in b["after"].checks] == [True, False]
    # Reset gives a fresh world and namespace in the same worker.
    assert not b["fresh_ns"].ok and "NameError" in b["fresh_ns"].observation
    assert b["fresh_eval"].score == 0.0
    # Teardown: both processes are gone, and so are their AppWorld output folders.
    assert not _alive(a["pid"]) and not _alive(b["pid"])
    assert a["outdir_existed"] and b["outdir_existed"]
    assert not a["outdir"].exists() and not b["outdir"].exists()


async def _timeouts(suite: AppWorldSuite) -> dict:
    env = await suite.open()
    try:
        await env.reset(suite.split("train")[0])
        out = {"set": await env.execute("x = 7"), "pid0": env.worker_pid}
        # Pure Python: AppWorld's own alarm stops it; the world survives.
        out["loop"] = await env.execute("while True:\n    pass")
        out["pid1"], out["x1"] = env.worker_pid, await env.execute("print(x)")
        # Stuck in C (no bytecode boundary for the alarm): the parent kills and replaces the worker.
        out["stuck"] = await env.execute("sum(range(10 ** 13))")
        out["pid2"], out["x2"] = env.worker_pid, await env.execute("print(x)")
        # A caller that gives up (cancels) mid-cell: the worker's state is unknown, so it is
        # killed; the next cell finds it gone and gets a restored world.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(env.execute("while True:\n    pass"), 0.5)
        out["pid3"] = env.worker_pid
        out["after_cancel"] = await env.execute("print(x)")
        out["pid4"] = env.worker_pid
        out["done"] = await env.execute("apis.supervisor.complete_task(answer=42)")
        out["eval"] = await env.evaluate()
    finally:
        await env.close()
    return out


def test_cell_timeouts_alarm_and_kill_with_replay(suite: AppWorldSuite) -> None:
    out = asyncio.run(_timeouts(suite))
    assert out["set"].ok
    assert out["loop"].timed_out and not out["loop"].ok and "timed out" in out["loop"].observation
    assert out["pid1"] == out["pid0"] and out["x1"].observation.strip() == "7"
    assert out["stuck"].timed_out and not out["stuck"].ok and "restarted" in out["stuck"].observation
    assert out["pid2"] != out["pid0"] and not _alive(out["pid0"])
    assert out["x2"].observation.strip() == "7"  # earlier cells replayed into the new worker
    assert out["pid3"] == out["pid2"] and not _alive(out["pid3"]) and out["pid4"] != out["pid3"]
    assert out["after_cancel"].ok and out["after_cancel"].observation.strip() == "7"
    assert out["done"].completed and out["eval"].success


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

    skill = (
        "def answer_with(value: int) -> None:\n"
        '    """Complete the active task, answering value."""\n'
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
