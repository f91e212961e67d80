"""Forward passes over per-sequence KV caches: the native one for Llama-family decoders, and (in
``hf_runner.py``) a plain transformers one for every other causal LM.

Both runners have the same operations: ``prefill(cache, ids)`` feeds one sequence's new tokens
(chunked), ``prefill_many(caches, id_lists)`` several sequences' (the native runner in shared
forward passes: an admission reads the weights once, not once per request) and ``decode(caches,
ids)`` feeds one token to each of several sequences; all append to the caches and return the
float32 logits of the last fed position(s). ``refresh()``
re-reads the model's weights; the engine calls it when it is told they changed
(``Engine.weights_changed``: a trainer updates the model object in place), and drops the caches
computed with the old ones. Nothing here detects a change by itself.

:class:`NativeRunner` (plain Llama, Mistral, Qwen2 and Qwen3 models, without sliding windows or
adapters) batches every linear layer over the rows of a decode step; on a CPU the rows' caches
are slots of one pool (``pool.py``) attended with two batched products a layer, elsewhere each row
attends over its own cache (no cache copies either way: a transformers ``DynamicCache``
re-concatenates the whole cache at every step). Its weights are views of the model's parameters
when ``dtype`` is the model's own, or a converted copy (``q|k|v`` and ``gate|up`` fused) otherwise,
e.g. bfloat16 compute for a float32 model on a CPU with AVX512-BF16: about 3x less time in the
matrix products. On a CPU the cache and the attention stay float32 (faster there; docs/LOG.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from sage_rl.engine import native
from sage_rl.engine.adapters import effective_linear, projection_problem, unwrap
from sage_rl.engine.attention import attend_causal, attend_padded, attend_pooled, rotate
from sage_rl.engine.hf_runner import HFRunner
from sage_rl.engine.kv import KVCache
from sage_rl.engine.packed import MAX_ROWS, layer_blocks, pack, packed_linear, wanted
from sage_rl.engine.pool import SHARED_MIN, DecodePool

NATIVE_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_CLASS_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
PREFILL_CHUNK = 512  # queries per attention block: bounds the scores tensor for long prompts


def native_unsupported(model: Any) -> str | None:
    """Why :class:`NativeRunner` cannot run ``model`` (None when it can). A peft LoRA wrapper
    around a supported model is supported (``adapters.py``)."""
    model = unwrap(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in NATIVE_TYPES:
        return f"model_type {model_type!r} is not one of {NATIVE_TYPES}"
    if type(model).__name__ != f"{_CLASS_PREFIX[model_type]}ForCausalLM":
        return f"{type(model).__name__} is not a plain transformers *ForCausalLM"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    if getattr(config, "use_sliding_window", False) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        return f"layer types {sorted(set(layer_types))}"
    if type(model.lm_head) is not torch.nn.Linear or type(model.model.embed_tokens) is not torch.nn.Embedding:
        return "the embedding or the LM head is wrapped (peft modules_to_save?)"
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            problem = projection_problem(p)
            if problem:
                return problem
    return None


@dataclasses.dataclass
class _Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]]  # one fused projection, or q, k, v
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate_up: list[torch.Tensor]  # one fused projection, or gate, up
    down: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    #: the same projections as column blocks for few rows (``engine/packed.py``), by name
    #: ("qkv", "o", "gate_up", "down"): (blocks, fused bias); empty when not packed
    blocks: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = dataclasses.field(default_factory=dict)


def _linear(m: Any, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    w, b, _ = effective_linear(m)
    return w.to(dtype), (b.to(dtype) if b is not None else None)


def _fuse(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.cat([p[0] for p in parts])
    b = torch.cat([p[1] for p in parts]) if parts[0][1] is not None else None
    return w, b


class NativeRunner:
    """Llama-family forward passes in ``dtype`` (None = the model's own)."""

    def __init__(
        self,
        model: Any,
        dtype: torch.dtype | None = None,
        packed: bool | None = None,
        pooled: bool | None = None,
    ) -> None:
        reason = native_unsupported(model)
        if reason:
            raise ValueError(f"NativeRunner cannot run this model: {reason}")
        self.model, self.hf = model, unwrap(model)  # hf: the transformers model (inside peft)
        inner = self.hf.model
        attn = inner.layers[0].self_attn
        self.dtype = dtype or inner.embed_tokens.weight.dtype
        self.device = inner.embed_tokens.weight.device
        self.heads = self.hf.config.num_attention_heads
        self.kv_heads = self.hf.config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = getattr(attn, "scaling", self.head_dim**-0.5)
        self.eps = inner.norm.variance_epsilon
        self.cache_shape = (len(inner.layers), self.kv_heads, self.head_dim)
        # On a CPU, attention over a float32 cache is faster than over a bfloat16 one: the
        # bfloat16 batched products copy strided operands, the float32 ones run at memory speed.
        self.kv_dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        # Decode attention: on a CPU each row attends over its own cache (no copies); on an
        # accelerator, where every small kernel costs a launch, the rows' caches are padded into
        # one batch and attended by a few batched kernels instead of three per row (2x at 64
        # rows on an H200: docs/LOG.md, 2026-11-26).
        self.padded_decode = self.device.type != "cpu"
        # On a CPU the decode batch's caches are seated in one pool (engine/pool.py) and a layer
        # attends all rows with two batched products (None = on a CPU).
        pooled = self.device.type == "cpu" if pooled is None else pooled
        self.pool = DecodePool(self.cache_shape, self.kv_dtype, self.device) if pooled else None
        # Few-row products through column blocks (engine/packed.py): None = where they pay
        # (float32 on a CPU) and their second copy of the weights fits (a quarter of free memory).
        size = sum(p.numel() for p in self.hf.parameters()) * self.dtype.itemsize
        self.packed = wanted(self.device, self.dtype, size) if packed is None else packed
        self.refresh()

    # ---------------------------------------------------------------- weights
    def refresh(self) -> None:
        """Re-read the weights: views of the parameters in the model's dtype, else converted
        copies (LoRA adapters folded in). Called when the weights changed (``Engine``)."""
        inner, dt = self.hf.model, self.dtype
        copy = dt != inner.embed_tokens.weight.dtype or self.hf is not self.model  # LoRA: folded copies
        self.embed = inner.embed_tokens.weight.detach().to(dt)
        self.norm = inner.norm.weight.detach().to(dt)
        head = self.hf.lm_head.weight
        same = head.data_ptr() == inner.embed_tokens.weight.data_ptr()
        self.lm_head = self.embed if same else head.detach().to(dt)
        self.layers = [self._layer(layer, dt, fuse=copy) for layer in inner.layers]
        self.head_blocks = pack([self.lm_head]) if self.packed else None
        if self.packed:
            for layer in self.layers:
                layer.blocks = layer_blocks(layer)
        # the compiled decode step (engine/native.py) where it applies: float32, packed, pooled;
        # built here (on first use, ~20 s) rather than inside a decode step, which would hold the loop
        fits = self.pool is not None and self.packed and dt == torch.float32 and self.head_dim in (64, 128)
        fits = fits and not native.disabled() and native.decode_kernel() is not None
        self.kernel_weights = native.layer_tensors(self.layers) if fits else None

    @staticmethod
    def _layer(layer: Any, dt: torch.dtype, fuse: bool) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        qkv = [_linear(a.q_proj, dt), _linear(a.k_proj, dt), _linear(a.v_proj, dt)]
        gate_up = [_linear(m.gate_proj, dt)[0], _linear(m.up_proj, dt)[0]]
        norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        return _Layer(
            in_norm=layer.input_layernorm.weight.detach().to(dt),
            post_norm=layer.post_attention_layernorm.weight.detach().to(dt),
            qkv=[_fuse(qkv)] if fuse else qkv,
            o=_linear(a.o_proj, dt),
            gate_up=[torch.cat(gate_up)] if fuse else gate_up,
            down=_linear(m.down_proj, dt)[0],
            q_norm=norm[0].weight.detach().to(dt) if norm[0] is not None else None,
            k_norm=norm[1].weight.detach().to(dt) if norm[1] is not None else None,
        )

    def new_cache(self) -> KVCache:
        return KVCache(self.cache_shape, self.kv_dtype, self.device)

    # ---------------------------------------------------------------- forward passes
    def prefill(self, cache: KVCache, ids: list[int]) -> torch.Tensor:
        """Feed ``ids`` to one sequence; the float32 logits ``[V]`` after its last token."""
        return self.prefill_many([cache], [ids])[0]

    def prefill_many(self, caches: list[KVCache], id_lists: list[list[int]]) -> torch.Tensor:
        """Feed ``id_lists[j]`` (at least one token) to sequence ``caches[j]``; the float32 logits
        ``[N, V]`` after each one's last token. The sequences share each forward pass (chunk k of
        every sequence together), so the linear layers read the weights once for all of them; each
        attends over its own cache."""
        last: list[torch.Tensor] = [torch.empty(0)] * len(caches)
        for at in range(0, max(len(ids) for ids in id_lists), PREFILL_CHUNK):
            part = [
                (c, ids[at : at + PREFILL_CHUNK], j)
                for j, (c, ids) in enumerate(zip(caches, id_lists, strict=True))
                if len(ids) > at
            ]
            starts, lengths = [len(c) for c, _, _ in part], [len(chunk) for _, chunk, _ in part]
            for (c, _, _), n in zip(part, lengths, strict=True):
                c.reserve(n)
            pos_T = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
            ids = [t for _, chunk, _ in part for t in chunk]
            h_TD = self._forward(ids, pos_T, [c for c, _, _ in part], starts, lengths)
            end = 0
            for c, chunk, j in part:
                c.ids.extend(chunk)
                end += len(chunk)
                last[j] = h_TD[end - 1]
        return self._logits(torch.stack(last))

    def decode(self, caches: list[KVCache], ids: list[int]) -> torch.Tensor:
        """Feed one token to each sequence; float32 logits ``[B, V]``."""
        starts = [len(c) for c in caches]
        seats = self._seat(caches, starts)
        for c in caches:
            c.reserve(1)
        if seats is not None and self.kernel_weights is not None:
            h_BD = native.decode_step(self, native.decode_kernel(), self.kernel_weights, ids, seats)
        else:
            h_BD = self._forward(ids, torch.tensor(starts), caches, starts, seats=seats)
        for c, i in zip(caches, ids, strict=True):
            c.ids.append(i)
        return self._logits(h_BD)

    def _seat(self, caches: list[KVCache], starts: list[int]) -> tuple | None:
        """Seat a decode batch's caches in the pool: (slots, positions, score bias, whether row b
        sits in slot b, the shared prefix) for ``attend_pooled``, or None for the per-row path (no
        pool, one row, the pool full, or more than half its span idle)."""
        if self.pool is None or len(caches) < 2:
            return None
        slots = self.pool.seat(caches, 1)
        if slots is None or max(slots) + 1 > 2 * len(slots):
            return None
        bias = self.pool.attention_bias(slots, [s + 1 for s in starts])
        in_order = slots == list(range(len(slots)))  # row b in slot b: no reordering of q and out
        shared = self.pool.shared_prefix(caches)
        shared_at = (shared, slots[0]) if shared >= SHARED_MIN else None
        slots_B, starts_B = torch.tensor(slots, device=self.device), torch.tensor(starts, device=self.device)
        return slots_B, starts_B, bias, in_order, shared_at

    def _logits(self, h_BD: torch.Tensor) -> torch.Tensor:
        h_BD = F.rms_norm(h_BD, h_BD.shape[-1:], self.norm, self.eps)
        if self.head_blocks is not None and h_BD.shape[0] <= MAX_ROWS:
            kernel = native.decode_kernel() if self.kernel_weights is not None else None  # its own product
            product = kernel.blocked_product if kernel is not None else torch.matmul
            return packed_linear(h_BD, self.head_blocks, product=product).float()
        return F.linear(h_BD, self.lm_head).float()

    def _forward(
        self,
        ids: list[int],
        pos_T: torch.Tensor,
        caches: list[KVCache],
        starts: list[int],
        lengths: list[int] | None = None,
        seats: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[T, D]`` for T tokens: ``lengths[j]`` consecutive tokens for each
        sequence ``caches[j]``, or (``lengths`` None) one token per sequence."""
        ids_T = torch.tensor(ids, dtype=torch.long, device=self.device)
        h_TD = F.embedding(ids_T, self.embed)
        cos, sin = self.hf.model.rotary_emb(h_TD, pos_T.to(self.device)[None])
        cos_T1D, sin_T1D = cos[0, :, None, :], sin[0, :, None, :]
        few = len(ids) <= MAX_ROWS
        for i, layer in enumerate(self.layers):
            x_TD = F.rms_norm(h_TD, h_TD.shape[-1:], layer.in_norm, self.eps)
            a_TD = self._attention(i, layer, x_TD, cos_T1D, sin_T1D, caches, starts, lengths, seats)
            h_TD = h_TD + _project(layer, "o", a_TD, few)
            x_TD = F.rms_norm(h_TD, h_TD.shape[-1:], layer.post_norm, self.eps)
            gate, up = _project(layer, "gate_up", x_TD, few).chunk(2, dim=-1)
            h_TD = h_TD + _project(layer, "down", F.silu(gate) * up, few)
        return h_TD

    def _attention(self, i, layer, x_TD, cos_T1D, sin_T1D, caches, starts, lengths, seats) -> torch.Tensor:
        T, H, KV, Dh = x_TD.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = _project(layer, "qkv", x_TD, T <= MAX_ROWS)
        v_TKD = qkv[:, (H + KV) * Dh :].view(T, KV, Dh)
        if layer.q_norm is None:  # rotate queries and keys in one pass
            qk_TND = rotate(qkv[:, : (H + KV) * Dh].view(T, H + KV, Dh), cos_T1D, sin_T1D)
            q_THD, k_TKD = qk_TND[:, :H], qk_TND[:, H:]
        else:
            q_THD = F.rms_norm(qkv[:, : H * Dh].view(T, H, Dh), (Dh,), layer.q_norm, self.eps)
            k_TKD = F.rms_norm(qkv[:, H * Dh : (H + KV) * Dh].view(T, KV, Dh), (Dh,), layer.k_norm, self.eps)
            q_THD, k_TKD = rotate(q_THD, cos_T1D, sin_T1D), rotate(k_TKD, cos_T1D, sin_T1D)
        q_THD = (q_THD * self.scaling).to(self.kv_dtype)
        out_THD = torch.empty_like(q_THD)
        if len(caches) == 1:  # one sequence, T new tokens
            cache, start = caches[0], starts[0]
            cache.kv[i, 0, :, start : start + T] = k_TKD.transpose(0, 1)
            cache.kv[i, 1, :, start : start + T] = v_TKD.transpose(0, 1)
            attend_causal(q_THD, cache.keys(i, start + T), cache.values(i, start + T), start, out_THD)
        elif lengths is not None:  # several sequences, lengths[j] new tokens each
            at = 0
            for cache, start, n in zip(caches, starts, lengths, strict=True):
                cache.kv[i, 0, :, start : start + n] = k_TKD[at : at + n].transpose(0, 1)
                cache.kv[i, 1, :, start : start + n] = v_TKD[at : at + n].transpose(0, 1)
                q, out = q_THD[at : at + n], out_THD[at : at + n]
                attend_causal(q, cache.keys(i, start + n), cache.values(i, start + n), start, out)
                at += n
        elif seats is not None:  # one new token per sequence, the caches slots of one pool
            attend_pooled(q_THD, torch.stack((k_TKD, v_TKD), 1), self.pool.kv[i], *seats, out_THD)
        elif self.padded_decode:  # one new token per sequence, the caches padded into a batch
            attend_padded(q_THD, torch.stack((k_TKD, v_TKD), 1), [c.kv[i] for c in caches], starts, out_THD)
        else:  # one new token per sequence, each attending over its own cache
            G = H // KV  # views made once per layer, not per row: the loop is ~8 ops a row
            new_T2KD = torch.stack((k_TKD, v_TKD), 1).unbind(0)
            q_TKGD, out_TKGD = q_THD.view(T, KV, G, Dh).unbind(0), out_THD.view(T, KV, G, Dh).unbind(0)
            for cache, start, new, q_KGD, out_KGD in zip(
                caches, starts, new_T2KD, q_TKGD, out_TKGD, strict=True
            ):
                kv_2KCD = cache.by_layer[i]
                kv_2KCD.select(2, start).copy_(new)
                k_KLD, v_KLD = kv_2KCD[:, :, : start + 1].unbind(0)
                p_KGL = torch.softmax(torch.bmm(q_KGD, k_KLD.transpose(1, 2)), dim=-1)
                torch.bmm(p_KGL, v_KLD, out=out_KGD)
        return out_THD.view(T, H * Dh).to(self.dtype)


def _project(layer: _Layer, name: str, x_TK: torch.Tensor, few: bool) -> torch.Tensor:
    """Projection ``name`` ("qkv", "o", "gate_up", "down") of ``x``, fused outputs concatenated:
    through its column blocks for few rows when it has them, else the BLAS product."""
    packed = layer.blocks.get(name) if few else None
    if packed is not None:
        return packed_linear(x_TK, *packed)
    if name == "qkv":
        return _cat([F.linear(x_TK, w, b) for w, b in layer.qkv])
    if name == "gate_up":
        return _cat([F.linear(x_TK, w) for w in layer.gate_up])
    return F.linear(x_TK, *layer.o) if name == "o" else F.linear(x_TK, layer.down)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, -1) if len(parts) > 1 else parts[0]


def make_runner(
    model: Any, dtype: torch.dtype | None, packed: bool | None = None, pooled: bool | None = None
) -> NativeRunner | HFRunner:
    """The native runner where it applies (``packed``, ``pooled``: its column blocks and decode
    pool, None = where they pay), else the transformers one (which keeps the model's dtype:
    converting a whole foreign model is not worth its memory)."""
    if native_unsupported(model) is None:
        return NativeRunner(model, dtype, packed, pooled)
    return HFRunner(model)
