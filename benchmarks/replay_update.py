"""One RL update replayed from a run's saved rollouts, with its real advantages or with each
group's advantages shuffled among its samples: is what an update does to the greedy policy the
rewards' signal, or the noise of updating on a few sampled chains at their decision points?

``perturb_control.py`` showed that a random direction of the update's size changes nothing (laptop35
``grpo_lib`` step 2: the same outcomes on all 90 ``train_val`` tasks) while the update itself lost
13 points: the damage lies in directions the samples pick. Shuffling the advantages within each
group keeps the samples, the tokens, each group's advantage values (zero-mean) and the optimizer's
first step, and cuts their link to success. If the shuffled update loses as much on a greedy
evaluation, the update's effect is the noise of its few samples, not what the reward says.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/replay_update.py --run runs/laptop35/grpo_lib \\
        --step 1 --start runs/laptop35/sft/final --advantages shuffled --seed 0 --out /tmp/ctl/shuffled0

then ``sage-rl eval`` the written model (``--out``) as ``docs/recipe.md`` shows. The update is the
run's first (its lr is the warm-up's first: ``trainer.warmup_steps``); ``--step`` names the
rollouts file (``rollouts/step_NNNNNN.jsonl``); from a step other than 1 the start model must be the
one that sampled it. Prints the step's figures (samples, groups trained, grad norm, lr) as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
from pathlib import Path

from sage_rl.config import load_config
from sage_rl.models import load_model
from sage_rl.recipe.controls import readable
from sage_rl.rollout.batch import Group, StepBatch, trained_groups
from sage_rl.settings import TrainConfig
from sage_rl.train.trainer import Trainer
from sage_rl.types import Chain


def batch_of(chains: list[Chain], cfg: TrainConfig) -> StepBatch:
    """The step's batch as ``rollout_step`` built it: groups by ``group_index`` in draw order, the
    trained ones those with a signal under dynamic sampling."""
    by_group: dict[int, list[Chain]] = {}
    for c in chains:
        by_group.setdefault(c.group_index, []).append(c)
    groups = [Group.of(cs, cfg.rollout) for cs in by_group.values()]
    return StepBatch.of(groups, trained_groups(groups, cfg.rollout))


def shuffled(batch: StepBatch, seed: int) -> StepBatch:
    """Each trained group's advantages permuted among its samples (``seed``): the same values, the
    same samples, no link between a sample's advantage and its outcome."""
    rng, groups = random.Random(seed), []
    for g in batch.trained:
        adv = [s.advantage for s in g.samples]
        rng.shuffle(adv)
        groups.append(
            Group(
                g.chains,
                tuple(dataclasses.replace(s, advantage=a) for s, a in zip(g.samples, adv, strict=True)),
            )
        )
    return StepBatch.of(batch.drawn, groups)


def add_step_args(ap: argparse.ArgumentParser) -> None:
    """The arguments naming a saved step and its advantages (this script's and ``grad_noise.py``'s)."""
    ap.add_argument(
        "--run", type=Path, required=True, help="an RL run folder (its config.yaml and rollouts/)"
    )
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--start", type=Path, required=True, help="the model that sampled the step's rollouts")
    ap.add_argument("--advantages", choices=("real", "shuffled"), required=True)
    ap.add_argument("--seed", type=int, default=0)


def saved_step(a: argparse.Namespace, script: str) -> tuple[TrainConfig, StepBatch]:
    """The run's config and the step's batch as the loop built it, its advantages shuffled if asked."""
    rollouts = a.run / "rollouts" / f"step_{a.step:06d}.jsonl"
    if not rollouts.is_file():
        raise SystemExit(f"{script}: {rollouts} does not exist (a finished step's rollouts)")
    cfg = load_config(TrainConfig, a.run / "config.yaml")
    batch = batch_of(readable(rollouts, Chain.from_dict, "chain record"), cfg)
    return cfg, shuffled(batch, a.seed) if a.advantages == "shuffled" else batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_step_args(ap)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cfg, batch = saved_step(a, "replay_update")
    model, tok = load_model(str(a.start))
    trainer = Trainer(
        model, tok, cfg.trainer.model_copy(update={"log_kl_ref": False}), temperature=cfg.sampling.temperature
    )
    stats = trainer.step(batch.samples, batch.num_chains)
    a.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(a.out)
    for path in a.start.iterdir():  # tokenizer and chat template: the start's
        if path.is_file() and not (a.out / path.name).exists():
            shutil.copyfile(path, a.out / path.name)
    keys = ("samples", "chains", "grad_norm", "lr", "updated", "gen_tokens", "train_time_s")
    print(json.dumps({"advantages": a.advantages, "seed": a.seed, "groups_trained": len(batch.trained)}
                     | {k: stats.get(k) for k in keys} | {"out": str(a.out)}))  # fmt: skip


if __name__ == "__main__":
    main()
