"""The AppWorld environment against a synthetic world built here with AppWorld's own code.

Needs the AppWorld virtualenv made by ``scripts/setup_appworld.sh`` (``sage-rl appworld setup``).
Fails (does not skip) when it is missing, unless ``SAGE_RL_SKIP_APPWORLD=1``. No task data is
needed: the world is synthetic (see ``sage_rl/integrations/appworld/synthetic.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pwd
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sage_rl.cli.appworld import app as appworld_cli
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import (
    AppWorldEnvironment,
    AppWorldSuite,
    EvaluationError,
    TaskLoadError,
)
from sage_rl.integrations.appworld.installer import sha256_of
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths, venv_status
from sage_rl.integrations.appworld.synthetic_world import DEFAULT_SPEC, build_world, pack_bundle
from sage_rl.types import Task

pytestmark = pytest.mark.appworld

#: The default world plus tasks that fail on purpose: a data version AppWorld does not accept,
#: and a ground truth whose evaluation code raises.
SPEC = {
    **DEFAULT_SPEC,
    "broken": [
        {"task_id": "ddd_1", "instruction": "Old data.", "answer": 1, "db_version": "0.0.1"},
        {
            "task_id": "eee_1",
            "instruction": "Broken ground truth.",
            "answer": 1,
            "evaluation_py": "raise RuntimeError('this ground truth is broken')\n",
        },
    ],
}
SECRET = "sk-parent-secret-0123456789"


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
    """A synthetic world: API docs from source, base DBs, task change logs, ground truths.

    Built once per test run: under pytest-xdist, the first worker builds it in the run's shared
    temp folder (under a file lock) and the others reuse it."""
    shared = (
        tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    )
    paths = AppWorldPaths(venv=venv, root=shared / "appworld-synthetic")
    with (shared / "appworld-synthetic.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (paths.root / "built").exists():
            build_world(paths, SPEC)
            (paths.root / "built").write_text("ok")
    return paths


def _config(world: AppWorldPaths, **kw: object) -> AppWorldEnvConfig:
    return AppWorldEnvConfig(venv=str(world.venv), root=str(world.root), **kw)


@pytest.fixture(scope="session")
def suite(world: AppWorldPaths):
    """One suite (one AppWorld zygote) for the environment tests; short cell limits. A secret sits
    in this process's environment while the zygote starts."""
    os.environ["SAGE_RL_TEST_SECRET"] = SECRET
    s = AppWorldSuite(_config(world, cell_timeout_s=2, kill_grace_s=2))
    s._factory.zygote()  # started now, with the secret in this process's environment
    yield s
    asyncio.run(s.close())
    os.environ.pop("SAGE_RL_TEST_SECRET", None)


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
    assert b["pid_after_reset"] != b["pid"] and not _alive(b["pid"])
    assert not b["fresh_ns"].ok and "NameError" in b["fresh_ns"].observation
    assert b["fresh_eval"].score == 0.0
    # Teardown: the processes are gone, and nothing was written to AppWorld's root.
    assert not _alive(a["pid"]) and not _alive(b["pid_after_reset"])
    assert not (world.root / "experiments").exists()
    assert list((suite._factory.tmp / "episodes").iterdir()) == []


#: Reads of the task data, another task's answer, the parent's environment: each must be refused.
PROBES = {
    "environ": "import os\nprint(sorted(os.environ))",
    "scandir_data": "import os\nprint(sorted(e.name for e in os.scandir({data!r} + '/tasks')))",
    "scandir_relative": "import os\nprint(sorted(e.name for e in os.scandir('root/data/tasks')))",
    "answer": "import pathlib\nprint(pathlib.Path({data!r} + '/tasks/aaa_2/ground_truth/answer.json').read_text())",
    "answer_via_link": "import pathlib\nprint(pathlib.Path('root/data/tasks/aaa_1/ground_truth/answer.json').read_text())",
    "parent_environ": "import pathlib\nprint(pathlib.Path('/proc/{ppid}/environ').read_text())",
    "network": "__import__('socket').create_connection(('1.1.1.1', 53), timeout=1)",
    # the zygote's socket: with it, agent code could fork workers that hold no layers yet
    "zygote": "s = __import__('_socket')\nc = s.socket(s.AF_UNIX, s.SOCK_STREAM)\nc.connect({zygote!r})",
    "uid": "import os\nprint(os.getuid())",
}


async def _probe(suite: AppWorldSuite) -> tuple[dict, dict]:
    env = await suite.open()
    try:
        await env.reset(suite.split("train")[0])
        data = str(suite.paths.data)
        names = {"data": data, "ppid": os.getpid(), "zygote": str(suite._factory.zygote().socket_path)}
        out = {k: await env.execute(code.format(**names)) for k, code in PROBES.items()}
        return out, env.isolation
    finally:
        await env.close()


def test_agent_code_cannot_read_ground_truth_data_or_the_parents_environment(suite: AppWorldSuite) -> None:
    out, isolation = asyncio.run(_probe(suite))
    assert out["environ"].ok and SECRET not in out["environ"].observation
    assert "SAGE_RL_TEST_SECRET" not in out["environ"].observation
    assert set(json.loads(out["environ"].observation)) <= {
        "PATH", "LANG", "HOME", "TMPDIR", "APPWORLD_ROOT", "APPWORLD_CACHE", "PYTHONDONTWRITEBYTECODE",
    }  # fmt: skip
    for probe in (
        "scandir_data",
        "scandir_relative",
        "answer",
        "answer_via_link",
        "parent_environ",
        "zygote",
    ):
        assert not out[probe].ok and "PermissionError" in out[probe].observation, (probe, out[probe])
        # the answers are 42 and 43; a pid in a path (/proc/11428/environ) is not one
        assert not re.search(r"(?<!\d)4[23](?!\d)", out[probe].observation), (probe, out[probe])
    assert not out["network"].ok
    assert isolation["filesystem"] == "landlock" and "fs-read" in isolation["landlock"]
    assert isolation["network"] == "netns" and {"AS", "FSIZE", "NOFILE", "CPU"} <= set(isolation["rlimits"])
    if os.getuid() == 0:
        assert isolation["user"] == "nobody" and out["uid"].observation.strip() == str(
            pwd.getpwnam("nobody").pw_uid
        )
    # Evaluation still works: it runs elsewhere, with the ground truth the worker never had.


#: Cells of the exact-restore test. ``cells`` counts how often a cell body has run (a replay
#: would run earlier cells again); ``n`` is left at a timing-dependent value by AppWorld's alarm;
#: the emails are rows in AppWorld's database, sent until the alarm fires.
RESTORE_CELLS = {
    "setup": (
        "cells = 1\n"
        "apis.gmail.signup(first_name='Ada', last_name='L', email='ada@example.com', password='secret1')\n"
        "token = apis.gmail.login(username='ada@example.com', password='secret1')['access_token']"
    ),
    "alarm": (
        "cells += 1\nn = 0\nwhile True:\n"
        "    apis.gmail.send_email(email_addresses=['ada@example.com'], subject=f'n{n}', body='x', access_token=token)\n"
        "    n += 1"
    ),
    "state": (
        "count = 0\npage = 0\nwhile True:\n"
        "    got = apis.gmail.show_outbox_threads(access_token=token, page_limit=20, page_index=page)\n"
        "    if not got:\n        break\n    count += len(got)\n    page += 1\n"
        "print(cells, n, count)"
    ),
    "stuck": "cells += 1000\nsum(range(10 ** 13))",
    "timed_out_by_message": "raise Exception('upload timed out after 3 retries')",
}


async def _restore(suite: AppWorldSuite) -> dict:
    env = await suite.open()
    out: dict = {}
    try:
        await env.reset(suite.split("train")[0])
        for name in ("setup", "alarm"):
            out[name] = await env.execute(RESTORE_CELLS[name])
        out["before"] = await env.execute(RESTORE_CELLS["state"])
        out["pids"] = [env.worker_pid]
        for i in range(3):  # three kills: each restore is the same single step
            out[f"stuck{i}"] = await env.execute(RESTORE_CELLS["stuck"])
            out["pids"].append(env.worker_pid)
            out[f"after{i}"] = await env.execute(RESTORE_CELLS["state"])
        # A caller that gives up (cancels) mid-cell: the worker is killed at once; the next request
        # finds its snapshot in its place.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(env.execute("cells += 1000\nwhile True:\n    pass"), 0.5)
        out["after_cancel"] = await env.execute(RESTORE_CELLS["state"])
        out["message"] = await env.execute(RESTORE_CELLS["timed_out_by_message"])
        out["done"] = await env.execute("apis.supervisor.complete_task(answer=42)")
        out["eval"] = await env.evaluate()
        out["dead_pids"] = [p for p in out["pids"][:-1] if _alive(p)]
    finally:
        await env.close()
    return out


def test_a_killed_worker_is_restored_exactly_from_its_snapshot(suite: AppWorldSuite) -> None:
    out = asyncio.run(_restore(suite))
    assert out["setup"].ok, out["setup"].observation
    # AppWorld's own alarm stopped the loop part-way: the world survives with its partial effects.
    assert out["alarm"].timed_out and not out["alarm"].ok and "timed out" in out["alarm"].observation
    assert out["before"].ok, out["before"].observation
    cells, n, count = map(int, out["before"].observation.split())
    assert cells == 2 and n > 0 and count in (n, n + 1)  # the alarm may stop it before ``n += 1``
    for i in range(3):
        stuck = out[f"stuck{i}"]
        assert (
            stuck.timed_out and not stuck.ok and "restored to its state before this cell" in stuck.observation
        )
        # The same numbers after each kill: the namespace (n), the database (count), and no cell
        # ran twice (cells): nothing was replayed, whatever came before.
        assert out[f"after{i}"].observation.split() == [str(cells), str(n), str(count)]
    assert len(set(out["pids"])) == 4 and out["dead_pids"] == []
    assert out["after_cancel"].observation.split() == [str(cells), str(n), str(count)]
    assert not out["message"].ok and not out["message"].timed_out  # an error's words are not a timeout
    assert out["done"].completed and out["eval"].success


#: Agent code writes a forged "my snapshot took over" on its worker's connection, naming a process
#: outside the episode: the parent must not take it for its worker (it would kill it later).
FORGE = """import os
for e in os.scandir('/proc/self/fd'):
    try:
        if os.readlink(e.path).startswith('socket:'):
            os.writev(int(e.name), [b'\\n{{"ok": true, "restored": true, "pid": {pid}}}\\n'])
    except OSError:
        pass"""


async def _forge(suite: AppWorldSuite, pid: int) -> dict:
    env = await suite.open()
    out: dict = {}
    try:
        await env.reset(suite.split("train")[0])
        out["group"] = env._worker.group  # type: ignore[union-attr]
        try:
            out["result"] = await env.execute(FORGE.format(pid=pid))
        except Exception as e:  # noqa: BLE001 - what the environment raises is the result
            out["error"] = e
    finally:
        await env.close()
    return out


def test_a_forged_takeover_on_the_workers_connection_kills_no_stranger(suite: AppWorldSuite) -> None:
    from sage_rl.integrations.appworld.env import EnvironmentBroken

    stranger = subprocess.Popen(["sleep", "60"])
    try:
        out = asyncio.run(_forge(suite, stranger.pid))
        assert isinstance(out.get("error"), EnvironmentBroken), out
        assert "outside its episode" in str(out["error"])
        assert stranger.poll() is None  # still running
        assert not _alive(out["group"])  # the episode's own processes were stopped
    finally:
        stranger.kill()
        stranger.wait()


async def _failures(world: AppWorldPaths) -> dict:
    suite = AppWorldSuite(_config(world))
    tmp = suite._factory.tmp
    out: dict = {"tmp": tmp}
    env = await suite.open()
    old, broken_eval = suite.split("broken")
    with pytest.raises(TaskLoadError) as e:
        await env.reset(old)
    out["load_error"] = str(e.value)
    out["episodes_after_load_error"] = list((tmp / "episodes").iterdir())
    await env.reset(broken_eval)  # the same environment carries on with the next task
    await env.execute("apis.supervisor.complete_task(answer=1)")
    with pytest.raises(EvaluationError) as e:
        await env.evaluate()
    out["eval_error"] = str(e.value)
    out["pid"] = env.worker_pid
    out["zygote"] = suite._factory.zygote()._proc.pid
    await suite.close()  # closes the environment still open, too
    return out


def test_reset_and_evaluation_failures_raise_clear_errors_and_close_leaves_nothing(
    world: AppWorldPaths,
) -> None:
    out = asyncio.run(_failures(world))
    assert out["load_error"].startswith("AppWorld could not load task ddd_1: Exception: The database version")
    assert "\n" not in out["load_error"] and out["episodes_after_load_error"] == []
    assert out["eval_error"].startswith("AppWorld could not evaluate task eee_1: RuntimeError")
    assert "this ground truth is broken" in out["eval_error"]
    # Everything the suite made in /tmp lives in its one folder (episodes, evaluations, the
    # zygote's socket and log): gone, with every process.
    assert out["tmp"].parent == Path(tempfile.gettempdir()) and not out["tmp"].exists()
    assert not _alive(out["pid"]) and not _alive(out["zygote"])
    assert not (world.root / "experiments").exists()


def test_reset_refuses_a_sandbox_that_leaves_the_task_data_readable(world: AppWorldPaths) -> None:
    """The worker checks the one thing its layers must do: with reads left open (and root kept),
    agent code could read every answer, so the reset fails and says so."""
    from sage_rl.integrations.appworld.config import AppWorldLimits

    limits = AppWorldLimits(restrict_reads=False, drop_user="")

    async def reset() -> str:
        suite = AppWorldSuite(_config(world, limits=limits))
        try:
            env = await suite.open()
            with pytest.raises(TaskLoadError) as e:
                await env.reset(suite.split("train")[0])
            return str(e.value)
        finally:
            await suite.close()

    message = asyncio.run(reset())
    assert "does not hide AppWorld's task data from agent code" in message and "\n" not in message
    assert "appworld.sandbox=false" in message


async def _recorded_run(world: AppWorldPaths, run: Path) -> list[Path]:
    suite = AppWorldSuite(_config(world))
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
