"""Recorded chains replayed under each skill-credit rule: what ``flow`` would pay where ``api`` paid.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/credit_replay.py FILE.jsonl [...] [--config C] [--rules api,flow] [--limit N]

FILE is any JSON Lines file of chains: an evaluation's ``trajectories.*.jsonl``, an RL run's
``rollouts/step_*.jsonl``, or a step's journal (``step_*.partial.jsonl``: its groups' chains).
Each chain runs again through the project's own ``ChainRunner`` in the sandbox (PocketWorld is
deterministic), with a policy that writes the recorded completions turn by turn, once per rule:
so the cells, the library each task loads and the outcomes are the recorded ones, and only the
credit differs. ``--config`` must be the run's (its agent limits, skills and retrieval; default
configs/laptop_recipe.yaml). Prints one JSON object: per rule the later tasks credited with an
earlier task's skill (``used_from`` not empty) and those paid the bonus for it (credited and
successful); the chains whose rewards differ between the first two rules, with the tasks and the
skills used under the second; and
``mismatches``, replayed tasks whose outcome, library or turns differ from the record (0 means the
replay is faithful; ``mismatched`` says which and how).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sage_rl.build import build_runner, open_suite
from sage_rl.config import load_config
from sage_rl.envs.pocketworld import tasks
from sage_rl.policies.base import Completion
from sage_rl.rollout.batch import chain_rewards
from sage_rl.runs.console import progress
from sage_rl.settings import TrainConfig
from sage_rl.skills import Library


class Replay:
    """Writes the recorded completion of each (task, turn) of one chain."""

    renderer = None
    name = "replay"

    def __init__(self) -> None:
        self.turns: dict[str, list[Mapping[str, Any]]] = {}

    def load(self, chain: Mapping[str, Any]) -> None:
        self.turns = {t["task"]["task_id"]: t["turns"] for t in chain["trajectories"]}

    async def generate(self, request: Any) -> Completion:
        k = sum(m["role"] == "assistant" for m in request.messages)
        turns = self.turns.get(request.task_id, [])
        if k >= len(turns):  # the record ended here: anything further is a mismatch
            return Completion("", completion_tokens=1, finish_reason="length")
        turn = turns[k]
        return Completion(turn["text"], completion_tokens=int(turn.get("completion_tokens") or 1))

    def weights_changed(self) -> None:
        pass


def _mismatch(recorded: Mapping[str, Any], replayed: Any) -> str:
    """What differs between a recorded task and its replay ("" when nothing does)."""
    if bool(recorded["outcome"]["success"]) != replayed.outcome.success:
        return f"success {recorded['outcome']['success']} -> {replayed.outcome.success}"
    if list(recorded.get("library_in") or ()) != list(replayed.library_in):
        return f"library {recorded.get('library_in')} -> {list(replayed.library_in)}"
    if len(recorded["turns"]) != len(replayed.turns):
        return f"turns {len(recorded['turns'])} -> {len(replayed.turns)}"
    return ""


async def replay(chains: list[dict[str, Any]], rules: list[str], config: str) -> dict[str, Any]:
    report: dict[str, Any] = {
        "chains": len(chains),
        "rules": {},
        "differ": [],
        "mismatches": 0,
        "mismatched": [],
    }
    rewards: dict[str, list[tuple[float, ...]]] = {}
    with progress() as bar:  # on stderr: stdout is the JSON
        for rule in rules:
            cfg = load_config(TrainConfig, config, [f"skills.credit={rule}"])
            credited = bonus = 0
            rewards[rule] = []
            job = bar.add_task(f"replay under {rule}", total=len(chains))
            async with open_suite(cfg) as suite:
                policy = Replay()
                runner = build_runner(cfg, policy, suite)
                for i, record in enumerate(chains):
                    policy.load(record)
                    seq = [tasks.task_by_id(t["task"]["task_id"]) for t in record["trajectories"]]
                    chain = await runner.run(seq, Library())
                    rewards[rule].append(chain_rewards(chain, cfg.rollout))
                    for k, traj in enumerate(chain.trajectories[1:], 1):
                        if chain.used_from[k]:
                            credited += 1
                            bonus += traj.outcome.success
                    if rule == rules[0]:
                        for r, t in zip(record["trajectories"], chain.trajectories, strict=False):
                            if why := _mismatch(r, t):
                                report["mismatches"] += 1
                                report["mismatched"].append({"task": t.task.task_id, "why": why})
                    elif rule == rules[1] and rewards[rule][i] != rewards[rules[0]][i]:
                        report["differ"].append({
                            "tasks": [t.task.task_id for t in chain.trajectories],
                            "rewards": {r: list(rewards[r][i]) for r in rules[:2]},
                            "skills_used": [list(t.skills_used) for t in chain.trajectories],
                        })  # fmt: skip
                    bar.advance(job)
            later = sum(len(c["trajectories"]) - 1 for c in chains)
            report["rules"][rule] = {"later_tasks": later, "credited": credited, "bonus_paid": bonus}
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--config", default="configs/laptop_recipe.yaml", help="the run's config")
    ap.add_argument(
        "--rules", default="api,flow", help="credit rules, comma-separated (the first two compared)"
    )
    ap.add_argument("--limit", type=int, default=None, help="replay only the first N chains")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    chains = []
    for path in args.files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                chain = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if isinstance(chain, dict) and chain.get("trajectories"):
                chains.append(chain)
            elif isinstance(chain, dict) and isinstance(chain.get("chains"), list):  # a step's journal
                chains += [c for c in chain["chains"] if isinstance(c, dict) and c.get("trajectories")]
    started = [c for c in chains if c.get("start_library")]
    if started:  # the replay starts every chain from an empty library, as evaluations and RL do here
        raise SystemExit(
            f"{len(started)} chain(s) started from a non-empty library ({started[0]['start_library'][:3]}...): "
            "the replay cannot rebuild it; replay chains that started empty"
        )
    chains = chains[: args.limit]
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    if len(rules) < 2:
        raise SystemExit("--rules: name at least two credit rules to compare, e.g. api,flow")
    report = {"files": [str(f) for f in args.files], **asyncio.run(replay(chains, rules, args.config))}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
