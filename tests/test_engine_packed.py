"""Few-row linear layers through column blocks (engine/packed.py): the same numbers as the BLAS
product, used only where they pay, and re-read with the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sage_rl.engine import decoder
from sage_rl.engine.decoder import NativeRunner
from sage_rl.engine.packed import BLOCK, pack, packed_linear
from tests.test_engine import _reference_logits, _tiny

torch.set_num_threads(1)


@pytest.mark.parametrize("rows", [1, 3, 8, 64])
@pytest.mark.parametrize("shape", [(BLOCK, 16), (3 * BLOCK, 40), (5 * BLOCK, 7)])
def test_packed_product_equals_the_plain_one(rows, shape):
    g = torch.Generator().manual_seed(rows)
    w, x, b = torch.randn(shape, generator=g), torch.randn(rows, shape[1], generator=g), torch.randn(shape[0])
    blocks = pack([w])
    assert blocks.shape == (shape[0] // BLOCK, shape[1], BLOCK)
    assert torch.allclose(packed_linear(x, blocks), F.linear(x, w), atol=1e-5)
    assert torch.allclose(packed_linear(x, blocks, b), F.linear(x, w, b), atol=1e-5)
    # several weights stacked: the outputs side by side, in order
    w2 = torch.randn(BLOCK, shape[1], generator=g)
    assert torch.allclose(packed_linear(x, pack([w, w2])), torch.cat([x @ w.T, x @ w2.T], -1), atol=1e-5)


def test_a_width_that_is_not_whole_blocks_is_not_packed():
    assert pack([torch.randn(BLOCK + 1, 8)]) is None


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_packed_runner_equals_transformers_and_the_plain_runner(kind, monkeypatch):
    model = _tiny(kind)
    ids = [int(i) for i in torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(2))]
    ref = _reference_logits(model, ids)
    with torch.inference_mode():
        packed, plain = NativeRunner(model), NativeRunner(model, packed=False)
        assert packed.packed and set(packed.layers[0].blocks) == {"qkv", "o", "gate_up", "down"}
        assert not plain.packed and not plain.layers[0].blocks and plain.head_blocks is None
        monkeypatch.setattr(decoder, "MAX_ROWS", 4)  # prefills of more rows take the BLAS product
        a, b = packed.new_cache(), plain.new_cache()
        assert torch.allclose(packed.prefill(a, ids[:11]), ref[10], atol=1e-5)
        assert torch.allclose(plain.prefill(b, ids[:11]), ref[10], atol=1e-5)
        for t in range(11, 20):
            got = packed.decode([a], [ids[t]])[0]
            assert torch.allclose(got, ref[t], atol=1e-5)
            assert torch.allclose(got, plain.decode([b], [ids[t]])[0], atol=1e-6)


def test_the_blocks_are_read_again_with_the_weights():
    """The blocks are a copy: a weight change reaches them at ``refresh`` (the engine calls it
    when told the weights changed), not before."""
    model = _tiny("llama")
    ids = list(range(10))
    with torch.inference_mode():
        runner = NativeRunner(model)
        before = runner.prefill(runner.new_cache(), ids)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.down_proj.weight.mul_(-1.0)
        stale = runner.prefill(runner.new_cache(), ids)
        runner.refresh()
        fresh = runner.prefill(runner.new_cache(), ids)
    assert torch.equal(stale, before)  # the copy did not see the change
    assert torch.allclose(fresh, _reference_logits(model, ids)[-1], atol=1e-5)
    assert not torch.allclose(fresh, before, atol=1e-3)


def test_blocks_only_for_float32_on_a_cpu_and_when_their_copy_fits(monkeypatch):
    from sage_rl.engine import packed

    model = _tiny("llama")
    assert NativeRunner(model).packed
    assert not NativeRunner(model, dtype=torch.bfloat16).packed
    assert not packed.wanted(torch.device("cuda"), torch.float32, 1)
    monkeypatch.setattr(packed, "available_bytes", lambda: 4 * 10**9)
    assert packed.wanted(torch.device("cpu"), torch.float32, 10**9)  # a quarter of what is free
    assert not packed.wanted(torch.device("cpu"), torch.float32, 10**9 + 1)
    monkeypatch.undo()
    if Path("/proc/meminfo").exists():  # Linux: MemAvailable, a positive number of bytes
        assert packed.available_bytes() > 0
