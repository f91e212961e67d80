"""Hostile answers through a whole rollout batch and a short training run (issue 11): nothing an
agent writes can end a run. Huge ints, deep nesting, NaN and infinity, huge strings and odd types
each end their task as a scored failure; the batch, the rewards and the optimizer step go on.

Through the real ``rollout_batch`` and ``train``; the policies here are scripted, so
the answers are exactly the hostile ones, through the real sandboxed PocketWorld.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
import random

import torch

from sage_rl.build import build_runner, open_suite
from sage_rl.rollout.batch import RolloutConfig, rollout_batch, to_samples
from sage_rl.settings import RunConfig, TrainConfig
from sage_rl.types import Completion, PolicyRequest, StopReason

HOSTILE = (
    "10**400",
    "-(10**4000)",
    "(lambda f: f(f, 500))(lambda f, n: [f(f, n - 1)] if n else [])",  # nested 500 deep
    "float('nan')",
    "float('inf')",
    "'9' * 5_000_000",
    "['x' * 100_000] * 3",
    "{1, 2}",
    "b'bytes'",
    "object()",
    "{'a': {'b': [float('-inf')]}}",
)


def _cell(answer: str) -> str:
    return f"apis.supervisor.complete_task(answer={answer})"


class HostileScript:
    """A text policy that answers every task with the next hostile answer (in turn)."""

    renderer = None
    name = "hostile-script"

    def __init__(self) -> None:
        self.answers = itertools.cycle(HOSTILE)

    async def generate(self, request: PolicyRequest) -> Completion:
        return Completion(f"```python\n{_cell(next(self.answers))}\n```", completion_tokens=8)


SMALL = {"agent": {"max_steps": 2, "max_tokens_per_turn": 48, "context_limit": 4096}, "worked_example": False}


def test_rollout_batch_scores_hostile_answers_as_failures():
    cfg = RunConfig(**SMALL)
    rollout = RolloutConfig(chain_length=2, group_size=3, groups_per_step=2, concurrency=6)

    async def run():
        async with open_suite(cfg) as suite:
            return await rollout_batch(build_runner(cfg, HostileScript(), suite), random.Random(0), rollout)

    groups = asyncio.run(run())
    trajs = [t for chains in groups for c in chains for t in c.trajectories]
    assert len(trajs) == 12
    assert all(not t.outcome.success and t.stop is not StopReason.ENV_ERROR for t in trajs)
    observations = " ".join(turn.observation for t in trajs for turn in t.turns)
    for message in ("64 bits", "nested more than 32", "finite number", "JSON"):
        assert message in observations, message
    samples = to_samples(groups, rollout)
    assert len(samples) == 12 and all(math.isfinite(s.reward) and math.isfinite(s.advantage) for s in samples)


class ForcedPolicy:
    """Token-exact: it 'samples' the hostile cells, with their true logprobs under the model being
    trained, so the optimizer step sees an ordinary on-policy batch."""

    name = "forced-hostile"

    def __init__(self, model, tokenizer) -> None:
        from sage_rl.agent.render import ChatRenderer

        self.model, self.tokenizer = model, tokenizer
        self.renderer = ChatRenderer(tokenizer)
        self.eot = self.renderer.eot_id
        self.answers = itertools.cycle(HOSTILE)

    async def generate(self, request: PolicyRequest) -> Completion:
        text = f"```python\n{_cell(next(self.answers))}\n```"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.eot]
        full = torch.tensor([[*request.prompt_ids, *ids]])
        with torch.no_grad():
            logits = self.model(input_ids=full).logits[0, len(request.prompt_ids) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        return Completion(
            text, tuple(ids), tuple(logprobs.tolist()), "stop", len(request.prompt_ids), len(ids)
        )


def train_forced(cfg: TrainConfig, trainer, tok):
    """The real training loop of ``cfg`` in a new run folder, sampling with ``ForcedPolicy``."""
    from sage_rl.train.checkpoint import open_run
    from sage_rl.train.loop import train

    logger, start = open_run(trainer, cfg.out_dir, resume=False, tensorboard=False)

    async def run():
        async with open_suite(cfg) as suite:
            runner = build_runner(cfg, ForcedPolicy(trainer.model, tok), suite)
            # ForcedPolicy reads the model at every call: it holds nothing to sync
            return await train(runner, trainer, logger, cfg, cfg.seed, start, sync=lambda: None)

    try:
        return asyncio.run(run())
    finally:
        logger.close()


def test_a_short_training_run_with_hostile_answers_completes(tiny, tmp_path):
    from sage_rl.train.logging import read_metrics
    from sage_rl.train.trainer import Trainer

    torch.set_num_threads(1)
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = TrainConfig(
        **SMALL,
        steps=2,
        out_dir=str(tmp_path / "run"),
        rollout={"chain_length": 2, "group_size": 2, "groups_per_step": 1},
        eval={"before_after": False},
        tensorboard=False,
    )
    trainer = Trainer(model, tok, cfg.trainer)
    result = train_forced(cfg, trainer, tok)
    rows = read_metrics(cfg.out_dir)
    assert result.steps_done == 2 and [r["step"] for r in rows] == [1, 2]
    assert all(r["success"] == 0.0 and math.isfinite(r["loss"]) for r in rows)
