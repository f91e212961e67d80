"""Training throughput of sage-rl's Trainer.step vs TRL's GRPOTrainer, same model, same batch, CPU.

    .venv/bin/python benchmarks/train_bench.py [--model tiny|smollm2] [--batch 8] [--micro 4] [--steps 3] ...

Prints one JSON object: tokens/s of each side and the ratio ours / TRL (target >= 1.0).

What is compared, precisely. Generation is excluded on both sides; one optimizer step on the same
B sequences (prompt P tokens + completion of varying length, right-padded), in micro-batches:
- ours: ``Trainer.step(samples, num_chains=B)``: tensor building from the Samples, forward,
  logprobs (chunked LM head), clipped surrogate (seq_mean_token_mean), backward per micro-batch,
  grad clip 1.0, fused AdamW step, metrics (entropy, mismatch, clip fractions).
- TRL: a real ``GRPOTrainer`` (loss_type="grpo", beta=0, num_iterations=1, so its old logprobs are
  the detached current ones, as ours) built on a copy of the same model; per micro-batch its own
  ``training_step`` (its fused LM-head logprob path, its ``_compute_loss``, accelerate backward) on
  inputs prepared as its generation step would leave them, then grad clip 1.0 and its optimizer
  step (HF's default, fused AdamW). Gradient checkpointing is off on both sides (TRL's default
  turns it on, which would make TRL slower for a reason unrelated to the loss path).
- ``ours_recompute``: ours with ``old_logprobs="recompute"`` (one more no-grad forward).
tokens/s = (prompt + completion tokens of the batch) / seconds per step, median over timed steps;
``*_per_cpu_s`` and ``ratio_cpu`` use this process's CPU seconds instead (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from sage_rl.train.trainer import Trainer, TrainerConfig
from sage_rl.types import ExecResult, Outcome, Sample, StopReason, Task, Trajectory, Turn


def make_batch(batch: int, prompt_len: int, gen_len: int, vocab: int, seed: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        n_gen = int(torch.randint(gen_len // 2, gen_len + 1, (1,), generator=g))
        rows.append(
            {
                "prompt": torch.randint(3, vocab, (prompt_len,), generator=g).tolist(),
                "gen": torch.randint(3, vocab, (n_gen,), generator=g).tolist(),
                "adv": float(torch.randn((), generator=g)),
            }
        )
    return rows


def as_samples(rows: list[dict[str, Any]]) -> list[Sample]:
    out = []
    for i, r in enumerate(rows):
        task = Task(f"b_{i}", "b", 1, "", "train")
        turn = Turn(
            gen_ids=tuple(r["gen"]),
            gen_logprobs=(0.0,) * len(r["gen"]),
            text="",
            code="x",
            result=ExecResult("", True),
        )
        traj = Trajectory(task, tuple(r["prompt"]), (turn,), Outcome(0.0, False), StopReason.COMPLETED)
        out.append(Sample(((task.task_id,), 0), traj, 0.0, r["adv"]))
    return out


def as_trl_inputs(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    c_max = max(len(r["gen"]) for r in rows)
    comp = torch.full((len(rows), c_max), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(rows), c_max), dtype=torch.long)
    for i, r in enumerate(rows):
        comp[i, : len(r["gen"])] = torch.tensor(r["gen"])
        cmask[i, : len(r["gen"])] = 1
    prompt = torch.tensor([r["prompt"] for r in rows])
    return {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": comp,
        "completion_mask": cmask,
        "advantages": torch.tensor([r["adv"] for r in rows]),
        "num_items_in_batch": cmask.sum(),
    }


def time_steps(fns: dict[str, Any], steps: int, warmup: int) -> dict[str, tuple[float, float]]:
    """(median wall seconds, median process CPU seconds) per call of each function, calls interleaved
    round-robin so that a change in the machine's load (it is shared) hits every side alike. CPU
    seconds (all threads of this process) are the steadier measure on a loaded machine."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def trl_step_fn(model: Any, tok: Any, rows: list[dict[str, Any]], micro: int, lr: float) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=max(1, len(rows) // micro),
        num_generations=2,
        learning_rate=lr,
        max_grad_norm=1.0,
        loss_type="grpo",
        beta=0.0,
        gradient_checkpointing=False,  # TRL's default is True; ours does not checkpoint: same work
        use_cpu=True,
        bf16=False,
        report_to="none",
        lr_scheduler_type="constant",
    )
    data = Dataset.from_dict({"prompt": ["x"] * len(rows)})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda **kw: [0.0] * len(kw["prompts"]),
        args=args,
        train_dataset=data,
        processing_class=tok,
    )
    trainer.create_optimizer()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    chunks = [as_trl_inputs(rows[i : i + micro], pad) for i in range(0, len(rows), micro)]
    trainer.current_gradient_accumulation_steps = len(chunks)

    def step() -> None:
        for inputs in chunks:
            trainer._prepare_inputs = lambda _batch, inputs=inputs: inputs  # generation already done
            trainer.training_step(trainer.model, inputs, None)
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return step


def load(name: str) -> tuple[Any, Any]:
    from sage_rl.models import load_model, tiny_model

    return tiny_model(seed=0) if name == "tiny" else load_model()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--gen-len", type=int, default=96)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="(always JSON; accepted for uniformity)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load(a.model)
    rows = make_batch(a.batch, a.prompt_len, a.gen_len, len(tok), seed=0)
    tokens = sum(len(r["prompt"]) + len(r["gen"]) for r in rows)
    samples = as_samples(rows)
    cfg = TrainerConfig(lr=1e-6, micro_batch_size=a.micro)
    ours = Trainer(copy.deepcopy(model), tok, cfg)
    recompute = Trainer(copy.deepcopy(model), tok, cfg.model_copy(update={"old_logprobs": "recompute"}))
    secs = time_steps(
        {
            "ours": lambda: ours.step(samples, num_chains=len(samples)),
            "recompute": lambda: recompute.step(samples, num_chains=len(samples)),
            "trl": trl_step_fn(copy.deepcopy(model), tok, rows, a.micro, 1e-6),
        },
        a.steps,
        a.warmup,
    )
    (ours_s, ours_c), (rec_s, rec_c), (trl_s, trl_c) = secs["ours"], secs["recompute"], secs["trl"]
    result = {
        "model": a.model,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": a.batch,
        "micro_batch": a.micro,
        "tokens_per_step": tokens,
        "threads": a.threads,
        "steps_timed": a.steps,
        "ours_tokens_per_s": tokens / ours_s,
        "ours_recompute_old_logprobs_tokens_per_s": tokens / rec_s,
        "trl_tokens_per_s": tokens / trl_s,
        "ratio": trl_s / ours_s,
        "ratio_recompute": trl_s / rec_s,
        "ours_tokens_per_cpu_s": tokens / ours_c,
        "trl_tokens_per_cpu_s": tokens / trl_c,
        "ratio_cpu": trl_c / ours_c,
        "ratio_cpu_recompute": trl_c / rec_c,
        "compared": "one optimizer step on the same batch, generation excluded (see module docstring)",
    }
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
