"""attention.attend_causal, both of its ways (the two products for a few queries, torch's fused
kernel from FUSED_MIN on): causal attention of T new queries over a cache of start + T positions,
grouped-query, against the definition computed in float64."""

from __future__ import annotations

import pytest
import torch

from sage_rl.engine import attention


def _reference(q_THD, k_KLD, v_KLD, start):
    T, H, _ = q_THD.shape
    KV, L = k_KLD.shape[0], k_KLD.shape[1]
    k_HLD = k_KLD.double().repeat_interleave(H // KV, dim=0)  # head h reads KV head h // (H / KV)
    v_HLD = v_KLD.double().repeat_interleave(H // KV, dim=0)
    s_HTL = torch.einsum("thd,hld->htl", q_THD.double(), k_HLD)
    seen_TL = torch.arange(L)[None, :] <= start + torch.arange(T)[:, None]
    p_HTL = torch.softmax(s_HTL.masked_fill(~seen_TL, float("-inf")), dim=-1)
    return torch.einsum("htl,hld->thd", p_HTL, v_HLD)


@pytest.mark.parametrize("T", [1, 5, attention.FUSED_MIN, 40])
@pytest.mark.parametrize("start", [0, 37])
def test_attend_causal_is_causal_attention(T, start):
    g = torch.Generator().manual_seed(T * 100 + start)
    H, KV, Dh, capacity = 6, 2, 16, 128
    q = torch.randn(T, H, Dh, generator=g) * 0.5
    kv = torch.randn(2, KV, capacity, Dh, generator=g)  # a cache's layer: its first L positions used
    L = start + T
    out = torch.full((T, H, Dh), float("nan"))
    attention.attend_causal(q, kv[0, :, :L], kv[1, :, :L], start, out)
    want = _reference(q, kv[0, :, :L], kv[1, :, :L], start)
    assert torch.allclose(out.double(), want, atol=1e-5), float((out.double() - want).abs().max())
    # the first query sees the prefix and itself only: changing a later key leaves it as it was
    if T > 1:
        kv[0, :, start + 1] += 10.0
        again = torch.empty_like(out)
        attention.attend_causal(q, kv[0, :, :L], kv[1, :, :L], start, again)
        assert torch.equal(again[0], out[0]) and not torch.allclose(again[1], out[1])
