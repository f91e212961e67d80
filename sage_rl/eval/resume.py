"""An evaluation that continues where a stopped one left off.

Chains are appended to ``trajectories.<strategy>.jsonl`` as they finish (``report.ChainLog``), so a
killed evaluation leaves every finished scenario on disk. Resuming reads them back, runs only the
scenarios that are missing, and reports on all of them: greedy evaluation runs each scenario as
its own chain from the same start library, so a scenario's result does not depend on the run it
was part of.

A folder is resumed only by the evaluation that wrote it: its settings (``resume.json``, written
when an evaluation starts; everything but the run folder and the amount of parallelism) must be
the same (a folder with trajectories and no ``resume.json`` cannot be checked, and is refused), and
every chain read back must be one of this evaluation's scenarios, task for task.
Otherwise :class:`ResumeError` names the folder and what differs, and nothing is deleted. A line
that does not parse (the one a kill cut short) is dropped and its scenario runs again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sage_rl.config import describe_diff, settings_diff
from sage_rl.types import Chain, Task

log = logging.getLogger(__name__)

SETTINGS = "resume.json"
#: keys that change how fast an evaluation runs, not what it measures
_OPERATIONAL = {"out_dir", "concurrency"}
POLICY_OPERATIONAL = {"threads", "max_batch", "cache_gib", "max_concurrency", "column_blocks", "decode_pool"}


class ResumeError(Exception):
    """A run folder that this evaluation cannot continue."""


def settings_of(cfg: BaseModel) -> dict[str, Any]:
    """What an evaluation measures: its config less the run folder and its parallelism."""
    data = cfg.model_dump(mode="json")
    out = {k: v for k, v in data.items() if k not in _OPERATIONAL}
    if isinstance(out.get("policy"), dict):
        out["policy"] = {k: v for k, v in out["policy"].items() if k not in POLICY_OPERATIONAL}
    return out


def start(folder: Path, cfg: BaseModel, resume: bool) -> None:
    """Record ``cfg``'s settings in ``folder`` (a new evaluation), or check them (``resume``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SETTINGS
    if resume and not path.is_file() and any(folder.glob("trajectories.*.jsonl")):
        raise ResumeError(
            f"{folder} holds trajectories but no {SETTINGS}: written by an evaluation whose settings "
            "cannot be checked; evaluate into another out_dir, or remove that folder"
        )
    if resume and path.is_file():
        same_settings(folder, cfg)
        return
    path.write_text(json.dumps(settings_of(cfg), indent=1, sort_keys=True), encoding="utf-8")


def same_settings(folder: Path, cfg: BaseModel) -> None:
    """``ResumeError`` naming what differs when ``folder``'s recorded settings are not ``cfg``'s
    (the model evaluated among them); nothing when it records none."""
    path = folder / SETTINGS
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ResumeError(f"{path}: unreadable ({type(e).__name__}: {e}); nothing was deleted") from None
    now = settings_of(cfg)
    diffs = settings_diff(_located(saved), _located(now)) if isinstance(saved, dict) else [("(whole file)", saved, None)]
    if diffs:
        raise ResumeError(
            f"{folder} holds an evaluation with other settings ({describe_diff(diffs)}; per {path}): evaluate into "
            "another out_dir, or remove that folder"
        )


def located(path: Any) -> Any:
    """A model's folder as the folder it resolves to (a run linked into another folder, as
    ``--sft-from`` links them, evaluates the same model); anything else as it is."""
    return os.path.realpath(path) if isinstance(path, str) and path and os.path.exists(path) else path


def _located(settings: dict[str, Any]) -> dict[str, Any]:
    policy = settings.get("policy")
    if not isinstance(policy, dict) or "model" not in policy:
        return settings
    return settings | {"policy": policy | {"model": located(policy["model"])}}


def finished(path: Path, scenarios: Sequence[tuple[Task, ...]]) -> dict[int, Chain]:
    """{scenario index: its chain} for the chains of ``path`` (a streamed trajectories file)."""
    if not path.is_file():
        return {}
    index = {tuple(t.task_id for t in s): i for i, s in enumerate(scenarios)}
    found: dict[int, Chain] = {}
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for n, line in enumerate(f, 1):
            try:
                chain = Chain.from_dict(json.loads(line))  # ValueError for anything but a chain
            except ValueError as e:
                log.warning("%s:%d: not a chain (%s); its scenario runs again", path, n, type(e).__name__)
                continue
            i = index.get(chain.task_ids)
            if i is None:
                raise ResumeError(
                    f"{path}:{n}: tasks {', '.join(chain.task_ids)} are not a scenario of this evaluation; "
                    "evaluate into another out_dir, or remove that folder"
                )
            found[i] = chain
    return found
