"""The CPU decode pool (engine/pool.py): a decode batch's caches seated as slots of one tensor and
attended together give the numbers of per-row attention, whatever rows come, go, come back, grow,
or find no room."""

from __future__ import annotations

import random

import pytest
import torch

from sage_rl.engine import attention, decoder, pool
from sage_rl.engine.decoder import NativeRunner
from tests.test_engine import _reference_logits, _tiny

torch.set_num_threads(1)


class Calls(list):
    """``[layer attentions through the pool]``; ``shared``: the shared prefix each one got."""

    def __init__(self) -> None:
        super().__init__([0])
        self.shared: list = []


@pytest.fixture
def counted(monkeypatch):
    """How many layer attentions went through the pool, and their shared prefixes."""
    calls = Calls()

    def wrapped(*args):
        calls[0] += 1
        calls.shared.append(args[7])
        return attention.attend_pooled(*args)

    monkeypatch.setattr(decoder, "attend_pooled", wrapped)
    return calls


def _storage_of(cache) -> int:
    return cache.kv.untyped_storage().data_ptr()


def test_rows_that_come_go_and_come_back_get_the_per_row_numbers(monkeypatch, counted):
    monkeypatch.setattr(pool, "STEP", 16)  # several capacity growths in 40 steps
    model = _tiny("llama")
    rng = random.Random(0)
    with torch.inference_mode():
        pooled, rows = NativeRunner(model), NativeRunner(model, pooled=False)
        assert pooled.pool is not None and rows.pool is None
        live: list[tuple] = []  # (pooled cache, per-row cache)
        worst = 0.0

        def prefill(a, b, ids):
            nonlocal worst
            worst = max(worst, float((pooled.prefill(a, ids) - rows.prefill(b, ids)).abs().max()))

        for _ in range(40):
            if len(live) < 6 and rng.random() < 0.35:  # a new row
                a, b = pooled.new_cache(), rows.new_cache()
                prefill(a, b, [rng.randrange(96) for _ in range(rng.randrange(1, 30))])
                live.append((a, b))
            if len(live) > 2 and rng.random() < 0.25:  # a row leaves, then its next turn comes back
                a, b = live.pop(rng.randrange(len(live)))
                n = rng.randrange(1, len(a))
                a.truncate(n), b.truncate(n)
                prefill(a, b, [rng.randrange(96) for _ in range(rng.randrange(1, 20))])
                live.append((a, b))
            if live:
                tokens = [rng.randrange(96) for _ in live]
                got = pooled.decode([a for a, _ in live], tokens)
                want = rows.decode([b for _, b in live], tokens)
                worst = max(worst, float((got - want).abs().max()))
        assert worst < 1e-5
        assert counted[0] > 0 and pooled.pool.capacity > 16  # the pool was used, and grew
        for a, b in live:
            assert a.ids == b.ids and a.pool is pooled.pool
            n = len(a)
            assert torch.allclose(a.kv[:, :, :, :n], b.kv[:, :, :, :n], atol=1e-6)


def test_bf16_weights_decode_through_the_float32_pool(counted):
    """bf16 weights (``dtype: bfloat16`` / ``auto`` on a CPU with native bf16) keep a float32 cache:
    the pool's indexed write casts the new keys and values (it raised a dtype error before)."""
    model = _tiny("llama")
    ids = [int(i) for i in torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(5))]
    with torch.inference_mode():
        pooled = NativeRunner(model, dtype=torch.bfloat16)
        rows = NativeRunner(model, dtype=torch.bfloat16, pooled=False)
        assert pooled.pool.kv[0].dtype is torch.float32
        a, b = [pooled.new_cache() for _ in range(3)], [rows.new_cache() for _ in range(3)]
        starts = [12, 7, 9]
        pooled.prefill_many(a, [ids[:n] for n in starts])
        rows.prefill_many(b, [ids[:n] for n in starts])
        for t in range(3):
            tokens = [ids[n + t] for n in starts]
            got, want = pooled.decode(a, tokens), rows.decode(b, tokens)
            assert got.dtype == want.dtype and torch.allclose(got.float(), want.float(), atol=1e-2)
    assert counted[0] > 0


def test_rows_that_share_a_prefix_read_it_once_and_get_the_per_row_numbers(counted):
    """Rows whose first tokens are the same (a system prompt) attend that prefix from one slot;
    the numbers stay the per-row ones, also after a row is cut inside the prefix and continues
    with other tokens (the shared prefix is found again, shorter)."""
    model = _tiny("llama")
    rng = random.Random(1)
    system = [rng.randrange(96) for _ in range(pool.SHARED_MIN + 16)]
    with torch.inference_mode():
        pooled, rows = NativeRunner(model), NativeRunner(model, pooled=False)
        a, b = [pooled.new_cache() for _ in range(4)], [rows.new_cache() for _ in range(4)]
        prompts = [system + [rng.randrange(96) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
        pooled.prefill_many(a, prompts)
        rows.prefill_many(b, prompts)

        def steps(n: int) -> float:
            worst = 0.0
            for _ in range(n):
                tokens = [rng.randrange(96) for _ in a]
                worst = max(worst, float((pooled.decode(a, tokens) - rows.decode(b, tokens)).abs().max()))
            return worst

        assert steps(5) < 1e-5
        assert counted.shared[-1] == (len(system), a[0].slot)
        cut = pool.SHARED_MIN + 4  # row 2 leaves the shared tokens at position cut
        other = [(t + 1) % 96 for t in system[cut:]]
        for c, runner in ((a[2], pooled), (b[2], rows)):
            c.truncate(cut)
            runner.prefill(c, other)
        assert steps(5) < 1e-5
        assert counted.shared[-1] == (cut, a[0].slot)
        a[1].truncate(8), b[1].truncate(8)  # below SHARED_MIN: the prefix is attended per row
        pooled.prefill(a[1], prompts[0][8:20]), rows.prefill(b[1], prompts[0][8:20])
        assert steps(3) < 1e-5 and counted.shared[-1] is None


def test_a_parked_cache_comes_back_to_its_slot_and_an_evicted_one_keeps_its_positions(counted):
    model = _tiny("llama")
    ids = [int(i) for i in torch.randint(0, 96, (24,), generator=torch.Generator().manual_seed(3))]
    ref = _reference_logits(model, ids)
    with torch.inference_mode():
        runner = NativeRunner(model)
        first = [runner.new_cache() for _ in range(2)]
        runner.prefill_many(first, [ids[:10], ids[:6]])
        runner.decode(first, [ids[10], ids[6]])
        slots = [c.slot for c in first]
        assert sorted(slots) == [0, 1] and runner.pool.slots == 2
        # the first row's next turn: truncated and prefilled in its slot, decoded without a copy
        first[0].truncate(8)
        assert torch.allclose(runner.prefill(first[0], ids[8:12]), ref[11], atol=1e-5)
        before = _storage_of(first[0])
        runner.decode(first, [ids[12], ids[7]])
        assert [c.slot for c in first] == slots and _storage_of(first[0]) == before
        # two other rows take both slots: the parked caches move out, their positions intact
        others = [runner.new_cache() for _ in range(2)]
        runner.prefill_many(others, [ids[:3], ids[:4]])
        runner.decode(others, [ids[3], ids[4]])
        assert runner.pool.slots == 2 and all(c.pool is None for c in first)
        assert [c.pool for c in others] == [runner.pool] * 2
        step = runner.decode(first, [ids[13], ids[8]])  # back: seated again
        assert torch.allclose(step[0], ref[13], atol=1e-5) and torch.allclose(step[1], ref[8], atol=1e-5)


def test_a_pool_that_cannot_grow_leaves_the_rows_to_the_per_row_path(monkeypatch, counted):
    model = _tiny("llama")
    ids = [int(i) for i in torch.randint(0, 96, (16,), generator=torch.Generator().manual_seed(4))]
    ref = _reference_logits(model, ids)
    monkeypatch.setattr(pool, "available_bytes", lambda: 1024)  # no room for any slot
    with torch.inference_mode():
        runner = NativeRunner(model)
        a, b = runner.new_cache(), runner.new_cache()
        runner.prefill_many([a, b], [ids[:9], ids[:5]])
        for t in range(9, 16):
            step = runner.decode([a, b], [ids[t], ids[t - 4]])
            assert torch.allclose(step[0], ref[t], atol=1e-5) and torch.allclose(
                step[1], ref[t - 4], atol=1e-5
            )
    assert counted[0] == 0 and runner.pool.slots == 0 and a.pool is None


def test_a_dropped_cache_frees_its_slot():
    model = _tiny("llama")
    with torch.inference_mode():
        runner = NativeRunner(model)
        caches = [runner.new_cache() for _ in range(3)]
        runner.prefill_many(caches, [[1, 2, 3]] * 3)
        runner.decode(caches, [4, 5, 6])
        gone = caches.pop(1).slot
        assert runner.pool.member(gone) is None  # only the pool held it
        newcomer = runner.new_cache()
        runner.prefill(newcomer, [7, 8])
        runner.decode([*caches, newcomer], [1, 2, 3])
        assert newcomer.slot == gone and runner.pool.slots == 3


@pytest.mark.parametrize("overrides", [[], ["policy.column_blocks=false", "policy.decode_pool=false"]])
def test_the_policy_config_turns_the_pool_and_the_column_blocks_off(tiny, monkeypatch, overrides):
    from sage_rl import build
    from sage_rl.config import load_config
    from sage_rl.engine import packed
    from sage_rl.settings import RunConfig

    monkeypatch.setattr(packed, "available_bytes", lambda: 1 << 40)  # room for the blocks' copy
    cfg = load_config(RunConfig, None, overrides)
    policy = build.build_policy(cfg, *tiny)
    runner = policy.engine.runner
    on = not overrides  # null: where they pay, which a float32 model on a CPU is
    assert runner.packed is on and (runner.pool is not None) is on
