"""The compiled CPU decode step (engine/native.py, csrc/decode_cpu.cpp): the torch path's numbers
(logits and cache contents) for rows that share a prefix or not, sit in their slots in order or
not, with q/k/v biases, 1 to 5 query heads per KV head and head sizes 64 and 128; and the torch
path wherever it cannot be built or is turned off."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from sage_rl.engine import decoder, native
from sage_rl.engine.decoder import NativeRunner

torch.set_num_threads(1)


def _model(kind: str, heads: int, kv_heads: int, head_dim: int, intermediate: int = 96):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[kind]
    config = config_cls(
        vocab_size=128,
        hidden_size=96,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=1024,
        tie_word_embeddings=kind == "llama",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = model_cls(config).eval()
        for p in model.parameters():  # random biases and norms too, so that they matter
            p.data.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module")
def kernel():
    module = native.decode_kernel()
    if module is None:
        pytest.skip(
            f"the kernel cannot be built here: {native.disabled() or 'build failed (see the warning)'}"
        )
    return module


@pytest.mark.parametrize(
    "kind,heads,kv_heads,head_dim,intermediate",
    # query heads a KV head: 3 (one group), 4 (3 + 1), 1, 2, 5 twice (3 + 2, two KV heads);
    # 80: the MLP's gate and up halves not whole blocks of 32 columns (the kernel's one-by-one SiLU)
    [("llama", 3, 1, 64, 96), ("llama", 4, 1, 64, 96), ("qwen2", 2, 2, 64, 96), ("llama", 2, 1, 128, 96),
     ("qwen2", 10, 2, 64, 96), ("llama", 3, 1, 64, 80)],
)  # fmt: skip
def test_the_kernel_gives_the_torch_paths_numbers(
    kernel, monkeypatch, kind, heads, kv_heads, head_dim, intermediate
):
    model = _model(kind, heads, kv_heads, head_dim, intermediate)
    rng = random.Random(0)
    with torch.inference_mode():
        fast, slow = NativeRunner(model), NativeRunner(model)
        slow.kernel_weights = None  # the torch path
        assert fast.kernel_weights is not None, "the kernel applies to this model"
        prefix = [rng.randrange(128) for _ in range(80)]  # shared by rows 0-3 (>= SHARED_MIN)
        pairs = [(fast.new_cache(), slow.new_cache()) for _ in range(5)]
        worst = 0.0
        for j, (a, b) in enumerate(pairs):
            ids = (prefix if j < 4 else []) + [rng.randrange(128) for _ in range(3 + 5 * j)]
            worst = max(worst, float((fast.prefill(a, ids) - slow.prefill(b, ids)).abs().max()))
        batches = [[0, 1, 2, 3]] * 3 + [[2, 0, 3]] * 3 + [[4, 1, 0]] * 3 + [[3, 1, 2, 0, 4]] * 2
        calls, real = [], native.decode_step
        monkeypatch.setattr(native, "decode_step", lambda *a: calls.append(1) or real(*a))
        for rows in batches:  # shared prefix, rows out of slot order, a row without the prefix
            ids = [rng.randrange(128) for _ in rows]
            got = fast.decode([pairs[r][0] for r in rows], ids)
            want = slow.decode([pairs[r][1] for r in rows], ids)
            worst = max(worst, float((got - want).abs().max()))
            assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert len(calls) == len(batches)  # every decode step went through the kernel
        assert worst < 1e-5
        for a, b in pairs:
            assert a.ids == b.ids
            n = len(a)
            assert torch.allclose(a.kv[:, :, :, :n], b.kv[:, :, :, :n], atol=1e-6)


def test_the_torch_path_where_the_kernel_is_off_or_does_not_fit(monkeypatch):
    monkeypatch.setenv("SAGE_RL_NATIVE", "0")
    assert native.disabled() == "SAGE_RL_NATIVE=0"
    with torch.inference_mode():
        assert NativeRunner(_model("llama", 2, 1, 64)).kernel_weights is None
    monkeypatch.delenv("SAGE_RL_NATIVE")
    if native.disabled() is None:
        with torch.inference_mode():
            assert NativeRunner(_model("llama", 2, 1, 64)).kernel_weights is not None
            assert NativeRunner(_model("llama", 2, 1, 64), packed=False).kernel_weights is None
            assert NativeRunner(_model("llama", 2, 1, 64), pooled=False).kernel_weights is None
            assert NativeRunner(_model("llama", 2, 1, 64), dtype=torch.bfloat16).kernel_weights is None
            assert NativeRunner(_model("llama", 4, 1, 16)).kernel_weights is None  # head size 16


def test_a_failed_build_warns_once_and_decodes_through_torch(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ext

    def broken(*args, **kwargs):
        raise RuntimeError("Error building extension 'x': g++: command not found")

    monkeypatch.setattr(ext, "load", broken)
    monkeypatch.setenv("SAGE_RL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "disabled", lambda: None)
    with pytest.warns(RuntimeWarning, match="g\\+\\+: command not found"):
        assert native.decode_kernel.__wrapped__() is None
    calls = []
    monkeypatch.setattr(native, "decode_kernel", lambda: None)  # what the cache holds after that
    monkeypatch.setattr(decoder, "attend_pooled", lambda *a: calls.append(1) or _attend(*a))
    with torch.inference_mode():
        runner = NativeRunner(_model("llama", 2, 1, 64))
        assert runner.kernel_weights is None
        caches = [runner.new_cache() for _ in range(2)]
        for c in caches:
            runner.prefill(c, [1, 2, 3])
        assert runner.decode(caches, [4, 5]).shape == (2, 128)
    assert calls == [1, 1]  # both layers through the torch pooled attention


def _attend(*args):
    from sage_rl.engine import attention

    return attention.attend_pooled(*args)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 15, 16])
def test_the_kernels_blocked_product_is_the_blocked_matmul(kernel, rows):
    """``blocked_product`` (its own loop: two rows a pass over a block where the kernel is built for
    AVX2, eight, then four, two and one with AVX-512): the column blocks' product of ``packed.pack``,
    row counts that take every pass (15 = 8 + 4 + 2 + 1) and a K that is no multiple of 8 included,
    within float32 rounding; the LM head's logits through it are ``packed_linear``'s."""
    from sage_rl.engine.packed import pack, packed_linear

    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 37, generator=g)
    x = torch.randn(rows, 37, generator=g)
    blocks = pack([w])
    got = kernel.blocked_product(x, blocks)
    assert got.shape == (3, rows, 32)
    assert torch.allclose(got, torch.matmul(x, blocks), atol=1e-5, rtol=1e-5)
    head = packed_linear(x, blocks, product=kernel.blocked_product)
    assert torch.allclose(head, x @ w.T, atol=1e-5, rtol=1e-5)
    assert torch.allclose(head, packed_linear(x, blocks), atol=1e-5)


def _fake_load(seen):
    """torch's builder as far as its lock goes: it would wait for ever on a ``lock`` file in the folder."""

    def load(name, sources, build_directory, **kwargs):
        assert not (Path(build_directory) / "lock").exists(), "torch's builder would wait on it for ever"
        assert sources == [str(Path(build_directory) / "decode_cpu.cpp")]  # compiled from its copy
        assert Path(sources[0]).read_bytes() == native.SOURCE.read_bytes()
        seen.append(time.monotonic())
        return name

    return load


def test_a_builder_lock_left_by_a_killed_build_is_removed_with_a_warning(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("SAGE_RL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "disabled", lambda: None)
    seen = []
    monkeypatch.setattr(ext, "load", _fake_load(seen))
    folder = tmp_path / native.build_name()
    folder.mkdir()
    (folder / "lock").touch()  # what a process killed inside torch's builder leaves
    with pytest.warns(RuntimeWarning, match="stopped mid-way"):
        assert native.decode_kernel.__wrapped__() == native.build_name()
    assert len(seen) == 1 and not (folder / "lock").exists()


def test_a_live_builds_lock_is_waited_for_not_removed(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("SAGE_RL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "disabled", lambda: None)
    folder = tmp_path / native.build_name()
    folder.mkdir()
    # another process builds: it holds the kernel's lock and torch's lock file for 1.5 s
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    seen = []
    monkeypatch.setattr(ext, "load", _fake_load(seen))
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "stale lock" warning: that lock was alive
        assert native.decode_kernel.__wrapped__() == native.build_name()
    assert holder.wait(timeout=30) == 0
    assert seen[0] - start > 1.0  # it waited for the build to end


_HOLDER = """
import fcntl, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
with open(folder.parent / (folder.name + ".flock"), "a") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    (folder / "lock").touch()
    print("held", flush=True)
    time.sleep(1.5)
    (folder / "lock").unlink()
"""


def test_torchs_own_builder_loads_past_a_stale_lock(kernel):
    # the lock file a killed build leaves, in the built kernel's own folder: torch's real builder, in a
    # fresh process, loads the kernel (it waited for ever before the kernel's own lock). The file is
    # removed whatever happens, so that a failure here cannot hang other tests' loads.
    stale = native.cache_root() / native.build_name() / "lock"
    stale.touch()
    try:
        code = "from sage_rl.engine import native; assert native.decode_kernel() is not None"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    finally:
        stale.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped mid-way" in done.stderr


def test_two_checkouts_of_the_source_share_one_build(monkeypatch, tmp_path):
    # torch's builder keys a build on its command line, which names the source by path: compiled from
    # each checkout's own path, two checkouts rebuilt the kernel in turn
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("SAGE_RL_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "disabled", lambda: None)
    calls = []
    monkeypatch.setattr(ext, "load", lambda name, sources, **kw: calls.append((name, sources)) or name)
    other = tmp_path / "checkout" / "decode_cpu.cpp"
    other.parent.mkdir()
    other.write_bytes(native.SOURCE.read_bytes())
    native.decode_kernel.__wrapped__()
    monkeypatch.setattr(native, "SOURCE", other)
    native.decode_kernel.__wrapped__()
    assert calls[0] == calls[1]  # the same module name and the same source path: one command line
    assert calls[0][1] == [str(tmp_path / "cache" / calls[0][0] / "decode_cpu.cpp")]
    other.write_bytes(native.SOURCE.read_bytes() + b"\n// changed\n")
    native.decode_kernel.__wrapped__()
    assert calls[2][0] != calls[0][0]  # another source, another build
    assert Path(calls[2][1][0]).read_bytes().endswith(b"// changed\n")
