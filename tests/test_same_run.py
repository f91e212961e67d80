"""A resumed training run keeps the settings its folder was trained with (``train/same_run.py``),
and a recipe reads a finished arm back only at the lengths it was trained to."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sage_rl.config import dump_config, load_config, settings_diff
from sage_rl.recipe.pipeline import RecipeError, train_once
from sage_rl.settings import TrainConfig
from sage_rl.train.checkpoint import CheckpointError
from sage_rl.train.same_run import SettingsChanged, changed, check_same_run

ROOT = Path(__file__).resolve().parents[1]


def _cfg(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, ROOT / "configs/quickstart.yaml", list(overrides))


def test_settings_diff_names_dotted_keys_and_skips_one_sided_ones():
    saved = {"a": 1, "s": {"x": 1, "y": {"z": 2}, "old": 5}, "gone": 3}
    now = {"a": 1, "s": {"x": 2, "y": {"z": 3}, "new": 6}, "added": 4}
    assert settings_diff(saved, now) == [("s.x", 1, 2), ("s.y.z", 2, 3)]
    assert settings_diff(saved, saved) == []


def test_what_a_resume_may_change_and_what_it_may_not(tmp_path):
    sft = tmp_path / "sft"
    sft.mkdir()
    (tmp_path / "linked").symlink_to(sft, target_is_directory=True)
    saved = _cfg(f"init_from={sft}", "trainer.lr=1e-5").model_dump(mode="json")
    # how long it goes on, where it saves, how fast it samples, how often the curve is drawn, what it measures
    longer = _cfg(
        f"init_from={tmp_path / 'linked'}", "trainer.lr=1e-5", "steps=99", "sampled_token_budget=800000",
        "out_dir=/elsewhere", "checkpoint_every=3", "policy.threads=1", "policy.max_batch=4",
        "rollout.concurrency=3", "eval.every=5", "trainer.noise_scale=true",
    ).model_dump(mode="json")  # fmt: skip
    assert changed(saved, longer) == []
    other = _cfg(f"init_from={tmp_path}", "trainer.lr=5e-5", "rollout.screen_confirm=2", "seed=7")
    assert changed(saved, other.model_dump(mode="json")) == [
        ("init_from", str(tmp_path / "sft"), str(tmp_path)),
        ("rollout.screen_confirm", 0, 2),
        ("seed", 0, 7),
        ("trainer.lr", 1e-5, 5e-5),
    ]
    del saved["rollout"]["screen_confirm"]  # a run begun before the setting existed
    assert changed(saved, _cfg(f"init_from={sft}", "trainer.lr=1e-5", "rollout.screen_confirm=2").model_dump(mode="json")) == []


def test_check_same_run_refuses_and_names_a_damaged_config(tmp_path):
    config = tmp_path / "config.yaml"
    check_same_run(config, _cfg())  # no run yet: nothing to compare
    config.write_text(dump_config(_cfg("rollout.reward=outcome")))
    with pytest.raises(SettingsChanged, match=r"rollout.reward: 'outcome' -> 'skill_integrated'"):
        check_same_run(config, _cfg())
    assert issubclass(SettingsChanged, CheckpointError)  # the commands' one-line errors
    config.write_text("rollout: [unclosed")
    with pytest.raises(SettingsChanged, match="config.yaml: the run's settings cannot be read"):
        check_same_run(config, _cfg())
    config.write_text("- a list")
    with pytest.raises(SettingsChanged, match="must hold a mapping"):
        check_same_run(config, _cfg())
    config.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)))
    with pytest.raises(SettingsChanged, match="cannot be read"):  # an alias bomb: 10^9 values, refused unexpanded
        check_same_run(config, _cfg())


def test_train_resume_with_other_settings_is_one_line_and_changes_nothing(tmp_path):
    """The check comes before any model loads, and the folder keeps its config.yaml."""
    out = tmp_path / "run"
    out.mkdir()
    config = out / "config.yaml"
    config.write_text(dump_config(_cfg(f"out_dir={out}", "init_from=null", "trainer.lr=1e-5")))
    before = config.read_bytes()
    cmd = [sys.executable, "-m", "sage_rl.cli", "train", "configs/quickstart.yaml", f"out_dir={out}",
           "init_from=null", "trainer.lr=5e-5", "--resume"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "trainer.lr: 1e-05 -> 5e-05" in r.stderr and "nothing was changed" in r.stderr
    assert config.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["config.yaml"]


def test_a_finished_arm_is_read_back_only_at_its_own_lengths(tmp_path):
    """Arms are compared at one sampled-token budget: a finished one is not reported under another."""
    out = tmp_path / "sage"
    out.mkdir()
    cfg = _cfg(f"out_dir={out}", "init_from=null", "sampled_token_budget=400000")
    (out / "config.yaml").write_text(dump_config(cfg))
    (out / "summary.json").write_text('{"steps": 13, "sampled_tokens": 420206}')
    assert train_once(cfg) == {"steps": 13, "sampled_tokens": 420206}  # read back, nothing trained
    longer = cfg.model_copy(update={"sampled_token_budget": 800000})
    with pytest.raises(RecipeError, match="sampled_token_budget: 400000 -> 800000"):
        train_once(longer)
    with pytest.raises(SettingsChanged, match=r"trainer.lr"):
        train_once(cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"lr": 5e-5})}))
