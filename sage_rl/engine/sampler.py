"""Drawing the next token of every row of a batch at once, with exact logprobs.

Each row draws with inverse-CDF sampling from one uniform number of its own stream
(``random.Random`` seeded per request): the token is the first whose cumulative probability
exceeds ``u * total``. One ``log_softmax`` and one ``cumsum`` over the ``[B, V]`` logits serve
all the rows: no per-row pass over the 49k-token vocabulary (it used to be the largest cost
outside ``forward`` with small models, docs/LOG.md). Rows with top-k or top-p go through
:func:`sampling_logprobs` on their own. A row's draw depends only on its logits and its stream,
never on the other rows of the batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from sage_rl.types import SamplingParams


def sampling_logprobs(logits_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the distribution to sample from, over the vocabulary.

    ``logits / temperature``, then top-k (keep the k largest), then top-p (keep the smallest
    prefix of tokens, by decreasing probability, whose mass reaches p), renormalised; removed
    tokens get ``-inf``. ``temperature <= 0`` returns the plain ``log_softmax(logits)``.
    """
    logits = logits_V.float()
    if params.temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # the first token is always kept
        drop = order[mass_before >= params.top_p]
        logits = logits.index_fill(-1, drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def _filtered(params: SamplingParams, vocab: int) -> bool:
    return params.temperature > 0 and (0 < params.top_k < vocab or params.top_p < 1.0)


def draw(
    logits_BV: torch.Tensor, params: Sequence[SamplingParams], streams: Sequence[random.Random]
) -> tuple[list[int], list[float]]:
    """The next token of each row and its logprob under the distribution it was drawn from
    (the contract of ``sage_rl.policies.transformers_policy``). Greedy rows take the argmax
    and report the plain ``log_softmax`` (temperature 1); they consume no random number."""
    B, V = logits_BV.shape
    device = logits_BV.device
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    scaled_BV = logits_BV.float()
    if any(t != 1.0 for t in temps):
        scaled_BV = scaled_BV / torch.tensor(temps, device=device)[:, None]
    logp_BV = torch.log_softmax(scaled_BV, dim=-1)
    for b, p in enumerate(params):
        if _filtered(p, V):
            logp_BV[b] = sampling_logprobs(logits_BV[b], p)
    sampled = [b for b, p in enumerate(params) if p.temperature > 0]
    tokens = logp_BV.argmax(dim=-1)
    if sampled:
        rows = torch.tensor(sampled, device=device)
        probs_SV = (logp_BV if len(sampled) == B else logp_BV[rows]).exp()
        cdf_SV = torch.cumsum(probs_SV, dim=-1, dtype=torch.float64)
        u_S1 = torch.tensor([[streams[b].random()] for b in sampled], dtype=torch.float64, device=device)
        # First token whose cumulative mass exceeds u * total: never a zero-probability token.
        picked = torch.searchsorted(cdf_SV, u_S1 * cdf_SV[:, -1:], right=True)[:, 0]
        tokens[rows] = torch.minimum(picked, (cdf_SV < cdf_SV[:, -1:]).sum(-1))
    chosen = tokens.tolist()
    return chosen, logp_BV[torch.arange(B, device=device), tokens].tolist()
