"""What the default skill credit (``skills.credit=api``) and the stricter ``flow`` change against the
paper's rule (``skills.credit=paper``) on the laptop experiment's rollouts, measured with the scripted
expert.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/skill_credit.py [--chains 40] [--seed 0]

Runs ``--chains`` train task sequences of the laptop experiment's config (configs/laptop_recipe.yaml:
K = 2, its agent limits, prompts and retrieval) in the sandbox, with the scripted expert as the
policy (the SFT data's author: what the SFT model imitates), once under each rule. The same seeded
expert writes the same cells under every rule, so every difference is credit. Prints one JSON
object: per rule the mean reward per position and overall, the fraction of later tasks credited
with a skill use, and the per-chain differences (api - paper, flow - api). The expert always uses
its skills' values, so ``flow`` should pay what ``api`` pays: a difference is a use ``flow`` misses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from sage_rl.build import build_runner, open_suite
from sage_rl.config import load_config
from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.expert import ScriptedExpert
from sage_rl.rollout.batch import chain_rewards
from sage_rl.settings import TrainConfig
from sage_rl.skills import Library


async def rewards(cfg: TrainConfig, sequences, seed: int) -> list[tuple[tuple[float, ...], bool]]:
    """Per chain: its rewards, and whether its last task was credited with a skill use."""
    async with open_suite(cfg) as suite:
        runner = build_runner(cfg, ScriptedExpert(seed=seed), suite)
        out = []
        for seq in sequences:
            chain = await runner.run(seq, Library())
            out.append((chain_rewards(chain, cfg.rollout), bool(chain.used_from[-1])))
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chains", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="configs/laptop_recipe.yaml")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = load_config(TrainConfig, args.config)
    sequences = [tasks.sample_chain(rng, base.rollout.chain_length, "train") for _ in range(args.chains)]
    report: dict[str, object] = {"chains": args.chains, "chain_length": base.rollout.chain_length}
    by_rule = {}
    for rule in ("paper", "api", "flow"):
        cfg = load_config(TrainConfig, args.config, [f"skills.credit={rule}"])
        start = time.perf_counter()
        by_rule[rule] = asyncio.run(rewards(cfg, sequences, args.seed))
        rs = [r for r, _ in by_rule[rule]]
        report[rule] = {
            "mean_reward": sum(map(sum, rs)) / sum(map(len, rs)),
            "mean_reward_per_position": [sum(r[k] for r in rs) / len(rs) for k in range(len(rs[0]))],
            "later_task_credited": sum(used for _, used in by_rule[rule]) / len(rs),
            "seconds": round(time.perf_counter() - start, 1),
        }
    for a, b in (("api", "paper"), ("flow", "api")):
        diffs = [sum(x) - sum(y) for (x, _), (y, _) in zip(by_rule[a], by_rule[b], strict=True)]
        report[f"chain_reward_sum_difference_{a}_minus_{b}"] = {
            "mean": sum(diffs) / len(diffs),
            "chains_that_differ": sum(d != 0 for d in diffs),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
