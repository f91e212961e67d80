"""The sampler of ``sampler.py`` as tensor operations only: no host synchronisation inside a step.

Same contract and the same arithmetic as :func:`sage_rl.engine.sampler.draw`, so that for the same
logits and the same uniforms it picks the same tokens and reports the same logprobs: each sampled
row draws by inverse CDF with one uniform number of its own stream (``u_B``, drawn on the host and
sent with one copy), the first token whose float64 cumulative probability exceeds ``u * total``;
greedy rows take the argmax and report the plain ``log_softmax`` (their temperature is 1 here and
their uniform unused). The per-row parameters arrive as tensors, so the whole draw can be captured
in a CUDA graph; the only host work is building those tensors when the batch changes.

Top-k and top-p are applied batched (:func:`filter_logits`, the operations of
``sampler.sampling_logprobs`` row-wise); the engine runs that variant only when a row of the batch
asks for it.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class RowParams:
    """A batch's sampling parameters as device tensors (one entry a row): ``temp_B`` (1.0 for
    greedy rows), ``greedy_B`` (bool), ``top_k_B`` (int64; the vocabulary size = off), ``top_p_B``
    (float32; 1.0 = off)."""

    temp_B: torch.Tensor
    greedy_B: torch.Tensor
    top_k_B: torch.Tensor
    top_p_B: torch.Tensor


def filter_logits(scaled_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """Top-k (keep the k largest), then top-p (the smallest prefix by decreasing probability whose
    mass reaches p; the first token always kept); removed tokens get ``-inf``. Rows with k = V and
    p = 1 are unchanged."""
    V = scaled_BV.shape[-1]
    sorted_BV, _ = torch.sort(scaled_BV, dim=-1, descending=True, stable=True)
    kth_B1 = sorted_BV.gather(1, (top_k_B.clamp(1, V) - 1)[:, None])
    scaled_BV = scaled_BV.masked_fill(scaled_BV < kth_B1, float("-inf"))
    sorted_BV, order_BV = torch.sort(scaled_BV, dim=-1, descending=True, stable=True)
    probs_BV = torch.softmax(sorted_BV, dim=-1)
    mass_before_BV = torch.cumsum(probs_BV, dim=-1) - probs_BV
    drop_sorted_BV = (mass_before_BV >= top_p_B[:, None]) & (top_p_B[:, None] < 1.0)
    drop_BV = torch.zeros_like(drop_sorted_BV).scatter(1, order_BV, drop_sorted_BV)
    return scaled_BV.masked_fill(drop_BV, float("-inf"))


def draw_tensors(
    logits_BV: torch.Tensor, params: RowParams, u_B: torch.Tensor, filtered: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens_B int64, logprobs_B float32)`` on the logits' device; ``u_B`` float64 uniforms
    in [0, 1). ``filtered``: apply each row's top-k/top-p (greedy rows are never filtered)."""
    scaled_BV = logits_BV.float() / params.temp_B[:, None]
    if filtered:
        sampled = ~params.greedy_B
        k_B = torch.where(sampled, params.top_k_B, scaled_BV.shape[-1])
        p_B = torch.where(sampled, params.top_p_B, 1.0)
        scaled_BV = filter_logits(scaled_BV, k_B, p_B)
    logp_BV = torch.log_softmax(scaled_BV, dim=-1)
    cdf_BV = torch.cumsum(logp_BV.exp(), dim=-1, dtype=torch.float64)
    total_B1 = cdf_BV[:, -1:]
    # First token whose cumulative mass exceeds u * total: never a zero-probability token.
    picked_B = torch.searchsorted(cdf_BV, u_B[:, None] * total_B1, right=True)[:, 0]
    picked_B = torch.minimum(picked_B, (cdf_BV < total_B1).sum(-1))
    tokens_B = torch.where(params.greedy_B, logp_BV.argmax(dim=-1), picked_B)
    return tokens_B, logp_BV.gather(1, tokens_B[:, None])[:, 0]
