"""The native runners' attention and rotary embedding, as plain torch functions (``decoder.py``
for the per-sequence caches, ``cuda_step.py`` for the paged store)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Queries from which causal attention goes through torch's fused kernel (on a CPU its flash
# attention: 2.1x the two products below at 79 queries over 1,100 keys, 3.1-3.5x at 362-512; 0.9x
# at 8. docs/LOG.md, 2026-12-04, twenty-ninth session).
FUSED_MIN = 16


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, as transformers' ``apply_rotary_pos_emb`` (rotate_half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attend_causal(q_THD, k_KLD, v_KLD, start: int, out_THD) -> None:
    """Causal attention of T queries at positions ``start..start+T-1`` over L = start + T keys
    (grouped-query: each of the KV heads serves H / KV query heads). ``q`` is pre-scaled."""
    T, H, Dh = q_THD.shape
    KV, L = k_KLD.shape[0], k_KLD.shape[1]
    if T >= FUSED_MIN:  # query t sees keys 0..start+t; head h reads KV head h // (H / KV)
        mask_TL = torch.ones((T, L), dtype=torch.bool, device=q_THD.device).tril(start)
        o_1HTD = F.scaled_dot_product_attention(
            q_THD.transpose(0, 1)[None],
            k_KLD[None],
            v_KLD[None],
            attn_mask=mask_TL,
            scale=1.0,
            enable_gqa=True,
        )
        out_THD.copy_(o_1HTD[0].transpose(0, 1))
        return
    G = H // KV
    q_KQD = q_THD.view(T, KV, G, Dh).permute(1, 2, 0, 3).reshape(KV, G * T, Dh)
    s_KGTL = torch.bmm(q_KQD, k_KLD.transpose(1, 2)).view(KV, G, T, L)
    # Every query sees the whole cached prefix; only the new keys after it need a mask (masking
    # all L columns cost ~7% of a 60-token admission over a 1,000-token cache).
    future_TT = torch.ones((T, T), dtype=torch.bool, device=q_THD.device).triu(1)
    s_KGTL[..., start:].masked_fill_(future_TT, float("-inf"))
    p_KQL = torch.softmax(s_KGTL, dim=-1).view(KV, G * T, L)
    o_KQD = torch.bmm(p_KQL, v_KLD)
    out_THD.copy_(o_KQD.view(KV, G, T, Dh).permute(2, 0, 1, 3).reshape(T, H, Dh))


def attend_padded(q_BHD, kv_B2KD, layer_kv: list[torch.Tensor], starts: list[int], out_BHD) -> None:
    """Attention of one new token per row (positions ``starts``), each over its own cache
    (``layer_kv[b]``: the row's ``[2, KV, capacity, Dh]`` for this layer), after writing the new
    keys and values into the caches; the caches are right-padded into one ``[B, L, ...]`` batch and
    the padding is masked out. ``q`` is pre-scaled."""
    B, H, Dh = q_BHD.shape
    KV = kv_B2KD.shape[2]
    for b, (kv, start) in enumerate(zip(layer_kv, starts, strict=True)):
        kv[:, :, start] = kv_B2KD[b]
    lengths = [s + 1 for s in starts]
    kv_BL2KD = torch.nn.utils.rnn.pad_sequence(
        [kv[:, :, :n].permute(2, 0, 1, 3) for kv, n in zip(layer_kv, lengths, strict=True)], batch_first=True
    )
    k_BKDL = kv_BL2KD[:, :, 0].permute(0, 2, 3, 1)
    v_BKLD = kv_BL2KD[:, :, 1].permute(0, 2, 1, 3)
    s_BKGL = torch.matmul(q_BHD.view(B, KV, H // KV, Dh), k_BKDL)
    L = kv_BL2KD.shape[1]
    pad_BL = torch.arange(L) >= torch.tensor(lengths)[:, None]
    s_BKGL = s_BKGL.masked_fill(pad_BL.to(s_BKGL.device)[:, None, None, :], float("-inf"))
    o_BKGD = torch.matmul(torch.softmax(s_BKGL, dim=-1), v_BKLD)
    out_BHD.copy_(o_BKGD.reshape(B, H, Dh))


def attend_pooled(q_BHD, new_B2KD, pool_2SKCD, slots_B, pos_B, bias_S1L, in_order, shared, out_BHD) -> None:
    """Attention of one new token per row, the rows' caches being slots of one pool
    (``engine/pool.py``; ``pool_2SKCD``: this layer's ``[k|v, slots, KV, capacity, Dh]``): one
    indexed write of the new keys and values (row b's at slot ``slots_B[b]``, position
    ``pos_B[b]``), then one batched product over the first ``S`` slots, masked by adding
    ``bias_S1L`` (``DecodePool.attention_bias``: 0 or -inf); ``in_order``: row b sits in slot b
    (no reordering of ``q`` and the output). ``shared``: None, or ``(P, slot)`` when every row holds the same first
    P positions: those keys and values are read once, from ``slot``, for all rows' queries
    (one softmax over the joined scores: the same sums, in another order). ``q`` is pre-scaled."""
    B, H, Dh = q_BHD.shape
    S, L = bias_S1L.shape[0], bias_S1L.shape[2]
    KV = pool_2SKCD.shape[2]
    G = H // KV
    pool_2SKCD[:, slots_B, :, pos_B] = new_B2KD.to(pool_2SKCD.dtype)  # bf16 weights, a float32 pool
    P, source = shared if shared is not None else (0, 0)
    k_NLD = pool_2SKCD[0, :S].flatten(0, 1)[:, P:L]
    v_NLD = pool_2SKCD[1, :S].flatten(0, 1)[:, P:L]
    q_SHD = q_BHD if in_order else q_BHD.new_zeros(S, H, Dh).index_copy_(0, slots_B, q_BHD)
    q_NGD = q_SHD.reshape(S * KV, G, Dh)
    s_NGL = torch.bmm(q_NGD, k_NLD.transpose(1, 2))
    if P:  # the shared prefix: all S x G queries of a KV head against its P keys, in one product
        k_KPD, v_KPD = pool_2SKCD[0, source, :, :P], pool_2SKCD[1, source, :, :P]
        q_KQD = q_SHD.view(S, KV, G, Dh).transpose(0, 1).reshape(KV, S * G, Dh)
        s_KQP = torch.bmm(q_KQD, k_KPD.transpose(1, 2))
        s_NGP = s_KQP.view(KV, S, G, P).transpose(0, 1).reshape(S * KV, G, P)
        s_NGL = torch.cat((s_NGP, s_NGL), dim=-1)
    s_NGL.view(S, H, L).add_(bias_S1L)
    p_NGL = torch.softmax(s_NGL, dim=-1)
    o_NGD = torch.bmm(p_NGL[..., P:], v_NLD)
    if P:
        p_KQP = p_NGL[..., :P].reshape(S, KV, G, P).transpose(0, 1).reshape(KV, S * G, P)
        o_KQD = torch.bmm(p_KQP, v_KPD)
        o_NGD += o_KQD.view(KV, S, G, Dh).transpose(0, 1).reshape(S * KV, G, Dh)
    o_SHD = o_NGD.view(S, H, Dh)
    out_BHD.copy_(o_SHD if in_order else o_SHD.index_select(0, slots_B))
