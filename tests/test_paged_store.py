"""The paged KV store's bookkeeping (pages, reference counts, prefix sharing, copy-on-write) and
the device sampler's contract (the same draws as ``sampler.draw`` for the same streams)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sage_rl.engine.device_sampler import RowParams, draw_tensors
from sage_rl.engine.sampler import draw
from sage_rl.engine.store import SCRATCH_PAGE, PageStore, StoreFull, block_table
from sage_rl.types import SamplingParams

P = 4  # positions a page


def _store(pages: int = 12) -> PageStore:
    return PageStore((2, 1, 2), pages, P, torch.float32, "cpu")


def _fill(store: PageStore, seq, ids: list[int]) -> None:
    """Append ``ids`` to ``seq``, writing each position's value = its token id in every layer."""
    start = len(seq)
    store.reserve(seq, len(ids))
    for pos, slot in zip(range(start, start + len(ids)), store.slots(seq, start, len(ids)), strict=True):
        store.kv[:, :, :, slot] = float(ids[pos - start])
    seq.ids.extend(ids)


def _read(store: PageStore, seq) -> list[int]:
    return [int(store.kv[0, 0, 0, s, 0]) for s in store.slots(seq, 0, len(seq))]


def test_pages_are_allocated_shared_by_count_and_given_back():
    store = _store()
    a = store.new_seq()
    _fill(store, a, list(range(1, 11)))  # 10 positions: pages 2 full + 1 partial
    assert len(a.pages) == 3 and SCRATCH_PAGE not in a.pages and store.free_pages == 11 - 3
    b = store.fork(a, 9)  # shares the 2 full pages, copies the partial third (1 position)
    assert b.pages[:2] == a.pages[:2] and b.pages[2] != a.pages[2]
    assert [store.refs[p] for p in a.pages] == [2, 2, 1]
    assert _read(store, b) == list(range(1, 10))
    store.release(a)
    assert [store.refs[p] for p in b.pages] == [1, 1, 1] and store.free_pages == 11 - 3
    store.release(b)
    assert store.free_pages == 11 and all(r == 0 for r in store.refs)


def test_writes_after_a_fork_never_reach_the_other_sequence():
    store = _store()
    a = store.new_seq()
    _fill(store, a, list(range(1, 9)))  # exactly 2 full pages
    b = store.fork(a, 6)  # the first page shared, the second one's first 2 positions copied
    store.truncate(a, 5)  # a goes on from position 5, in its own second page
    _fill(store, a, [50, 51, 52])
    _fill(store, b, [60, 61])
    assert _read(store, a) == [1, 2, 3, 4, 5, 50, 51, 52]
    assert _read(store, b) == [1, 2, 3, 4, 5, 6, 60, 61]


def test_a_shared_page_is_copied_before_it_is_written():
    store = _store()
    a = store.new_seq()
    _fill(store, a, list(range(1, 7)))  # page 0 full, page 1 holds 2
    b = store.fork(a, 4)  # shares page 0 whole
    store.truncate(b, 2)  # b goes on from position 2: inside the shared page
    shared = b.pages[0]
    _fill(store, b, [70, 71])
    assert b.pages[0] != shared and store.refs[shared] == 1  # copied on write
    assert _read(store, a) == [1, 2, 3, 4, 5, 6] and _read(store, b) == [1, 2, 70, 71]


def test_parked_sequences_are_matched_taken_and_dropped_oldest_first():
    store = _store(pages=7)  # 6 usable pages
    a, b = store.new_seq(), store.new_seq()
    _fill(store, a, [1, 2, 3, 4, 5])
    _fill(store, b, [1, 2, 9])
    store.reserve(a, 3)  # room reserved past the end goes back when parked
    store.park(a)
    store.park(b)
    assert len(a.pages) == 2 and len(store) == 2
    seq, n = store.match(np.array([1, 2, 3, 4, 7]))
    assert seq is a and n == 4
    c = store.new_seq()
    _fill(store, c, list(range(100, 116)))  # 4 pages: only 6 - 3 free, so a (oldest) is dropped
    assert len(store) == 1 and store.take(b) and not store.take(a)
    with pytest.raises(StoreFull, match="KV store full"):
        _fill(store, c, list(range(200, 212)))


def test_block_table_pads_with_the_scratch_page():
    store = _store()
    a = store.new_seq()
    _fill(store, a, [1] * 6)
    table = block_table([a], 3, 4)
    assert table.dtype == np.int32 and table[0, :2].tolist() == a.pages
    assert (table[0, 2:] == SCRATCH_PAGE).all() and (table[1:] == SCRATCH_PAGE).all()
    with pytest.raises(ValueError, match="pages"):
        block_table([a], 1, 1)


def _params(ps: list[SamplingParams], V: int) -> RowParams:
    temp = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in ps])
    greedy = torch.tensor([p.temperature <= 0 for p in ps])
    k = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in ps])
    return RowParams(temp, greedy, k, torch.tensor([p.top_p for p in ps]))


@pytest.mark.parametrize("filtered", [False, True])
def test_the_device_sampler_draws_what_the_host_sampler_draws(filtered):
    """Same logits and the same streams: the same tokens and logprobs, row by row, for plain,
    greedy and (batched) top-k/top-p rows."""
    V = 300
    plain = [SamplingParams(temperature=t, seed=None) for t in (1.0, 0.0, 0.7, 1.3)]
    extra = [SamplingParams(temperature=0.9, top_k=20), SamplingParams(temperature=1.0, top_p=0.8)]
    ps = plain + (extra if filtered else [])
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        logits = torch.randn(len(ps), V, generator=g) * 3
        streams = [random.Random(trial * 10 + b) for b in range(len(ps))]
        u = [s.random() if p.temperature > 0 else 0.0 for s, p in zip(streams, ps, strict=True)]
        want_t, want_lp = draw(logits, ps, [random.Random(trial * 10 + b) for b in range(len(ps))])
        tokens, logp = draw_tensors(logits, _params(ps, V), torch.tensor(u, dtype=torch.float64), filtered)
        assert tokens.tolist() == want_t
        assert np.allclose(logp.tolist(), want_lp, atol=1e-6)
