"""Checkpoints of a training run, and resuming one exactly.

Layout of ``<run_dir>/checkpoints/step_000012/`` (the run folder's: ``train/layout.py``)::

    model/        Hugging Face folder (config, model.safetensors, tokenizer): ``from_pretrained``,
                  ``sage-rl eval`` and vLLM load it. With LoRA this holds the MERGED weights.
    adapter/      LoRA only: the peft adapter (``PeftModel.from_pretrained``); resuming loads it.
    optimizer.pt  AdamW state (tensors and plain values only).
    rng.pt        python, numpy and torch (CPU and CUDA) RNG states (tensors and plain values only).
    state.json    {"step": 12, "metrics_offset": <bytes of metrics.jsonl at that step>, ...}

A checkpoint is written into a temporary folder and renamed into place, then ``latest`` (a text
file naming it) is replaced atomically, so a run killed at any moment (``kill -9``) leaves the
last complete checkpoint findable. Resuming restores weights, optimizer, RNG and step, and cuts
the metrics file back to the recorded offset.

Loading never runs code from the files: JSON, safetensors and ``torch.load(weights_only=True)``
only (a crafted pickle in ``rng.pt`` is refused, not executed). Resuming never starts over
silently and never cuts the metrics file unless a valid checkpoint was loaded: a run folder with
metrics but no usable checkpoint, and every corrupt file, is a ``CheckpointError`` naming the file.
One exception: a run killed during its first step has only the start model's evaluation (step 0)
in its metrics and needs no checkpoint, since the trainer as built is its state; it resumes at
step 0 without redoing that evaluation (a half-written last row is cut).

    logger, start = open_run(trainer, run_dir, resume=True)   # start = steps already done
    for step in range(start + 1, total + 1):
        logger.log(step, trainer.step(samples, num_chains))
        if step % every == 0 or step == total:
            save_checkpoint(trainer, run_dir, logger.offset())
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sage_rl.files import load_failure, write_atomic
from sage_rl.train.layout import STEP_NAME, CheckpointError, RunFolder
from sage_rl.train.logging import MetricsLogger
from sage_rl.train.trainer import Trainer


@dataclass(frozen=True)
class CheckpointState:
    step: int
    metrics_offset: int


def save_checkpoint(
    trainer: Trainer, run_dir: str | os.PathLike[str], metrics_offset: int, keep_last: int | None = None
) -> Path:
    """Write the trainer's state at ``trainer.global_step``; returns the checkpoint folder."""
    folder = RunFolder.of(run_dir)
    root = folder.checkpoints
    root.mkdir(parents=True, exist_ok=True)
    final = folder.checkpoint(trainer.global_step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        _save_model(trainer, tmp)
        torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(_rng_states(), tmp / "rng.pt")
        state = {
            "step": trainer.global_step,
            "metrics_offset": metrics_offset,
            "config": trainer.cfg.model_dump(mode="json"),
        }
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        if final.exists():  # a re-run of the same step after a crash: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_atomic(folder.latest, final.name)
    if keep_last:
        _prune(root, keep_last, final)
    return final


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None when the run has none yet.

    Raises ``CheckpointError`` when the ``latest`` pointer is unreadable or names no complete
    checkpoint (never a silent None: resuming would start over)."""
    pointer = RunFolder.of(run_dir).latest
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{pointer} cannot be read: {e}") from None
    if not STEP_NAME.match(name):
        raise CheckpointError(f"{pointer} should name a checkpoint folder (step_NNNNNN), not {name[:80]!r}")
    ckpt = pointer.parent / name
    if not (ckpt / "state.json").is_file():
        raise CheckpointError(f"{pointer} names {ckpt}, which is not a complete checkpoint (no state.json)")
    return ckpt


def load_checkpoint(trainer: Trainer, ckpt: str | os.PathLike[str]) -> CheckpointState:
    """Restore weights, optimizer, RNG states and step into ``trainer``, exactly.

    Every file is read and checked before the trainer is touched where that is possible (state,
    optimizer, RNG); any corrupt or crafted file raises ``CheckpointError`` naming it."""
    ckpt = Path(ckpt)
    state = _read_state(ckpt / "state.json")
    optimizer = _torch_load(ckpt / "optimizer.pt", trainer.device)
    rng = _torch_load(ckpt / "rng.pt", "cpu")
    _load_model(trainer, ckpt)
    try:
        trainer.optimizer.load_state_dict(optimizer)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt / 'optimizer.pt'} does not fit this model's optimizer: {e}") from None
    try:
        _set_rng_states(rng)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
        raise CheckpointError(f"{ckpt / 'rng.pt'} does not hold valid RNG states: {e}") from None
    trainer.global_step = state.step
    return state


def open_run(
    trainer: Trainer,
    run_dir: str | os.PathLike[str],
    resume: bool,
    tensorboard: bool = True,
    wandb_project: str | None = None,
    trackio_project: str | None = None,
) -> tuple[MetricsLogger, int]:
    """Open the run's metrics logger, resuming from the latest checkpoint if asked.

    Returns the logger and the number of steps already done. A fresh start refuses a run folder
    that already has metrics (so a forgotten ``--resume`` does not mix two runs). Resuming a folder
    that has no metrics yet starts at step 0; one that has metrics but no usable checkpoint is a
    ``CheckpointError`` (nothing is cut or overwritten)."""
    metrics = RunFolder.of(run_dir).metrics
    has_rows = metrics.is_file() and metrics.stat().st_size > 0
    offset, purge, start = None, None, 0
    if not resume:
        if metrics.exists():
            raise FileExistsError(f"{run_dir} already holds a run: resume it or choose another folder")
    else:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None and has_rows:
            # killed during the first step: its rows are the start model's evaluation only, and
            # the trainer as built is the step-0 state; the loop reads that evaluation back
            offset = _before_training(metrics)
            if offset is None:
                raise CheckpointError(_no_checkpoint(Path(run_dir)))
            purge = 1
        if ckpt is not None:
            size = metrics.stat().st_size if metrics.is_file() else 0
            st = load_checkpoint(trainer, ckpt)
            if st.metrics_offset > size:
                raise CheckpointError(
                    f"{metrics} has {size} bytes but {ckpt.name} was saved when it had {st.metrics_offset}: "
                    "the metrics file was cut or replaced"
                )
            offset, purge, start = st.metrics_offset, st.step + 1, st.step
    logger = MetricsLogger(
        run_dir,
        resume_offset=offset,
        purge_step=purge,
        tensorboard=tensorboard,
        wandb_project=wandb_project,
        trackio_project=trackio_project,
        run_name=Path(run_dir).name,
    )
    return logger, start


def _before_training(metrics: Path) -> int | None:
    """Bytes of ``metrics`` that hold only step-0 rows (the evaluation before training), up to
    its last complete row; None when a row of a later step, or one that is not JSON, is there."""
    offset = 0
    for line in metrics.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # a row cut by the kill: not written
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                return None
            if not isinstance(row, dict) or row.get("step") != 0:
                return None
        offset += len(line)
    return offset


def _no_checkpoint(run_dir: Path) -> str:
    folder = RunFolder(run_dir)
    pointer = folder.latest
    newest = sorted(p.name for p in folder.checkpoints.glob("step_*") if (p / "state.json").is_file())
    hint = (
        f"; the newest complete checkpoint folder is {newest[-1]}: write its name into {pointer} to resume from it"
        if newest
        else f"; start a new run with another out_dir, or remove {run_dir} to start this one afresh"
    )
    return (
        f"{folder.metrics} holds metrics but {pointer} does not exist: there is no checkpoint to resume{hint}"
    )


def _read_state(path: Path) -> CheckpointState:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path} is not readable JSON: {e}") from None
    fields = [state.get(k) if isinstance(state, dict) else None for k in ("step", "metrics_offset")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in fields):
        raise CheckpointError(f"{path} must hold non-negative integers 'step' and 'metrics_offset'")
    return CheckpointState(step=fields[0], metrics_offset=fields[1])


def _torch_load(path: Path, device: Any) -> Any:
    """``torch.load`` that never unpickles code (``weights_only=True``); errors name the file."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except Exception as e:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise CheckpointError(f"{path} is corrupt or not a checkpoint file ({load_failure(e)})") from None


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config")


def _save_model(trainer: Trainer, folder: Path) -> None:
    save_model(trainer.model, trainer.tokenizer, model_dir=folder / "model", adapter_dir=folder / "adapter")


def save_model(
    model: Any, tokenizer: Any, model_dir: Path | None = None, adapter_dir: Path | None = None
) -> None:
    """Hugging Face folders of ``model`` (the GRPO trainer's checkpoints and SFT's output).

    ``model_dir``: the full weights (a LoRA model's MERGED weights; the model itself is left
    unmerged) and the tokenizer, for ``from_pretrained``, ``sage-rl eval`` and vLLM.
    ``adapter_dir`` (LoRA only): the peft adapter and the tokenizer, which resuming loads.
    """
    from sage_rl.models import save_plain

    if _is_peft(model) and adapter_dir is not None:
        model.save_pretrained(adapter_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(adapter_dir)
    if model_dir is not None:
        plain = copy.deepcopy(model).merge_and_unload() if _is_peft(model) else model
        save_plain(plain, model_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(model_dir)


def _load_model(trainer: Trainer, ckpt: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file, load_model

    if _is_peft(trainer.model):
        from peft import set_peft_model_state_dict

        path = ckpt / "adapter" / "adapter_model.safetensors"
        try:
            weights = load_file(str(path), device=str(trainer.device))
            result = set_peft_model_state_dict(trainer.model, weights)
        except (OSError, SafetensorError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{path} is corrupt or does not fit this model: {e}") from None
        if result.unexpected_keys:
            raise CheckpointError(f"{path}: adapter has keys the model lacks: {result.unexpected_keys[:5]}")
        return
    path = ckpt / "model" / "model.safetensors"
    try:
        load_model(trainer.model, str(path), device=str(trainer.device))
    except (OSError, SafetensorError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{path} is corrupt or does not fit this model: {e}") from None


def _rng_states() -> dict[str, Any]:
    """Plain values and tensors only, so that loading needs no unpickling of objects."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    version, mt, gauss = states["python"]
    random.setstate((version, tuple(mt), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _prune(root: Path, keep_last: int, current: Path) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep_last]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
