"""The typed config of ``sage-rl sft`` (configs/sft.yaml is the reference, docs/sft.md the guide)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from sage_rl.config import Section
from sage_rl.train.lora import LoraConfig


class SFTDataOptions(Section):
    """What to train on, besides where the data is (the recipe fills ``path`` in)."""

    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of scenarios held out for eval loss")
    max_length: int = Field(
        2048, gt=8, description="tokens per example (longer ones are truncated) and per packed row"
    )
    limit: int | None = Field(None, gt=0, description="use only the first N examples (smoke runs)")
    position_weights: dict[int, float] = Field(
        {},
        description="times per epoch an example of chain position p is seen (fractions rotate over "
        "epochs; missing positions: 1); see train/sft_schedule.py",
    )

    @field_validator("position_weights")
    @classmethod
    def _weights(cls, value: dict[int, float]) -> dict[int, float]:
        bad = {p: w for p, w in value.items() if not (w >= 0 and math.isfinite(w))}
        if bad:
            raise ValueError(f"position weights must be finite and >= 0, got {bad}")
        return value


class SFTData(SFTDataOptions):
    path: str = Field(description="chat JSON Lines written by `sage-rl collect` (sage_rl.data.records)")


class SFTOptim(Section):
    epochs: float = Field(2.0, gt=0, description="passes over the training set (fractions allowed)")
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimizer steps")
    lr: float = Field(2e-5, gt=0)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    batch_size: int = Field(1, gt=0, description="rows per micro-batch")
    grad_accum: int = Field(8, gt=0, description="micro-batches per optimizer step")
    packing: bool = Field(False, description="pack several examples per row (exact: no cross-attention)")
    shared_prefix: bool = Field(
        True,
        description="with packing: the opening that a row's examples share (the system prompt) is "
        "kept once per row, so more examples fit and fewer tokens run (exact)",
    )
    attention: Literal["segments", "dense"] = Field(
        "segments",
        description="segments: each packed example attends to its shared head and itself, computed "
        "per example (train/segments.py); dense: the row's full T x T mask (the same numbers, slower)",
    )
    lean_activations: bool = Field(
        True,
        description="MLPs and RMSNorms keep only their inputs for backward and recompute the rest "
        "(train/lean.py): the same loss, ~1/3 less activation memory",
    )
    freeze_layers: int = Field(
        0,
        ge=0,
        description="the bottom N decoder layers do not train and no gradient flows below them "
        "(train/freeze.py): backward runs through the top layers only; 0 = train every layer",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32",
        description="compute dtype of the forward and backward: bfloat16 runs them under torch.autocast "
        "(weights, gradients, AdamW and the loss stay float32); auto = bfloat16 where the device computes "
        "it natively (a CUDA GPU with bf16; a CPU with AVX512-BF16 or AMX), else float32. Where bf16 "
        "is emulated it is several times slower than float32 (docs/LOG.md)",
    )
    seed: int = 0
    threads: int | None = Field(
        None, gt=0, description="torch CPU threads (None = the cores other processes leave free, re-measured before every step)"
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="where to train: cpu, cuda, cuda:N, or auto = CUDA when available",
    )
    patience: int | None = Field(
        None,
        gt=0,
        description="stop after this many held-out evaluations in a row without a new best "
        "(needs output.eval_every); null = run every step",
    )


class SFTLora(Section):
    enabled: bool = False
    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    merge: bool = Field(
        True, description="save the merged model (loadable by vLLM); the adapter is saved too"
    )

    def adapters(self) -> LoraConfig | None:
        """The trainer's LoRA settings for these keys (None when LoRA is off)."""
        if not self.enabled:
            return None
        return LoraConfig(r=self.r, alpha=self.alpha, dropout=self.dropout, targets=self.target_modules)


class SFTOutput(Section):
    dir: str = "runs/sft"
    log_every: int = Field(1, gt=0, description="optimizer steps between metric lines")
    eval_every: int = Field(0, ge=0, description="optimizer steps between eval passes (0 = at the end only)")
    save_every_s: float | None = Field(
        600,
        ge=0,
        description="seconds of training between resume points in <dir>/resume; the same config "
        "started again continues from the newest; 0 = every step, null = none",
    )
    keep: Literal["best", "last"] = Field(
        "best",
        description="the weights saved in final/: the lowest held-out loss among the evaluations "
        "after step 0, or the last step's",
    )


class SFTConfig(Section):
    model: str | None = Field(
        None, description="HF model folder or .gguf; null = embedded SmolLM2-135M-Instruct"
    )
    data: SFTData
    optim: SFTOptim = SFTOptim()
    lora: SFTLora = SFTLora()
    output: SFTOutput = SFTOutput()
