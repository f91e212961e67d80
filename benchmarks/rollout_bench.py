"""Share of rollout wall time spent outside the model (issue 5): parsing, sandbox, environment,
bookkeeping, and any idle gap. Target: under 10%.

Runs a batch of scenario chains concurrently with the transformers policy (SmolLM2 by default) in
the sandboxed PocketWorld, timing every step of the policy's sampling thread (a forward pass plus
drawing the next tokens). That thread runs one step at a time, so the sum is the model's busy time;
everything else (including any moment the model waits for an episode to come back) is "outside".

    .venv/bin/python benchmarks/rollout_bench.py                 # SmolLM2, 8 dev scenarios
    .venv/bin/python benchmarks/rollout_bench.py --tiny          # a tiny random model (fast)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.envs.pocketworld.sandboxed import SandboxExecutors
from sage_rl.eval.runner import evaluate_chains, scenarios_of
from sage_rl.models import load_model, tiny_model
from sage_rl.policies.base import SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.sandbox import Sandbox
from sage_rl.skills.library import Library
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever


class Timed:
    """Wraps ``owner.attr`` (a method) and sums the seconds spent in it."""

    def __init__(self, owner, attr: str):
        self.inner, self.seconds, self.calls = getattr(owner, attr), 0.0, 0
        setattr(owner, attr, self)

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random model instead of SmolLM2")
    ap.add_argument("--scenarios", type=int, default=8)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = tiny_model(0) if args.tiny else load_model(None)
    forward = Timed(model, "forward")
    policy = TransformersPolicy(model, tok, max_batch=args.scenarios)
    busy = Timed(policy, "_advance")
    with Sandbox() as sandbox:  # started before timing (a one-off cost per process)
        suite = PocketWorldSuite(SandboxExecutors(sandbox))
        runner = ChainRunner(
            policy,
            suite,
            PromptBuilder(),
            AgentConfig(max_steps=args.max_steps, max_tokens_per_turn=args.max_tokens),
            SkillsConfig(),
            SamplingParams(temperature=1.0, seed=0),
            make_retriever(RetrievalConfig()),
        )
        tasks = [t for s in scenarios_of(suite.split(args.split, args.scenarios)) for t in s]
        t0 = time.perf_counter()
        chains = asyncio.run(evaluate_chains(runner, tasks, Library(), concurrency=args.scenarios))
        wall = time.perf_counter() - t0
    turns = [turn for c in chains for t in c.trajectories for turn in t.turns]
    print(
        json.dumps(
            {
                "model": "tiny" if args.tiny else "SmolLM2-135M-Instruct",
                "threads": args.threads,
                "scenarios": len(chains),
                "episodes": sum(len(c.trajectories) for c in chains),
                "turns": len(turns),
                "generated_tokens": sum(len(t.gen_ids) for t in turns),
                "wall_s": round(wall, 3),
                "model_busy_s": round(busy.seconds, 3),
                "forward_s": round(forward.seconds, 3),
                "sampler_steps": busy.calls,
                "env_s_sum": round(sum(t.env_s for t in turns), 3),
                "outside_model_share": round(1 - busy.seconds / wall, 4),
                "target_outside_share": 0.10,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
