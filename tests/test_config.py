import pytest
from pydantic import ValidationError

from sage_rl.config import ConfigError, Section, apply_overrides, load_config


class Inner(Section):
    lr: float = 1e-6
    steps: int = 10


class Outer(Section):
    name: str = "run"
    train: Inner = Inner()
    tags: list[str] = []


def test_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: a\ntrain:\n  steps: 3\n")
    cfg = load_config(Outer, p, ["train.lr=0.5", "tags=[x, y]"])
    assert (cfg.name, cfg.train.steps, cfg.train.lr, cfg.tags) == ("a", 3, 0.5, ["x", "y"])


def test_unknown_key_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.lrr: unknown key"):
        load_config(Outer, None, ["train.lrr=1"])


def test_bad_type_names_field_and_value():
    with pytest.raises(ConfigError, match=r"train\.steps: .*got 'many'"):
        load_config(Outer, None, ["train.steps=many"])


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Outer, bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(Outer, lst)
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(Outer, None, ["nonsense"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_configs_are_frozen():
    cfg = load_config(Outer)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.name = "other"


def test_extends_merges_parent_first(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\ntrain:\n  lr: 0.1\n  steps: 5\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ntrain:\n  steps: 7\n")
    cfg = load_config(Outer, tmp_path / "child.yaml")
    assert (cfg.name, cfg.train.lr, cfg.train.steps) == ("base", 0.1, 7)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(Outer, tmp_path / "loop.yaml")


# -- bounds at load (issue 11): the bad value is named before any model is loaded ----------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_size=0", r"rollout\.group_size: .*greater than or equal to 1 \(got 0\)"),
        ("rollout.group_size=1", r"rollout\.group_size=1: GRPO compares the chains of a group"),
        ("rollout.chain_length=0", r"rollout\.chain_length: .*greater than or equal to 1"),
        ("rollout.chain_length=-3", r"rollout\.chain_length: .*\(got -3\)"),
        ("rollout.groups_per_step=-1", r"rollout\.groups_per_step: .*\(got -1\)"),
        ("trainer.lr=.inf", r"trainer\.lr: Input should be a finite number \(got inf\)"),
        ("trainer.lr=0", r"trainer\.lr: .*greater than 0"),
        ("sampling.temperature=.nan", r"sampling\.temperature: Input should be a finite number"),
        ("sampling.top_p=0", r"sampling\.top_p: .*greater than 0"),
        ("sampling.temperature=0", r"sampling\.temperature=0: RL trains the distribution"),
        ("agent.max_steps=0", r"agent\.max_steps: .*greater than or equal to 1"),
        (
            "rollout.split=trian",
            r"rollout\.split='trian' is not a split of pocketworld; choose from train, dev",
        ),
        ("eval.split=devv", r"eval\.split='devv' is not a split of pocketworld"),
        ("eval.scenarios=0", r"eval\.scenarios: .*greater than or equal to 1"),
    ],
)
def test_train_config_bounds_name_the_bad_value(override, message):
    from sage_rl.settings import TrainConfig

    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, "configs/quickstart.yaml", [override])


@pytest.mark.parametrize("command", ["eval", "collect"])
def test_split_typos_fail_at_load_for_every_command(command):
    from sage_rl.settings import CollectConfig, EvalRunConfig

    model = {"eval": EvalRunConfig, "collect": CollectConfig}[command]
    with pytest.raises(ConfigError, match=r"split='trian' is not a split of pocketworld"):
        load_config(model, None, ["split=trian"])
    with pytest.raises(ConfigError, match=r"split='trian' is not a split of appworld"):
        load_config(model, None, ["env=appworld", "policy.kind=openai", "split=trian"])
    assert load_config(model, None, ["split=test_normal"]).split == "test_normal"


def test_a_split_typo_stops_train_before_the_model_loads(tmp_path):
    """Through the real command: exit 2 with the sentence, in seconds (no model, no evaluation)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "sage_rl.cli", "train", "rollout.split=trian", f"out_dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "rollout.split='trian' is not a split" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_appworld_refuses_the_scripted_expert_and_training_on_test_splits_at_load():
    from sage_rl.settings import CollectConfig, EvalRunConfig, TrainConfig

    with pytest.raises(ConfigError, match=r"policy\.kind=scripted is PocketWorld's scripted expert"):
        load_config(EvalRunConfig, None, ["env=appworld", "policy.kind=scripted"])
    for model, key in ((TrainConfig, "rollout.split"), (CollectConfig, "split")):
        extra = ["policy.kind=openai"] if model is CollectConfig else []
        with pytest.raises(ConfigError, match=r"split=test_normal is one of AppWorld's test splits"):
            load_config(model, None, ["env=appworld", f"{key}=test_normal", *extra])
        flag = "appworld.allow_test_contamination=true"
        assert load_config(model, None, ["env=appworld", f"{key}=test_normal", flag, *extra])
    assert load_config(EvalRunConfig, None, ["env=appworld", "split=test_normal"]).split == "test_normal"


class Lists(Section):
    names: list[str] = []
    maybe: list[int] | None = None
    either: list[str] | str = "all-linear"


def test_one_value_for_a_list_field_is_a_one_item_list(tmp_path):
    cfg = load_config(Lists, None, ["names=all", "maybe=3", "either=q"])
    assert (cfg.names, cfg.maybe, cfg.either) == (["all"], [3], "q")  # a union keeps its scalar
    p = tmp_path / "c.yaml"
    p.write_text("names: x\n")
    assert load_config(Lists, p).names == ["x"]
    assert load_config(Lists, None, ["names=[a, b]", "maybe=null"]).maybe is None


def test_strategies_all_is_every_retrieval_strategy():
    from sage_rl.settings import EvalRunConfig
    from sage_rl.skills.retrieval import STRATEGIES

    for form in ("strategies=all", "strategies=[all]"):
        assert load_config(EvalRunConfig, None, [form]).strategies == list(STRATEGIES)
    assert load_config(EvalRunConfig, None, ["strategies=bm25"]).strategies == ["bm25"]
    with pytest.raises(ConfigError, match="unknown retrieval strategy 'telepathy'"):
        load_config(EvalRunConfig, None, ["strategies=telepathy"])
