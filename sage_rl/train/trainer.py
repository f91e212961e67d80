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

Shared prefixes (``shared_prefix``, default on): the opening that every sample of the batch shares
(the system prompt) runs through the model once per step, and a micro-batch's longer shared
opening (its group's task prompt) once per micro-batch; the suffixes attend to those keys/values.
Exact: same loss and gradients as the per-sample forward (``train/prefix.py``).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sage_rl.train import causal
from sage_rl.train.batch import PreparedSample, TokenBatch, collate, grouped_micro_batches, micro_batches
from sage_rl.train.config import LoraConfig, TrainerConfig
from sage_rl.train.lean import lean_activations
from sage_rl.train.logprobs import ChunkedHead, token_logprobs
from sage_rl.train.lora import with_lora
from sage_rl.train.loss import LossOutput, clipped_surrogate, tis_weights
from sage_rl.train.noise import GroupGradients
from sage_rl.train.optim import build_optimizer, optimizer_step, updates_made, warmup_lr
from sage_rl.train.prefix import KV, RefPrefix, StepPrefix, as_cache, prefix_kv, shareable_len, supported
from sage_rl.types import Sample

__all__ = ["LoraConfig", "MicroStep", "StepStats", "Trainer", "TrainerConfig"]


@dataclass(frozen=True)
class MicroStep:
    """What one micro-batch's forward/backward gave: the loss terms, the old logprobs used in the
    ratio (detached) and the entropy of each predictive distribution (detached)."""

    loss: LossOutput
    old_logp_BT: torch.Tensor
    entropy_BT: torch.Tensor
    tis_BT: torch.Tensor | None = None  # the truncated importance weights, when on
    tis_cap: float = float("inf")
    kl_measured: bool = False  # the KL to the start model was computed in this micro-batch


@dataclass
class StepStats:
    """Token-weighted sums over the micro-batches of one step (docs/metrics.md defines each)."""

    loss: float = 0.0
    gen_tokens: int = 0
    seq_tokens: int = 0
    padded_tokens: int = 0
    forward_tokens: int = 0
    entropy_sum: float = 0.0
    clip_low_sum: float = 0.0
    clip_high_sum: float = 0.0
    approx_kl_sum: float = 0.0
    kl_ref_sum: float = 0.0
    kl_ref_tokens: int = 0  # generated tokens of the micro-batches where it was measured
    mismatch_sum: float = 0.0
    mismatch_max: float = 0.0
    tis_sum: float | None = None  # None: TIS off
    tis_capped: int = 0
    ratio_min: float = field(default=float("inf"))
    ratio_max: float = field(default=float("-inf"))
    samples_run: int = 0  # samples that went through the model (not skipped for a zero gradient)
    noise: dict[str, float] = field(default_factory=dict)  # noise/* (trainer.noise_scale: train/noise.py)

    def add(self, m: MicroStep, b: TokenBatch) -> None:
        out, old_logp_BT, entropy_BT = m.loss, m.old_logp_BT, m.entropy_BT
        n = out.num_tokens
        sel = b.mask_BT.bool()
        self.loss += float(out.loss.item())
        self.gen_tokens += n
        self.seq_tokens += b.seq_tokens
        self.padded_tokens += b.ids_BT.numel() + len(b.prefix_ids) * b.ids_BT.shape[0]
        self.forward_tokens += b.ids_BT.numel()
        self.entropy_sum += float(entropy_BT[sel].sum().item())
        self.clip_low_sum += out.clip_frac_low * n
        self.clip_high_sum += out.clip_frac_high * n
        self.approx_kl_sum += out.approx_kl * n
        if m.kl_measured:
            self.kl_ref_sum += out.kl_ref * n
            self.kl_ref_tokens += n
        if n:
            diff = (b.sampler_logp_BT - old_logp_BT.float())[sel].abs()
            self.mismatch_sum += float(diff.sum().item())
            self.mismatch_max = max(self.mismatch_max, float(diff.max().item()))
            if m.tis_BT is not None:
                self.tis_sum = (self.tis_sum or 0.0) + float(m.tis_BT[sel].sum().item())
                self.tis_capped += int((m.tis_BT[sel] >= m.tis_cap).sum().item())
            self.ratio_min = min(self.ratio_min, out.ratio_min)
            self.ratio_max = max(self.ratio_max, out.ratio_max)

    def as_metrics(self) -> dict[str, float]:
        n = max(self.gen_tokens, 1)
        return {
            "loss": self.loss,
            "entropy": self.entropy_sum / n,
            "clip_frac_low": self.clip_low_sum / n,
            "clip_frac_high": self.clip_high_sum / n,
            "approx_kl": self.approx_kl_sum / n,
            "kl_ref": self.kl_ref_sum / max(self.kl_ref_tokens, 1),
            "ratio_min": self.ratio_min if self.gen_tokens else 1.0,
            "ratio_max": self.ratio_max if self.gen_tokens else 1.0,
            "logprob_mismatch": self.mismatch_sum / n,
            "logprob_mismatch_max": self.mismatch_max,
            "gen_tokens": float(self.gen_tokens),
            "seq_tokens": float(self.seq_tokens),
            "pad_fraction": 1.0 - self.seq_tokens / max(self.padded_tokens, 1),
            "forward_tokens": float(self.forward_tokens),
            "tis_weight_mean": 1.0 if self.tis_sum is None else self.tis_sum / n,
            "tis_capped_frac": self.tis_capped / n,
        } | self.noise


class Trainer:
    """Owns the model being trained, its optimizer, and the step counter (``global_step``).

    Construction seeds torch's global RNG with ``cfg.seed`` (so a run is reproducible), wraps the
    model with LoRA adapters when configured, and moves it to ``device`` (default: CUDA if present).
    ``temperature`` is the rollouts' sampling temperature: the policy trained (its logprobs, the
    ratio, the entropy and the KL) is softmax(logits / temperature), the one that sampled.
    The model is left in eval mode between steps, ready for sampling.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: TrainerConfig,
        device: str | torch.device | None = None,
        temperature: float = 1.0,
    ):
        if not temperature > 0:
            raise ValueError(
                f"Trainer: temperature must be > 0 (the rollouts' sampling temperature), got {temperature}"
            )
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.temperature = float(temperature)  # the policy trained is softmax(logits / temperature)
        self.tokenizer = tokenizer
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = with_lora(model, cfg.lora).to(self.device)
        # Reference for the optional KL term: the initial weights (LoRA: the base, adapters off).
        self.ref_model = None
        if self.measures_kl_ref and cfg.lora is None:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.head = ChunkedHead.of(self.model, self.device) if cfg.chunked_head else None
        # the reference's logprobs through its own chunked head too: its plain path made (B, T, V)
        # logits over the whole trained window, observations included (LoRA: ``head`` serves both)
        self.ref_head = (
            ChunkedHead.of(self.ref_model, self.device)
            if cfg.chunked_head and self.ref_model is not None
            else None
        )
        self.share_prefix = cfg.shared_prefix and supported(self.model, self.device)
        self.causal = cfg.causal_attention and causal.supported(self.model, self.device)
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
        """One optimizer step on ``samples`` (the tasks of ``num_chains`` chains); returns metrics.

        When no sample carries a gradient (no samples at all: every group dropped, or every task
        failed before its first turn; every advantage 0 and no KL term; no generated token among
        those run), no update is made: the weights and the optimizer's moments stay as they are
        (``updated`` = 0). Nor is one made from a gradient that is not finite (``nonfinite_grad``
        = 1): one such step would make every weight NaN, and every checkpoint after it."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.accumulate_gradients(samples, num_chains) if samples else StepStats(samples_run=0)
        updated = stats.gen_tokens > 0
        lr = warmup_lr(self.cfg.lr, updates_made(self.optimizer) + 1, self.cfg.warmup_steps)
        grad_norm = optimizer_step(self.optimizer, self.cfg.grad_clip, lr) if updated else 0.0
        nonfinite = not math.isfinite(grad_norm)
        updated = updated and not nonfinite
        self.global_step += 1
        elapsed = time.perf_counter() - t0
        return {
            **stats.as_metrics(),
            "grad_norm": grad_norm if not nonfinite else -1.0,
            "lr": lr,
            "updated": float(updated),
            "nonfinite_grad": float(nonfinite),
            "samples": float(len(samples)),
            "samples_run": float(stats.samples_run),
            "chains": float(num_chains),
            "train_time_s": elapsed,
            "train_tokens_per_s": stats.seq_tokens / elapsed if elapsed > 0 else 0.0,
        }

    def accumulate_gradients(self, samples: Sequence[Sample], num_chains: int) -> StepStats:
        """Add d loss / d params of the whole batch into ``.grad``, one micro-batch at a time.

        Each micro-batch's loss is normalised by the whole batch (``num_chains``, or its total
        generated tokens for ``token_mean``), so the accumulated gradient is the full-batch one.
        Samples whose gradient is exactly 0 (advantage 0 and no KL term: ``skip_zero_advantage``)
        are not run; they still count in that normalisation, so the gradient is unchanged.
        """
        if not samples:
            raise ValueError("Trainer.step: no samples")
        if num_chains < 1:
            raise ValueError(f"Trainer.step: num_chains must be >= 1, got {num_chains}")
        keyed = [(PreparedSample.of(s), s.group[0]) for s in samples]  # group: its task sequence
        total_tokens = sum(sum(p.mask) for p, _ in keyed)
        if self.cfg.skip_zero_advantage and self.cfg.kl_coef == 0:
            keyed = [(p, k) for p, k in keyed if p.advantage != 0.0]
        prepared = [p for p, _ in keyed]
        stats = StepStats(samples_run=len(prepared))
        if not prepared:
            return stats
        self.model.train()
        args = (self.cfg.micro_batch_size, self.share_prefix, self.cfg.micro_batch_tokens)
        chunks, ends = (
            grouped_micro_batches(keyed, *args)
            if self.cfg.noise_scale
            else (micro_batches(prepared, *args), set())
        )
        root = self._step_prefix(prepared) if len(chunks) > 1 else None
        ref_root = self._ref_prefix(root.ids) if root is not None and self.measures_kl_ref else None
        by_group = GroupGradients([p for p in self.model.parameters() if p.requires_grad]) if ends else None
        for i, chunk in enumerate(chunks):
            n = self._prefix_len(chunk)
            batch = collate(chunk, self.pad_id, self.device, n)
            kl = self.measures_kl_ref and i % self.cfg.kl_ref_every == 0
            stats.add(self._micro_step(batch, num_chains, total_tokens, root, ref_root, kl), batch)
            if by_group is not None and i in ends:  # the group's share through the step prefix too
                if root is not None:
                    root.backward(retain=True)
                by_group.group_done()
        if root is not None:
            root.backward()
            stats.forward_tokens += len(root.ids)
        if by_group is not None:
            stats.noise = by_group.figures(len({s.group[0] for s in samples}))
        self.model.eval()
        return stats

    def _prefix_len(self, group: Sequence[PreparedSample]) -> int:
        """Tokens the group shares and will run once (0: sharing off, or too short to be worth it)."""
        if not self.share_prefix:
            return 0
        n = shareable_len([p.ids for p in group], [p.mask for p in group])
        return n if n >= self.cfg.shared_prefix_min_tokens else 0

    def _step_prefix(self, prepared: Sequence[PreparedSample]) -> StepPrefix | None:
        n = self._prefix_len(prepared)
        if not n:
            return None
        return self._autocast(lambda: StepPrefix.compute(self.model, prepared[0].ids[:n], self.device))

    @torch.no_grad()
    def _ref_prefix(self, ids: tuple[int, ...]) -> RefPrefix:
        """The reference model's keys/values over the step's shared prefix: like the policy's
        (``StepPrefix``), run once a step, not again in each micro-batch."""
        with self._reference() as model:
            return RefPrefix(ids, self._autocast(lambda: prefix_kv(model, ids, self.device)))

    def _past(self, model: Any, b: TokenBatch, root: StepPrefix | RefPrefix | None) -> KV | None:
        """The micro-batch's prefix keys/values through ``model``: the step's prefix (the policy's
        as leaves, with grad; the reference's without) continued by the rest of the micro-batch's
        own prefix."""
        if not b.prefix_ids:
            return None
        start, past = 0, None
        if root is not None and b.prefix_ids[: len(root.ids)] == root.ids:
            start, past = len(root.ids), root.past
        if start == len(b.prefix_ids):
            return past
        return self._autocast(lambda: prefix_kv(model, b.prefix_ids[start:], self.device, past))

    def _micro_step(
        self,
        b: TokenBatch,
        num_chains: int,
        total_tokens: int,
        root: StepPrefix | None = None,
        ref_root: RefPrefix | None = None,
        kl: bool = False,
    ) -> MicroStep:
        # the reference first: its forward's buffers come and go before the policy's activations are kept
        ref_logp_BT = self._ref_logprobs(b, ref_root) if kl else None
        past = self._past(self.model, b, root)
        if self.cfg.old_logprobs == "recompute":
            with torch.no_grad():
                old_logp_BT, _ = self._logprobs(self.model, b, with_entropy=False, past=past)
        logp_BT, entropy_BT = self._logprobs(self.model, b, with_entropy=True, past=past)
        if self.cfg.old_logprobs == "same_pass":
            old_logp_BT = logp_BT.detach()
        cap = self.cfg.tis_cap
        tis_BT = tis_weights(old_logp_BT, b.sampler_logp_BT, cap) if cap is not None else None
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
            weight_BT=tis_BT,
        )
        out.loss.backward()
        assert entropy_BT is not None
        return MicroStep(out, old_logp_BT.detach(), entropy_BT, tis_BT, cap or float("inf"), kl)

    @property
    def measures_kl_ref(self) -> bool:
        """Whether steps compute the k3 KL to the initial model (in the loss, or only logged)."""
        return self.cfg.kl_coef > 0 or self.cfg.log_kl_ref

    @contextlib.contextmanager
    def _forward_mode(self, model: Any) -> Iterator[None]:
        """bf16 autocast where configured; lean activations (``train/lean.py``) when it trains."""
        dtype = self.autocast_dtype
        lean = self.cfg.lean_activations and torch.is_grad_enabled()
        with (
            torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None),
            lean_activations(model, lean),
        ):
            yield

    def _autocast(self, fn: Any) -> Any:
        with self._forward_mode(self.model):
            return fn()

    def _logprobs(
        self, model: Any, b: TokenBatch, with_entropy: bool, past: KV | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        extra: dict[str, Any] = {}
        attention = contextlib.nullcontext()
        if self.causal:  # train/causal.py: one causal mask for every layer, no padding mask
            T = b.ids_BT.shape[1]
            dtype = self.autocast_dtype or next(model.parameters()).dtype
            extra["sage_causal"] = causal.causal_mask(T, len(b.prefix_ids) + T, dtype, self.device)
            attention = causal.attention_as(model, causal.NAME)
        with self._forward_mode(model), attention:
            head = self.head if model is self.model else self.ref_head if model is self.ref_model else None
            if head is not None:
                return head.logprobs(b, with_entropy, past, self.temperature, **extra)
            # Logits only from the first trained position on: prompt logits are never used.
            logits_BTV = model(
                input_ids=b.ids_BT,
                attention_mask=b.attn_full_BT,
                logits_to_keep=b.logits_to_keep,
                past_key_values=as_cache(past, b.ids_BT.shape[0]),
                use_cache=past is not None,
                **extra,
            ).logits
        return token_logprobs(logits_BTV, b.target_BT, with_entropy, self.temperature)

    @torch.no_grad()
    def _ref_logprobs(self, b: TokenBatch, root: RefPrefix | None = None) -> torch.Tensor:
        with self._reference() as model:
            return self._logprobs(model, b, with_entropy=False, past=self._past(model, b, root))[0]

    @contextlib.contextmanager
    def _reference(self) -> Iterator[Any]:
        """The KL reference: the initial weights (LoRA: the base model, its adapters off)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with self.model.disable_adapter():
            yield self.model
