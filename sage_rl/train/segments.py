"""Attention over a packed SFT row by its segments, not over the whole row (issue 32).

A packed row is ``[shared head | example 1 | example 2 | ... | padding]``: each example's tokens
attend causally to the head and to their own example, never across examples (``sft_data.collate``
draws that as a dense ``T x T`` mask). Given the dense mask, the CPU's fused attention computes
every one of the ``T^2`` scores and masks most of them away; on the main job's 1,900-token rows
(a ~850-token head and three examples) that was 41% of an SFT step (docs/LOG.md).

Here the row's attention runs as what it is:

- the head, causally over itself;
- each example, over ``[head, example]``, causal within the example;
- padding attends to nothing and outputs zeros: no trained token sees it, so no loss or
  gradient changes.

That is ``h^2/2 + sum_i n_i (h + n_i)`` scores in place of ``T^2`` (2.3x fewer on that row) and
the same numbers as the dense mask up to float rounding (tests/test_sft_segments.py). It is
transformers' attention interface: ``segment_attention`` is registered as ``"sage_segments"`` and
``forward_loss_sum`` switches the model to it for its own forward, with the row layouts as a
keyword argument that the model hands down to every attention call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from sage_rl.train.causal import attention_as
from sage_rl.train.sft_data import HEAD, PAD

NAME = "sage_segments"


@dataclass(frozen=True)
class RowLayout:
    """One packed row: ``head`` tokens shared at its start, then each example as ``(start, end)``."""

    head: int
    spans: tuple[tuple[int, int], ...]


def layouts(segment_BT: torch.Tensor) -> tuple[RowLayout, ...]:
    """Each row's layout from its segment ids (``HEAD``, ``PAD`` or the example's index, laid out
    head first, then examples in order, then padding)."""
    out = []
    for row in segment_BT.tolist():
        head = sum(1 for s in row if s == HEAD)
        spans: list[tuple[int, int]] = []
        for t in range(head, len(row)):
            if row[t] == PAD:
                break
            if spans and row[t] == row[t - 1]:
                spans[-1] = (spans[-1][0], t + 1)
            else:
                spans.append((t, t + 1))
        out.append(RowLayout(head, tuple(spans)))
    return tuple(out)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, head: int
) -> torch.Tensor:
    """Causal attention of ``q`` (the last ``n`` of ``k``'s positions) over ``k``, whose first
    ``head`` positions every query sees. Shapes ``[1, H, n, D]`` and ``[1, Hkv, head + n, D]``."""
    n = q.shape[-2]
    if head == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    mask = torch.ones(n, head + n, dtype=torch.bool, device=q.device)
    mask[:, head:] = torch.tril(mask[:, head:])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def segment_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sage_segments: tuple[RowLayout, ...] | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, T, D]``, ``key``/``value``
    ``[B, Hkv, T, D]``; returns ``([B, T, H, D], None)``. The dense ``attention_mask`` is not read."""
    if sage_segments is None:
        raise ValueError("segment attention needs the rows' layouts (sage_segments=...)")
    if dropout:
        raise ValueError("segment attention has no dropout")
    B, H, T, D = query.shape
    rows = []
    for b, lay in enumerate(sage_segments):
        q, k, v = query[b : b + 1], key[b : b + 1], value[b : b + 1]
        h = lay.head
        parts = [_attend(q[:, :, :h], k[:, :, :h], v[:, :, :h], scaling, 0)] if h else []
        for s, e in lay.spans:
            kk = torch.cat([k[:, :, :h], k[:, :, s:e]], dim=2)
            vv = torch.cat([v[:, :, :h], v[:, :, s:e]], dim=2)
            parts.append(_attend(q[:, :, s:e], kk, vv, scaling, h))
        end = lay.spans[-1][1] if lay.spans else h
        if end < T:
            parts.append(query.new_zeros(1, H, T - end, D))
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, segment_attention)


def segmented(model: Any) -> contextlib.AbstractContextManager[None]:
    """Run ``model``'s attention as :func:`segment_attention` inside the block."""
    return attention_as(model, NAME)
