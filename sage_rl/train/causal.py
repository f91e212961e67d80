"""RL training attention over right-padded rows: one causal mask per forward, shared by every layer.

Given a padding mask, transformers' SDPA path hands every layer a boolean ``(B, 1, T, P + T)``
mask; torch's CPU attention converts it to a float mask at each call and keeps that copy for
backward, so a forward keeps one ``B x T x (P + T)`` float32 mask per layer (30 on SmolLM2): memory
that grows with the square of the sample's length. It also repeats the key/value heads to the query
heads before the call and keeps those copies. On laptop30's step 12, a micro-batch holding a
4,184-token sample grew the RL process to 24.3 GB and the kernel killed it (docs/LOG.md,
2026-12-05).

The trainer's rows are right-padded (``batch.collate``): every padding position comes after a row's
real tokens, so the causal mask alone keeps each real token off the padding, and what padding
positions compute is never read (the loss mask). Here the trainer builds one float ``(T, P + T)``
bottom-right causal mask per forward (``causal_mask``) and hands it down to every layer as the
keyword ``sage_causal``; each layer runs torch's SDPA with it and ``enable_gqa``. torch keeps that
one tensor (not a copy per layer) and the key/value heads unrepeated. The real tokens' numbers are
those of the padding mask up to float rounding (tests/test_train_causal.py); ``supported`` checks that
on a probe batch before a trainer uses it, so a model whose attention is not plain causal SDPA
(sliding windows, soft-capping, ...) keeps transformers' own path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

NAME = "sage_causal"


def causal_mask(queries: int, keys: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(queries, keys)``: 0 where query ``t`` (at position ``keys - queries + t``) may see key ``l``
    (``l <= keys - queries + t``), ``-inf`` elsewhere."""
    allowed = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
    return torch.zeros(queries, keys, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))


def causal_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sage_causal: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, T, D]``, ``key``/``value``
    ``[B, Hkv, P + T, D]``; returns ``([B, T, H, D], None)``. ``attention_mask`` is not read."""
    if sage_causal is None:
        raise ValueError("causal attention needs the forward's mask (sage_causal=...)")
    if dropout:
        raise ValueError("causal attention has no dropout")
    for name in ("sliding_window", "softcap"):
        if kwargs.get(name) is not None:
            raise ValueError(f"causal attention does not do {name}")
    mask = sage_causal if sage_causal.dtype == query.dtype else sage_causal.to(query.dtype)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, causal_attention)
AttentionMaskInterface.register(NAME, lambda *args, **kwargs: None)  # the layers build no mask of their own


@contextlib.contextmanager
def attention_as(model: Any, name: str) -> Iterator[None]:
    """Run ``model``'s attention as the registered function ``name`` inside the block."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


@torch.no_grad()
def supported(model: Any, device: torch.device) -> bool:
    """Whether ``model`` on a right-padded probe batch, with and without a prefix cache, gives the
    logits of its own attention on every real token through ``causal_attention``."""
    from sage_rl.train.prefix import PROBE_PREFIX, as_cache, prefix_kv, probe_batch

    was_training = model.training
    model.eval()
    try:
        ids, attn = probe_batch(device)
        dtype = model.get_input_embeddings().weight.dtype
        whole = model(input_ids=ids, attention_mask=attn).logits
        past = prefix_kv(model, PROBE_PREFIX, device)  # as the trainer runs it: the model's own path
        with attention_as(model, NAME):
            ours = model(
                input_ids=ids, attention_mask=attn, sage_causal=causal_mask(8, 8, dtype, device)
            ).logits
            split = model(
                input_ids=ids[:, 4:],
                attention_mask=attn,
                past_key_values=as_cache(past, 2),
                use_cache=True,
                sage_causal=causal_mask(4, 8, dtype, device),
            ).logits
    except (TypeError, AttributeError, RuntimeError, ValueError):
        return False
    finally:
        model.train(was_training)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a, b, atol=1e-4, rtol=1e-4)

    return (
        close(whole[0], ours[0])
        and close(whole[1, :6], ours[1, :6])
        and close(whole[0, 4:], split[0])
        and close(whole[1, 4:6], split[1, :2])
    )
