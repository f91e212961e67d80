"""The engine's CUDA path on one GPU (issue 28): tokens/s, the bandwidth floor, HF generate, the
trainer, and the correctness checks, in one run of a few minutes.

    PYTHONPATH=$PWD python benchmarks/gpu_engine_bench.py [--model x.gguf] [--rows 8,64,256]
        [--attention gather,flex] [--out docs/results/gpu_engine.json]
    .venv/bin/python benchmarks/engine_bench.py --device cuda ...   (the same: engine_bench dispatches here)
    .venv/bin/python benchmarks/gpu_engine_bench.py --quick          (CPU smoke test of this script: tiny model, nothing written)

What it measures, on ``engine_bench.py``'s agent workload (``--prompt`` ~900-token prompts, 4
turns of exactly 96 sampled tokens, a ~60-token observation after each; ``rows`` episodes at once):

- ``tokens/s`` of ``TransformersPolicy`` on the paged engine, bf16, at each ``--rows`` and
  ``--attention`` (the workload is run twice; the second run is timed: graphs captured, flex
  compiled);
- the **bandwidth floor**: a decode step must read the weights and every row's keys and values
  once; bytes at the workload's mean context / the measured device-to-device copy bandwidth
  (bytes read + written / s), as tokens/s, and the ratio measured / floor;
- the same workload through HF ``generate`` (bf16, left-padded batch) at ``--hf-rows``, and the ratio;
- **greedy equality**: a fixed prompt set, greedy, float32: the paged engine on the GPU against
  the per-sequence engine on the CPU (token ids equal), and how far bf16 greedy agrees;
- **logprobs**: the bf16 engine's sampled logprobs against a float32 forward and a bf16-autocast
  forward of the same tokens (what the trainer computes with ``dtype`` float32 / auto);
- the **trainer**: ``Trainer.step`` (bf16 autocast, fp32 master weights) on rollout-shaped
  batches (``train_bench.make_rollout_batch``) at each ``--train-micro``, tokens/s and MFU
  (6 x parameters x forward tokens/s over the measured bf16 matmul rate and over 989 TFLOP/s).

Writes ``--out`` (keys ``device``, ``tok_s_64``, ``floor_tok_s_64``, ``ratio_vs_hf_generate_64``,
``train_tok_s`` and the details) only when run on a CUDA GPU; prints the same JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_bench  # noqa: E402  (benchmarks/ is not a package)
import train_bench  # noqa: E402

from sage_rl.agent.render import ChatRenderer  # noqa: E402
from sage_rl.engine.paged_engine import PagedOptions  # noqa: E402
from sage_rl.policies.base import PolicyRequest, SamplingParams  # noqa: E402
from sage_rl.policies.transformers_policy import TransformersPolicy  # noqa: E402

NOMINAL_BF16_FLOPS = 989e12  # H100 / H200 SXM dense bf16


def log(msg: str) -> None:
    print(f"[gpu_engine_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy of 1 GiB, best of 5: bytes read + written per second."""
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        y.copy_(x)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() * 4 / best


def matmul_flops(device: str) -> float:
    n = 8192 if device == "cuda" else 512
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ a
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    sync()
    return 10 * 2 * n**3 / (time.perf_counter() - t0)


def per_position_bytes(model: Any, dtype: torch.dtype) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return (
        c.num_hidden_layers
        * 2
        * c.num_key_value_heads
        * head_dim
        * torch.empty((), dtype=dtype).element_size()
    )


def store_bytes(model: Any, rows: int, args: argparse.Namespace) -> int:
    """The workload's contexts, twice over (rows in flight and their parked turns), plus slack."""
    longest = args.prompt_max + args.turns * (args.gen + args.obs_len) + 512
    return 2 * rows * longest * per_position_bytes(model, torch.bfloat16) + (64 << 20)


def run_engine(model, tok, prompts, obs, rows: int, attention: str, args) -> dict:
    policy = TransformersPolicy(
        model, tok, max_batch=rows, stop_ids=(), dtype=torch.bfloat16, threads=None,
        engine=PagedOptions(store_bytes=store_bytes(model, rows, args), attention=attention),
    )  # fmt: skip
    a = argparse.Namespace(**{**vars(args), "turns": args.turns})
    t0 = time.perf_counter()
    engine_bench.run_policy(policy, prompts[:rows], obs, a)  # warm-up: captures, compilation
    sync()
    warm_s = time.perf_counter() - t0
    policy.engine.stats.decode_tokens = 0
    t0 = time.perf_counter()
    tokens = engine_bench.run_policy(policy, prompts[:rows], obs, a)
    sync()
    wall = time.perf_counter() - t0
    out = {
        "tokens": tokens, "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 1),
        "first_run_s": round(warm_s, 2), "graphs": policy.engine.graphs.captures,
    }  # fmt: skip
    del policy
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def run_hf(model_bf16, tok, prompts, obs, args) -> dict:
    device = next(model_bf16.parameters()).device
    seqs, done = [list(p) for p in prompts], 0
    sync()
    t0 = time.perf_counter()
    for _ in range(args.turns):
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, width - len(s) :], mask[b, width - len(s) :] = torch.tensor(s), 1
        with torch.inference_mode():
            out = model_bf16.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=args.gen, min_new_tokens=args.gen, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        for b, s in enumerate(seqs):
            gen = out[b, width:].tolist()
            s += gen + obs
            done += len(gen)
    sync()
    wall = time.perf_counter() - t0
    return {"tokens": done, "wall_s": round(wall, 3), "tok_s": round(done / wall, 1)}


def greedy_check(model_cpu, model_dev, tok, prompts, args) -> dict:
    """Greedy ids of the per-sequence engine on the CPU (float32) against the paged engine on
    the device, float32 (must be equal) and bf16 (agreement reported)."""
    params = SamplingParams(temperature=0.0, max_tokens=args.greedy_tokens)

    def sample(model, **kw) -> list[tuple[int, ...]]:
        policy = TransformersPolicy(model, tok, max_batch=len(prompts), stop_ids=(), threads=None, **kw)

        async def go():
            return await asyncio.gather(
                *[policy.generate(PolicyRequest((), tuple(p), params)) for p in prompts]
            )

        return [c.token_ids for c in asyncio.run(go())]

    want = sample(model_cpu, dtype="model", engine="per_sequence")
    fp32 = sample(model_dev, dtype="model", engine=PagedOptions(store_bytes=1 << 30))
    bf16 = sample(model_dev, dtype=torch.bfloat16, engine=PagedOptions(store_bytes=1 << 30))

    def agree(a, b) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))

    return {
        "prompts": len(prompts), "tokens_each": args.greedy_tokens,
        "fp32_equal_to_cpu": sum(a == b for a, b in zip(want, fp32, strict=True)),
        "bf16_equal_to_cpu": sum(a == b for a, b in zip(want, bf16, strict=True)),
        "bf16_first_difference": [agree(a, b) for a, b in zip(want, bf16, strict=True)],
    }  # fmt: skip


def logprob_check(model, tok, prompts, args) -> dict:
    """The bf16 engine's sampled logprobs against float32 and bf16-autocast forwards."""
    policy = TransformersPolicy(
        model, tok, max_batch=len(prompts), stop_ids=(), dtype=torch.bfloat16, threads=None,
        engine=PagedOptions(store_bytes=1 << 30),
    )  # fmt: skip
    params = SamplingParams(temperature=1.0, max_tokens=args.gen, seed=0)

    async def go():
        return await asyncio.gather(*[policy.generate(PolicyRequest((), tuple(p), params)) for p in prompts])

    out: dict[str, Any] = {}
    samples = asyncio.run(go())
    device = next(model.parameters()).device
    for name, autocast in (("vs_fp32_forward", False), ("vs_bf16_autocast_forward", True)):
        diffs = []
        for prompt, s in zip(prompts, samples, strict=True):
            seq = torch.tensor([list(prompt) + list(s.token_ids)], device=device)
            with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
            ids = torch.tensor(s.token_ids, device=device)[:, None]
            ref = torch.log_softmax(logits, -1).gather(1, ids)[:, 0].cpu()
            diffs.append(torch.tensor(s.logprobs) - ref)
        d = torch.cat(diffs)
        out[name] = {
            "tokens": d.numel(),
            "mean_abs": round(d.abs().mean().item(), 5),
            "max_abs": round(d.abs().max().item(), 5),
        }
    out["tolerance_mean_abs"] = 2e-2
    out["within_tolerance"] = out["vs_bf16_autocast_forward"]["mean_abs"] <= 2e-2
    return out


def train_check(model, tok, args, peak: float) -> dict:
    from sage_rl.train.trainer import Trainer, TrainerConfig

    samples = train_bench.as_samples(
        train_bench.make_rollout_batch(args.train_batch, model.config.vocab_size, 0)
    )
    params = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {"samples": len(samples), "params": params, "micro": {}}
    for micro in (int(m) for m in args.train_micro.split(",")):
        trainer = Trainer(copy.deepcopy(model), tok, TrainerConfig(micro_batch_size=micro, lr=1e-7))
        try:
            runs = [trainer.step(samples, num_chains=len(samples)) for _ in range(args.train_steps + 1)][1:]
        except torch.OutOfMemoryError:
            out["micro"][micro] = "out of memory"
            break
        finally:
            del trainer
            gc.collect()
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
        step_s = statistics.median(m["train_time_s"] for m in runs)
        seq_tok_s = runs[0]["seq_tokens"] / step_s
        fwd_tok_s = runs[0]["forward_tokens"] / step_s
        out["micro"][micro] = {
            "step_s": round(step_s, 3), "seq_tok_s": round(seq_tok_s), "forward_tok_s": round(fwd_tok_s),
            "mfu_vs_matmul": round(6 * params * fwd_tok_s / peak, 3),
            "mfu_vs_nominal": round(6 * params * fwd_tok_s / NOMINAL_BF16_FLOPS, 3),
        }  # fmt: skip
        log(f"trainer micro {micro}: {out['micro'][micro]}")
    best = max(
        (v for v in out["micro"].values() if isinstance(v, dict)), key=lambda v: v["seq_tok_s"], default=None
    )
    out["best"] = best
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="accepted for engine_bench's dispatch; cuda only")
    ap.add_argument("--model", default=None, help="a .gguf or model folder (default: the embedded SmolLM2)")
    ap.add_argument("--rows", default="8,64,256")
    ap.add_argument("--attention", default="gather,flex")
    ap.add_argument("--flex-rows", default="64", help="rows at which the non-first attentions run")
    ap.add_argument("--hf-rows", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=900)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--obs", type=int, default=60)
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--greedy-prompts", type=int, default=8)
    ap.add_argument("--greedy-tokens", type=int, default=48)
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--train-micro", default="8,16,32")
    ap.add_argument("--train-steps", type=int, default=2)
    ap.add_argument(
        "--skip", default="", help="comma-separated parts to skip: engine,hf,greedy,logprobs,train"
    )
    ap.add_argument("--out", default="docs/results/gpu_engine.json")
    ap.add_argument(
        "--quick", action="store_true", help="CPU smoke test: tiny model, tiny sizes, nothing written"
    )
    args = ap.parse_args(argv)
    from sage_rl.models import load_model, tiny_model

    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        raise SystemExit(
            "gpu_engine_bench: no CUDA GPU here (use --quick for a CPU smoke test); nothing written"
        )
    device = "cuda" if cuda else "cpu"
    if args.quick:
        args.rows, args.hf_rows, args.attention = "2,4", 4, "gather"  # eager flex on a CPU: dense, slow
        args.prompt, args.turns, args.gen, args.obs = 150, 2, 8, 20
        args.greedy_prompts, args.greedy_tokens, args.train_batch, args.train_micro = 2, 6, 4, "2"
        model_cpu, tok = tiny_model()
    else:
        model_cpu, tok = load_model(args.model)
    skip = set(filter(None, args.skip.split(",")))
    rows_list = [int(r) for r in args.rows.split(",")]
    attentions = args.attention.split(",")
    episodes = max(rows_list + [args.hf_rows, args.greedy_prompts])
    wl = argparse.Namespace(prompt=args.prompt, episodes=episodes, group=args.group, obs=args.obs)
    prompts, obs = engine_bench.workload(ChatRenderer(tok), tok, wl)
    args.prompt_max, args.obs_len = max(len(p) for p in prompts), len(obs)
    model = copy.deepcopy(model_cpu).to(device).eval()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "workload": {"prompt_tokens": [min(map(len, prompts)), args.prompt_max], "turns": args.turns,
                     "gen_tokens": args.gen, "obs_tokens": len(obs), "group": args.group},
    }  # fmt: skip

    def save() -> None:  # after every part: a run cut short by its time limit keeps what it measured
        if cuda and not args.quick:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")

    bw = copy_bandwidth(device)
    peak = matmul_flops(device)
    result["copy_bandwidth_gbs"] = round(bw / 1e9, 1)
    result["bf16_matmul_tflops"] = round(peak / 1e12, 1)
    log(f"{result['device']}: copy {bw / 1e9:.0f} GB/s, bf16 matmul {peak / 1e12:.0f} TFLOP/s")
    if "greedy" not in skip:
        result["greedy"] = greedy_check(model_cpu, model, tok, prompts[: args.greedy_prompts], args)
        log(f"greedy: {result['greedy']}")
        save()
    if "engine" not in skip:
        weights = sum(p.numel() for p in model.parameters()) * 2  # bf16 (a tied head read once more: ignored)
        mean_ctx = args.prompt + args.turns * (args.gen + len(obs)) / 2
        engine: dict[str, Any] = {}
        for attention in attentions:
            for rows in rows_list:
                if attention != attentions[0] and str(rows) not in args.flex_rows.split(","):
                    continue
                r = run_engine(model, tok, prompts, obs, rows, attention, args)
                step_bytes = weights + rows * mean_ctx * per_position_bytes(model, torch.bfloat16)
                r["floor_tok_s"] = round(rows * bw / step_bytes)
                r["fraction_of_floor"] = round(r["tok_s"] / r["floor_tok_s"], 3)
                engine[f"{attention}_{rows}"] = r
                log(f"engine {attention} rows {rows}: {r}")
                save()
        result["engine"] = engine
        best64 = max(
            (v for k, v in engine.items() if k.endswith("_64")), key=lambda v: v["tok_s"], default=None
        )
        if best64:
            result["tok_s_64"], result["floor_tok_s_64"] = best64["tok_s"], best64["floor_tok_s"]
    if "hf" not in skip:
        model_bf16 = copy.deepcopy(model_cpu).to(device, torch.bfloat16).eval()
        result["hf_generate"] = run_hf(model_bf16, tok, prompts[: args.hf_rows], obs, args)
        del model_bf16
        log(f"hf generate rows {args.hf_rows}: {result['hf_generate']}")
        save()
        if "tok_s_64" in result and args.hf_rows == 64:
            result["ratio_vs_hf_generate_64"] = round(result["tok_s_64"] / result["hf_generate"]["tok_s"], 2)
    if "logprobs" not in skip:
        result["logprobs"] = logprob_check(model, tok, prompts[:2], args)
        log(f"logprobs: {result['logprobs']}")
        save()
    if "train" not in skip:
        result["train"] = train_check(model, tok, args, peak)
        if result["train"]["best"]:
            result["train_tok_s"] = result["train"]["best"]["seq_tok_s"]
    print(json.dumps(result, indent=1))
    save()
    return result


if __name__ == "__main__":
    main()
