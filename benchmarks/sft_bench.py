"""SFT throughput on real chat examples: padding vs packing vs packing with shared openings.

    .venv/bin/python benchmarks/sft_bench.py --data runs/expert/sage_expert.jsonl [--examples 16] ...

Prints one JSON object. Each mode trains the same examples (every n-th of the file, so that
scenarios and chain positions are mixed) with its own copy of the model (SmolLM2 unless
``--model tiny``): one optimizer step = forward + backward of every row of the examples, one row
per micro-batch (``optim.batch_size: 1``, the recipe's), loss normalised by the step's trained
tokens, then clip + fused AdamW (``train/sft.py``'s ``forward_loss_sum`` and ``optimizer_step``).
Modes, called round-robin so that a change of the machine's load hits each alike:

- ``padding``: one example per row (``optim.packing: false``);
- ``packing``: first-fit packing into rows of ``--max-length`` tokens (``packing: true,
  shared_prefix: false``);
- ``shared``: packing with each row's shared opening kept once (``packing: true``, the default
  ``shared_prefix: true``), attention by segment (``optim.attention: segments``, the default:
  ``train/segments.py``);
- ``shared_dense``: the same rows through the row's dense ``T x T`` mask (``optim.attention:
  dense``, what every mode did before issue 32): ``ratio_shared_vs_shared_dense`` is the segment
  attention's gain;
- ``shared_full``: ``shared`` with ``optim.lean_activations: false`` (autograd keeps every
  intermediate of the MLPs and norms; ``train/lean.py``): ``ratio_shared_vs_shared_full`` is what
  recomputing them costs, ``saved_mb_longest_row`` per mode what it saves;
- ``shared_frozen``: ``shared`` with the bottom ``--freeze`` decoder layers frozen
  (``optim.freeze_layers``, the main job's 10 by default; ``train/freeze.py``): backward through the
  top layers only; ``ratio_shared_frozen_vs_shared`` is its gain per step;
- ``shared_bf16``: ``shared`` under bfloat16 autocast (``optim.dtype: bfloat16``; weights,
  gradients and AdamW float32): ``ratio_shared_bf16_vs_shared`` is its gain per step, large where
  the CPU multiplies bf16 natively (AMX, AVX512-BF16), below 1 where bf16 is emulated;
- ``shared_lora``: ``shared`` through LoRA adapters (the recipe's ``sft.lora`` defaults: r 16,
  alpha 32, all linear layers): no weight gradients for the frozen layers and AdamW over the
  adapters only; ``ratio_shared_lora_vs_shared`` is its gain per step (what it does to the model
  is not measured here).

``padding`` and ``packing`` run with segment attention too (one example, or several without a head).

tokens/s = the examples' own tokens (what padding would train on, without pad) / seconds per step,
median over the timed steps; ``row_tokens`` = token positions the model actually ran per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
from machine import cpu_info

from sage_rl.agent.render import ChatRenderer
from sage_rl.data.records import read_jsonl
from sage_rl.train.freeze import frozen_bottom
from sage_rl.train.lora import with_lora
from sage_rl.train.optim import build_optimizer, optimizer_step
from sage_rl.train.sft import forward_loss_sum
from sage_rl.train.sft_config import SFTLora
from sage_rl.train.sft_data import Encoded, collate, encode_example, fit_length, make_rows

MODES = {  # packing, shared openings, attention, lean activations (shared_bf16: + autocast)
    "padding": (False, False, "segments", True),
    "packing": (True, False, "segments", True),
    "shared": (True, True, "segments", True),
    "shared_dense": (True, True, "dense", True),
    "shared_full": (True, True, "segments", False),
    "shared_frozen": (True, True, "segments", True),
    "shared_lora": (True, True, "segments", True),
    "shared_bf16": (True, True, "segments", True),
}


def step_fn(
    model: Any,
    rows: list[list[Encoded]],
    share: bool,
    pad_id: int,
    attention: str,
    lean: bool,
    freeze: int = 0,
    amp: torch.dtype | None = None,
) -> Any:
    with frozen_bottom(model, freeze):
        opt = build_optimizer(model, 1e-6)
    batches = [collate([row], pad_id, share) for row in rows]
    n_trained = sum(b.num_trained for b in batches)

    def step() -> None:
        model.train()
        with frozen_bottom(model, freeze):
            for b in batches:
                (forward_loss_sum(model, b, attention, lean, amp) / n_trained).backward()
            optimizer_step(opt, 1.0, 1e-6)

    return step, sum(int(b.input_ids_BT.numel()) for b in batches), batches


def saved_mb(model: Any, batch: Any, attention: str, lean: bool, amp: torch.dtype | None = None) -> float:
    """MiB that autograd keeps for backward in one forward of ``batch`` (parameters not counted)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward_loss_sum(model, batch, attention, lean, amp)
    del loss
    return sum(seen.values()) / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="chat JSON Lines from `sage-rl collect`")
    p.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    p.add_argument("--examples", type=int, default=16)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--freeze", type=int, default=10, help="frozen bottom layers in shared_frozen")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from sage_rl.models import load_model, tiny_model

    model, tok = tiny_model(seed=0) if a.model == "tiny" else load_model()
    examples = read_jsonl(a.data)
    every = max(1, len(examples) // a.examples)
    chosen = examples[::every][: a.examples]
    encoded, _ = fit_length([encode_example(ChatRenderer(tok).conversation, e) for e in chosen], a.max_length)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens = sum(len(e.ids) for e in encoded)
    fns, out = {}, {}
    for mode in a.modes:
        packing, share, attention, lean = MODES[mode]
        rows = make_rows(encoded, packing, a.max_length, share)
        copied = copy.deepcopy(model)
        if mode.endswith("_lora"):
            copied = with_lora(copied, SFTLora(enabled=True).adapters())
        freeze = a.freeze if mode == "shared_frozen" else 0
        amp = torch.bfloat16 if mode == "shared_bf16" else None
        fns[mode], row_tokens, batches = step_fn(copied, rows, share, pad_id, attention, lean, freeze, amp)
        longest = max(batches, key=lambda b: int(b.input_ids_BT.numel()))
        with frozen_bottom(copied, freeze):
            kept = saved_mb(copied, longest, attention, lean, amp)
        out[mode] = {
            "rows": len(rows),
            "row_tokens": row_tokens,
            "longest_row": int(longest.input_ids_BT.numel()),
            "saved_mb_longest_row": round(kept, 1),
        }
    load0 = os.getloadavg()[0]
    for _ in range(a.warmup):
        for fn in fns.values():
            fn()
    wall: dict[str, list[float]] = {m: [] for m in fns}
    cpu: dict[str, list[float]] = {m: [] for m in fns}
    for _ in range(a.steps):
        for mode, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
    for mode in fns:
        out[mode]["tokens_per_s"] = tokens / statistics.median(wall[mode])
        out[mode]["tokens_per_cpu_s"] = tokens / statistics.median(cpu[mode])
    result: dict[str, Any] = {
        "model": a.model,
        "cpu": cpu_info(),
        "examples": len(encoded),
        "example_tokens": tokens,
        "trained_tokens": sum(e.num_trained for e in encoded),
        "max_length": a.max_length,
        "threads": a.threads,
        "steps_timed": a.steps,
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        **out,
    }
    for variant in ("shared_lora", "shared_frozen", "shared_bf16"):
        if variant in fns and "shared" in fns:
            result[f"ratio_{variant}_vs_shared"] = (
                out[variant]["tokens_per_s"] / out["shared"]["tokens_per_s"]
            )
    for base in ("packing", "padding", "shared_dense", "shared_full"):
        if base in fns and "shared" in fns:
            result[f"ratio_shared_vs_{base}"] = out["shared"]["tokens_per_s"] / out[base]["tokens_per_s"]
            result[f"ratio_cpu_shared_vs_{base}"] = (
                out["shared"]["tokens_per_cpu_s"] / out[base]["tokens_per_cpu_s"]
            )
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
