"""Forward passes over the paged KV store (``store.py``): the engine's accelerator path.

:class:`PagedRunner` runs the Llama-family models of ``decoder.NativeRunner`` (same weights, same
arithmetic) with every sequence's keys and values in one :class:`~sage_rl.engine.store.PageStore`:

- **Weights** are the runner's own buffers (``q|k|v`` and ``gate|up`` fused, in ``dtype``),
  allocated once; :meth:`refresh` copies the model's current weights into them in place
  (``copy_``, LoRA adapters folded in), so captured CUDA graphs stay valid after an optimizer step.
- **Prefill** (:meth:`prefill_many`): the new tokens of every sequence admitted together share
  each forward pass; attention is one batched SDPA call per layer over the sequences' pages (padded
  and masked on the device).
- **Decode** (:meth:`decode_step`): one token for each row of a batch held in static device
  buffers (``DecodeBuffers``: last tokens, lengths, block table, uniforms, sampling parameters).
  Positions, the store slots to write and the attention mask all come from the lengths tensor on
  the device; the step writes its keys and values with one indexed write per layer, attends, draws
  with ``device_sampler.draw_tensors``, and advances the tokens and lengths in place. Nothing in
  it reads a tensor back to the host, so on CUDA it is captured as a graph once per batch-size
  bucket (``graphs.py``) and replayed.
- **Attention** in a decode step: ``"gather"`` reads each row's pages through the block table into
  a ``[B, L]`` batch and masks past the length (any device); ``"flex"`` runs torch's
  ``flex_attention`` over the whole store with a block mask built from the block table (no copy of
  the caches; compiled on CUDA, eager and slow on a CPU). ``"auto"`` is ``"gather"`` until the
  GPU check (``benchmarks/gpu_check.sh``) has measured both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sage_rl.engine.adapters import unwrap
from sage_rl.engine.attention import rotate
from sage_rl.engine.decoder import NativeRunner, native_unsupported
from sage_rl.engine.device_sampler import RowParams, draw_tensors
from sage_rl.engine.store import PagedSeq, PageStore

ATTENTION = ("auto", "gather", "flex")
PREFILL_CHUNK = 512  # new tokens per sequence per forward pass: bounds the padded batch


def paged_unsupported(model: Any) -> str | None:
    """Why :class:`PagedRunner` cannot run ``model`` (None when it can)."""
    reason = native_unsupported(model)
    if reason:
        return reason
    config = unwrap(model).config
    scaling = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    if scaling.get("rope_type", scaling.get("type", "default")) in ("dynamic", "longrope"):
        return "rotary embeddings that depend on the sequence length"
    return None


@dataclasses.dataclass
class DecodeBuffers:
    """Static device tensors of a decode step, for up to ``rows`` rows; a batch of B rows uses
    the first B entries (rows past the batch pad a captured bucket and use the scratch page)."""

    tokens: torch.Tensor  # [R] int64: each row's last token, fed by the next step
    lengths: torch.Tensor  # [R] int64: positions written; the next token goes at this position
    table: torch.Tensor  # [R, max_pages] int32: block table
    u: torch.Tensor  # [R] float64: this step's uniforms
    temp: torch.Tensor  # [R] float32
    greedy: torch.Tensor  # [R] bool
    top_k: torch.Tensor  # [R] int64 (vocabulary size = off)
    top_p: torch.Tensor  # [R] float32
    out: torch.Tensor  # [R, 2] float64: the step's token and logprob (one copy back)
    page_of: torch.Tensor | None  # flex: [R, pages] int32, a physical page's index in the row (-1: none)
    kv_blocks: torch.Tensor | None  # flex: [R, 1, 1] int32, pages to visit

    @classmethod
    def allocate(
        cls, rows: int, max_pages: int, pages: int, device: torch.device, flex: bool
    ) -> DecodeBuffers:
        def z(*shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            tokens=z(rows, dtype=torch.long),
            lengths=z(rows, dtype=torch.long),
            table=z(rows, max_pages, dtype=torch.int32),
            u=z(rows, dtype=torch.float64),
            temp=torch.ones(rows, device=device),
            greedy=torch.ones(rows, dtype=torch.bool, device=device),
            top_k=z(rows, dtype=torch.long),
            top_p=torch.ones(rows, device=device),
            out=z(rows, 2, dtype=torch.float64),
            page_of=torch.full((rows, pages), -1, dtype=torch.int32, device=device) if flex else None,
            kv_blocks=z(rows, 1, 1, dtype=torch.int32) if flex else None,
        )


class PagedRunner:
    """Llama-family forward passes over a :class:`PageStore` (see the module docstring).

    ``dtype``: compute dtype (None = the model's own); the store holds keys and values in it too.
    ``rows``: the most rows a decode step takes; ``max_len``: the most positions a sequence holds.
    """

    def __init__(
        self,
        model: Any,
        store_bytes: int,
        dtype: torch.dtype | None = None,
        rows: int = 64,
        max_len: int = 8192,
        page_size: int = 128,
        attention: str = "auto",
    ) -> None:
        reason = paged_unsupported(model)
        if reason:
            raise ValueError(f"PagedRunner cannot run this model: {reason}")
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
        # for its reading of the architecture and the weights; its few-row blocks are never used here
        native = NativeRunner(model, dtype, packed=False)
        self.model, self.hf, self._native = model, native.hf, native
        self.dtype, self.device = native.dtype, native.device
        self.heads, self.kv_heads, self.head_dim = native.heads, native.kv_heads, native.head_dim
        self.scaling, self.eps = native.scaling, native.eps
        self.attention = "gather" if attention == "auto" else attention
        self.page_size, self.max_len = page_size, max_len
        self.max_pages = -(-max_len // page_size)
        page_bytes = PageStore.bytes_per_page(native.cache_shape, page_size, self.dtype)
        pages = max(store_bytes // page_bytes, 2 + rows)
        self.store = PageStore(native.cache_shape, pages, page_size, self.dtype, self.device)
        self.rows = rows
        self.buf = DecodeBuffers.allocate(rows, self.max_pages, pages, self.device, self.attention == "flex")
        self._weights: list[torch.Tensor] = []
        self._bind(self._read_weights())
        with torch.inference_mode():
            pos = torch.arange(max_len, device=self.device)
            probe = torch.zeros(1, dtype=self.dtype, device=self.device)
            cos, sin = self.hf.model.rotary_emb(probe, pos[None])
        self.cos_LD, self.sin_LD = cos[0], sin[0]  # the table NativeRunner computes per call
        self._flex = _compiled_flex() if self.attention == "flex" else None
        self._mask_mod = self._make_mask_mod() if self.attention == "flex" else None

    # ---------------------------------------------------------------- weights
    def _read_weights(self) -> list[torch.Tensor]:
        """The model's current weights in the order :meth:`_bind` lays them out."""
        self._native.refresh()
        n = self._native
        inner = self.hf.model
        flat = [n.embed, n.norm]
        for layer in inner.layers:
            L = NativeRunner._layer(layer, self.dtype, fuse=True)
            b = L.qkv[0][1]
            flat += [L.in_norm, L.post_norm, L.qkv[0][0], b if b is not None else torch.empty(0), L.o[0]]
            flat += [L.o[1] if L.o[1] is not None else torch.empty(0), L.gate_up[0], L.down]
            flat += [t if t is not None else torch.empty(0) for t in (L.q_norm, L.k_norm)]
        tied = n.lm_head is n.embed
        flat.append(torch.empty(0) if tied else n.lm_head)
        return flat

    def _bind(self, flat: list[torch.Tensor]) -> None:
        """Own copies of ``flat`` (allocated once) and the views the forward pass reads."""
        self._weights = [t.detach().to(self.dtype, copy=True).to(self.device) for t in flat]
        w = self._weights
        self.embed, self.norm = w[0], w[1]
        self.lm_head = w[-1] if w[-1].numel() else self.embed
        self.layers = []
        for i in range(len(self.hf.model.layers)):
            in_norm, post_norm, qkv, qkv_b, o, o_b, gate_up, down, qn, kn = w[2 + 10 * i : 12 + 10 * i]
            self.layers.append(
                dict(in_norm=in_norm, post_norm=post_norm, qkv=qkv, qkv_b=qkv_b if qkv_b.numel() else None,
                     o=o, o_b=o_b if o_b.numel() else None, gate_up=gate_up, down=down,
                     q_norm=qn if qn.numel() else None, k_norm=kn if kn.numel() else None)
            )  # fmt: skip

    def refresh(self) -> None:
        """Copy the model's current weights into the runner's buffers, in place (captured graphs
        read the same addresses, so they stay valid)."""
        with torch.inference_mode():
            for dst, src in zip(self._weights, self._read_weights(), strict=True):
                dst.copy_(src)

    # ---------------------------------------------------------------- the layers
    def _forward(self, ids_T, pos_T, slots_T, attend) -> torch.Tensor:
        """Hidden states ``[T, D]``: tokens ``ids_T`` at positions ``pos_T`` whose keys and values
        go to store positions ``slots_T``; ``attend(layer, q_THD)`` reads the store after the write."""
        T, H, KV, Dh = ids_T.shape[0], self.heads, self.kv_heads, self.head_dim
        h_TD = F.embedding(ids_T, self.embed)
        cos_T1D, sin_T1D = self.cos_LD[pos_T][:, None], self.sin_LD[pos_T][:, None]
        kv = self.store.kv
        for i, L in enumerate(self.layers):
            x_TD = F.rms_norm(h_TD, h_TD.shape[-1:], L["in_norm"], self.eps)
            qkv = F.linear(x_TD, L["qkv"], L["qkv_b"])
            v_TKD = qkv[:, (H + KV) * Dh :].view(T, KV, Dh)
            if L["q_norm"] is None:
                qk = rotate(qkv[:, : (H + KV) * Dh].view(T, H + KV, Dh), cos_T1D, sin_T1D)
                q_THD, k_TKD = qk[:, :H], qk[:, H:]
            else:
                q_THD = F.rms_norm(qkv[:, : H * Dh].view(T, H, Dh), (Dh,), L["q_norm"], self.eps)
                k_TKD = F.rms_norm(
                    qkv[:, H * Dh : (H + KV) * Dh].view(T, KV, Dh), (Dh,), L["k_norm"], self.eps
                )
                q_THD, k_TKD = rotate(q_THD, cos_T1D, sin_T1D), rotate(k_TKD, cos_T1D, sin_T1D)
            kv[i, 0][:, slots_T] = k_TKD.transpose(0, 1)  # one indexed write per layer
            kv[i, 1][:, slots_T] = v_TKD.transpose(0, 1)
            a_THD = attend(i, q_THD * self.scaling)
            h_TD = h_TD + F.linear(a_THD.reshape(T, H * Dh), L["o"], L["o_b"])
            x_TD = F.rms_norm(h_TD, h_TD.shape[-1:], L["post_norm"], self.eps)
            gate, up = F.linear(x_TD, L["gate_up"]).chunk(2, dim=-1)
            h_TD = h_TD + F.linear(F.silu(gate) * up, L["down"])
        return h_TD

    def _logits(self, h_BD: torch.Tensor) -> torch.Tensor:
        h_BD = F.rms_norm(h_BD, h_BD.shape[-1:], self.norm, self.eps)
        return F.linear(h_BD, self.lm_head).float()

    # ---------------------------------------------------------------- prefill
    def prefill_many(self, seqs: list[PagedSeq], id_lists: list[list[int]]) -> torch.Tensor:
        """Feed ``id_lists[j]`` (at least one token each) to ``seqs[j]``, whose pages must already
        hold room for them (``PageStore.reserve``); appends the ids; float32 logits ``[N, V]``
        after each sequence's last token."""
        last: list[torch.Tensor | None] = [None] * len(seqs)
        for at in range(0, max(len(ids) for ids in id_lists), PREFILL_CHUNK):
            part = [(j, ids[at : at + PREFILL_CHUNK]) for j, ids in enumerate(id_lists) if len(ids) > at]
            h_TD, ends = self._prefill_chunk([seqs[j] for j, _ in part], [c for _, c in part])
            for (j, chunk), end in zip(part, ends, strict=True):
                seqs[j].ids.extend(chunk)
                last[j] = h_TD[end - 1]
        return self._logits(torch.stack(last))  # type: ignore[arg-type]

    def _prefill_chunk(self, seqs: list[PagedSeq], chunks: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        N, starts = len(seqs), [len(s) for s in seqs]
        lens = [len(c) for c in chunks]
        Tm, Lm = max(lens), max(s + n for s, n in zip(starts, lens, strict=True))
        T = sum(lens)
        pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        slots = np.concatenate(
            [self.store.slots(q, s, n) for q, s, n in zip(seqs, starts, lens, strict=True)]
        )
        q_index = np.full((N, Tm), T, dtype=np.int64)  # T: a zero row appended to the queries
        kv_index = np.zeros((N, Lm), dtype=np.int64)  # padding reads the scratch page
        q_pos = np.full((N, Tm), -1, dtype=np.int64)
        kv_len = np.zeros((N, 1), dtype=np.int64)
        at = 0
        for j, (seq, s, n) in enumerate(zip(seqs, starts, lens, strict=True)):
            q_index[j, :n] = np.arange(at, at + n)
            q_pos[j, :n] = np.arange(s, s + n)
            kv_index[j, : s + n] = self.store.slots(seq, 0, s + n)
            kv_len[j] = s + n
            at += n
        dev = self.device
        q_index_t, kv_index_t = torch.from_numpy(q_index).to(dev), torch.from_numpy(kv_index).to(dev)
        kv_pos = np.arange(Lm)[None, None, :]
        allowed = (kv_pos <= q_pos[:, :, None]) & (kv_pos < kv_len[:, :, None])
        allowed[:, :, 0] |= q_pos < 0  # padding queries attend to something (their output is dropped)
        mask_N1TL = torch.from_numpy(allowed).to(dev)[:, None]
        flat_T = torch.from_numpy(_flat(q_index, T)).to(dev)
        G = self.heads // self.kv_heads

        def attend(i: int, q_THD: torch.Tensor) -> torch.Tensor:
            q_pad = torch.cat([q_THD, q_THD.new_zeros(1, *q_THD.shape[1:])])[q_index_t]  # [N, Tm, H, Dh]
            k_KNLD = self.store.kv[i, 0][:, kv_index_t]
            v_KNLD = self.store.kv[i, 1][:, kv_index_t]
            k_NHLD = k_KNLD.transpose(0, 1).repeat_interleave(G, dim=1)
            v_NHLD = v_KNLD.transpose(0, 1).repeat_interleave(G, dim=1)
            o_NHTD = F.scaled_dot_product_attention(
                q_pad.transpose(1, 2), k_NHLD, v_NHLD, mask_N1TL, scale=1.0
            )
            return o_NHTD.transpose(1, 2).reshape(N * Tm, *q_THD.shape[1:])[flat_T]

        ids_T = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=dev)
        h_TD = self._forward(ids_T, torch.from_numpy(pos).to(dev), torch.from_numpy(slots).to(dev), attend)
        return h_TD, list(np.cumsum(lens))

    # ---------------------------------------------------------------- decode
    def decode_step(self, B: int, pages: int, filtered: bool, advance: bool = True) -> None:
        """One decode step over the first ``B`` rows of :attr:`buf`, attending over at most
        ``pages`` pages a row (gather). Writes ``buf.out[:B]`` (token, logprob); with ``advance``
        also the next tokens into ``buf.tokens`` and ``lengths + 1``. Device operations only."""
        b, P = self.buf, self.page_size
        pos_B = b.lengths[:B]
        page_B = b.table[:B].gather(1, (pos_B // P)[:, None]).long()[:, 0]
        slots_B = page_B * P + pos_B % P
        if self.attention == "gather":
            L = pages * P
            idx_BL = (b.table[:B, :pages].long()[:, :, None] * P + torch.arange(P, device=self.device)).view(
                B, L
            )
            pad_B11L = (torch.arange(L, device=self.device) > pos_B[:, None])[:, None, None, :]
            attend = self._gather_attend(idx_BL, pad_B11L)
        else:
            b.kv_blocks[:B, 0, 0] = (pos_B // P + 1).int()  # type: ignore[index]
            attend = self._flex_attend(B)
        h_BD = self._forward(b.tokens[:B], pos_B, slots_B, attend)
        params = RowParams(b.temp[:B], b.greedy[:B], b.top_k[:B], b.top_p[:B])
        tokens_B, logp_B = draw_tensors(self._logits(h_BD), params, b.u[:B], filtered)
        b.out[:B, 0] = tokens_B.double()
        b.out[:B, 1] = logp_B.double()
        if advance:
            b.tokens[:B] = tokens_B
            b.lengths[:B] += 1

    def _gather_attend(self, idx_BL: torch.Tensor, pad_B11L: torch.Tensor):
        G = self.heads // self.kv_heads

        def attend(i: int, q_BHD: torch.Tensor) -> torch.Tensor:
            B, H, Dh = q_BHD.shape
            k_KBLD = self.store.kv[i, 0][:, idx_BL]
            v_KBLD = self.store.kv[i, 1][:, idx_BL]
            q_BKGD = q_BHD.view(B, self.kv_heads, G, Dh)
            s_BKGL = torch.matmul(q_BKGD, k_KBLD.permute(1, 0, 3, 2)).float()
            p_BKGL = torch.softmax(s_BKGL.masked_fill(pad_B11L, float("-inf")), dim=-1)
            return torch.matmul(p_BKGL.to(q_BHD.dtype), v_KBLD.transpose(0, 1)).view(B, H, Dh)

        return attend

    def _make_mask_mod(self):
        page_of, lengths, P = self.buf.page_of, self.buf.lengths, self.page_size

        def mask_mod(b, h, q_idx, kv_idx):  # kv_idx: a position in the whole store
            logical = page_of[b, kv_idx // P]  # type: ignore[index]
            return (logical >= 0) & (logical * P + kv_idx % P <= lengths[b])

        return mask_mod

    def _flex_attend(self, B: int):
        from torch.nn.attention.flex_attention import BlockMask

        b = self.buf
        S = self.store.kv.shape[3]
        mask = BlockMask.from_kv_blocks(
            b.kv_blocks[:B], b.table[:B, None, None, :], BLOCK_SIZE=(128, self.page_size),  # type: ignore[index]
            mask_mod=self._mask_mod, seq_lengths=(1, S), compute_q_blocks=False,
        )  # fmt: skip

        def attend(i: int, q_BHD: torch.Tensor) -> torch.Tensor:
            k, v = self.store.kv[i, 0][None], self.store.kv[i, 1][None]
            o = self._flex(q_BHD[:, :, None, :], k, v, block_mask=mask, scale=1.0, enable_gqa=True)
            return o[:, :, 0]

        return attend

    def set_page_of(self, rows: int, bucket: int) -> None:
        """flex: rebuild each row's physical-to-logical page map from the block table (after the
        batch or its pages changed); padding rows ``[rows, bucket)`` own the scratch page."""
        b = self.buf
        if b.page_of is None:
            return
        b.page_of.fill_(-1)
        t = b.table[:bucket].long()
        logical = torch.arange(t.shape[1], device=self.device, dtype=torch.int32).expand_as(t)
        b.page_of[:bucket].scatter_(1, t, logical)
        b.page_of[:, 0] = -1  # table padding points at the scratch page: it belongs to no row
        b.page_of[rows:bucket, 0] = 0


def _flat(q_index: np.ndarray, T: int) -> np.ndarray:
    """Positions in the flattened ``[N * Tm]`` padded batch of the T real queries, in order."""
    flat = np.empty(T, dtype=np.int64)
    rows, cols = np.nonzero(q_index < T)
    flat[q_index[rows, cols]] = rows * q_index.shape[1] + cols
    return flat


def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    if torch.cuda.is_available():
        return torch.compile(flex_attention, dynamic=False)
    return flex_attention  # eager: the dense reference implementation, for tests
