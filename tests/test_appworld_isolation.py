"""AppWorld episodes under the sandbox's layers: agent code reads no answer and no secret, a
killed worker is restored exactly, a forged takeover kills no stranger, failures are clear errors.
Fixtures: tests/appworld_support.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from appworld_support import SECRET, alive, config_for

from sage_rl.integrations.appworld.env import (
    AppWorldSuite,
    EvaluationError,
    TaskLoadError,
)
from sage_rl.integrations.appworld.paths import AppWorldPaths

pytestmark = pytest.mark.appworld

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
        # the answers are 42 and 43; a pid in a path (/proc/11428/environ) is not one, nor is a
        # quoted path (pytest's numbered temp folder may be pytest-42)
        shown = re.sub(r"'/[^']*'", "'<path>'", out[probe].observation)
        assert not re.search(r"(?<!\d)4[23](?!\d)", shown), (probe, out[probe])
    assert not out["network"].ok
    assert isolation["filesystem"] == "landlock" and "fs-read" in isolation["landlock"]
    assert isolation["network"] == "netns" and {"AS", "FSIZE", "NOFILE", "CPU"} <= set(isolation["rlimits"])
    if os.getuid() == 0:
        assert isolation["user"] == "nobody" and out["uid"].observation.strip() == str(
            pwd.getpwnam("nobody").pw_uid
        )
    # Evaluation still works: it runs elsewhere, with the ground truth the worker never had.


#: Agent code reaching for this integration's source (the evaluator's plumbing): by path, by
#: listing, through its own modules' ``__file__``, by import. Each must fail.
SOURCE_PROBES = {
    "read": "import pathlib\nprint(pathlib.Path({dir!r} + '/episode.py').read_text()[:80])",
    "list": "import os\nprint(sorted(e.name for e in os.scandir({dir!r})))",
    "own_file": "import pathlib\nprint(pathlib.Path(__import__('sage_rl_appworld_episode').__file__).read_text()[:80])",
    "exec_module": (
        "u = __import__('importlib.util', fromlist=['util'])\n"
        "spec = u.spec_from_file_location('aw_env', {dir!r} + '/synthetic.py')\n"
        "spec.loader.exec_module(u.module_from_spec(spec))\nprint('imported')"
    ),
    "import": "m = __import__('sage_rl.integrations.appworld.synthetic')\nprint('imported')",
    "import_path": "__import__('sys').path.insert(0, {dir!r})\n__import__('synthetic')\nprint('imported')",
}


async def _source_probe(suite: AppWorldSuite) -> dict:
    from sage_rl.integrations.appworld import env as env_module

    source = str(Path(env_module.__file__).resolve().parent)
    env = await suite.open()
    try:
        await env.reset(suite.split("train")[0])
        out = {k: await env.execute(code.format(dir=source)) for k, code in SOURCE_PROBES.items()}
        await env.execute("apis.supervisor.complete_task(answer=42)")
        out["eval"] = await env.evaluate()
        return out
    finally:
        await env.close()


def test_agent_code_cannot_read_or_import_the_integrations_source_and_evaluation_still_works(
    suite: AppWorldSuite,
) -> None:
    """Only the evaluator (no agent code) reads ``sage_rl/integrations/appworld/``."""
    out = asyncio.run(_source_probe(suite))
    for probe in SOURCE_PROBES:
        result = out[probe]
        assert not result.ok, (probe, result.observation)
        assert re.search(r"PermissionError|ModuleNotFoundError", result.observation), (probe, result)
        assert "imported" not in result.observation and "from __future__" not in result.observation
    assert out["eval"].success


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
        out["dead_pids"] = [p for p in out["pids"][:-1] if alive(p)]
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
        assert not alive(out["group"])  # the episode's own processes were stopped
    finally:
        stranger.kill()
        stranger.wait()


async def _failures(world: AppWorldPaths) -> dict:
    suite = AppWorldSuite(config_for(world))
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
    assert not alive(out["pid"]) and not alive(out["zygote"])
    assert not (world.root / "experiments").exists()


def test_reset_refuses_a_sandbox_that_leaves_the_task_data_readable(world: AppWorldPaths) -> None:
    """The worker checks the one thing its layers must do: with reads left open (and root kept),
    agent code could read every answer, so the reset fails and says so."""
    from sage_rl.integrations.appworld.config import AppWorldLimits

    limits = AppWorldLimits(restrict_reads=False, drop_user="")

    async def reset() -> str:
        suite = AppWorldSuite(config_for(world, limits=limits))
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
