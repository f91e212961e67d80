"""One template, the screen's way, greedy against sampled on the same scenarios (issue 27).

The screened pool (``sage_rl/rollout/pool.py``) keeps a template when its *sampled* success lies
strictly between 0 and 1. A template the screen calls hopeless that greedy evaluation solves says
either that the screen's scenarios were hard ones, or that sampling fails where greedy does not.
This runs ``--scenarios`` fresh train scenarios of TEMPLATE as a screen does (chains of
``rollout.chain_length`` tasks from an empty library), and the template's first ``train_heldout``
scenarios the same way, each once greedy and ``--samples`` times at the rollouts' temperature, and
prints every task's outcome and the successes by split, mode and scenario:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/screen_probe.py runs/laptop29/sft/final email_mark_read_from
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from sage_rl.build import build_policy, build_runner, open_suite
from sage_rl.config import load_config
from sage_rl.envs.pocketworld.env import check_scope
from sage_rl.settings import TrainConfig
from sage_rl.skills.library import Library

SPLITS = ("train", "train_heldout")


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Successes over tasks by ``"<split> <mode>"`` (mode ``greedy`` or ``T=<t>``), in all and by
    scenario (pure)."""
    out: dict[str, dict[str, Any]] = {}
    by: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[f"{r['split']} {r['mode']}"][r["scenario"]].append(bool(r["success"]))
    for key, scenarios in by.items():
        every = [ok for oks in scenarios.values() for ok in oks]
        out[key] = {
            "success": sum(every),
            "tasks": len(every),
            "by_scenario": {s: f"{sum(oks)}/{len(oks)}" for s, oks in scenarios.items()},
        }
    return out


async def probe(
    cfg: TrainConfig, template: str, scenarios: int, samples: int, seed: int = 0
) -> list[dict[str, Any]]:
    """Every task of the probe, one row each: split, mode, scenario, task, success, stop, turns, tokens."""
    k = cfg.rollout.chain_length
    rows: list[dict[str, Any]] = []
    async with open_suite(cfg) as suite:
        one = suite.scoped([template])
        base = build_runner(cfg, build_policy(cfg), one)
        rng = random.Random(f"{seed}:probe:{template}")
        heldout: dict[str, list] = defaultdict(list)  # the scoped split holds only this template's tasks
        for t in one.split("train_heldout"):
            heldout[t.scenario_id].append(t)
        chains = {
            "train": [one.sample_chain(rng, k, "train") for _ in range(scenarios)],
            "train_heldout": [tuple(ts[:k]) for ts in heldout.values()][:scenarios],
        }
        temperature = base.params.temperature
        for split in SPLITS:
            for mode, temp, times in (("greedy", 0.0, 1), (f"T={temperature:g}", temperature, samples)):
                runner = dataclasses.replace(base, params=dataclasses.replace(base.params, temperature=temp))
                done = await asyncio.gather(
                    *(
                        runner.run(seq, Library(), group_index=i, chain_index=j)
                        for i, seq in enumerate(chains[split])
                        for j in range(times)
                    )
                )
                for chain in done:
                    for t in chain.trajectories:
                        rows.append(
                            {
                                "split": split,
                                "mode": mode,
                                "scenario": t.task.scenario_id,
                                "task": t.task.task_id,
                                "success": t.outcome.success,
                                "stop": str(t.stop),
                                "turns": len(t.turns),
                                "tokens": t.num_generated_tokens,
                                "skills_saved": list(t.skills_saved),
                            }
                        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "model", help="a model folder (an SFT or RL checkpoint), or 'base' for the embedded model"
    )
    ap.add_argument("template", help="a train template's name (pocketworld)")
    ap.add_argument("--config", default="configs/laptop_recipe.yaml")
    ap.add_argument("--scenarios", type=int, default=3, help="train scenarios, and held-out ones (at most 7)")
    ap.add_argument("--samples", type=int, default=2, help="sampled chains per scenario")
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = ap.parse_intermixed_args(argv)
    model = None if args.model == "base" else args.model
    if model is not None and not Path(model).is_dir():
        ap.error(f"model {model!r} is not a folder")
    cfg = load_config(TrainConfig, args.config, [*args.overrides, f"policy.model={model or 'null'}"])
    try:
        check_scope([args.template])
    except ValueError as e:
        ap.error(str(e))
    rows = asyncio.run(probe(cfg, args.template, args.scenarios, args.samples))
    for r in rows:
        print(json.dumps(r))
    result = {"model": args.model, "template": args.template, "rows": rows, "summary": summary(rows)}
    for key, s in result["summary"].items():
        print(f"{key}: {s['success']}/{s['tasks']}  by scenario {s['by_scenario']}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
