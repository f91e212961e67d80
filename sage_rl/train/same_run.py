"""A resumed training run continues the run its folder holds, under the same settings, or is refused.

``sage-rl train --resume`` (and every stage of the recipes that resumes a training run) used to
overwrite the folder's ``config.yaml`` with whatever it was given, so a resume with another
learning rate, reward or pool mixed two runs in one folder and reported the second's settings for
both. Now the saved ``config.yaml`` is compared with the new config first; every difference is
named, and nothing is written.

What may differ on a resume (:data:`MAY_DIFFER`): how long the run goes on (``steps``,
``sampled_token_budget``: a finished run can be extended, the learning rate after warm-up being
constant), where and how often it saves and logs, how fast it samples (the policy's threads, rows
and cache, chains in flight), how often the greedy curve is drawn, and whether each step's gradient
noise scale is measured (``trainer.noise_scale``: the same gradient, summed group by group). ``init_from`` is compared as
the folder it resolves to, where it exists (a run linked into another folder starts from the same model). A key that
only one side has (a setting added to the code since the run began) is not compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sage_rl.config import ConfigError, describe_diff, read_yaml, settings_diff
from sage_rl.eval.resume import POLICY_OPERATIONAL, located
from sage_rl.train.checkpoint import CheckpointError

#: Top-level keys, and keys of sections, that a resumed run may change.
MAY_DIFFER: dict[str, Any] = {
    "out_dir": True,
    "steps": True,
    "sampled_token_budget": True,
    "checkpoint_every": True,
    "keep_last": True,
    "tensorboard": True,
    "wandb_project": True,
    "trackio_project": True,
    "recipe": True,  # the recipe's own section: ``sage-rl train`` ignores it
    "policy": POLICY_OPERATIONAL | {"timeout_s"},
    "rollout": {"concurrency"},
    "trainer": {"noise_scale"},  # a measurement: the gradient is the same, summed group by group
    "eval": {"every"},
}
_PATHS = {"init_from"}


class SettingsChanged(CheckpointError):
    """The config of a resumed run differs from the one its folder was trained with."""


def changed(saved: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(dotted key, saved value, new value)]`` for every setting that differs and may not, in
    key order (``config.settings_diff``: keys that one side only has are left out)."""

    def kept(d: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in d.items() if MAY_DIFFER.get(k) is not True}
        for section, keys in MAY_DIFFER.items():
            if isinstance(out.get(section), dict) and keys is not True:
                out[section] = {k: v for k, v in out[section].items() if k not in keys}
        return out | {key: located(out[key]) for key in _PATHS if key in out}  # the folder it resolves to

    return settings_diff(kept(saved), kept(now))


def check_same_run(config_file: Path, cfg: BaseModel) -> dict[str, Any] | None:
    """Raise :class:`SettingsChanged` naming every setting of ``cfg`` that differs from the run's
    ``config_file`` (and may not); else return the saved settings (None: no file, a new run)."""
    if not config_file.is_file():
        return None
    try:
        saved = read_yaml(config_file)  # the guarded reader: alias bombs and deep nesting are refused by name
    except ConfigError as e:
        raise SettingsChanged(
            f"{config_file}: the run's settings cannot be read ({e}); nothing was changed: restore the file, or "
            "train into another out_dir"
        ) from None
    diffs = changed(saved, cfg.model_dump(mode="json"))
    if diffs:
        raise SettingsChanged(
            f"{config_file.parent} was trained with other settings: {describe_diff(diffs)}. Resume it with "
            "the settings of its config.yaml, or train into another out_dir; nothing was changed"
        )
    return saved
