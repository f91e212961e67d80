"""The config sections of training (no torch here: commands validate them before loading a model).

``TrainerConfig`` (the GRPO optimizer step, ``train/trainer.py``), ``LoraConfig`` (``train/lora.py``),
``LoopConfig`` and ``TrainEvalConfig`` (the loop's schedule, ``train/loop.py``).
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import Field, model_validator

from sage_rl.config import Section
from sage_rl.eval.runner import EvalConfig
from sage_rl.rollout.batch import RolloutConfig


class LossAgg(enum.StrEnum):
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    TOKEN_MEAN = "token_mean"


class LoraConfig(Section):
    """LoRA through peft; ``None`` in ``TrainerConfig.lora`` = full-parameter training."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] | Literal["all-linear"] = "all-linear"


class TrainerConfig(Section):
    lr: float = Field(1e-6, gt=0, description="learning rate after warm-up (the paper's, constant, at 32B)")
    warmup_steps: int = Field(
        0, ge=0, description="linear warm-up over this many updates (lr * u / warmup_steps); 0 = constant lr"
    )
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    micro_batch_size: int = Field(4, gt=0, description="sequences per forward/backward")
    micro_batch_tokens: int | None = Field(
        None,
        gt=0,
        description="at most this many padded tokens (sequences x the longest) per forward/backward: "
        "long samples run in smaller micro-batches (a sample longer than it runs alone); null = no cap",
    )
    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.2, ge=0)
    loss_agg: LossAgg = LossAgg.SEQ_MEAN_TOKEN_MEAN
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the initial model; 0 = off (no reference kept)")
    log_kl_ref: bool = Field(
        False,
        description="keep the initial model and log kl_ref (k3 to it) every step, also when kl_coef is 0 "
        "(then it is measured, not trained on: one more forward per micro-batch)",
    )
    kl_ref_every: int = Field(
        1,
        ge=1,
        description="when kl_ref is only logged (kl_coef 0): measure it in the step's first micro-batch and every "
        "Nth after it, the logged figure the token-weighted mean over those (the reference's forward is ~30% of "
        "an update on a CPU); 1 = every micro-batch. KL in the loss (kl_coef > 0) needs every one",
    )
    lora: LoraConfig | None = None
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto = fp32 on CPU, bf16 on GPU"
    )
    old_logprobs: Literal["same_pass", "recompute"] = "same_pass"
    chunked_head: bool = Field(
        True,
        description="logprobs of generated tokens only, in tiles, without (B, T, V) logits (auto-checked)",
    )
    lean_activations: bool = Field(
        True,
        description="MLPs and RMSNorms keep only their inputs for backward (train/lean.py; off under autocast)",
    )
    causal_attention: bool = Field(
        True,
        description="attention of the right-padded rows through one causal mask per forward, not a "
        "padding mask copied per layer (train/causal.py; memory only, auto-checked per model)",
    )
    tis_cap: float | None = Field(
        None,
        gt=0,
        description="truncated importance sampling: weight each token's surrogate by "
        "min(exp(trainer old logprob - sampler logprob), tis_cap); null = off (docs/algorithm.md)",
    )
    shared_prefix: bool = Field(
        True,
        description="run the opening tokens that samples share (system prompt, a group's task prompt) "
        "once, not once per sample; exact (auto-checked per model)",
    )
    shared_prefix_min_tokens: int = Field(
        16, ge=1, description="share a prefix only when it is at least this many tokens"
    )
    skip_zero_advantage: bool = Field(
        True,
        description="do not run samples whose advantage is 0 when kl_coef is 0: their gradient is "
        "exactly 0 (they still count in the loss normalisation); a step where none is left makes "
        "no update",
    )
    noise_scale: bool = Field(
        False,
        description="log each step's gradient noise scale over its groups (noise/*: train/noise.py); runs a "
        "group's micro-batches together and a shared step prefix's backward once per group",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _noise_scale_needs_groups_normalised_alike(self) -> TrainerConfig:
        if self.noise_scale and self.loss_agg != LossAgg.SEQ_MEAN_TOKEN_MEAN:
            raise ValueError(
                f"noise_scale with loss_agg={self.loss_agg}: a group's gradient is its share of the step's "
                "only when each chain is normalised by itself (seq_mean_token_mean)"
            )
        return self

    @model_validator(mode="after")
    def _kl_in_the_loss_is_measured_everywhere(self) -> TrainerConfig:
        if self.kl_coef > 0 and self.kl_ref_every > 1:
            raise ValueError(
                f"kl_ref_every={self.kl_ref_every} with kl_coef={self.kl_coef}: a KL term in the loss is "
                "measured in every micro-batch; kl_ref_every applies only to a logged KL (kl_coef 0)"
            )
        return self


class TrainEvalConfig(Section):
    split: str = "dev"
    every: int = Field(0, ge=0, description="evaluate every N steps; 0 = only before and after")
    scenarios: int | None = Field(2, ge=1, description="first N scenarios of the split; null = all")
    before_after: bool = True
    keep: Literal["last", "best"] = Field(
        "last",
        description="the run's model: its last weights, or the best-scoring of its evaluations (the "
        "start's included; train/best.py). Choosing fits the split: use one no result reports (train_val)",
    )

    @model_validator(mode="after")
    def _best_needs_the_start(self) -> TrainEvalConfig:
        if self.keep == "best" and not self.before_after:
            raise ValueError(
                "eval.keep=best judges the start model too, before the first step: it needs eval.before_after=true"
            )
        return self

    def protocol(self, strategy: str) -> EvalConfig:
        """The evaluation to run: this split's first scenarios, all at once, with the training
        run's own retrieval ``strategy``."""
        return EvalConfig(
            split=self.split, limit_scenarios=self.scenarios, concurrency=None, strategies=[strategy]
        )


class LoopConfig(Section):
    """The loop's schedule (the ``sage-rl train`` config holds these keys at its top level)."""

    rollout: RolloutConfig = RolloutConfig()
    eval: TrainEvalConfig = TrainEvalConfig()
    steps: int = Field(4, ge=1)
    sampled_token_budget: int | None = Field(
        None,
        ge=1,
        description="stop after the step at which the run's sampled (generated) rollout tokens reach "
        "this many; null = run every step (``steps`` is the cap either way)",
    )
    checkpoint_every: int = Field(1, ge=1)
    keep_last: int | None = 2
    out_dir: str = "runs/train"
