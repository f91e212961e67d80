"""Checkpoints of a training run, and resuming one exactly.

Layout of ``<run_dir>/checkpoints/step_000012/``::

    model/        Hugging Face folder (config, model.safetensors, tokenizer): ``from_pretrained``,
                  ``sage-rl eval`` and vLLM load it. With LoRA this holds the MERGED weights.
    adapter/      LoRA only: the peft adapter (``PeftModel.from_pretrained``); resuming loads it.
    optimizer.pt  AdamW state.
    rng.pt        python, numpy and torch (CPU and CUDA) RNG states.
    state.json    {"step": 12, "metrics_offset": <bytes of metrics.jsonl at that step>, ...}

A checkpoint is written into a temporary folder and renamed into place, then ``latest`` (a text
file naming it) is replaced atomically, so a run killed at any moment (``kill -9``) leaves the
last complete checkpoint findable. Resuming restores weights, optimizer, RNG and step, and cuts
the metrics file back to the recorded offset.

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

from sage_rl.train.logging import MetricsLogger
from sage_rl.train.trainer import Trainer

LATEST = "latest"


@dataclass(frozen=True)
class CheckpointState:
    step: int
    metrics_offset: int


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    trainer: Trainer, run_dir: str | os.PathLike[str], metrics_offset: int, keep_last: int | None = None
) -> Path:
    """Write the trainer's state at ``trainer.global_step``; returns the checkpoint folder."""
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{trainer.global_step:06d}"
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
    _write_atomic(root / LATEST, final.name)
    if keep_last:
        _prune(root, keep_last, final)
    return final


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None."""
    pointer = checkpoints_dir(run_dir) / LATEST
    if not pointer.is_file():
        return None
    ckpt = pointer.parent / pointer.read_text().strip()
    return ckpt if (ckpt / "state.json").is_file() else None


def load_checkpoint(trainer: Trainer, ckpt: str | os.PathLike[str]) -> CheckpointState:
    """Restore weights, optimizer, RNG states and step into ``trainer``, exactly."""
    ckpt = Path(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    _load_model(trainer, ckpt)
    trainer.optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=trainer.device))
    _set_rng_states(torch.load(ckpt / "rng.pt", weights_only=False))
    trainer.global_step = int(state["step"])
    return CheckpointState(step=trainer.global_step, metrics_offset=int(state["metrics_offset"]))


def open_run(
    trainer: Trainer,
    run_dir: str | os.PathLike[str],
    resume: bool,
    tensorboard: bool = True,
    wandb_project: str | None = None,
    trackio_project: str | None = None,
) -> tuple[MetricsLogger, int]:
    """Open the run's metrics logger, resuming from the latest checkpoint if asked and present.

    Returns the logger and the number of steps already done. A fresh start refuses a run folder
    that already has metrics (so a forgotten ``--resume`` does not mix two runs)."""
    ckpt = latest_checkpoint(run_dir) if resume else None
    offset, purge, start = 0, None, 0
    if ckpt is None:
        if not resume and (Path(run_dir) / "metrics.jsonl").exists():
            raise FileExistsError(f"{run_dir} already holds a run: resume it or choose another folder")
    else:
        st = load_checkpoint(trainer, ckpt)
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
    from safetensors.torch import load_file, load_model

    if _is_peft(trainer.model):
        from peft import set_peft_model_state_dict

        weights = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"), device=str(trainer.device))
        result = set_peft_model_state_dict(trainer.model, weights)
        if result.unexpected_keys:
            raise ValueError(f"{ckpt}: adapter has keys the model lacks: {result.unexpected_keys[:5]}")
        return
    load_model(trainer.model, str(ckpt / "model" / "model.safetensors"), device=str(trainer.device))


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _prune(root: Path, keep_last: int, current: Path) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep_last]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
