"""The AppWorld test world and fixtures, shared by tests/test_appworld*.py (registered in
conftest.py, so the session's one synthetic world and one suite are built once).

Needs the AppWorld virtualenv made by ``scripts/setup_appworld.sh`` (``sage-rl appworld setup``).
Fails (does not skip) when it is missing, unless ``SAGE_RL_SKIP_APPWORLD=1``. No task data is
needed: the world is synthetic (see ``sage_rl/integrations/appworld/synthetic.py``).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

import pytest

from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldSuite
from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths, venv_status
from sage_rl.integrations.appworld.synthetic_world import DEFAULT_SPEC, build_world

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


def config_for(world: AppWorldPaths, **kw: object) -> AppWorldEnvConfig:
    return AppWorldEnvConfig(venv=str(world.venv), root=str(world.root), **kw)


@pytest.fixture(scope="session")
def suite(world: AppWorldPaths):
    """One suite (one AppWorld zygote) for the environment tests; short cell limits. A secret sits
    in this process's environment while the zygote starts."""
    os.environ["SAGE_RL_TEST_SECRET"] = SECRET
    s = AppWorldSuite(config_for(world, cell_timeout_s=2, kill_grace_s=2))
    s._factory.zygote()  # started now, with the secret in this process's environment
    yield s
    asyncio.run(s.close())
    os.environ.pop("SAGE_RL_TEST_SECRET", None)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"
