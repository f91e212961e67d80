"""AppWorld adapter pieces that need neither the AppWorld venv nor its data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from sage_rl.integrations.appworld.client import zygote_env
from sage_rl.integrations.appworld.config import AppWorldEnvConfig, check_policy
from sage_rl.integrations.appworld.connection import WorkerError, WorkerTimeout
from sage_rl.integrations.appworld.env import AppWorldSuite
from sage_rl.integrations.appworld.installer import install_bundle, sha256_of
from sage_rl.integrations.appworld.outputs import experiments, start_recording
from sage_rl.integrations.appworld.paths import AppWorldPaths, SetupError, appworld_data_status
from sage_rl.integrations.appworld.tasks import (
    filter_tasks,
    load_split,
    parse_task_id,
    sample_chain,
    task_context,
)


def _fake_venv(tmp: Path) -> Path:
    """A folder that passes ``venv_status``: bin/python and the decrypted supervisor app."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    apps = venv / "lib" / "python3.11" / "site-packages" / "appworld" / "apps" / "supervisor"
    apps.mkdir(parents=True)
    (apps / "apis.py").write_text("")
    return venv


def _write_data(root: Path, splits: dict[str, list[str]], difficulty: dict[str, int] | None = None) -> None:
    """Task folders for ``splits``; every task has difficulty 2 unless ``difficulty`` says."""
    data = root / "data"
    (data / "api_docs").mkdir(parents=True, exist_ok=True)
    (data / "datasets").mkdir(exist_ok=True)
    for split, ids in splits.items():
        (data / "datasets" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for tid in ids:
            tid = tid.split(":")[0]
            folder = data / "tasks" / tid
            (folder / "ground_truth").mkdir(parents=True, exist_ok=True)
            specs = {
                "instruction": f"do {tid}",
                "supervisor": {"first_name": "Ada"},
                "datetime": "2023-05-18T12:00:00",
            }
            (folder / "specs.json").write_text(json.dumps(specs))
            level = (difficulty or {}).get(tid, 2)
            (folder / "ground_truth" / "metadata.json").write_text(json.dumps({"difficulty": level}))


def test_parse_task_id() -> None:
    assert parse_task_id("50e1ac9_3") == ("50e1ac9", 3)
    assert parse_task_id("50e1ac9_3:tagged") == ("50e1ac9", 3)
    with pytest.raises(ValueError, match="<scenario>_<n>"):
        parse_task_id("50e1ac9")


def test_split_is_grouped_by_scenario_then_position(tmp_path: Path) -> None:
    # File order interleaves scenarios and positions; the split must come back grouped.
    _write_data(tmp_path, {"dev": ["bbb_2", "aaa_1", "bbb_1:hard", "aaa_3", "aaa_2"]})
    tasks = load_split(tmp_path / "data", "dev")
    assert [t.task_id for t in tasks] == ["bbb_1", "bbb_2", "aaa_1", "aaa_2", "aaa_3"]
    assert {(t.scenario_id, t.position) for t in tasks} >= {("bbb", 1), ("aaa", 3)}
    assert all(t.env == "appworld" and t.difficulty == 2 and t.split == "dev" for t in tasks)
    assert tasks[0].instruction == "do bbb_1" and tasks[0].spec["supervisor"] == {"first_name": "Ada"}


def test_sample_chain_keeps_one_scenario_in_order(tmp_path: Path) -> None:
    _write_data(tmp_path, {"train": ["aaa_1", "aaa_2", "aaa_3", "bbb_1"]})
    tasks = load_split(tmp_path / "data", "train")
    rng = random.Random(0)
    for _ in range(20):
        chain = sample_chain(tasks, rng, 2)
        # Only scenario aaa has two tasks.
        assert [t.scenario_id for t in chain] == ["aaa", "aaa"]
        assert chain[0].position < chain[1].position
    with pytest.raises(ValueError, match="no scenario has 4 tasks"):
        sample_chain(tasks, rng, 4)


def test_missing_venv_and_missing_data_say_how_to_install(tmp_path: Path) -> None:
    no_venv = AppWorldPaths(venv=tmp_path / "nowhere", root=tmp_path / "root")
    ok, msg = appworld_data_status(no_venv)
    assert not ok and "virtualenv not found" in msg and "sage-rl appworld setup" in msg and "\n" not in msg

    venv = _fake_venv(tmp_path)
    ok, msg = appworld_data_status(AppWorldPaths(venv=venv, root=tmp_path / "root"))
    assert not ok and "data not found" in msg and "--bundle" in msg and "\n" not in msg

    config = AppWorldEnvConfig(venv=str(venv), root=str(tmp_path / "root"))
    with pytest.raises(SetupError, match="sage-rl appworld setup") as e:
        AppWorldSuite(config)
    assert "\n" not in str(e.value)


def test_suite_from_installed_data(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path)
    _write_data(tmp_path / "root", {"train": ["aaa_1", "aaa_2"], "dev": ["ccc_1"]})
    suite = AppWorldSuite(AppWorldEnvConfig(venv=str(venv), root=str(tmp_path / "root")))
    assert suite.name == "appworld"
    assert [t.task_id for t in suite.split("train")] == ["aaa_1", "aaa_2"]
    assert [t.task_id for t in suite.sample_chain(random.Random(1), 2)] == ["aaa_1", "aaa_2"]
    with pytest.raises(SetupError, match="split 'test_normal' not found"):
        suite.split("test_normal")


def test_bundle_with_wrong_sha256_is_refused_before_unpacking(tmp_path: Path) -> None:
    bundle = tmp_path / "data-0.1.0.bundle"
    bundle.write_bytes(b"not the real bundle")
    paths = AppWorldPaths(venv=tmp_path / "venv", root=tmp_path / "root")
    lines: list[str] = []
    with pytest.raises(SetupError, match="sha256") as e:
        install_bundle(paths, bundle, lines.append)
    assert sha256_of(bundle) in str(e.value)
    assert not paths.data.exists() and lines == []
    with pytest.raises(SetupError, match="not found"):
        install_bundle(paths, tmp_path / "missing.bundle", lines.append)


def test_sha256_of_matches_hashlib_on_known_input(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_bytes(b"abc")
    # sha256("abc") from FIPS 180-2, appendix B.1.
    assert sha256_of(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_appworld_prompts_render_with_the_agents_builder_and_name_the_supervisor() -> None:
    from sage_rl.integrations.appworld.prompts import prompt_builder
    from sage_rl.integrations.appworld.tasks import task_context
    from sage_rl.types import Task

    builder = prompt_builder(use_skills=True, max_steps=12)
    queue = Task("q_1", "q", 1, "Play my queue.", "dev", env="appworld")
    system, user = builder.messages(queue, library="def play(q):\n    ...")
    assert "apis.api_docs.show_app_descriptions()" in system["content"]
    assert "apis.supervisor.complete_task" in system["content"] and "at most 12 steps" in system["content"]
    assert "# Skills" in system["content"]
    assert "def play(q)" in user["content"] and user["content"].endswith("Play my queue.")
    assert "supervisor" not in user["content"] and "About this task" not in user["content"]  # none given

    spec = {
        "supervisor": {"first_name": "Ada", "last_name": "L", "email": "a@x.org", "phone_number": "555"},
        "datetime": "2023-05-18T12:00:00",
    }
    task = Task("abc_1", "abc", 1, "Play my queue.", "dev", env="appworld", context=task_context(spec))
    _, user2 = prompt_builder(use_skills=False).messages(task)
    assert (
        'Your supervisor, the "I" and "me" of the task, is Ada L (email a@x.org, phone 555).'
        in user2["content"]
    )
    assert "it is now Thursday, 2023-05-18, 12:00." in user2["content"]  # 18 May 2023 was a Thursday
    assert "# Skill library" not in user2["content"] and user2["content"].endswith(
        "# Your task\nPlay my queue."
    )


@pytest.mark.parametrize("name", ["appworld_eval", "appworld_collect"])
def test_appworld_configs_validate_against_the_commands_schemas(name: str) -> None:
    from sage_rl.config import load_config
    from sage_rl.settings import CollectConfig, EvalRunConfig

    model = EvalRunConfig if name == "appworld_eval" else CollectConfig
    cfg = load_config(model, Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml")
    assert cfg.env == "appworld" and cfg.policy.kind == "openai"
    assert cfg.split in ("dev", "train")  # test splits only for final numbers, by override
    assert (cfg.agent.max_steps, cfg.agent.max_tokens_per_turn) == (40, 1500)  # the paper's limits


def test_appworld_templates_mirror_the_agents_template_files() -> None:
    from sage_rl.agent.prompts import DEFAULT_TEMPLATES
    from sage_rl.integrations.appworld.prompts import APPWORLD_PROMPTS

    names = {p.name for p in DEFAULT_TEMPLATES.glob("*.j2")}
    assert names and names == {p.name for p in APPWORLD_PROMPTS.glob("*.j2")}


def test_task_context_is_what_appworlds_protocol_tells_the_agent(tmp_path: Path) -> None:
    spec = {
        "supervisor": {
            "first_name": "Ada",
            "last_name": "Lovelace",
            "email": "a@x.org",
            "phone_number": "555",
        },
        "datetime": "2023-05-18T12:00:00",
    }
    assert task_context(spec) == {
        "supervisor": "Ada Lovelace (email a@x.org, phone 555)",
        "date": "Thursday, 2023-05-18, 12:00",
    }
    assert task_context({"supervisor": {"first_name": "Ada"}, "datetime": "soon"}) == {
        "supervisor": "Ada",
        "date": "soon",
    }
    assert task_context({}) == {}
    _write_data(tmp_path, {"dev": ["aaa_1"]})
    task = load_split(tmp_path / "data", "dev")[0]
    assert task.spec["supervisor"] == {"first_name": "Ada"} and task.spec["datetime"] == "2023-05-18T12:00:00"
    if hasattr(task, "context"):  # Task.context: what the agent's prompt builder renders
        assert task.context == {"supervisor": "Ada", "date": "Thursday, 2023-05-18, 12:00"}


def test_difficulty_and_tasks_per_scenario_filters_follow_appworld(tmp_path: Path) -> None:
    ids = ["aaa_1", "aaa_2", "aaa_3", "bbb_1", "bbb_2", "bbb_3", "ccc_1", "ccc_2"]
    _write_data(tmp_path, {"dev": ids}, difficulty={"bbb_1": 3, "bbb_2": 3, "bbb_3": 3})
    tasks = load_split(tmp_path / "data", "dev")

    def names(ts):
        return [t.task_id for t in ts]

    assert names(filter_tasks(tasks)) == ids
    assert names(filter_tasks(tasks, [3])) == ["bbb_1", "bbb_2", "bbb_3"]
    assert names(filter_tasks(tasks, [1])) == []
    assert names(filter_tasks(tasks, [], 1)) == ["aaa_1", "bbb_1", "ccc_1"]
    assert names(filter_tasks(tasks, [2], 2)) == ["aaa_1", "aaa_2", "ccc_1", "ccc_2"]
    with pytest.raises(SetupError, match=r"scenario ccc has tasks \[1, 2\], not \[1, 2, 3\]"):
        filter_tasks(tasks, [], 3)
    config = AppWorldEnvConfig(venv=str(_fake_venv(tmp_path)), root=str(tmp_path), difficulties=[3])
    assert names(AppWorldSuite(config).split("dev")) == ["bbb_1", "bbb_2", "bbb_3"]
    with pytest.raises(ValidationError):
        AppWorldEnvConfig(difficulties=[4])


def test_training_on_a_test_split_is_refused_unless_the_risk_is_accepted() -> None:
    config = AppWorldEnvConfig()
    for split in ("train", "dev"):
        config.check_training_split(split)
    for split in ("test_normal", "test_challenge"):
        with pytest.raises(ValueError, match="contaminates them") as e:
            config.check_training_split(split)
        assert "appworld.allow_test_contamination=true" in str(e.value) and "\n" not in str(e.value)
        AppWorldEnvConfig(allow_test_contamination=True).check_training_split(split)


def test_choosing_checkpoints_on_a_test_split_is_refused_as_training_on_it_is() -> None:
    """``sage-rl train ... eval.split=test_normal``: the periodic evaluation picks checkpoints,
    so it is tuning on test data; refused at load, in one line naming the field."""
    from sage_rl.config import ConfigError, load_config
    from sage_rl.settings import TrainConfig

    for split in ("test_normal", "test_challenge"):
        with pytest.raises(ConfigError, match=rf"eval\.split={split} is one of AppWorld's test splits") as e:
            load_config(TrainConfig, None, ["env=appworld", "policy.kind=openai", f"eval.split={split}"])
        line = next(x for x in str(e.value).splitlines() if f"eval.split={split} is" in x)
        assert "choosing checkpoints" in line and "appworld.allow_test_contamination=true" in line
        flag = "appworld.allow_test_contamination=true"
        cfg = load_config(
            TrainConfig, None, ["env=appworld", "policy.kind=openai", f"eval.split={split}", flag]
        )
        assert cfg.eval.split == split
    assert load_config(TrainConfig, None, ["env=appworld", "policy.kind=openai", "eval.split=dev"])


def test_the_scripted_policy_is_refused_on_appworld_in_one_sentence() -> None:
    with pytest.raises(SetupError, match="there is no AppWorld expert") as e:
        check_policy("scripted")
    assert "\n" not in str(e.value)
    for kind in ("openai", "transformers"):
        check_policy(kind)


def test_run_outputs_are_named_as_appworlds_leaderboard_expects(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        AppWorldEnvConfig(experiment="My Run")  # AppWorld's leaderboard: lowercase, no spaces
    data = tmp_path / "data"
    (data / "datasets").mkdir(parents=True)
    for split in ("train", "dev", "test_normal", "test_challenge"):
        (data / "datasets" / f"{split}.txt").write_text("")
    rec = start_recording(tmp_path / "run", data, "sage-rl", variant="Query N-gram")
    assert rec.root == (tmp_path / "run" / "appworld").resolve() and (rec.root / "data").resolve() == data
    assert rec.experiment("test_normal") == "sage-rl-query-n-gram_test_normal"
    again = start_recording(tmp_path / "run", data, "sage-rl")  # idempotent; no variant
    for split in ("test_normal", "dev"):
        (again.outputs / again.experiment(split) / "tasks").mkdir(parents=True)
    (rec.outputs / "stray" / "tasks").mkdir(parents=True)  # names no split: ignored
    assert experiments(rec.root) == [("sage-rl_dev", "dev"), ("sage-rl_test_normal", "test_normal")]


def test_the_bench_takes_a_world_root_and_names_what_is_missing_there(tmp_path: Path) -> None:
    """``sage-rl appworld bench --root PATH`` measures on an installed world (no synthetic build);
    a root without data stops in one line before anything starts."""
    from typer.testing import CliRunner

    from sage_rl.cli.appworld import app as appworld_cli
    from sage_rl.integrations.appworld.bench import ratio_table

    venv, root = _fake_venv(tmp_path), tmp_path / "no-data"
    result = CliRunner().invoke(appworld_cli, ["bench", "--root", str(root), "--venv", str(venv)])
    assert result.exit_code == 1, result.output
    assert "AppWorld data not found" in result.output and str(root) in result.output
    figures = {
        "execute_0_calls_s": 0.030, "evaluate_s": 0.060,
        "native": {"execute_0_calls_s": 0.015, "evaluate_s": 0.040},
        "ratio_over_native": {"execute_0_calls_s": 2.0, "evaluate_s": 1.5},
    }  # fmt: skip
    table = ratio_table(figures).splitlines()
    assert table[0].split() == ["figure", "sage-rl", "ms", "native", "ms", "ratio"]
    assert table[1].split() == ["execute_0_calls_s", "30.0", "15.0", "2.00"]
    assert table[2].split() == ["evaluate_s", "60.0", "40.0", "1.50"]


def test_the_idle_cell_is_compared_with_a_native_cell_after_the_same_idle_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sage-rl's idle cell (``execute_0_calls_ready_s``: sent ``IDLE_S`` after the previous answer)
    is compared with AppWorld's bare cell after the same gap, not with one run back to back (a CPU
    that idled runs the next cell about 2x slower, natively too); the wait itself is not timed."""
    from sage_rl.integrations.appworld import bench, native_bench

    assert bench.VERSUS_NATIVE["execute_0_calls_ready_s"] == "execute_0_calls_ready_s"
    assert bench.VERSUS_NATIVE["execute_0_calls_s"] == "execute_0_calls_s"
    clock, gaps, last_return = [100.0], [], [None]

    def sleep(s: float) -> None:
        clock[0] += s

    def cell() -> None:
        if last_return[0] is not None:
            gaps.append(clock[0] - last_return[0])
        clock[0] += 0.005 if len(gaps) % 2 else 0.003  # 3, 5, 3, 5, 3 ms
        last_return[0] = clock[0]

    monkeypatch.setattr(native_bench, "_now", lambda: clock[0])
    monkeypatch.setattr(native_bench.time, "sleep", sleep)
    median = native_bench._median_after_idle(cell, 5, 0.2)
    assert median == pytest.approx(0.003)
    assert gaps == pytest.approx([0.2] * 4)


def test_worker_errors_read_as_one_line_and_the_zygote_gets_no_parent_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = WorkerError("reset", "Exception: The database version of the task (0.0.1) is not compatible")
    assert (
        str(e)
        == "AppWorld reset failed: Exception: The database version of the task (0.0.1) is not compatible"
    )
    assert not WorkerTimeout("took too long", restored=False).restored
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env = zygote_env(AppWorldPaths(venv=tmp_path / "v", root=tmp_path / "r"), tmp_path)
    assert "OPENAI_API_KEY" not in env and "sk-secret" not in env.values()
    assert env["APPWORLD_ROOT"] == str(tmp_path / "r")


SNAPSHOT_NICENESS_SCRIPT = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("snapshots", sys.argv[1])
snapshots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snapshots)
before = os.getpriority(os.PRIO_PROCESS, 0)
s = snapshots.Snapshots()
if s.take():  # a copy that took over (this script died): nothing to do
    os._exit(0)
old = s._pid
if s.take():
    os._exit(0)
fields = []
for _ in range(500):  # the discarded copy, told to exit, is a zombie until reaped
    with open(f"/proc/{old}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        break
    time.sleep(0.01)
s.discard()
print(fields[0], fields[16], os.getpriority(os.PRIO_PROCESS, 0) - before)
"""


def test_a_discarded_snapshot_exits_at_the_lowest_priority_not_taking_a_core_from_the_worker(
    tmp_path: Path,
) -> None:
    """Its exit unmaps a copy of the whole worker (as much CPU as the fork); at nice 0 it competes
    with the worker's next cell on a loaded machine. The worker itself keeps its priority."""
    import subprocess
    import sys

    import sage_rl.integrations.appworld as appworld

    script = Path(appworld.__file__).with_name("snapshots.py")
    out = subprocess.run(
        [sys.executable, "-c", SNAPSHOT_NICENESS_SCRIPT, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    state, nice, worker_change = out[0], int(out[1]), int(out[2])
    assert state == "Z"
    assert nice == 19
    assert worker_change == 0
