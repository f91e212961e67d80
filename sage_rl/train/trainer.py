"""The local GRPO trainer: one optimizer step per rollout batch (SAGE.md section 5, issue 6).

    trainer = Trainer(model, tokenizer, TrainerConfig(lr=1e-6))
    metrics = trainer.step(samples, num_chains=len(chains))   # strictly on-policy: one step per batch

``step`` builds right-padded tensors from each ``Sample.trajectory.token_arrays()`` (the exact
sampled ids; the mask comes from the turn structure and is never edited), runs the model over
micro-batches with gradient accumulation, clips the gradient norm and takes one AdamW step.

Old logprobs. The batch is trained for exactly one optimizer step, and no weight changes between
the micro-batches, so the old policy IS the current model: its logprobs are those of the forward
pass itself, detached (``old_logprobs="same_pass"``, default; ratio s = 1 on every token, so the
clip is inactive, as in strictly on-policy GRPO). ``"recompute"`` runs a separate no-grad pass
first (the same numbers at the cost of one more forward; useful with dropout, or as a check).
The sampler's logprobs are compared with them: ``logprob_mismatch`` (docs/metrics.md).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field

from sage_rl.config import Section
from sage_rl.train.loss import LossAgg, clipped_surrogate
from sage_rl.train.optim import (
    ChunkedHead,
    StepStats,
    TokenBatch,
    build_optimizer,
    collate,
    micro_batches,
    token_logprobs,
)
from sage_rl.types import Sample


class LoraConfig(Section):
    """LoRA through peft; ``None`` in ``TrainerConfig.lora`` = full-parameter training."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] | Literal["all-linear"] = "all-linear"


class TrainerConfig(Section):
    lr: float = Field(1e-6, gt=0, description="constant learning rate (the paper's, at 32B)")
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    micro_batch_size: int = Field(4, gt=0, description="sequences per forward/backward")
    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.2, ge=0)
    loss_agg: LossAgg = LossAgg.SEQ_MEAN_TOKEN_MEAN
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the initial model; 0 = off (no reference kept)")
    lora: LoraConfig | None = None
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto = fp32 on CPU, bf16 on GPU"
    )
    old_logprobs: Literal["same_pass", "recompute"] = "same_pass"
    chunked_head: bool = Field(
        True,
        description="logprobs of generated tokens only, in tiles, without (B, T, V) logits (auto-checked)",
    )
    seed: int = 0


@dataclass(frozen=True)
class PreparedSample:
    """One sample's exact token arrays and advantage, checked."""

    ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    advantage: float

    @classmethod
    def of(cls, s: Sample) -> PreparedSample:
        ids, mask, lps = s.trajectory.token_arrays()
        task = s.trajectory.task.task_id
        if not (len(ids) == len(mask) == len(lps)):
            raise ValueError(f"sample of task {task}: ids, mask and logprobs differ in length")
        if not ids or mask[0]:
            raise ValueError(f"sample of task {task}: empty prompt (the first token cannot be trained)")
        return cls(ids, mask, lps, float(s.advantage))


class Trainer:
    """Owns the model being trained, its optimizer, and the step counter (``global_step``).

    Construction seeds torch's global RNG with ``cfg.seed`` (so a run is reproducible), wraps the
    model with LoRA adapters when configured, and moves it to ``device`` (default: CUDA if present).
    The model is left in eval mode between steps, ready for sampling.
    """

    def __init__(
        self, model: Any, tokenizer: Any, cfg: TrainerConfig, device: str | torch.device | None = None
    ):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = _maybe_lora(model, cfg.lora).to(self.device)
        # Reference for the optional KL term: the initial weights (LoRA: the base, adapters off).
        self.ref_model = None
        if cfg.kl_coef > 0 and cfg.lora is None:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.head = ChunkedHead.of(self.model, self.device) if cfg.chunked_head else None
        self.optimizer = build_optimizer(self.model, cfg.lr, cfg.betas, cfg.weight_decay)
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad) if pad is not None else 0
        self.global_step = 0

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """bf16 autocast (fp32 master weights) on GPU by default; None = plain fp32."""
        want = self.cfg.dtype
        if want == "bfloat16" or (want == "auto" and self.device.type == "cuda"):
            return torch.bfloat16
        return None

    def step(self, samples: Sequence[Sample], num_chains: int) -> dict[str, float]:
        """One optimizer step on ``samples`` (the tasks of ``num_chains`` chains); returns metrics."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.accumulate_gradients(samples, num_chains)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        elapsed = time.perf_counter() - t0
        return {
            **stats.as_metrics(),
            "grad_norm": float(grad_norm),
            "lr": self.cfg.lr,
            "samples": float(len(samples)),
            "chains": float(num_chains),
            "train_time_s": elapsed,
            "train_tokens_per_s": stats.seq_tokens / elapsed if elapsed > 0 else 0.0,
        }

    def accumulate_gradients(self, samples: Sequence[Sample], num_chains: int) -> StepStats:
        """Add d loss / d params of the whole batch into ``.grad``, one micro-batch at a time.

        Each micro-batch's loss is normalised by the whole batch (``num_chains``, or its total
        generated tokens for ``token_mean``), so the accumulated gradient is the full-batch one.
        """
        if not samples:
            raise ValueError("Trainer.step: no samples")
        if num_chains < 1:
            raise ValueError(f"Trainer.step: num_chains must be >= 1, got {num_chains}")
        prepared = [PreparedSample.of(s) for s in samples]
        total_tokens = sum(sum(p.mask) for p in prepared)
        self.model.train()
        stats = StepStats()
        for group in micro_batches(prepared, self.cfg.micro_batch_size):
            batch = collate(group, self.pad_id, self.device)
            stats.add(self._micro_step(batch, num_chains, total_tokens), batch)
        self.model.eval()
        return stats

    def _micro_step(self, b: TokenBatch, num_chains: int, total_tokens: int) -> Any:
        if self.cfg.old_logprobs == "recompute":
            with torch.no_grad():
                old_logp_BT, _ = self._logprobs(self.model, b, with_entropy=False)
        logp_BT, entropy_BT = self._logprobs(self.model, b, with_entropy=True)
        if self.cfg.old_logprobs == "same_pass":
            old_logp_BT = logp_BT.detach()
        ref_logp_BT = self._ref_logprobs(b) if self.cfg.kl_coef > 0 else None
        out = clipped_surrogate(
            logp_BT,
            old_logp_BT,
            b.adv_B,
            b.mask_BT,
            eps_low=self.cfg.eps_low,
            eps_high=self.cfg.eps_high,
            agg=self.cfg.loss_agg,
            num_chains=num_chains,
            num_tokens=total_tokens,
            ref_logp_BT=ref_logp_BT,
            kl_coef=self.cfg.kl_coef,
        )
        out.loss.backward()
        return out, old_logp_BT.detach(), entropy_BT

    def _logprobs(
        self, model: Any, b: TokenBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        dtype = self.autocast_dtype
        with torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if self.head is not None and model is self.model:
                return self.head.logprobs(b, with_entropy)
            # Logits only from the first trained position on: prompt logits are never used.
            logits_BTV = model(
                input_ids=b.ids_BT, attention_mask=b.attn_BT, logits_to_keep=b.logits_to_keep, use_cache=False
            ).logits
        return token_logprobs(logits_BTV, b.target_BT, with_entropy)

    @torch.no_grad()
    def _ref_logprobs(self, b: TokenBatch) -> torch.Tensor:
        if self.ref_model is not None:
            return self._logprobs(self.ref_model, b, with_entropy=False)[0]
        with self.model.disable_adapter():  # LoRA: the base model is the reference
            return self._logprobs(self.model, b, with_entropy=False)[0]


def _maybe_lora(model: Any, lora: LoraConfig | None) -> Any:
    if lora is None:
        return model
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = lora.targets if lora.targets == "all-linear" else list(lora.targets)
    peft_cfg = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets
    )
    return get_peft_model(model, peft_cfg)
