"""The CPU decode batch's caches as slots of one tensor, so a decode step attends all rows at once.

Each row's attention over its own cache costs a handful of small operations per row and layer
(SmolLM2, 8 rows: ~2,000 a step). With the rows' caches in one ``[layers, k|v, slots, heads,
capacity, dim]`` tensor, a layer's decode attention is one indexed write, two batched products, a
mask and a softmax for all rows (issue 29: 43 ms against 68 ms for 8 rows at 1,200 context).

A seated :class:`~sage_rl.engine.kv.KVCache` does not own its storage: its ``kv`` is a view of its
slot, so prefills, prefix copies and the per-row path read and write the slot in place. A cache
stays seated after its row leaves the batch (parked: the store keeps it for the episode's next
turn, which then comes back without a copy); it is copied out to storage of its own only when its
slot is given to another cache or the pool cannot grow for it. The pool holds its members weakly:
a cache dropped by the store frees its slot.

Rows that share their first tokens (every episode's system prompt, a group's task) hold the same
keys and values there: :meth:`DecodePool.shared_prefix` finds that prefix, and the decode attention
reads it once from one slot for all rows instead of once per row (``attention.attend_pooled``; 8
rows sharing 850 of 1,180 positions read 2.7x fewer keys and values).

Capacity (positions) grows in steps of :data:`STEP` for all slots at once, by a copy of the pool;
slots are added when a batch has more rows than free slots. The pool never takes more than a
quarter of the memory available when it grows; past that, callers use the per-row path.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np
import torch

from sage_rl.engine.kv import KVCache, common_prefix
from sage_rl.engine.packed import available_bytes

STEP = 512  # positions added to every slot when one needs more
MAX_SLOTS = 64
SHARED_MIN = 64  # positions: below it a shared prefix is attended per row (the split costs more)


class DecodePool:
    """Slots for the caches of ``(layers, kv_heads, head_dim)`` sequences (see the module docstring)."""

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> None:
        self.layers, self.heads, self.dim = shape
        self.dtype, self.device = dtype, device
        self.kv = torch.zeros((self.layers, 2, 0, self.heads, 0, self.dim), dtype=dtype, device=device)
        self._members: list[weakref.ref[KVCache] | None] = []  # by slot
        self._used: list[int] = []  # by slot: the seat() call that last used it
        self._calls = 0
        self._shared: tuple[tuple[int, ...], int] = ((), 0)  # (the rows' cache versions, prefix)

    @property
    def slots(self) -> int:
        return self.kv.shape[2]

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    def member(self, slot: int) -> KVCache | None:
        ref = self._members[slot]
        cache = ref() if ref is not None else None
        return cache if cache is not None and cache.pool is self and cache.slot == slot else None

    def seat(self, caches: Sequence[KVCache], extra: int) -> list[int] | None:
        """Seat every cache (copying in those not yet seated), with room for ``extra`` more
        positions each; their slots, or None when the pool cannot hold them (too many rows, or no
        memory to grow): the caches are then left as they were."""
        self._calls += 1
        if len(caches) > MAX_SLOTS:
            return None
        slots = [c.slot if c.pool is self else None for c in caches]  # seated ones keep their slot
        taken = {s for s in slots if s is not None}
        free = [s for s in range(self.slots) if s not in taken and self.member(s) is None]
        newcomers = sum(s is None for s in slots)
        if newcomers > len(free):  # then the least recently used parked slots
            parked = [s for s in range(self.slots) if s not in taken and s not in free]
            free += sorted(parked, key=self._used.__getitem__)[: newcomers - len(free)]
        added, before = max(0, newcomers - len(free)), self.slots
        need = max(len(c) for c in caches) + extra
        if (need > self.capacity or added) and not self.grow(before + added, need):
            return None
        free += range(before, before + added)
        it = iter(sorted(free))
        for j, cache in enumerate(caches):
            if slots[j] is None:
                slots[j] = s = next(it)
                evicted = self.member(s)
                if evicted is not None:
                    evicted.own()
                n = len(cache)
                self.kv[:, :, s, :, :n] = cache.kv[:, :, :, :n]
                self._enter(cache, s)
            self._used[slots[j]] = self._calls
        return slots

    def shared_prefix(self, caches: Sequence[KVCache]) -> int:
        """How many first positions every cache holds for the same tokens (so the same keys and
        values: a key depends only on the tokens up to it). Recomputed only when a cache of the
        batch is new or was truncated (its ``version``): appends cannot change it."""
        key = tuple(c.version for c in caches)
        if key != self._shared[0]:
            n = min(len(c) for c in caches)
            first = np.asarray(caches[0].ids[:n], dtype=np.int64)
            for cache in caches[1:]:
                n = common_prefix(cache.ids[:n], first[:n])
            self._shared = (key, n)
        return self._shared[1]

    def grow(self, rows: int, positions: int) -> bool:
        """At least ``rows`` slots of at least ``positions`` positions (False, unchanged, when
        that would take more than a quarter of the available memory)."""
        rows, cap = max(rows, self.slots), max(self.capacity, -(-positions // STEP) * STEP)
        if rows == self.slots and cap == self.capacity:
            return True
        item = self.layers * 2 * self.heads * self.dim * self.kv.element_size()
        free = available_bytes()
        if free is not None and (rows * cap - self.slots * self.capacity) * item > free // 4:
            return False
        old = self.kv
        self.kv = torch.zeros(
            (self.layers, 2, rows, self.heads, cap, self.dim), dtype=self.dtype, device=self.device
        )
        self.kv[:, :, : old.shape[2], :, : old.shape[4]] = old
        self._members += [None] * (rows - len(self._members))
        self._used += [0] * (rows - len(self._used))
        for s in range(len(self._members)):
            cache = self.member(s)
            if cache is not None:
                cache.adopt(self.kv[:, :, s])
        return True

    def _enter(self, cache: KVCache, slot: int) -> None:
        self._members[slot] = weakref.ref(cache)
        cache.pool, cache.slot = self, slot
        cache.adopt(self.kv[:, :, slot])

    def attention_bias(self, slots: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
        """``[span, 1, L]`` in the pool's dtype, added to the scores: -inf where a score must be
        masked, else 0 (one add a layer costs a sixth of a boolean ``masked_fill``): slot ``s`` (of
        the first ``span = max(slots) + 1``) sees its row's first ``lengths`` positions; slots
        without a row of the batch see position 0 (their output is not read)."""
        span, L = max(slots) + 1, max(lengths)
        seen = torch.ones(span, dtype=torch.long)
        seen[torch.tensor(slots)] = torch.tensor(lengths)
        hidden = (torch.arange(L) >= seen[:, None])[:, None, :]
        bias = torch.zeros(hidden.shape, dtype=self.dtype).masked_fill_(hidden, float("-inf"))
        return bias.to(self.device)
