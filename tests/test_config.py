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
