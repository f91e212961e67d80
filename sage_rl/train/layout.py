"""A training run's folder: the one place its layout is written down (issue 31).

    <run>/config.yaml                      the run's config            (runs/train.py)
    <run>/metrics.jsonl                    one row per step            (train/logging.py)
    <run>/tb/                              TensorBoard events          (train/logging.py)
    <run>/rollouts/step_NNNNNN.jsonl       every chain drawn that step (train/loop.py)
    <run>/checkpoints/step_NNNNNN/         one checkpoint              (train/checkpoint.py)
    <run>/checkpoints/latest               the newest complete one's folder name
    <run>/evals/step_NNNNNN.json           a periodic greedy evaluation's outcomes (train/loop.py)
    <run>/best/best.json, step_NNNNNN.*/   the model kept by its evaluations (train/best.py; eval.keep: best)
    <run>/summary.json, report.md, curves.png   written at the end     (runs/train.py)

Every module that writes or reads one of these asks ``RunFolder`` for its path. SFT's output
folder shares ``metrics.jsonl`` and ``tb/`` (its ``MetricsLogger``); an evaluation's run folder is
``eval/report.py``'s, and the recipe's folders of stages are ``recipe.Layout``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: A step's folder or file stem: ``step_000012`` (sorting by name sorts by step).
STEP_NAME = re.compile(r"^step_\d{6}$")


class CheckpointError(ValueError):
    """A run folder cannot be resumed. The message names the file and what is wrong with it.
    (Here, beside the layout, so that readers of a run folder need no torch.)"""


def step_name(step: int) -> str:
    return f"step_{step:06d}"


@dataclass(frozen=True)
class RunFolder:
    """The paths of one training run's folder (``root``: the train config's ``out_dir``)."""

    root: Path

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> RunFolder:
        return cls(Path(root))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tb"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    def rollout_file(self, step: int) -> Path:
        """The chains drawn by step ``step`` (counted from 1, as the metrics rows)."""
        return self.rollouts / f"{step_name(step)}.jsonl"

    @property
    def evals(self) -> Path:
        return self.root / "evals"

    def eval_file(self, step: int) -> Path:
        """The periodic greedy evaluation after step ``step``: its metrics and per-task outcomes
        (``EvalResult.record``), so a curve's points can be compared task by task."""
        return self.evals / f"{step_name(step)}.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    @property
    def latest(self) -> Path:
        """The text file naming the newest complete checkpoint folder."""
        return self.checkpoints / "latest"

    @property
    def best(self) -> Path:
        """The model a run that keeps its best kept (``train/best.py``), and its record."""
        return self.root / "best"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def curves(self) -> Path:
        return self.root / "curves.png"
