"""Scenario templates, collected from their modules by an explicit list.

To add templates: write a module exposing ``TEMPLATES: tuple[Template, ...]`` and append it to
``_MODULES`` below (see docs/pocketworld.md, "Writing a template").
"""

from __future__ import annotations

from sage_rl.envs.pocketworld.scenarios import (
    eval_challenge,
    eval_challenge_split,
    eval_dev,
    eval_test,
    eval_test_organize,
    train_email,
    train_money,
    train_more,
    train_music,
    train_organize,
    train_phone,
)
from sage_rl.envs.pocketworld.scenarios.base import SPLITS, Template

_MODULES = (
    train_music,
    train_money,
    train_phone,
    train_email,
    train_organize,
    train_more,
    eval_dev,
    eval_test,
    eval_test_organize,
    eval_challenge,
    eval_challenge_split,
)

TEMPLATES: tuple[Template, ...] = tuple(t for m in _MODULES for t in m.TEMPLATES)
BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}


def templates(split: str) -> tuple[Template, ...]:
    """The templates of one split, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits are {list(SPLITS)}")
    return tuple(t for t in TEMPLATES if t.split == split)
