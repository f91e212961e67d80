"""The token-level clipped surrogate of GRPO, as SAGE optimises it (SAGE.md section 5). Pure: tensors
in, a scalar to minimise and diagnostics out; no model, no I/O.

Per generated token t of sample i, with s = exp(logp - old_logp) and advantage A_i::

    l_it = -min(s * A_i, clip(s, 1 - eps_low, 1 + eps_high) * A_i)     [+ kl_coef * k3_it]

Aggregations (mask m = 1 on generated tokens only):

- ``seq_mean_token_mean`` (the paper's): token mean within each sample, summed over samples,
  divided by the number of chains: L = (1 / num_chains) sum_i (sum_t m_it l_it / sum_t m_it).
  Samples are the tasks of the chains, so this is "summed over the chain positions, averaged over
  chains". A sample with no generated token contributes 0.
- ``token_mean``: L = sum_it m_it l_it / num_tokens, num_tokens = all generated tokens of the batch.

``num_chains`` must be given for ``seq_mean_token_mean``: the rows of a batch are the K tasks of
each chain, so their count is not the number of chains. ``num_tokens`` defaults to this batch's
own count. A trainer that splits a batch into micro-batches passes the whole batch's values, so
the micro-batch losses sum to the full loss.

KL to a reference policy (off by default) is the k3 estimator of KL(pi || pi_ref),
k3 = exp(ref - logp) - (ref - logp) - 1, aggregated like the surrogate.

Truncated importance sampling (TIS, off by default): when the tokens were sampled by another
engine or in another precision than the trainer's, the surrogate of token t is weighted by
w_it = min(exp(old_logp_it - sampler_logp_it), C) (``tis_weights``; a constant, no gradient):

    l_it = -w_it * min(s * A_i, clip(s, 1 - eps_low, 1 + eps_high) * A_i)     [+ kl_coef * k3_it]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sage_rl.train.config import LossAgg


@dataclass(frozen=True)
class LossOutput:
    """The loss to minimise (a graph-connected scalar) and detached diagnostics over masked tokens.

    ``clip_frac_low``: share of tokens with s < 1 - eps_low and A < 0 (clipped, no gradient);
    ``clip_frac_high``: share with s > 1 + eps_high and A > 0; ``approx_kl``: mean k3 estimate of
    KL(old || current), (s - 1) - log s; ``kl_ref``: mean k3 to the reference (0 when off).
    """

    loss: torch.Tensor
    num_tokens: int
    clip_frac_low: float
    clip_frac_high: float
    approx_kl: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    kl_ref: float


def aggregate(
    x_BT: torch.Tensor, mask_BT: torch.Tensor, agg: LossAgg, num_chains: float, num_tokens: float
) -> torch.Tensor:
    """Masked aggregation of per-token values (module docstring)."""
    masked_BT = x_BT * mask_BT
    if LossAgg(agg) is LossAgg.SEQ_MEAN_TOKEN_MEAN:
        per_seq_B = masked_BT.sum(-1) / mask_BT.sum(-1).clamp(min=1.0)
        return per_seq_B.sum() / num_chains
    return masked_BT.sum() / max(num_tokens, 1.0)


def _check_shapes(
    logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor
) -> None:
    if logp_BT.shape != old_logp_BT.shape or logp_BT.shape != mask_BT.shape or logp_BT.dim() != 2:
        raise ValueError(
            f"clipped_surrogate: logp {tuple(logp_BT.shape)}, old_logp {tuple(old_logp_BT.shape)} and mask "
            f"{tuple(mask_BT.shape)} must all be the same (B, T)"
        )
    if adv_B.shape != logp_BT.shape[:1]:
        raise ValueError(
            f"clipped_surrogate: adv must be (B,) = {tuple(logp_BT.shape[:1])}, got {tuple(adv_B.shape)}"
        )


def tis_weights(old_logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(exp(old_logp - sampler_logp), cap), detached: the trainer's
    old probability of each sampled token over the sampler's, capped at ``cap`` (> 0)."""
    if not cap > 0:
        raise ValueError(f"tis_weights: cap must be > 0, got {cap}")
    if old_logp_BT.shape != sampler_logp_BT.shape:
        raise ValueError(
            f"tis_weights: old_logp {tuple(old_logp_BT.shape)} and sampler_logp "
            f"{tuple(sampler_logp_BT.shape)} differ in shape"
        )
    return torch.exp(old_logp_BT.detach().float() - sampler_logp_BT.detach().float()).clamp(max=cap)


def clipped_surrogate(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: LossAgg = LossAgg.SEQ_MEAN_TOKEN_MEAN,
    num_chains: float | None = None,
    num_tokens: float | None = None,
    ref_logp_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    weight_BT: torch.Tensor | None = None,
) -> LossOutput:
    """The GRPO clipped-surrogate loss to minimise (module docstring). ``old_logp_BT``,
    ``ref_logp_BT`` and ``weight_BT`` (per-token weights of the surrogate, e.g. ``tis_weights``)
    are treated as constants (detached). ``num_chains`` is required for ``seq_mean_token_mean``
    (ValueError otherwise)."""
    _check_shapes(logp_BT, old_logp_BT, adv_B, mask_BT)
    if num_chains is None and LossAgg(agg) is LossAgg.SEQ_MEAN_TOKEN_MEAN:
        raise ValueError(
            "clipped_surrogate: seq_mean_token_mean divides by the number of chains; pass num_chains "
            "(the K samples of one chain are not K chains)"
        )
    mask_BT = mask_BT.to(logp_BT.dtype)
    n_chains = float(num_chains or 1)
    n_tokens = float(mask_BT.sum().item()) if num_tokens is None else float(num_tokens)
    log_ratio_BT = logp_BT - old_logp_BT.detach()
    ratio_BT = torch.exp(log_ratio_BT)
    adv_B1 = adv_B.to(logp_BT.dtype).unsqueeze(-1)
    clipped_BT = torch.clamp(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
    per_token_BT = -torch.minimum(ratio_BT * adv_B1, clipped_BT * adv_B1)
    if weight_BT is not None:
        if weight_BT.shape != logp_BT.shape:
            raise ValueError(
                f"clipped_surrogate: weight {tuple(weight_BT.shape)} must be {tuple(logp_BT.shape)}"
            )
        per_token_BT = weight_BT.detach().to(per_token_BT.dtype) * per_token_BT
    kl_ref_BT = torch.zeros_like(per_token_BT)
    if ref_logp_BT is not None:  # measured whenever given; in the loss only with a coefficient
        delta_BT = ref_logp_BT.detach() - (logp_BT if kl_coef != 0.0 else logp_BT.detach())
        kl_ref_BT = torch.exp(delta_BT) - delta_BT - 1.0
        if kl_coef != 0.0:
            per_token_BT = per_token_BT + kl_coef * kl_ref_BT
    loss = aggregate(per_token_BT, mask_BT, agg, n_chains, n_tokens)
    return _with_diagnostics(loss, ratio_BT, log_ratio_BT, adv_B1, mask_BT, kl_ref_BT, eps_low, eps_high)


@torch.no_grad()
def _with_diagnostics(
    loss: torch.Tensor,
    ratio_BT: torch.Tensor,
    log_ratio_BT: torch.Tensor,
    adv_B1: torch.Tensor,
    mask_BT: torch.Tensor,
    kl_ref_BT: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> LossOutput:
    m = mask_BT.bool()
    n = int(m.sum().item())

    def mean(x_BT: torch.Tensor) -> float:
        return float(x_BT[m].float().mean().item()) if n else 0.0

    low = (ratio_BT < 1.0 - eps_low) & (adv_B1 < 0)
    high = (ratio_BT > 1.0 + eps_high) & (adv_B1 > 0)
    ratios = ratio_BT[m]
    return LossOutput(
        loss=loss,
        num_tokens=n,
        clip_frac_low=mean(low),
        clip_frac_high=mean(high),
        approx_kl=mean(ratio_BT - 1.0 - log_ratio_BT),
        ratio_mean=mean(ratio_BT),
        ratio_min=float(ratios.min().item()) if n else 1.0,
        ratio_max=float(ratios.max().item()) if n else 1.0,
        kl_ref=mean(kl_ref_BT),
    )
