"""Linear layers for few rows on a CPU: the weight kept as column blocks (issue 29).

A decode step multiplies a handful of rows (one per sequence) by every weight matrix. The CPU's
BLAS runs such a skinny product at a fraction of the memory bandwidth: on an AVX2 Zen 3, 8 rows
through SmolLM2's linear layers read the fp32 weights at 6-8 GB/s, where a plain sum reads 32 GB/s
(docs/LOG.md, 2026-11-27). Kept as ``[N / BLOCK, K, BLOCK]`` (each block: BLOCK output columns,
contiguous along K), the same product is a batch of ``[rows, K] x [K, BLOCK]`` products that stream
each block once: 1.2-2.5x faster for 1-64 rows by the shape, the LM head fastest; the same sums in
the same order (equal to ``F.linear`` in the measured cases, and within float32 rounding always).

The blocks are a copy of the weights (their size again in memory), made when the runner reads the
weights, and used only up to ``MAX_ROWS`` rows: longer prefills keep the BLAS product, which is
efficient there.
"""

from __future__ import annotations

import os
from typing import Any

import torch

BLOCK = 32  # output columns per block (16-64 measured; 32 the best overall)
MAX_ROWS = 64  # above it the BLAS product is as fast or faster


def pack(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The weights ``[N_i, K]`` stacked along N and cut into ``[N / BLOCK, K, BLOCK]`` blocks;
    None when N is not a multiple of BLOCK (the caller keeps the plain product)."""
    w = torch.cat(weights) if len(weights) > 1 else weights[0]
    n, k = w.shape
    if n % BLOCK:
        return None
    return w.detach().reshape(n // BLOCK, BLOCK, k).transpose(1, 2).contiguous()


def packed_linear(
    x_TK: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None = None, product=torch.matmul
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for ``blocks = pack([W])``: ``[T, N]``. ``product`` computes the blocked
    product ``[N / BLOCK, T, BLOCK]`` (the compiled kernel's ``blocked_product`` where it applies)."""
    y_BTC = product(x_TK, blocks)  # [N / BLOCK, T, BLOCK]
    y_TN = y_BTC.transpose(0, 1).reshape(x_TK.shape[0], -1)
    return y_TN if bias is None else y_TN + bias


def wanted(device: torch.device, dtype: torch.dtype, nbytes: int) -> bool:
    """Blocks where they were measured to pay, float32 on a CPU, and where their copy of the
    ``nbytes`` of weights takes at most a quarter of the memory available now (a 7B float32 model
    on a laptop gets none). bfloat16 weights, on CPUs with native bf16, use oneDNN's kernels, fast
    for few rows; an accelerator has its own."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    free = available_bytes()
    return free is None or nbytes <= free // 4


def available_bytes() -> int | None:
    """Memory available to new allocations (Linux ``MemAvailable``, else free pages); None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def layer_blocks(layer: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """``layer``'s projections as column blocks (q|k|v and gate|up fused), those whose width allows."""
    parts = {
        "qkv": ([w for w, _ in layer.qkv], [b for _, b in layer.qkv]),
        "o": ([layer.o[0]], [layer.o[1]]),
        "gate_up": (list(layer.gate_up), [None]),
        "down": ([layer.down], [None]),
    }
    out = {}
    for name, (weights, biases) in parts.items():
        blocks = pack(weights)
        if blocks is not None:
            out[name] = (blocks, torch.cat(biases) if biases[0] is not None else None)
    return out
