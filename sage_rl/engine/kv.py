"""Per-sequence KV caches and the store that keeps them between turns.

A :class:`KVCache` holds the keys and values of one token sequence, ``kv[layer, k|v, head, pos,
dim]``, together with the ids of the tokens it was computed from (``ids``: position ``i`` of the
cache is token ``ids[i]``). Capacity grows by doubling, so appending is amortised O(1).

The :class:`PrefixStore` keeps the caches of finished turns. A new request reuses the cache that
shares the longest prefix with its prompt: the whole cache when its ids are a prefix of the prompt
(the next turn of the same episode: only the new observation tokens are prefilled), otherwise a
copy of the shared positions (the G chains of a group, or tasks sharing a system prompt). The key
at position ``i`` depends only on ``ids[:i + 1]`` and the weights, so a shared prefix is exact;
the store is emptied whenever the weights change.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from sage_rl.engine.pool import DecodePool

_MIN_CAPACITY = 256
_VERSIONS = itertools.count()  # KVCache.version: unique over the process's caches and truncations


class KVCache:
    """Keys and values of one sequence. ``len(self)`` positions are valid."""

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> None:
        self.layers, self.heads, self.dim = shape
        self.dtype, self.device = dtype, device
        self.kv = torch.empty((self.layers, 2, self.heads, 0, self.dim), dtype=dtype, device=device)
        self.by_layer = self.kv.unbind(0)  # per layer [k|v, heads, capacity, dim] views of ``kv``
        self.ids: list[int] = []
        #: changes whenever a position's token may change (new cache, truncation); appends keep it
        self.version = next(_VERSIONS)
        self.pool: DecodePool | None = None  # the pool whose slot ``kv`` is a view of (engine/pool.py)
        self.slot = -1

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more positions (doubling the capacity when it runs out)."""
        need = len(self) + n
        if need <= self.kv.shape[3]:
            return
        if self.pool is not None and self.pool.grow(self.pool.slots, need):
            return
        self.own(need)

    def own(self, need: int = 0) -> None:
        """Move to storage of its own (out of a pool's slot), with room for ``need`` positions."""
        capacity = max(_MIN_CAPACITY, self.kv.shape[3] if self.pool is None else len(self))
        while capacity < need:
            capacity *= 2
        grown = torch.empty(
            (self.layers, 2, self.heads, capacity, self.dim), dtype=self.dtype, device=self.device
        )
        grown[:, :, :, : len(self)] = self.kv[:, :, :, : len(self)]
        self.pool, self.slot = None, -1
        self.adopt(grown)

    def adopt(self, kv: torch.Tensor) -> None:
        """Use ``kv`` (``[layers, k|v, heads, capacity, dim]``, holding this cache's positions)."""
        self.kv, self.by_layer = kv, kv.unbind(0)

    def keys(self, layer: int, end: int) -> torch.Tensor:
        """``[heads, end, dim]`` view of the layer's keys at positions ``[0, end)``."""
        return self.kv[layer, 0, :, :end]

    def values(self, layer: int, end: int) -> torch.Tensor:
        return self.kv[layer, 1, :, :end]

    def truncate(self, n: int) -> None:
        """Forget positions ``n`` and later (their storage is reused by the next writes)."""
        if n < len(self.ids):
            del self.ids[n:]
            self.version = next(_VERSIONS)

    def copy_prefix(self, n: int) -> KVCache:
        """A new cache holding this one's first ``n`` positions."""
        new = KVCache((self.layers, self.heads, self.dim), self.dtype, self.device)
        new.reserve(n)
        new.kv[:, :, :, :n] = self.kv[:, :, :, :n]
        new.ids = self.ids[:n]
        return new


def common_prefix(a: Sequence[int], b: np.ndarray) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixStore:
    """Caches of finished turns, least recently used first out once over ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[int, KVCache] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._entries.values())

    def put(self, cache: KVCache) -> None:
        if len(cache) == 0 or cache.nbytes > self.max_bytes:
            return
        self._entries[id(cache)] = cache
        total = self.nbytes
        while total > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            total -= old.nbytes

    def clear(self) -> None:
        self._entries.clear()

    def match(self, prompt: np.ndarray, others: Iterable[KVCache] = ()) -> tuple[KVCache | None, int]:
        """The cache (stored, or one of ``others``: caches in use) sharing the longest prefix with
        ``prompt``, and that length. Ties go to a stored cache, which can be taken over whole."""
        best, best_n = None, 0
        for cache in [*self._entries.values(), *others]:
            n = common_prefix(cache.ids, prompt)
            if n > best_n:
                best, best_n = cache, n
        return best, best_n

    def take(self, cache: KVCache) -> bool:
        """Remove ``cache`` from the store; False if it was not stored (a cache in use)."""
        return self._entries.pop(id(cache), None) is not None
