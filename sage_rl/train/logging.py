"""Metrics of a training run: JSON Lines and TensorBoard always; W&B or trackio when configured.

One row per optimizer step: ``{"step": n, "<name>": value, ...}`` in ``<run_dir>/metrics.jsonl``,
each name defined in docs/metrics.md. Every row is flushed and fsynced, and the file's byte size
after a row (``offset()``) is what a checkpoint records: resuming truncates the file back to it, so
rows of steps after the checkpoint are dropped and written again, never duplicated.

``batch_metrics(samples)`` derives the rollout-side metrics of one batch (reward and success by
position, no-code rate, skill use and save rates, turns, tokens) from the samples alone.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sage_rl.skills.usage import SkillCredit, used_skills_from_calls
from sage_rl.text import brief
from sage_rl.train.layout import RunFolder
from sage_rl.types import Sample, StopReason, Trajectory


class MetricsLogger:
    """Writes metric rows. ``resume_offset`` truncates an existing file to that many bytes first;
    without it an existing file is appended to. ``wandb_project`` / ``trackio_project`` turn those
    backends on; a backend that is configured but not installed is skipped with a warning.
    ``tag_prefix`` is put before each TensorBoard tag (SFT logs ``sft/<name>``)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        resume_offset: int | None = None,
        purge_step: int | None = None,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        trackio_project: str | None = None,
        run_name: str | None = None,
        tag_prefix: str = "",
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        folder = RunFolder(self.run_dir)
        self.path = folder.metrics
        if resume_offset is not None:
            truncate_metrics(self.path, resume_offset)
        self._file = self.path.open("a", encoding="utf-8")
        self._prefix = tag_prefix  # of TensorBoard tags (``sft/loss``); rows keep the plain names
        self._tb = _tensorboard(folder.tensorboard, purge_step) if tensorboard else None
        self._wandb = _optional_run("wandb", wandb_project, run_name, self.run_dir)
        self._trackio = _optional_run("trackio", trackio_project, run_name, self.run_dir)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row, sort_keys=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        scalars = {
            k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)
        }
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(self._prefix + k, v, step)
            self._tb.flush()
        for run in (self._wandb, self._trackio):
            if run is not None:
                run.log(scalars, step=step)

    def offset(self) -> int:
        """Byte size of the metrics file after the last row written."""
        self._file.flush()
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for run in (self._wandb, self._trackio):
            if run is not None:
                run.finish()


def truncate_metrics(path: Path, offset: int) -> None:
    """Cut ``path`` back to ``offset`` bytes (a checkpoint's record of it)."""
    if not path.exists():
        if offset:
            raise ValueError(f"{path} is missing but the checkpoint expects {offset} bytes of metrics")
        return
    size = path.stat().st_size
    if size < offset:
        raise ValueError(
            f"{path} holds {size} bytes, fewer than the checkpoint's {offset}: not the same run?"
        )
    with path.open("r+b") as f:
        f.truncate(offset)


def is_metric(v: Any) -> bool:
    """What ``MetricsLogger.log`` writes for a value: a number (``true``/``false`` too, from a
    trainer that reports a flag as a ``bool``), or null for a non-finite one."""
    return v is None or isinstance(v, int | float)


def metrics_row(d: Any) -> dict[str, Any]:
    """``d`` when it is a row as ``MetricsLogger.log`` writes it (an integer ``step``; every value a
    number or null: ``is_metric``), else ``ValueError`` naming what is not. The resume, the viewer,
    the recipe's report and results read rows through this, so a damaged value is refused at its
    line, never deeper in a sum or a plot (``recipe.status`` reads per value, showing ``?``)."""
    if not isinstance(d, dict) or type(d.get("step")) is not int:
        raise ValueError("expected an object with an integer 'step'")
    for k, v in d.items():
        if not is_metric(v):
            raise ValueError(f"{k!r} holds {brief(v)}, not a number")
    return d


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every row of a run's ``metrics.jsonl``; a line that is not one is a ``ValueError`` naming the
    file and line (a resumed run's sampled-token count cannot be had without it)."""
    path = RunFolder.of(run_dir).metrics
    rows = []
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if line.strip():
            try:
                rows.append(metrics_row(json.loads(line)))
            except ValueError as e:  # not JSON, not UTF-8, not a row
                raise ValueError(f"{path} line {lineno} is not a metrics row ({e})") from None
    return rows


def _finite(v: Any) -> Any:
    # JSON has no NaN/inf: write null so the file stays strict JSON Lines.
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _tensorboard(folder: Path, purge_step: int | None) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(folder), purge_step=purge_step)


def _optional_run(backend: str, project: str | None, name: str | None, run_dir: Path) -> Any:
    if project is None:
        return None
    try:
        module = __import__(backend)
    except ImportError:
        warnings.warn(
            f"{backend} is configured (project {project!r}) but not installed; skipping it", stacklevel=3
        )
        return None
    if backend == "wandb":
        return module.init(project=project, name=name, dir=str(run_dir), resume="allow")
    module.init(project=project, name=name)
    return module  # trackio's module-level log/finish


def batch_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Rollout metrics of one batch, overall and by position k (``/k{k}`` suffix, k from 0)."""
    by_pos: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_pos[s.group[1]].append(s)
    out = _rollout_stats(samples, "")
    for k in sorted(by_pos):
        out.update(_rollout_stats(by_pos[k], f"/k{k}"))
    return out


def without_effect(traj: Trajectory) -> bool | None:
    """Whether ``traj`` was credited with library skills none of which ``flow`` would credit: none
    whose work reached the world in it for good (``CallRecord.reached``; the door ``skills.credit: api``
    leaves open); None when it used no skill or its environment reports no call records."""
    results = [turn.result for turn in traj.turns if turn.code]
    if not traj.skills_used or any(r.calls is None for r in results):
        return None
    o = traj.outcome
    return not used_skills_from_calls(results, traj.skills_used, SkillCredit.FLOW, o.lasting, o.answer_scored)


def _rollout_stats(samples: Sequence[Sample], suffix: str) -> dict[str, float]:
    n = max(len(samples), 1)
    trajs = [s.trajectory for s in samples]
    used = [bool(t.skills_used) for t in trajs]
    used_ok = [t.outcome.success for t, u in zip(trajs, used, strict=True) if u]
    idle = [w for w in map(without_effect, trajs) if w is not None]
    return {
        f"reward{suffix}": sum(s.reward for s in samples) / n,
        f"score{suffix}": sum(t.outcome.score for t in trajs) / n,
        f"success{suffix}": sum(t.outcome.success for t in trajs) / n,
        f"no_code_rate{suffix}": sum(not t.produced_code for t in trajs) / n,
        f"env_error_rate{suffix}": sum(t.stop is StopReason.ENV_ERROR for t in trajs) / n,
        f"skill_use_rate{suffix}": sum(used) / n,
        f"skill_use_success{suffix}": sum(used_ok) / len(used_ok) if used_ok else float("nan"),
        # of the tasks credited with skills, those whose skills' work reached nothing (0 under flow)
        f"skill_use_without_effect{suffix}": sum(idle) / len(idle) if idle else float("nan"),
        f"skill_save_rate{suffix}": sum(bool(t.skills_saved) for t in trajs) / n,
        f"skills_saved{suffix}": sum(len(t.skills_saved) for t in trajs) / n,
        f"turns{suffix}": sum(len(t.turns) for t in trajs) / n,
        f"gen_tokens_per_task{suffix}": sum(t.num_generated_tokens for t in trajs) / n,
    }
