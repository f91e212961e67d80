"""Decode steps of the native runner: per-row attention (the CPU path) against the rows' caches
padded into one batch (the GPU path), side by side, on random weights shaped like SmolLM2-135M.

    PYTHONPATH=$PWD python benchmarks/decode_bench.py [--rows 8,64] [--steps 50] [--prompt 900]

Each row's cache holds about ``--prompt`` tokens (row j: prompt + 3j, so lengths differ and the
padded path pads). Prints one JSON object: per row count and path, ms per decode step and tokens/s,
and padded / per-row as a speed ratio. Defaults to CUDA when there is one; on a CPU use small sizes
(``--rows 2 --steps 2 --prompt 60``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sage_rl.engine.decoder import NativeRunner

SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0,
)  # fmt: skip


def step_seconds(model, rows: int, padded: bool, steps: int, prompt: int, sync) -> float:
    """Mean wall seconds of one decode step over ``rows`` cached sequences."""
    with torch.inference_mode():
        runner = NativeRunner(model)
        runner.padded_decode = padded
        caches = [runner.new_cache() for _ in range(rows)]
        for j, cache in enumerate(caches):
            runner.prefill(cache, [1 + (k * 7 + j) % 40000 for k in range(prompt + 3 * j)])
        ids = [1] * rows
        runner.decode(caches, ids)  # warm-up
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.decode(caches, ids)
        sync()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="8,64")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--prompt", type=int, default=900)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(device).eval()
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    for rows in (int(x) for x in args.rows.split(",")):
        s = {p: step_seconds(model, rows, p, args.steps, args.prompt, sync) for p in (False, True)}
        out[f"rows_{rows}"] = {
            "per_row": {"ms_per_step": round(s[False] * 1e3, 2), "tok_s": round(rows / s[False])},
            "padded": {"ms_per_step": round(s[True] * 1e3, 2), "tok_s": round(rows / s[True])},
            "padded_over_per_row": round(s[False] / s[True], 2),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
