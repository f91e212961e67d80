"""The local engine against plain transformers ``generate`` (and llama.cpp), side by side (issues 16, 29).

An agent-like multi-turn workload: ``--episodes`` concurrent episodes in groups of ``--group``
(the chains of a group share their whole prompt; all episodes share a system prompt), a prompt of
about ``--prompt`` tokens, ``--turns`` turns of exactly ``--gen`` sampled tokens (stop ids off,
temperature 1), and a fixed observation of about ``--obs`` tokens appended after each turn.

- ``hf_generate``: what a user writes with transformers: each turn, the episodes' whole sequences
  left-padded into one batch and ``model.generate`` (the model as loaded, float32).
- ``policy``: ``TransformersPolicy`` with its default settings (one coroutine per episode);
  ``policy_<dtype>`` (fp32, bf16) and ``policy_t<N>`` / ``policy_fp32_t<N>`` fix the compute dtype
  or the sampling threads (``threads=N`` instead of the default "auto"); ``_unpacked`` turns off
  the few-row column blocks of ``engine/packed.py`` (the BLAS product for every row count),
  ``_rows`` the decode pool of ``engine/pool.py`` (each row attends over its own cache),
  ``_torch`` the compiled decode step of ``engine/native.py`` (its torch operations instead).
- ``llama_cpp``: llama-cpp-python on the same GGUF, one episode after another, when a bench venv
  has it (``--llama-python``, default ``.venv-bench/bin/python``); skipped otherwise. PyPI has no
  CPU wheel of it, so it builds from source (about 20 minutes on 2 cores):
  ``python3 -m venv .venv-bench && .venv-bench/bin/pip install llama-cpp-python==0.3.36``.

    .venv/bin/python benchmarks/engine_bench.py [--threads 2] [--systems policy,hf_generate] [--isa avx2] [--busy] [--quick]
    .venv/bin/python benchmarks/engine_bench.py --device cuda [...]   (benchmarks/gpu_engine_bench.py: the GPU figures)

- ``--isa avx2`` runs torch's, oneDNN's and MKL's AVX2 kernels on any x86 CPU (the process
  re-executes itself with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
  MKL_ENABLE_INSTRUCTIONS=AVX2``, which must be set before torch loads).
- ``--busy`` runs a competing 2-thread float32 matmul loop in another process beside every system
  (what the cores look like with a second job on them); its matmuls per second are reported.
- ``--quick``: a smaller workload (300-token prompts, 2 turns of 32 tokens) that runs in minutes.

Prints one JSON object: the CPU (model, ISA flags, torch's kernel level, the ISA variables); per
system tokens, wall and CPU seconds, tokens/s and tokens per CPU second, the load (``uptime``)
before and after; ratios of each policy to ``hf_generate`` and ``llama_cpp``; the memory-bandwidth
floor of a decode step (weights bytes read per step / measured read bandwidth) with the fraction
of it that the policy's full-batch decode steps reach; and how far the sampler's logprobs are from
a float32 forward pass (what a float32 trainer computes). Every line printed to stderr carries the
CPU and the load too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from decode_floor import DecodeTimer, floor_report, read_bandwidth_gbs
from machine import Busy, cpu_info, reexec_for_isa, uptime
from rich.console import Console
from runs_summary import median_runs, ratios

from sage_rl.agent.render import ChatRenderer
from sage_rl.engine import native
from sage_rl.models import load_model, smollm2_gguf_path
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy

APPS = ("phone", "spotify", "venmo", "gmail", "amazon", "todoist", "splitwise", "file_system")
VERBS = ("search", "show", "create", "update", "delete", "list")
OBS = 'Output:\n{"status": "ok", "results": [{"id": 17, "name": "Weekly groceries", "amount": 42.5}, {"id": 18, "name": "Rent", "amount": 900}], "page": 0}\n'


def workload(renderer: ChatRenderer, tok, args) -> tuple[list[list[int]], list[int]]:
    """Episode prompts (``--episodes``, identical within a group) and the observation ids."""
    lines = ["You are an agent that solves tasks by writing Python code against these APIs."]
    i = 0
    while len(tok.encode("\n".join(lines))) < args.prompt - 120:
        app, verb = APPS[i % len(APPS)], VERBS[(i // len(APPS)) % len(VERBS)]
        lines.append(
            f"apis.{app}.{verb}_item_{i}(access_token: str, query: str = '', page_index: int = 0) -> dict: {verb} one {app} item."
        )
        i += 1
    system = "\n".join(lines)
    prompts = []
    for e in range(args.episodes):
        task = (
            f"Task {e // args.group}: find every {APPS[e // args.group % len(APPS)]} item about the trip in May, "
            * 4
        )
        prompts.append(
            renderer.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": task}])
        )
    obs = renderer.observation_ids(OBS * max(1, round(args.obs / 60)), [])
    return prompts, obs


def _timed(fn, busy: Busy | None = None):
    load0, wall, cpu = uptime(), time.perf_counter(), time.process_time()
    tokens = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    entry = {
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "tokens_per_cpu_s": round(tokens / cpu, 2),
        "load_before_after": [load0, uptime()],
    }
    if busy is not None:
        entry["busy_matmuls_per_s_at_end"] = busy.rate()
    return entry


def run_policy(policy: TransformersPolicy, prompts, obs, args) -> int:
    async def episode(e: int) -> int:
        ids, done = list(prompts[e]), 0
        for _ in range(args.turns):
            params = SamplingParams(temperature=1.0, max_tokens=args.gen, seed=e)
            out = await policy.generate(PolicyRequest((), tuple(ids), params))
            ids += [*out.token_ids, *obs]
            done += len(out.token_ids)
        return done

    async def run() -> int:
        return sum(await asyncio.gather(*[episode(e) for e in range(len(prompts))]))

    return asyncio.run(run())


def run_hf_generate(model, pad_id: int, prompts, obs, args) -> int:
    seqs, done = [list(p) for p in prompts], 0
    torch.manual_seed(0)
    for _ in range(args.turns):
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, width - len(s) :], mask[b, width - len(s) :] = torch.tensor(s), 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.gen,
                min_new_tokens=args.gen,
                pad_token_id=pad_id,
            )
        for b, s in enumerate(seqs):
            gen = out[b, width:].tolist()
            s += gen + obs
            done += len(gen)
    return done


def run_llama_cpp(python: str, prompts, obs, args) -> dict:
    job = {"gguf": str(smollm2_gguf_path()), "threads": args.threads, "prompts": prompts, "obs_ids": obs}
    job |= {"turns": args.turns, "gen": args.gen}
    load0 = uptime()
    script = Path(__file__).with_name("llama_cpp_turns.py")
    proc = subprocess.run(
        [python, str(script)], input=json.dumps(job), capture_output=True, text=True, check=True
    )
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "tokens": r["tokens"],
        "wall_s": round(r["wall_s"], 2),
        "cpu_s": round(r["cpu_s"], 2),
        "tokens_per_s": round(r["tokens"] / r["wall_s"], 2),
        "tokens_per_cpu_s": round(r["tokens"] / r["cpu_s"], 2),
        "load_before_after": [load0, uptime()],
        "version": r["version"],
    }


def logprob_mismatch(model, tok, prompts, args) -> dict:
    """The sampler's logprobs against a float32 transformers forward over the same tokens
    (what a float32 trainer computes): mean and max |difference| per sampled token, and the mean
    signed difference, for one turn of the first two episodes, per compute dtype."""
    out = {}
    for name, dtype in (("policy_fp32", None), ("policy_bf16", "bfloat16")):
        policy = TransformersPolicy(model, tok, max_batch=2, stop_ids=(), dtype=dtype)
        params = SamplingParams(temperature=1.0, max_tokens=args.gen, seed=0)
        diffs = []
        for prompt in prompts[: min(2, len(prompts))]:
            sample = asyncio.run(policy.generate(PolicyRequest((), tuple(prompt), params)))
            seq = torch.tensor([list(prompt) + list(sample.token_ids)])
            with torch.inference_mode():
                logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
            diffs.append(torch.tensor(sample.logprobs) - ref)
        d = torch.cat(diffs)
        out[name] = {
            "tokens": d.numel(),
            "mean_abs": round(d.abs().mean().item(), 5),
            "max_abs": round(d.abs().max().item(), 5),
            "mean_signed": round(d.mean().item(), 5),
        }
    return out


QUICK = {"prompt": 300, "turns": 2, "gen": 32}
POLICY_DTYPES = {"": None, "fp32": "float32", "bf16": "bfloat16"}


def kernel_in_use(runner) -> str:
    """Whether decode steps go through the compiled kernel (engine/native.py), and why not."""
    if getattr(runner, "kernel_weights", None) is None:
        return f"torch ({native.disabled() or 'the kernel does not apply, or _torch'})"
    return "compiled" if native.decode_kernel() is not None else "torch (the kernel could not be built)"


def policy_variant(system: str) -> dict:
    """``policy[_fp32|_bf16][_t<N>|_auto][_unpacked][_rows][_torch]`` -> TransformersPolicy keyword arguments
    (the defaults where the name says nothing)."""
    kwargs: dict = {}
    parts = system.split("_")[1:]
    for part in parts:
        if part == "unpacked":  # the BLAS product at every row count
            kwargs["column_blocks"] = False
        elif part == "rows":  # each row's attention over its own cache
            kwargs["decode_pool"] = False
        elif part == "torch":  # the decode step through torch operations, not the compiled kernel
            kwargs["kernel"] = False
        elif part in POLICY_DTYPES:
            kwargs["dtype"] = POLICY_DTYPES[part]
        elif part == "auto":
            kwargs["threads"] = "auto"
        elif part.startswith("t") and part[1:].isdigit():
            kwargs["threads"] = int(part[1:])
        else:
            raise SystemExit(
                f"unknown system {system!r}: policy[_fp32|_bf16][_t<N>|_auto][_unpacked][_rows][_torch]"
            )
    return kwargs


def main() -> None:
    if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1 :][:1] == ["cuda"]:
        import gpu_engine_bench  # the CUDA path's measurements (issue 28): its own arguments

        gpu_engine_bench.main(sys.argv[1:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--group", type=int, default=1, help="episodes per group (sharing their whole prompt)")
    ap.add_argument("--prompt", type=int, default=900)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--obs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--systems", default="policy,hf_generate")
    ap.add_argument("--isa", choices=["avx2"], help="run torch, oneDNN and MKL with these kernels")
    ap.add_argument(
        "--busy", action="store_true", help="a competing 2-thread matmul loop beside every system"
    )
    ap.add_argument(
        "--quick", action="store_true", help="300-token prompts, 2 turns of 32 tokens (unless given)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the systems this many times, alternated: medians and each run's ratio (one run of "
        "the same code swings by 15%% on a 2-core machine)",
    )
    ap.add_argument("--llama-python", default=".venv-bench/bin/python")
    ap.add_argument("--no-mismatch", action="store_true", help="skip the sampler-vs-fp32 logprob check")
    if "--quick" in sys.argv:  # its sizes are defaults: --prompt, --turns, --gen still apply
        ap.set_defaults(**QUICK)
    args = ap.parse_args()
    reexec_for_isa(args.isa)
    torch.set_num_threads(args.threads)
    console = Console(stderr=True, markup=False)  # the CPU tag has brackets
    cpu = cpu_info()
    tag = f"{cpu['model']} [{','.join(cpu['isa_flags'])}; torch kernels {cpu['torch_cpu_capability']}]"
    model, tok = load_model(None)
    renderer = ChatRenderer(tok)
    prompts, obs = workload(renderer, tok, args)
    result: dict = {
        "cpu": cpu,
        "conditions": {"busy": args.busy, "isa": args.isa or "native", "quick": args.quick},
        "workload": {
            "episodes": args.episodes,
            "group": args.group,
            "prompt_tokens": [min(len(p) for p in prompts), max(len(p) for p in prompts)],
            "turns": args.turns,
            "gen_tokens": args.gen,
            "obs_tokens": len(obs),
            "threads": args.threads,
        },
        "systems": {},
    }
    with console.status("measuring memory bandwidth"):
        bandwidth = read_bandwidth_gbs()
    result["read_bandwidth_gbs"] = round(bandwidth, 1)
    runs: list[dict] = []
    with Busy() if args.busy else contextlib.nullcontext() as busy:
        for _ in range(args.repeats):
            runs.append(measure(args, model, tok, prompts, obs, bandwidth, busy, console, tag))
    result["systems"] = runs[0] if len(runs) == 1 else median_runs(runs)
    result["ratios"] = ratios(result["systems"])
    if len(runs) > 1:
        result["ratio_runs"] = {k: sorted(ratios(r)[k] for r in runs) for k in result["ratios"]}
    for name, value in result["ratios"].items():
        spread = f" (runs: {result['ratio_runs'][name]})" if len(runs) > 1 else ""
        console.print(
            f"{name}: {value}x{spread} on {tag}{' beside a 2-thread matmul loop' if args.busy else ''}"
        )
    if not args.no_mismatch:
        with console.status("sampler vs float32 forward logprobs"):
            result["logprob_mismatch_vs_fp32_forward"] = logprob_mismatch(model, tok, prompts, args)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


def measure(args, model, tok, prompts, obs, bandwidth, busy, console, tag) -> dict:
    """One run of every system of ``--systems``: {system: its figures}."""
    systems: dict = {}
    for system in args.systems.split(","):
        with console.status(f"{system}: {args.episodes} episodes x {args.turns} turns x {args.gen} tokens"):
            if system.startswith("policy"):
                kwargs = policy_variant(system)
                kernel = kwargs.pop("kernel", True)
                policy = TransformersPolicy(model, tok, max_batch=args.episodes, stop_ids=(), **kwargs)
                if not kernel:
                    policy.engine.runner.kernel_weights = None
                timer = DecodeTimer(policy.engine.runner, args.episodes)
                entry = _timed(lambda p=policy: run_policy(p, prompts, obs, args), busy)
                entry["settings"] = {
                    "dtype": str(policy.dtype or "model"),
                    "threads": kwargs.get("threads", "auto"),
                    "packed": getattr(policy.engine.runner, "packed", None),
                    "pooled": getattr(policy.engine.runner, "pool", None) is not None,
                    "decode_kernel": kernel_in_use(policy.engine.runner),
                }
                entry["engine"] = {k: v for k, v in vars(policy.stats).items() if k != "admitted_at"}
                entry["bandwidth_floor"] = floor_report(policy, timer, bandwidth, args)
            elif system == "hf_generate":
                entry = _timed(lambda: run_hf_generate(model, tok.pad_token_id, prompts, obs, args), busy)
            elif system == "llama_cpp":
                if not Path(args.llama_python).exists():
                    systems["llama_cpp"] = f"skipped: {args.llama_python} not found"
                    continue
                entry = run_llama_cpp(args.llama_python, prompts, obs, args)
            else:
                raise SystemExit(f"unknown system {system!r}")
        systems[system] = entry
        console.print(f"{system}: {entry['tokens_per_s']} tokens/s on {tag}, {entry['load_before_after'][1]}")
    return systems


if __name__ == "__main__":
    main()
