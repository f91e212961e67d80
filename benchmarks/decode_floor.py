"""The memory-bandwidth floor of a CPU decode step, for benchmarks/engine_bench.py: the bytes of
weights one step reads over the measured read bandwidth, and the fraction of it that the policy's
full-batch decode steps reach."""

from __future__ import annotations

import time

import torch

from sage_rl.policies.transformers_policy import TransformersPolicy


def read_bandwidth_gbs() -> float:
    """Best of 5 sums over a 512 MiB float32 tensor (far beyond the caches), in GB/s."""
    x = torch.ones(128 * 1024 * 1024)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


class DecodeTimer:
    """Wraps a runner's ``decode``: seconds of each call with a full batch."""

    def __init__(self, runner, full: int) -> None:
        self.inner, self.full, self.seconds = runner.decode, full, []
        runner.decode = self

    def __call__(self, caches, ids):
        t0 = time.perf_counter()
        out = self.inner(caches, ids)
        if len(caches) == self.full:
            self.seconds.append(time.perf_counter() - t0)
        return out


def weight_bytes(runner) -> int:
    """Bytes of weights one decode step reads: every layer, the final norm and the LM head
    (the embedding lookup reads only B rows, counted as nothing)."""
    tensors = [runner.norm, runner.lm_head]
    for layer in runner.layers:
        tensors += [layer.in_norm, layer.post_norm, layer.o[0], layer.down, *layer.gate_up]
        tensors += [w for w, b in layer.qkv] + [b for w, b in layer.qkv if b is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def floor_report(policy: TransformersPolicy, timer: DecodeTimer, bandwidth: float, args) -> dict:
    runner, nbytes = policy.engine.runner, weight_bytes(policy.engine.runner)
    floor_s = nbytes / (bandwidth * 1e9)
    step_s = sum(timer.seconds) / max(1, len(timer.seconds))
    return {
        "weight_bytes_per_step": nbytes,
        "floor_step_ms": round(floor_s * 1e3, 2),
        "measured_step_ms": round(step_s * 1e3, 2),
        "fraction_of_floor": round(floor_s / step_s, 3) if step_s else None,
        "arithmetic": f"{nbytes / 1e6:.0f} MB / {bandwidth:.1f} GB/s = {floor_s * 1e3:.1f} ms per step "
        f"of {args.episodes} rows (floor {args.episodes / floor_s:.0f} tokens/s); measured "
        f"{step_s * 1e3:.1f} ms ({args.episodes / step_s:.0f} tokens/s) over {len(timer.seconds)} full steps",
        "kv_dtype": str(runner.kv_dtype).removeprefix("torch."),
    }
