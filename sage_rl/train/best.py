"""Keeping an RL run's best model by its greedy evaluations (``eval.keep: best``; issue 27).

RL on a small model can help for a few steps and then hurt (laptop30's greedy curve: +13.3 TGC
after 2 steps, -3.3 after 6). A run that keeps its best judges every greedy evaluation of
``eval.split`` (the start model's before the first step, one every ``eval.every`` steps, the last
model's after the run) and keeps the weights that scored highest: the higher TGC, then the higher
SGC; a tie keeps the earlier model (fewer updates, the start model first). A run that never beats
its start ends with its start's weights. The recipe evaluates the kept model.

Choosing on a split is fitting to it: the split must be one that no result reports. On PocketWorld
that is ``train_val`` (seeds of the train templates that neither training nor ``train_heldout``
draws); the config refuses ``train_heldout`` (``settings.TrainConfig``).

Layout (``RunFolder.best``)::

    <run>/best/best.json            {"folder": ..., "step": 4, "tgc": .., "sgc": .., "split": ..}
    <run>/best/step_000004.<tag>/model/   the kept weights (a Hugging Face folder, as a checkpoint's)

A new best is written into a folder of its own, then ``best.json`` is replaced atomically and the
other folders are removed, so a run killed at any moment keeps a complete best. A resumed run that
redoes a step (stopped after that step's evaluation, before its checkpoint) judges it again: the
redone step's evaluation replaces the one its kept model had, as the model it names is gone.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sage_rl.eval.metrics import EvalMetrics
from sage_rl.files import write_atomic
from sage_rl.train.layout import CheckpointError, RunFolder, step_name

if TYPE_CHECKING:  # the judge needs torch; the rule and the pointer's reader (sage-rl choose) do not
    from sage_rl.train.trainer import Trainer


@dataclass(frozen=True)
class Best:
    """The kept model's evaluation: after ``step`` optimizer steps (0: the start model)."""

    step: int
    tgc: float
    sgc: float


def replaces(new: Best, kept: Best | None) -> bool:
    """Whether ``new`` is kept instead of ``kept``: a higher TGC, or an equal TGC and a higher
    SGC; or ``kept`` is of the same step (a resumed run redid it)."""
    if kept is None or new.step == kept.step:
        return True
    return (new.tgc, new.sgc) > (kept.tgc, kept.sgc)


def read_best(run_dir: str | Path) -> tuple[Best, Path] | None:
    """The kept model's evaluation and its Hugging Face folder; None when the run kept none yet.
    A pointer that cannot be read, or that names no model folder, is a ``CheckpointError``."""
    pointer = RunFolder.of(run_dir).best / "best.json"
    if not pointer.is_file():
        return None
    try:
        state = json.loads(pointer.read_text(encoding="utf-8"))
        best = Best(int(state["step"]), float(state["tgc"]), float(state["sgc"]))
        folder = pointer.parent / str(state["folder"])
        if not (math.isfinite(best.tgc) and math.isfinite(best.sgc)):
            raise ValueError(f"a score that is not a finite number ({best})")  # it would never be replaced
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{pointer} cannot be read as the kept model's record: {e}") from None
    if folder.parent != pointer.parent or not (folder / "model" / "config.json").is_file():
        raise CheckpointError(f"{pointer} names {folder}, which holds no model (model/config.json)")
    return best, folder / "model"


class KeepBest:
    """The judge of one run's evaluations; ``judge`` after each keeps the trainer's weights if
    they are the best so far, and returns the metrics row's ``eval/best_*`` columns."""

    def __init__(self, run_dir: str | Path, split: str) -> None:
        self.root = RunFolder.of(run_dir).best
        self.split = split
        found = read_best(run_dir)
        self.kept: Best | None = found[0] if found else None

    def judge(self, trainer: Trainer, step: int, metrics: EvalMetrics) -> dict[str, float]:
        new = Best(step, metrics.tgc, metrics.sgc)
        if replaces(new, self.kept):
            self._keep(trainer, new)
        assert self.kept is not None
        return {"eval/best_step": float(self.kept.step), "eval/best_tgc": self.kept.tgc}

    def _keep(self, trainer: Trainer, best: Best) -> None:
        from sage_rl.train.checkpoint import save_model

        self.root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f"{step_name(best.step)}.", dir=self.root))
        try:
            save_model(trainer.model, trainer.tokenizer, model_dir=folder / "model")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        record = {"folder": folder.name, **asdict(best), "split": self.split}
        write_atomic(self.root / "best.json", json.dumps(record, indent=1))
        for other in self.root.iterdir():
            if other.is_dir() and other != folder:
                shutil.rmtree(other, ignore_errors=True)
        self.kept = best
