"""Training throughput of sage-rl's Trainer.step vs TRL's GRPOTrainer, same model, same batch, CPU.

    .venv/bin/python benchmarks/train_bench.py [--model tiny|smollm2] [--shape both|short|rollout] ...

Prints one JSON object: per batch shape, the tokens/s of each side and the ratios ours / TRL.

Two batch shapes:
- ``short``: ``--batch`` (8) samples of a ``--prompt-len`` (96) prompt each (different prompts)
  and a completion of 48-96 tokens; one turn.
- ``rollout``: shaped like a SAGE rollout batch (issue 16): ``--rollout-batch`` (8) samples of
  ~1,200 tokens that share an 800-token opening (the G chains of a group: system prompt + task),
  then two turns of 80-120 generated tokens with a 150-250-token observation between them (~200
  generated tokens per sample; observations are in the sequence but carry no loss). For TRL the
  shared opening is the prompt and the rest the completion, with ``completion_mask`` 0 on the
  observation tokens (how TRL trains multi-turn completions).

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
- ``ours_no_prefix``: ours with ``shared_prefix=False`` (every sample runs its whole sequence).
- ``ours_bf16`` (``--sides``): ours with ``dtype="bfloat16"`` (bf16 autocast over fp32 weights, CPU);
  ``bf16_grad_rel_err`` is its gradient's distance to the fp32 one, |g_bf16 - g_fp32| / |g_fp32|
  over all parameters, on the same batch and weights.
- ``ours_recompute`` (``--sides``): ours with ``old_logprobs="recompute"`` (one more no-grad forward).
- ``ours_kl`` (``--sides``): ours with ``log_kl_ref=True`` (the KL to the start model logged, as the
  recipes do: a reference model's no-grad forward per micro-batch, its shared prefix once a step);
  ``ours_kl4``: the same measured in every 4th micro-batch (``kl_ref_every=4``).
- ``ours_noise`` (``--sides``): ours with ``noise_scale=True`` (each step's gradient noise scale,
  train/noise.py). Each ``--group`` (1) consecutive samples are a group; the shared opening's
  backward runs once per group, so ``--group 1`` is the worst case of its cost.
Every side holds a model copy with its AdamW state (~2 GB for SmolLM2): mind the memory when
adding sides. Each shape's figures also go to stderr as soon as they are measured.
tokens/s = (prompt + completion tokens of the batch) / seconds per step, median over timed steps
(sides interleaved round-robin); ``*_per_cpu_s`` and ``ratio_cpu_*`` use this process's CPU seconds
instead (steadier on a shared machine). ``load_avg`` is the 1-minute load before and after.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
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


def make_rollout_batch(batch: int, vocab: int, seed: int, prefix_len: int = 800) -> list[dict[str, Any]]:
    """``batch`` samples sharing a ``prefix_len`` opening, then gen (80-120) + obs (150-250) + gen (80-120)."""
    g = torch.Generator().manual_seed(seed)

    def span(lo: int, hi: int) -> list[int]:
        return torch.randint(
            3, vocab, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g
        ).tolist()

    prefix = torch.randint(3, vocab, (prefix_len,), generator=g).tolist()
    rows = []
    for _ in range(batch):
        turns = [(span(80, 120), span(150, 250)), (span(80, 120), [])]
        rows.append({"prompt": prefix, "turns": turns, "adv": float(torch.randn((), generator=g))})
    return rows


def turns_of(r: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """(generated, observation) ids of each turn of a row."""
    return r["turns"] if "turns" in r else [(r["gen"], [])]


def as_samples(rows: list[dict[str, Any]], group: int = 1) -> list[Sample]:
    """The rows as samples, ``group`` consecutive ones a GRPO group (the same task)."""
    out = []
    for i, r in enumerate(rows):
        task = Task(f"b_{i // group}", "b", 1, "", "train")
        turns = tuple(
            Turn(
                gen_ids=tuple(gen),
                gen_logprobs=(0.0,) * len(gen),
                text="",
                code="x",
                result=ExecResult("", True),
                obs_ids=tuple(obs),
            )
            for gen, obs in turns_of(r)
        )
        traj = Trajectory(task, tuple(r["prompt"]), turns, Outcome(0.0, False), StopReason.COMPLETED)
        out.append(Sample(((task.task_id,), 0), traj, 0.0, r["adv"]))
    return out


def as_trl_inputs(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Prompt = the row's prompt; completion = every turn's generated + observation tokens, with
    ``completion_mask`` 1 on generated tokens only."""
    completions = []
    for r in rows:
        ids: list[int] = []
        mask: list[int] = []
        for gen, obs in turns_of(r):
            ids += gen + obs
            mask += [1] * len(gen) + [0] * len(obs)
        completions.append((ids, mask))
    c_max = max(len(ids) for ids, _ in completions)
    comp = torch.full((len(rows), c_max), pad_id, dtype=torch.long)
    cmask = torch.zeros((len(rows), c_max), dtype=torch.long)
    for i, (ids, mask) in enumerate(completions):
        comp[i, : len(ids)] = torch.tensor(ids)
        cmask[i, : len(ids)] = torch.tensor(mask)
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


def grad_rel_err(a: Trainer, b: Trainer, samples: list[Sample]) -> float:
    """|g_b - g_a| / |g_a| over all parameters, on the same batch, after giving ``b`` the weights of
    ``a`` (their steps in the timing loop moved each a little)."""
    b.model.load_state_dict(a.model.state_dict())
    grads = []
    for t in (a, b):
        t.optimizer.zero_grad(set_to_none=True)
        t.accumulate_gradients(samples, num_chains=len(samples))
        grads.append(torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None]))
        t.optimizer.zero_grad(set_to_none=True)
    return float((grads[1] - grads[0]).norm() / grads[0].norm())


SIDES = {
    "ours": {},
    "ours_no_prefix": {"shared_prefix": False},
    "ours_bf16": {"dtype": "bfloat16"},
    "ours_recompute": {"old_logprobs": "recompute"},
    "ours_kl": {"log_kl_ref": True},
    "ours_kl4": {"log_kl_ref": True, "kl_ref_every": 4},
    "ours_noise": {"noise_scale": True},
}


def bench_shape(name: str, rows: list[dict[str, Any]], model: Any, tok: Any, a: argparse.Namespace) -> dict:
    tokens = sum(len(r["prompt"]) + sum(len(g) + len(o) for g, o in turns_of(r)) for r in rows)
    generated = sum(len(g) for r in rows for g, _ in turns_of(r))
    samples = as_samples(rows, a.group)
    cfg = TrainerConfig(lr=1e-6, micro_batch_size=a.micro)
    trainers = {
        side: Trainer(copy.deepcopy(model), tok, cfg.model_copy(update=SIDES[side]))
        for side in a.sides
        if side != "trl"
    }
    fns: dict[str, Any] = {
        side: (lambda t=t: t.step(samples, num_chains=len(samples))) for side, t in trainers.items()
    }
    if "trl" in a.sides:
        fns["trl"] = trl_step_fn(copy.deepcopy(model), tok, rows, a.micro, 1e-6)
    load0 = os.getloadavg()[0]
    secs = time_steps(fns, a.steps, a.warmup)
    out: dict[str, Any] = {
        "shape": name,
        "samples": len(rows),
        "tokens_per_step": tokens,
        "generated_tokens_per_step": generated,
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    for side, (wall, cpu) in secs.items():
        out[f"{side}_tokens_per_s"] = tokens / wall
        out[f"{side}_tokens_per_cpu_s"] = tokens / cpu
    if "trl" in secs:
        for side in trainers:
            out[f"ratio_{side}_vs_trl"] = secs["trl"][0] / secs[side][0]
            out[f"ratio_cpu_{side}_vs_trl"] = secs["trl"][1] / secs[side][1]
    if "ours" in trainers:
        metrics = trainers["ours"].step(samples, num_chains=len(samples))
        out["ours_forward_tokens"] = metrics["forward_tokens"]
        out["ours_pad_fraction"] = metrics["pad_fraction"]
    if "ours_bf16" in trainers and "ours" in trainers:
        out["bf16_grad_rel_err"] = grad_rel_err(trainers["ours"], trainers["ours_bf16"], samples)
    trainers.clear()
    fns.clear()
    gc.collect()  # every side holds a model copy and its AdamW state: free them before the next shape
    sys.stderr.write(json.dumps(out) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--shape", choices=["both", "short", "rollout"], default="both")
    p.add_argument("--batch", type=int, default=8, help="samples of the short batch")
    p.add_argument("--rollout-batch", type=int, default=8, help="samples of the rollout-shaped batch")
    p.add_argument("--group", type=int, default=1, help="consecutive samples that form a group (ours_noise)")
    p.add_argument("--micro", type=int, default=2, help="micro-batch size, both sides")
    p.add_argument("--prompt-len", type=int, default=96)
    p.add_argument("--gen-len", type=int, default=96)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadier on a loaded machine)")
    p.add_argument("--sides", nargs="+", default=["ours", "ours_no_prefix", "trl"],
                   choices=[*SIDES, "trl"])  # fmt: skip
    p.add_argument("--json", action="store_true", help="(always JSON; accepted for uniformity)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load(a.model)
    result: dict[str, Any] = {
        "model": a.model,
        "params": sum(p.numel() for p in model.parameters()),
        "micro_batch": a.micro,
        "threads": a.threads,
        "group": a.group,
        "steps_timed": a.steps,
        "compared": "one optimizer step on the same batch, generation excluded (see module docstring)",
    }
    if a.shape in ("both", "rollout"):
        rows = make_rollout_batch(a.rollout_batch, len(tok), seed=0)
        result["rollout"] = bench_shape("rollout", rows, model, tok, a)
    if a.shape in ("both", "short"):
        rows = make_batch(a.batch, a.prompt_len, a.gen_len, len(tok), seed=0)
        result["short"] = bench_shape("short", rows, model, tok, a)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
