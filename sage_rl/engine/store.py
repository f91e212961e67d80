"""A preallocated, device-resident KV store in pages, for the engine's accelerator path.

One tensor holds every layer's keys and values, ``kv[layer, k|v, kv_head, page * P + offset,
dim]`` (P = ``page_size`` positions a page), allocated once: a decode step writes its new keys and
values with one indexed write per layer and attends through a block table (a row's page ids, in
order), so nothing is re-allocated, padded or copied per step (the per-sequence caches of
``kv.py`` grow by doubling and are padded into a batch on an accelerator: ~2.9 GB of copies a
step at 64 rows, docs/LOG.md).

A :class:`PagedSeq` is one token sequence in the store: its pages and the ids whose keys and
values its first ``len(ids)`` positions hold. Prefix sharing is page bookkeeping with reference
counts: :meth:`PageStore.fork` gives a new sequence the first ``n`` positions of another by
sharing its full pages (a group's prompt is held once) and copying the partial last one; any page
about to be written while shared is copied first (copy-on-write, :meth:`PageStore.reserve`), so a
sequence never sees another's writes. Page 0 is never handed out: rows that only pad a batch to a
captured size write and read there.

Host-side bookkeeping only (lists of ints); the one device operation is the copy of a page
(:meth:`PageStore.copy_page`). Not thread-safe: used by the sampling task alone.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from sage_rl.engine.kv import common_prefix

SCRATCH_PAGE = 0  # written and read by padding rows only; never allocated


class StoreFull(RuntimeError):
    """No free page left, even after dropping every parked sequence."""


@dataclasses.dataclass(eq=False)  # sequences compare by identity
class PagedSeq:
    """A sequence in the store: ``pages`` in order; positions ``[0, len(ids))`` are valid."""

    pages: list[int] = dataclasses.field(default_factory=list)
    ids: list[int] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


class PageStore:
    """``pages`` pages of ``page_size`` positions for a model of ``shape = (layers, kv_heads,
    head_dim)``, plus the sequences parked between turns (least recently used dropped first when
    pages run out)."""

    def __init__(
        self,
        shape: tuple[int, int, int],
        pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if pages < 2:
            raise ValueError(f"PageStore: pages must be >= 2 (page 0 is scratch), got {pages}")
        if page_size < 1:
            raise ValueError(f"PageStore: page_size must be >= 1, got {page_size}")
        self.layers, self.kv_heads, self.head_dim = shape
        self.page_size, self.pages = page_size, pages
        self.kv = torch.zeros(
            (self.layers, 2, self.kv_heads, pages * page_size, self.head_dim), dtype=dtype, device=device
        )
        self.refs = [0] * pages
        self._free = list(range(pages - 1, 0, -1))  # a stack: low page ids first
        self._parked: collections.OrderedDict[int, PagedSeq] = collections.OrderedDict()

    # ---------------------------------------------------------------- pages
    @property
    def free_pages(self) -> int:
        return len(self._free)

    @staticmethod
    def bytes_per_page(shape: tuple[int, int, int], page_size: int, dtype: torch.dtype) -> int:
        layers, kv_heads, head_dim = shape
        return layers * 2 * kv_heads * page_size * head_dim * torch.empty((), dtype=dtype).element_size()

    def _alloc(self) -> int:
        while not self._free and self._parked:  # make room: the least recently parked goes first
            _, old = self._parked.popitem(last=False)
            self.release(old)
        if not self._free:
            raise StoreFull(
                f"KV store full: all {self.pages - 1} pages of {self.page_size} positions are in use by "
                "sequences in flight; give the store more memory or run fewer rows"
            )
        page = self._free.pop()
        self.refs[page] = 1
        return page

    def _drop(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self._free.append(page)

    def copy_page(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` positions of page ``src`` into page ``dst`` (every layer)."""
        a, b = src * self.page_size, dst * self.page_size
        self.kv[:, :, :, b : b + n] = self.kv[:, :, :, a : a + n]

    # ---------------------------------------------------------------- sequences
    def new_seq(self) -> PagedSeq:
        return PagedSeq()

    def fork(self, src: PagedSeq, n: int) -> PagedSeq:
        """A new sequence holding ``src``'s first ``n`` positions: full pages shared, the partial
        last page copied."""
        if not 0 <= n <= len(src):
            raise ValueError(f"fork: n must be in [0, {len(src)}], got {n}")
        full, rest = divmod(n, self.page_size)
        seq = PagedSeq(list(src.pages[:full]), list(src.ids[:n]))
        for page in seq.pages:
            self.refs[page] += 1
        if rest:
            page = self._alloc()
            self.copy_page(src.pages[full], page, rest)
            seq.pages.append(page)
        return seq

    def truncate(self, seq: PagedSeq, n: int) -> None:
        """Keep the first ``n`` positions and the pages that hold them."""
        del seq.ids[n:]
        keep = -(-n // self.page_size)
        for page in seq.pages[keep:]:
            self._drop(page)
        del seq.pages[keep:]

    def reserve(self, seq: PagedSeq, n: int, at: int | None = None) -> None:
        """Make positions ``[at, at + n)`` (``at`` default ``len(seq)``: the first position not
        valid) writable by ``seq`` alone: new pages as needed, and a shared page among them
        copied first (copy-on-write)."""
        start = len(seq) if at is None else at
        end = start + n
        first = start // self.page_size
        if first < len(seq.pages) and self.refs[seq.pages[first]] > 1 and start % self.page_size:
            page = self._alloc()
            self.copy_page(seq.pages[first], page, start % self.page_size)
            self._drop(seq.pages[first])
            seq.pages[first] = page
        elif first < len(seq.pages) and self.refs[seq.pages[first]] > 1:  # nothing valid to keep
            self._drop(seq.pages[first])
            seq.pages[first] = self._alloc()
        for later in range(first + 1, len(seq.pages)):  # pages past the valid ones: never shared
            if self.refs[seq.pages[later]] > 1:
                self._drop(seq.pages[later])
                seq.pages[later] = self._alloc()
        while len(seq.pages) * self.page_size < end:
            seq.pages.append(self._alloc())

    def release(self, seq: PagedSeq) -> None:
        """Give back every page of ``seq`` (it holds nothing afterwards)."""
        for page in seq.pages:
            self._drop(page)
        seq.pages, seq.ids = [], []

    def slots(self, seq: PagedSeq, start: int, n: int) -> list[int]:
        """Flat positions in the store of ``seq``'s positions ``[start, start + n)``."""
        P = self.page_size
        return [seq.pages[p // P] * P + p % P for p in range(start, start + n)]

    # ---------------------------------------------------------------- parked sequences
    def park(self, seq: PagedSeq) -> None:
        """Keep a finished turn's sequence for a later turn that continues it."""
        if len(seq) == 0:
            self.release(seq)
            return
        self.truncate(seq, len(seq))  # pages reserved past the end go back now
        self._parked[id(seq)] = seq

    def take(self, seq: PagedSeq) -> bool:
        """Remove ``seq`` from the parked ones (False if it was not parked)."""
        return self._parked.pop(id(seq), None) is not None

    def clear(self) -> None:
        """Drop every parked sequence (new weights)."""
        while self._parked:
            _, seq = self._parked.popitem(last=False)
            self.release(seq)

    def __len__(self) -> int:
        return len(self._parked)

    def match(self, prompt: np.ndarray, others: Iterable[PagedSeq] = ()) -> tuple[PagedSeq | None, int]:
        """The sequence (parked, or one of ``others``: sequences in use) sharing the longest prefix
        with ``prompt``, and that length; ties go to a parked one, which can be taken over whole."""
        best, best_n = None, 0
        for seq in [*self._parked.values(), *others]:
            n = common_prefix(seq.ids, prompt)
            if n > best_n:
                best, best_n = seq, n
        return best, best_n


def block_table(seqs: Sequence[PagedSeq], rows: int, width: int) -> np.ndarray:
    """``[rows, width]`` int32 page ids of ``seqs`` in order, padded with the scratch page."""
    table = np.full((rows, width), SCRATCH_PAGE, dtype=np.int32)
    for b, seq in enumerate(seqs):
        if len(seq.pages) > width:
            raise ValueError(f"block_table: a sequence has {len(seq.pages)} pages, the table {width}")
        table[b, : len(seq.pages)] = seq.pages
    return table
