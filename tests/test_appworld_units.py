"""AppWorld adapter pieces that need neither the AppWorld venv nor its data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.integrations.appworld.env import AppWorldSuite
from sage_rl.integrations.appworld.installer import install_bundle, sha256_of
from sage_rl.integrations.appworld.paths import AppWorldPaths, SetupError, appworld_data_status
from sage_rl.integrations.appworld.tasks import load_split, parse_task_id, sample_chain


def _fake_venv(tmp: Path) -> Path:
    """A folder that passes ``venv_status``: bin/python and the decrypted supervisor app."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    apps = venv / "lib" / "python3.11" / "site-packages" / "appworld" / "apps" / "supervisor"
    apps.mkdir(parents=True)
    (apps / "apis.py").write_text("")
    return venv


def _write_data(root: Path, splits: dict[str, list[str]]) -> None:
    data = root / "data"
    (data / "api_docs").mkdir(parents=True)
    (data / "datasets").mkdir()
    for split, ids in splits.items():
        (data / "datasets" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        for tid in ids:
            tid = tid.split(":")[0]
            folder = data / "tasks" / tid
            (folder / "ground_truth").mkdir(parents=True)
            specs = {
                "instruction": f"do {tid}",
                "supervisor": {"first_name": "Ada"},
                "datetime": "2023-05-18T12:00:00",
            }
            (folder / "specs.json").write_text(json.dumps(specs))
            (folder / "ground_truth" / "metadata.json").write_text(json.dumps({"difficulty": 2}))


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
    from sage_rl.integrations.appworld.prompts import prompt_builder, task_messages
    from sage_rl.types import Task

    builder = prompt_builder(use_skills=True, max_steps=12)
    queue = Task("q_1", "q", 1, "Play my queue.", "dev", env="appworld")
    system, user = builder.messages(queue, library="def play(q):\n    ...")
    assert "apis.api_docs.show_app_descriptions()" in system["content"]
    assert "apis.supervisor.complete_task" in system["content"] and "at most 12 steps" in system["content"]
    assert "# Skills" in system["content"]
    assert "def play(q)" in user["content"] and user["content"].endswith("Play my queue.")
    assert "supervisor is" not in user["content"]  # no supervisor given: the line is left out

    task = Task(
        "abc_1",
        "abc",
        1,
        "Play my queue.",
        "dev",
        env="appworld",
        spec={
            "supervisor": {"first_name": "Ada", "last_name": "L", "email": "a@x.org", "phone_number": "555"}
        },
    )
    _, user2 = task_messages(prompt_builder(use_skills=False), task)
    assert "Your supervisor is Ada L (email a@x.org, phone 555)." in user2["content"]
    assert "# Skill library" not in user2["content"]


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
