"""The local training loop end to end on a tiny model (issue 31): it tells the policy about every
optimizer step (``sync``), builds each step's data once, and evaluates greedily.

The rollouts run with the real sampling engine over the trained model itself, against a fake suite
whose environments alternate success and failure, so that every group has a learning signal
whatever the random model writes.
"""

from __future__ import annotations

import asyncio
import copy
import json

import torch

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.policies.base import SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.rollout.batch import RolloutConfig
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.trainer import Trainer, TrainerConfig
from sage_rl.types import CheckResult, ExecResult, Outcome, Task

torch.set_num_threads(1)


class _Env:
    """Runs nothing; every other environment opened succeeds, so each group of two chains has a
    learning signal (one success, one failure) whatever the model writes."""

    reports_calls, opened = True, 0

    def __init__(self, success: bool) -> None:
        self.success = success

    async def reset(self, task) -> None:
        pass

    async def execute(self, code, origin) -> ExecResult:
        return ExecResult("out", ok=True, calls=(), defined=())

    async def evaluate(self) -> Outcome:
        return Outcome.from_checks((CheckResult("done", self.success),))

    @property
    def completed(self) -> bool:
        return False

    async def close(self) -> None:
        pass


class _Suite:
    name, prompt_dir = "alternating", None

    def __init__(self) -> None:
        self.opened = 0

    def worked_example(self):
        return None

    def split(self, split, limit=None):
        return ()

    def sample_chain(self, rng, length, split="train"):
        return tuple(
            Task(f"t{rng.random():.6f}_{k}", "s", k, "say hello", split) for k in range(1, length + 1)
        )

    async def open(self) -> _Env:
        self.opened += 1
        return _Env(self.opened % 2 == 0)

    async def close(self) -> None:
        pass


def _runner(policy, temperature: float) -> ChainRunner:
    return ChainRunner(
        policy,
        _Suite(),
        PromptBuilder(use_skills=False, max_steps=1),
        AgentConfig(max_steps=1, max_tokens_per_turn=8, context_limit=2048),
        SkillsConfig(use_skills=False),
        SamplingParams(temperature=temperature, max_tokens=8, seed=0),
        make_retriever(RetrievalConfig()),
    )


def _train(tiny, tmp_path, monkeypatch) -> tuple[list[dict], list[int], int]:
    """Three steps of the real loop. Returns the metrics rows, the trainer's step at each
    ``sync()`` call, and how many times a chain's rewards were computed."""
    from sage_rl.rollout import batch as batch_module
    from sage_rl.train.checkpoint import open_run
    from sage_rl.train.logging import read_metrics
    from sage_rl.train.loop import train

    rewards = []
    real = batch_module.chain_rewards
    monkeypatch.setattr(batch_module, "chain_rewards", lambda c, cfg: rewards.append(c) or real(c, cfg))
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    trainer = Trainer(model, tok, TrainerConfig(lr=1e-2), temperature=1.0)
    policy = TransformersPolicy(trainer.model, tok)
    rollout = RolloutConfig(chain_length=1, group_size=2, groups_per_step=1, no_code_reward=None)
    cfg = LoopConfig(
        rollout=rollout, eval=TrainEvalConfig(before_after=False), steps=3, out_dir=str(tmp_path)
    )
    logger, start = open_run(trainer, tmp_path, resume=False, tensorboard=False)
    synced: list[int] = []

    def sync() -> None:
        synced.append(trainer.global_step)
        policy.weights_changed()

    try:
        asyncio.run(train(_runner(policy, 1.0), trainer, logger, cfg, seed=0, start=start, sync=sync))
    finally:
        logger.close()
    return read_metrics(tmp_path), synced, len(rewards)


def test_the_loop_syncs_after_every_step_and_builds_its_data_once(tiny, tmp_path, monkeypatch):
    """The sampler's logprobs of each step's rollouts equal the trainer's (the weights after the
    previous step) only if the loop told the policy about every update: the rollouts of steps 2
    and 3 share their prompt's opening with step 1's, whose cached keys are stale after it.
    Each chain's rewards are computed once (training, signal and metrics read the same values)."""
    rows, synced, rewards = _train(tiny, tmp_path / "run", monkeypatch)
    assert [r["updated"] for r in rows] == [1.0, 1.0, 1.0]
    assert all(r["logprob_mismatch_max"] < 1e-3 for r in rows), [r["logprob_mismatch_max"] for r in rows]
    assert synced == [1, 2, 3]
    assert rewards == 3 * 2  # 3 steps x 1 group x 2 chains
    assert [r["chains"] for r in rows] == [2.0, 2.0, 2.0]  # num_chains, from the step's batch


def test_the_periodic_evaluation_is_greedy_and_saved(tiny, tmp_path, monkeypatch):
    """Rollouts sample at the training temperature; the loop's evaluations (``eval/*``) are
    greedy, like ``sage-rl eval`` and the recipe's, and each is saved with its per-task outcomes."""
    from types import SimpleNamespace

    from sage_rl.train import loop
    from sage_rl.train.layout import RunFolder

    seen = []

    async def fake_eval(runner, protocol, step, progress, label=""):
        seen.append(runner.params)
        return SimpleNamespace(headline="m", record=lambda: {"metrics": {"tgc": 50.0}, "outcomes": [["t", "s", True]]})

    monkeypatch.setattr(loop, "run_eval", fake_eval)
    runner = _runner(None, 0.7)
    out = RunFolder.of(tmp_path)
    assert asyncio.run(loop._evaluate(runner, TrainEvalConfig(), 4, None, out)) == "m"
    assert seen[0].temperature == 0.0 and runner.params.temperature == 0.7
    assert seen[0].max_tokens == runner.params.max_tokens
    saved = json.loads((tmp_path / "evals" / "step_000004.json").read_text())
    assert saved == {"metrics": {"tgc": 50.0}, "outcomes": [["t", "s", True]]}
