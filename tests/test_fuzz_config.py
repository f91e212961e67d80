"""A property-based fuzz (hypothesis) of config loading: whatever a config file or an override
holds, ``load_config`` returns a config or raises ``ConfigError`` (one message naming what is
wrong), never another exception. Before it, a 5,000-digit integer (Python's int-to-str limit) or
a date like ``2024-13-45`` in YAML raised a bare ``ValueError`` out of the YAML constructors."""

from __future__ import annotations

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from sage_rl.config import ConfigError, load_config
from sage_rl.settings import TrainConfig

FUZZ = fuzz(150)


def _keys(data, prefix=()):
    for k, v in data.items():
        yield ".".join((*prefix, k))
        if isinstance(v, dict):
            yield from _keys(v, (*prefix, k))


#: Every key of the default config (``trainer.lr``, ``rollout.pool`` ...), and some that are not.
KEYS = sorted(_keys(TrainConfig().model_dump(mode="json"))) + ["x", "agent.x", "steps.x", "a..b", ".", " "]
SCALARS = st.sampled_from([
    "1", "-1", "0", "1e5000", "-1e5000", ".nan", ".inf", "9" * 5000, "2024-13-45", "2024-02-30", "0x1F",
    "0o17", "1_000", "true", "null", "~", "''", "[]", "{}", "[1, 2]", "{a: 1}", "&a [*a]", "!!python/tuple [1]",
    "!!binary aGk=", "!!float x", "!!int x", "!!timestamp x", "'\\x00'", "\"\\ud800\"", "- a", "a: b: c",
    "[" * 60 + "]" * 60, "{{", "'", "%YAML 1.1\n---\n1", "? a\n: b", "*b", "|\n  x", "!!set {a}",
])  # fmt: skip
VALUES = SCALARS | st.text(max_size=12)
OVERRIDES = st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=8), VALUES), max_size=4)


def _load(path=None, overrides=()):
    try:
        load_config(TrainConfig, path, overrides)
    except ConfigError as e:
        assert str(e).strip()


@FUZZ
@given(overrides=OVERRIDES)
def test_any_override_loads_or_is_a_config_error(overrides):
    _load(overrides=[f"{k}={v}" for k, v in overrides])


@FUZZ
@given(sections=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=5), raw=st.binary(max_size=40))
def test_any_config_file_loads_or_is_a_config_error(tmp_path, sections, raw):
    path = tmp_path / "c.yaml"
    text = "".join(f"{k}: {v}\n" if "\n" not in v else f"{k}:\n  {v}\n" for k, v in sections)
    path.write_bytes(text.encode("utf-8", "surrogatepass") + raw)
    _load(path)


@pytest.mark.parametrize("value", ["9" * 5000, "2024-13-45"])
def test_a_value_yaml_cannot_build_is_a_config_error_naming_the_override(value):
    with pytest.raises(ConfigError, match="cannot build"):
        load_config(TrainConfig, None, [f"steps={value}"])


def test_the_keys_are_the_configs():
    assert {"trainer.lr", "rollout.reward", "skills.credit", "agent.max_steps"} <= set(KEYS)
