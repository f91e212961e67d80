"""The transformers fallback runner: :class:`HFRunner` has the operations of
:class:`~sage_rl.engine.decoder.NativeRunner` (``prefill``, ``prefill_many``, ``decode``, ``refresh``,
``new_cache``) through the model's own forward, for the architectures the native runner does not cover
(``decoder.make_runner`` picks)."""

from __future__ import annotations

from typing import Any

import torch

from sage_rl.engine.kv import KVCache


class HFRunner:
    """The same operations through the model's own transformers forward, one sequence at a time
    (for architectures :class:`NativeRunner` does not cover). Correct, not fast."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache_shape = _probe_cache_shape(model)

    def refresh(self) -> None:
        """Nothing to re-read: the model's own forward reads its parameters."""

    def new_cache(self) -> KVCache:
        return KVCache(self.cache_shape, self.dtype, self.device)

    def prefill(self, cache: KVCache, ids: list[int]) -> torch.Tensor:
        from transformers import DynamicCache

        start = len(cache)
        past = DynamicCache()
        if start:
            for i in range(cache.layers):
                past.update(cache.keys(i, start)[None], cache.values(i, start)[None], i)
        pos = torch.arange(start, start + len(ids), device=self.device)[None]
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=pos,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.reserve(len(ids))
        for i, layer in enumerate(out.past_key_values.layers):
            cache.kv[i, 0, :, start : start + len(ids)] = layer.keys[0, :, start:]
            cache.kv[i, 1, :, start : start + len(ids)] = layer.values[0, :, start:]
        cache.ids.extend(ids)
        return out.logits[0, -1].float()

    def decode(self, caches: list[KVCache], ids: list[int]) -> torch.Tensor:
        return torch.stack([self.prefill(c, [i]) for c, i in zip(caches, ids, strict=True)])

    def prefill_many(self, caches: list[KVCache], id_lists: list[list[int]]) -> torch.Tensor:
        return torch.stack([self.prefill(c, ids) for c, ids in zip(caches, id_lists, strict=True)])


def _probe_cache_shape(model: Any) -> tuple[int, int, int]:
    with torch.inference_mode():
        out = model(
            input_ids=torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device),
            use_cache=True,
        )
    layers = getattr(out.past_key_values, "layers", None)
    if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        raise ValueError(
            f"unsupported cache type for {type(model).__name__}: {type(out.past_key_values).__name__}"
        )
    _, heads, _, dim = layers[0].keys.shape
    return len(layers), heads, dim
