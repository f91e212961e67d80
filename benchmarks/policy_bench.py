"""Benchmark the local model path: SmolLM2 load times and TransformersPolicy sampling throughput.

    .venv/bin/python benchmarks/policy_bench.py [--max-tokens 64] [--concurrent 8] [--threads 2]
                                                [--no-first-load]

Prints one JSON object on stdout (progress goes to stderr):
- ``load_first_s``: load with an empty cache (GGUF de-quantisation + writing the safetensors
  cache), measured in a temporary cache dir that is deleted afterwards;
- ``load_cached_s``: load from the cache (the usual case);
- ``tokens_per_s_1``: sampled tokens per second for one request at a time;
- ``tokens_per_s_N``: the same with N concurrent requests (batched together);
- ``tokens_per_s_N_agents``: N concurrent clients making 3 requests each, one after another; in
  each round one turn is ``max_tokens`` long and the others ``max_tokens // 8`` (continuous
  batching: a client's next turn joins the batch while the long one is still sampling).
Every request samples exactly ``--max-tokens`` tokens (stop ids are disabled), temperature 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from rich.console import Console

from sage_rl.agent.render import ChatRenderer
from sage_rl.models import load_model
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy

PROMPT = "Write a Python function that returns the sum of the squares of a list of numbers."


def timed_load() -> tuple[float, object, object]:
    t0 = time.perf_counter()
    model, tok = load_model()
    return time.perf_counter() - t0, model, tok


def timed_first_load() -> float:
    """Load with an empty cache (a temporary ``SAGE_RL_CACHE``, deleted afterwards)."""
    old, tmp = os.environ.get("SAGE_RL_CACHE"), tempfile.mkdtemp(prefix="sage-rl-bench-cache-")
    os.environ["SAGE_RL_CACHE"] = tmp
    try:
        return timed_load()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is None:
            del os.environ["SAGE_RL_CACHE"]
        else:
            os.environ["SAGE_RL_CACHE"] = old


def throughput(policy: TransformersPolicy, prompt: list[int], n: int, max_tokens: int) -> float:
    requests = [
        PolicyRequest((), tuple(prompt), SamplingParams(max_tokens=max_tokens, seed=i)) for i in range(n)
    ]

    async def run() -> int:
        outs = await asyncio.gather(*[policy.generate(r) for r in requests])
        return sum(len(o.token_ids) for o in outs)

    t0 = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens / (time.perf_counter() - t0)


def agents_throughput(policy: TransformersPolicy, prompt: list[int], n: int, max_tokens: int) -> float:
    """``n`` concurrent clients, each making 3 requests one after another. In each round one client's
    turn is long (``max_tokens``) and the others' short (``max_tokens // 8``), like agents whose
    turns end at different times."""
    lengths = [
        max_tokens if (c + t) % n == 0 else max(1, max_tokens // 8) for c in range(n) for t in range(3)
    ]

    async def client(c: int) -> int:
        done = 0
        for t in range(3):
            params = SamplingParams(max_tokens=lengths[3 * c + t], seed=c)
            done += len((await policy.generate(PolicyRequest((), tuple(prompt), params))).token_ids)
        return done

    async def run() -> int:
        return sum(await asyncio.gather(*[client(c) for c in range(n)]))

    t0 = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-first-load", action="store_true", help="skip the empty-cache load (~25 s, 540 MB)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    result: dict[str, object] = {"threads": args.threads, "max_tokens": args.max_tokens}
    if not args.no_first_load:
        with console.status("first load (empty cache: de-quantising the GGUF)"):
            result["load_first_s"] = round(timed_first_load(), 2)
    with console.status("cached load"):
        timed_load()  # make sure the real cache exists, then time a load from it
        seconds, model, tok = timed_load()
    result["load_cached_s"] = round(seconds, 2)
    prompt = ChatRenderer(tok).prompt_ids([{"role": "user", "content": PROMPT}])
    result["prompt_tokens"] = len(prompt)
    policy = TransformersPolicy(model, tok, max_batch=args.concurrent, stop_ids=())
    with console.status("warm-up"):
        throughput(policy, prompt, 1, 4)
    for n in (1, args.concurrent):
        with console.status(f"sampling, {n} concurrent"):
            result[f"tokens_per_s_{n}"] = round(throughput(policy, prompt, n, args.max_tokens), 1)
    with console.status(f"{args.concurrent} agents, 3 turns of different lengths each"):
        result[f"tokens_per_s_{args.concurrent}_agents"] = round(
            agents_throughput(policy, prompt, args.concurrent, args.max_tokens), 1
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
