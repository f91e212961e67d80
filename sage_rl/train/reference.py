"""One GRPO step of SAGE, top to bottom: the reference the trainer is tested against (STYLE.md, 8).

Given samples (the exact token ids of each episode, a mask that is 1 on generated tokens, one
advantage each) from ``num_chains`` chains, one strictly on-policy step (SAGE.md section 5) is

    s_it = pi_theta(o_it | o_<t) / pi_old(o_it | o_<t)      pi_old = pi_theta, detached
    L    = -(1 / num_chains) sum_i (1 / |o_i|) sum_t min(s_it A_i, clip(s_it, 1 - eps_low, 1 + eps_high) A_i)

then the gradient's global norm is clipped and AdamW takes one step. Nothing else: no
micro-batches, no chunked LM head, no KL term, no autocast. ``train/trainer.py`` computes the same
step with all of those; ``tests/test_reference.py`` checks that both give the same loss and the
same updated weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sage_rl.types import Sample


def grpo_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    num_chains: int,
    pad_id: int = 0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    grad_clip: float = 1.0,
) -> float:
    """One optimizer step on ``samples``; returns the loss L."""
    device = next(model.parameters()).device

    # 1. The exact token arrays of each episode, right-padded into one (B, T) batch.
    rows = [s.trajectory.token_arrays() for s in samples]
    B, T = len(rows), max(len(ids) for ids, _, _ in rows)
    ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    attn_BT = torch.zeros((B, T), dtype=torch.long)
    mask_BT = torch.zeros((B, T))
    for i, (ids, mask, _) in enumerate(rows):
        ids_BT[i, : len(ids)] = torch.tensor(ids)
        attn_BT[i, : len(ids)] = 1
        mask_BT[i, : len(ids)] = torch.tensor(mask, dtype=torch.float32)
    ids_BT, attn_BT, mask_BT = ids_BT.to(device), attn_BT.to(device), mask_BT.to(device)
    adv_B = torch.tensor([float(s.advantage) for s in samples], device=device)

    # 2. log pi_theta of every token given the ones before it: logits at t predict token t + 1.
    model.train()
    logits_BTV = model(input_ids=ids_BT, attention_mask=attn_BT).logits.float()
    logp_BT = torch.log_softmax(logits_BTV[:, :-1], dim=-1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    mask_BT = mask_BT[:, 1:]  # aligned with the predicted tokens

    # 3. The importance ratio. One step per batch, so the old policy is this very model.
    ratio_BT = torch.exp(logp_BT - logp_BT.detach())

    # 4. The clipped surrogate of every token (only generated tokens will count).
    adv_B1 = adv_B[:, None]
    clipped_BT = ratio_BT.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss_BT = -torch.minimum(ratio_BT * adv_B1, clipped_BT * adv_B1)

    # 5. Token mean within each episode, summed over episodes, divided by the number of chains.
    per_sample_B = (loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1.0)
    loss = per_sample_B.sum() / num_chains

    # 6. Backward, clip the global gradient norm, one AdamW step.
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
    optimizer.step()
    model.eval()
    return float(loss.item())
