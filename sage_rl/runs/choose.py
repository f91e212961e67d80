"""Choosing a run's model after the fact (``sage-rl choose``): from finished evaluations of its
saved models on a validation split, the one ``eval.keep: best`` would have kept during the run
(``sage_rl/train/best.py``: the higher TGC, then SGC; a tie keeps the earlier step).

For runs that cannot judge themselves while they train: verl's (docs/verl.md, "Choosing a
checkpoint": merge each saved checkpoint, serve it, ``sage-rl eval`` it on AppWorld's ``dev``),
or a local run that kept its last weights. The evaluations must measure the same thing: the same
settings (``resume.json``) in all but the model evaluated, on a split whose results are not
reported (choosing on ``test_*`` or ``train_heldout`` fits them). Anything else is a
:class:`ChooseError` naming the folder and what is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage_rl.config import describe_diff, settings_diff
from sage_rl.eval.resume import SETTINGS
from sage_rl.train.best import Best, replaces


class ChooseError(Exception):
    """Evaluations that cannot be chosen among; the message names the folder and the problem."""


@dataclass(frozen=True)
class Candidate:
    """One saved model's finished evaluation: after ``step`` updates (0: the start model)."""

    step: int
    folder: Path
    model: str | None
    split: str
    metrics: Mapping[str, Any]  # one strategy's metrics.json entry
    settings: Mapping[str, Any]  # resume.json: what the evaluation measured

    @property
    def best(self) -> Best:
        return Best(self.step, float(self.metrics["tgc"]), float(self.metrics["sgc"]))


def refused(split: str) -> bool:
    """Splits whose results are reported: PocketWorld's ``train_heldout`` and every ``test_*``."""
    return split == "train_heldout" or split.startswith("test")


def read_candidate(step: int, folder: str | Path, strategy: str = "same_scenario") -> Candidate:
    """``folder``'s finished evaluation (``metrics.json``, written when it ends; ``resume.json``)."""
    folder = Path(folder)
    parts: dict[str, Any] = {}
    for name in ("metrics.json", SETTINGS):
        path = folder / name
        if not path.is_file():
            why = (
                f"not a finished evaluation: finish it with `sage-rl eval <its config> out_dir={folder} --resume`"
                if name == "metrics.json"
                else "its settings are not recorded, so it cannot be compared: evaluate that model again"
            )
            raise ChooseError(f"{folder}: no {name} ({why})")
        try:
            parts[name] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ChooseError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    settings, by_strategy = parts[SETTINGS], parts["metrics.json"]
    if not isinstance(settings, dict) or not isinstance(by_strategy, dict):
        raise ChooseError(f"{folder}: metrics.json and {SETTINGS} must each hold a JSON object")
    metrics = by_strategy.get(strategy)
    if not isinstance(metrics, dict):
        raise ChooseError(f"{folder}: no {strategy!r} results (it has {sorted(by_strategy)}); pass --strategy")
    for key in ("tgc", "sgc", "tasks"):
        value = metrics.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise ChooseError(f"{folder}/metrics.json: {strategy}.{key} is {value!r}, not a finite number")
    policy = settings.get("policy")
    model = policy.get("model") if isinstance(policy, dict) else None
    return Candidate(step, folder, model, str(settings.get("split")), metrics, settings)


def choose(candidates: list[Candidate]) -> Candidate:
    """The kept candidate, judged in step order by ``best.replaces``, after checking that the
    evaluations compare (two or more, distinct steps, one allowed split, the same settings but
    the model)."""
    if len(candidates) < 2:
        raise ChooseError("give at least two evaluations (STEP=FOLDER) to choose among")
    steps = [c.step for c in candidates]
    if len(set(steps)) < len(steps):
        raise ChooseError(f"a step is given twice: {sorted(steps)}")
    first = min(candidates, key=lambda c: c.step)
    if refused(first.split):
        raise ChooseError(
            f"{first.folder} is an evaluation on {first.split!r}, whose results are reported: choosing on it fits "
            "them (choose on a validation split: PocketWorld's train_val, AppWorld's dev)"
        )
    base = _but_model(first.settings)
    for c in candidates:
        diffs = settings_diff(base, _but_model(c.settings))
        if diffs:
            raise ChooseError(
                f"{c.folder} was evaluated otherwise than {first.folder} ({describe_diff(diffs)}): "
                "only the model may differ"
            )
        if c.metrics["tasks"] != first.metrics["tasks"]:
            raise ChooseError(f"{c.folder} scored {c.metrics['tasks']} tasks, {first.folder} {first.metrics['tasks']}")
    kept: Candidate | None = None
    for c in sorted(candidates, key=lambda c: c.step):
        kept = c if replaces(c.best, kept.best if kept else None) else kept
    assert kept is not None
    return kept


#: the policy keys that say which model answered: its path or name, and the server that served it
#: (each checkpoint may be served on a port of its own)
MODEL_KEYS = {"model", "base_url", "api_key_env"}


def _but_model(settings: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(settings)
    if isinstance(out.get("policy"), dict):
        out["policy"] = {k: v for k, v in out["policy"].items() if k not in MODEL_KEYS}
    return out
