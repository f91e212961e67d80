"""Tensors and bookkeeping for one trainer step: padding, micro-batches, token logprobs, statistics.

Layout of a micro-batch of B sequences right-padded to length T. ``f`` is the first position
that any sequence of the micro-batch trains on (mask = 1); logits are asked for positions f-1 ..
T-1 only (``logits_to_keep``), and logits at t predict the token at t + 1. So every ``_BT`` tensor
of the trained window has T - f columns, aligned with ``target_BT = ids_BT[:, f:]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sage_rl.train.trainer import PreparedSample


@dataclass(frozen=True)
class TokenBatch:
    ids_BT: torch.Tensor  # whole sequences, right-padded with pad_id
    attn_BT: torch.Tensor  # 1 on real tokens, 0 on padding
    target_BT: torch.Tensor  # ids_BT[:, f:], the tokens whose logprobs are computed
    mask_BT: torch.Tensor  # loss mask over target_BT: 1 on generated tokens only
    sampler_logp_BT: torch.Tensor  # the sampler's logprobs over target_BT (0 off the mask)
    adv_B: torch.Tensor
    logits_to_keep: int  # T - f + 1
    seq_tokens: int  # real (non-pad) tokens in the micro-batch

    @property
    def gen_tokens(self) -> int:
        return int(self.mask_BT.sum().item())


def build_optimizer(
    model: Any, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    # fused: one kernel over all parameters (CPU and CUDA); the for-each path is ~10x slower on CPU.
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)


def micro_batches(samples: Sequence[PreparedSample], size: int) -> list[list[PreparedSample]]:
    """Chunks of ``size``, longest first, so that sequences of similar length are padded together."""
    ordered = sorted(samples, key=lambda s: len(s.ids), reverse=True)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def collate(samples: Sequence[PreparedSample], pad_id: int, device: torch.device) -> TokenBatch:
    """Right-pad ``samples`` into one ``TokenBatch`` (nothing is truncated)."""
    T = max(len(s.ids) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    lps = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
        lps[i, :n] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    trained_cols = mask.sum(0).nonzero()
    f = int(trained_cols[0].item()) if len(trained_cols) else T - 1  # no generated token: a 1-column window
    return TokenBatch(
        ids_BT=ids.to(device),
        attn_BT=attn.to(device),
        target_BT=ids[:, f:].to(device),
        mask_BT=mask[:, f:].to(device),
        sampler_logp_BT=lps[:, f:].to(device),
        adv_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        logits_to_keep=T - f + 1,
        seq_tokens=sum(len(s.ids) for s in samples),
    )


def token_logprobs(
    logits_BTV: torch.Tensor, target_BT: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target_t | prefix) from logits whose last column is dropped (it predicts past the end),
    and the entropy of each predictive distribution (detached) when asked."""
    if logits_BTV.shape[1] != target_BT.shape[1] + 1:
        raise ValueError(f"logits cover {logits_BTV.shape[1]} positions, expected {target_BT.shape[1] + 1}")
    logits_BTV = logits_BTV[:, :-1].float()
    lse_BT = torch.logsumexp(logits_BTV, dim=-1)
    logp_BT = logits_BTV.gather(-1, target_BT.unsqueeze(-1)).squeeze(-1) - lse_BT
    entropy_BT = _entropy(logits_BTV.detach(), lse_BT.detach()) if with_entropy else None
    return logp_BT, entropy_BT


@torch.no_grad()
def _entropy(logits_BTV: torch.Tensor, lse_BT: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """H = lse - sum_v p_v z_v, a few positions at a time: one (B, chunk, V) buffer, not (B, T, V)."""
    parts = []
    for t in range(0, logits_BTV.shape[1], chunk):
        z = logits_BTV[:, t : t + chunk]
        parts.append(lse_BT[:, t : t + chunk] - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(parts, dim=1)


@dataclass
class StepStats:
    """Token-weighted sums over the micro-batches of one step (docs/metrics.md defines each)."""

    loss: float = 0.0
    gen_tokens: int = 0
    seq_tokens: int = 0
    padded_tokens: int = 0
    entropy_sum: float = 0.0
    clip_low_sum: float = 0.0
    clip_high_sum: float = 0.0
    approx_kl_sum: float = 0.0
    kl_ref_sum: float = 0.0
    mismatch_sum: float = 0.0
    mismatch_max: float = 0.0
    ratio_min: float = field(default=float("inf"))
    ratio_max: float = field(default=float("-inf"))

    def add(self, result: tuple[Any, torch.Tensor, torch.Tensor], b: TokenBatch) -> None:
        out, old_logp_BT, entropy_BT = result
        n = out.num_tokens
        m = b.mask_BT.bool()
        self.loss += float(out.loss.item())
        self.gen_tokens += n
        self.seq_tokens += b.seq_tokens
        self.padded_tokens += b.ids_BT.numel()
        self.entropy_sum += float(entropy_BT[m].sum().item())
        self.clip_low_sum += out.clip_frac_low * n
        self.clip_high_sum += out.clip_frac_high * n
        self.approx_kl_sum += out.approx_kl * n
        self.kl_ref_sum += out.kl_ref * n
        if n:
            diff = (b.sampler_logp_BT - old_logp_BT.float())[m].abs()
            self.mismatch_sum += float(diff.sum().item())
            self.mismatch_max = max(self.mismatch_max, float(diff.max().item()))
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
            "kl_ref": self.kl_ref_sum / n,
            "ratio_min": self.ratio_min if self.gen_tokens else 1.0,
            "ratio_max": self.ratio_max if self.gen_tokens else 1.0,
            "logprob_mismatch": self.mismatch_sum / n,
            "logprob_mismatch_max": self.mismatch_max,
            "gen_tokens": float(self.gen_tokens),
            "seq_tokens": float(self.seq_tokens),
            "pad_fraction": 1.0 - self.seq_tokens / max(self.padded_tokens, 1),
        }


# --------------------------------------------------------------------------------------------
# Chunked LM head: logprobs of the generated tokens only, without a (B, T, V) logits tensor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkedHead:
    """The model split as decoder (-> final hidden states) + output projection, when that split
    reproduces the model's own logits (checked once by ``ChunkedHead.of``; models that scale or
    soft-cap logits fail the check and use the plain path)."""

    decoder: Any
    head: Any
    chunk: int = 1024  # generated tokens per projection tile
    #: logits (tokens x vocab) that may be kept for backward (2**28 fp32 = 1 GiB); above, tiles are
    #: recomputed in backward instead (one more head forward, memory ~ chunk x vocab)
    max_saved_logits: int = 2**28

    @classmethod
    @torch.no_grad()
    def of(cls, model: Any, device: torch.device) -> ChunkedHead | None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        get_decoder, head = getattr(base, "get_decoder", None), model.get_output_embeddings()
        if get_decoder is None or not isinstance(head, torch.nn.Linear):
            return None
        ids = torch.tensor([[1, 2, 3, 4, 5]], device=device)
        try:
            split = head(get_decoder()(input_ids=ids).last_hidden_state)
            whole = model(input_ids=ids).logits
        except (TypeError, AttributeError, RuntimeError):
            return None
        return cls(get_decoder(), head) if torch.allclose(split, whole, atol=1e-5, rtol=1e-4) else None

    def logprobs(self, b: TokenBatch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logp_BT, entropy_BT) over the trained window; zero off the mask (masked out later)."""
        T = b.ids_BT.shape[1]
        hidden = self.decoder(input_ids=b.ids_BT, attention_mask=b.attn_BT, use_cache=False).last_hidden_state
        window = hidden[:, T - b.logits_to_keep : T - 1]  # position t predicts target t + 1
        sel = b.mask_BT.bool()
        h_ND, target_N = window[sel], b.target_BT[sel]
        n, c = len(target_N), self.chunk
        if n * self.head.out_features <= self.max_saved_logits:
            tiles = [self._tile(h_ND, target_N)] if n else []
        else:  # recompute each tile's logits in backward instead of keeping them
            tiles = [
                torch.utils.checkpoint.checkpoint(
                    self._tile, h_ND[i : i + c], target_N[i : i + c], use_reentrant=False
                )
                for i in range(0, n, c)
            ]
        logp_N, ent_N = [lp for lp, _ in tiles], [e for _, e in tiles]
        logp_BT = torch.zeros(b.mask_BT.shape, dtype=torch.float32, device=hidden.device)
        logp_BT = logp_BT.masked_scatter(sel, torch.cat(logp_N)) if logp_N else logp_BT + 0.0 * hidden.sum()
        entropy_BT = None
        if with_entropy:
            entropy_BT = (
                torch.zeros_like(logp_BT).masked_scatter(sel, torch.cat(ent_N))
                if ent_N
                else torch.zeros_like(logp_BT)
            )
        return logp_BT, entropy_BT

    def _tile(self, h_ND: torch.Tensor, target_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits_NV = self.head(h_ND).float()
        lse_N = torch.logsumexp(logits_NV, dim=-1)
        logp_N = logits_NV.gather(-1, target_N.unsqueeze(-1)).squeeze(-1) - lse_N
        with torch.no_grad():
            ent_N = lse_N - (torch.softmax(logits_NV, dim=-1) * logits_NV).sum(-1)
        return logp_N, ent_N.detach()
