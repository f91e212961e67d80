"""The fixtures of test_docs_commands.py: one tiny model, a few small run folders, the stand-ins.

Each is built once per test run and shared by the xdist workers (``_shared``, under a file lock).
test_docs_commands.py imports them by name, as conftest.py does AppWorld's.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_server import run_cli
from doc_commands import ROOT
from fakes import FakeServer, chat_reply

AGENT = ["agent.max_steps=2", "agent.max_tokens_per_turn=12", "agent.context_limit=4096"]
REPLY = "```python\napis.supervisor.complete_task()\n```"  # the stand-in server's every answer
APPWORLD_SPEC = {  # AppWorld's synthetic world, with every split the docs name
    split: [{"task_id": f"{s}_{i}", "instruction": f"Answer {i}.", "answer": i} for i in (1, 2, 3)]
    for split, s in (("train", "aaa"), ("dev", "bbb"), ("test_normal", "ccc"), ("test_challenge", "ddd"))
}


def _shared(
    factory: pytest.TempPathFactory, worker_id: str, name: str, build: Callable[[Path], None]
) -> Path:
    """``build(folder)`` once per test run, shared by the xdist workers (under a file lock)."""
    base = factory.getbasetemp() if worker_id == "master" else factory.getbasetemp().parent
    folder = base / f"docs-{name}"
    with (base / f"docs-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            (folder / ".built").write_text("ok")
    return folder


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path,
            "OPENAI_API_KEY": "sk-smoke", **(extra or {})}  # fmt: skip


def sage_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m sage_rl.cli *args`` in ``cwd``, forked from a process that has imported torch,
    transformers and the commands (cli_server.py)."""
    return run_cli(args, cwd, _env(env), timeout=300)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


class Fixtures:
    """What the smoke forms point at, each built on first use."""

    def __init__(self, request: pytest.FixtureRequest, tmp: Path) -> None:
        self.request, self.tmp = request, tmp

    def __getattr__(self, name: str):
        return self.request.getfixturevalue(f"docs_{name}")


@pytest.fixture(scope="session")
def docs_tiny(tiny, tmp_path_factory, worker_id) -> Path:
    from sage_rl.models import save_plain

    def build(d: Path) -> None:
        save_plain(tiny[0], d)
        tiny[1].save_pretrained(d)

    return _shared(tmp_path_factory, worker_id, "tiny", build)


@pytest.fixture(scope="session")
def docs_openai() -> str:
    """A loopback OpenAI-compatible server answering every request with ``REPLY``."""
    server = FakeServer(lambda path, body, headers: (200, chat_reply(REPLY), {}, 0.0))
    yield server.url
    server.close()


@pytest.fixture(scope="session")
def docs_train_run(docs_tiny, tmp_path_factory, worker_id) -> Path:
    # the settings of the smoke form of `sage-rl train --resume` (test_docs_commands._overrides) less its
    # `steps=2`: a resume continues a run under its own settings (train/same_run.py)
    args = ["train", str(ROOT / "configs" / "quickstart.yaml"), f"policy.model={docs_tiny}", "init_from=null",
            "steps=1", "rollout.group_size=2", "rollout.groups_per_step=1", "eval.scenarios=1", *AGENT]  # fmt: skip
    return _shared(
        tmp_path_factory, worker_id, "train-run", lambda d: _ok(sage_cli([*args, f"out_dir={d}"], d))
    )


@pytest.fixture(scope="session")
def docs_eval_run(tmp_path_factory, worker_id) -> Path:
    args = ["eval", "policy.kind=scripted", "limit_scenarios=1"]
    return _shared(
        tmp_path_factory, worker_id, "eval-run", lambda d: _ok(sage_cli([*args, f"out_dir={d}"], d))
    )


@pytest.fixture(scope="session")
def docs_sft_data(tmp_path_factory, worker_id) -> Path:
    args = ["collect", "num_scenarios=1", "formats=jsonl"]
    folder = _shared(
        tmp_path_factory, worker_id, "expert", lambda d: _ok(sage_cli([*args, f"out_dir={d}"], d))
    )
    return folder / "sage_expert.jsonl"


@pytest.fixture(scope="session")
def docs_skill_store(tmp_path_factory, worker_id) -> Path:
    from sage_rl.skills.record import make_skill
    from sage_rl.skills.store import SkillStore

    def build(d: Path) -> None:
        with SkillStore(d / "skills.db") as store:
            store.put(
                make_skill(
                    'def me() -> dict:\n    """My profile."""\n    return apis.supervisor.show_profile()\n'
                )
            )

    return _shared(tmp_path_factory, worker_id, "skills", build) / "skills.db"


@pytest.fixture(scope="session")
def docs_appworld(tmp_path_factory, worker_id) -> Path:
    """AppWorld's synthetic world (root) and its data bundle, ``bundle`` beside ``data``."""
    from sage_rl.integrations.appworld.paths import AppWorldPaths, default_paths, venv_status
    from sage_rl.integrations.appworld.synthetic_world import build_world, pack_bundle

    if os.environ.get("SAGE_RL_SKIP_APPWORLD") == "1":
        pytest.skip("SAGE_RL_SKIP_APPWORLD=1")
    venv = default_paths().venv
    ok, msg = venv_status(default_paths())
    assert ok, f"{msg}. Run scripts/setup_appworld.sh, or set SAGE_RL_SKIP_APPWORLD=1 to skip."

    def build(d: Path) -> None:
        paths = AppWorldPaths(venv=venv, root=d)
        build_world(paths, APPWORLD_SPEC)
        pack_bundle(paths, d / "bundle")

    return _shared(tmp_path_factory, worker_id, "appworld", build)


@pytest.fixture(scope="session")
def docs_appworld_run(docs_appworld, docs_openai, tmp_path_factory, worker_id) -> Path:
    """A run folder of `sage-rl eval configs/appworld_eval.yaml`, against the stand-ins."""
    args = [
        "eval",
        "configs/appworld_eval.yaml",
        f"policy.base_url={docs_openai}",
        "limit_scenarios=1",
        *AGENT,
    ]
    env = {"SAGE_RL_APPWORLD_ROOT": str(docs_appworld)}

    def build(d: Path) -> None:
        (d / "configs").symlink_to(ROOT / "configs")
        _ok(sage_cli([*args, f"out_dir={d / 'run'}"], d, env))

    return _shared(tmp_path_factory, worker_id, "appworld-run", build) / "run"
