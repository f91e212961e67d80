"""Weights that announce themselves (issue 31): whoever changes the weights calls
``Policy.weights_changed()``, and the training loop's ``sync`` does it after every optimizer step.

Nothing watches the parameters, so these tests fail when the call is missing: the sampling engine
would keep its prompt-prefix caches (and, in another dtype, its converted weight copy) from before
the step.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from test_trainer import make_sample

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.rollout.batch import RolloutConfig
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.trainer import Trainer, TrainerConfig
from sage_rl.types import CheckResult, ExecResult, Outcome, Task

torch.set_num_threads(1)
PROMPT = "<|im_start|>system\nYou are a helpful agent.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def _ask(policy: TransformersPolicy, prompt: list[int], seed: int):
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=seed)
    return asyncio.run(policy.generate(PolicyRequest((), tuple(prompt), params)))


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_after_a_step_and_weights_changed_samples_come_from_the_new_weights(tiny, dtype):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    prompt = tok.encode(PROMPT)
    trainer = Trainer(model, tok, TrainerConfig(lr=1e-2))
    policy = TransformersPolicy(trainer.model, tok, stop_ids=(), dtype=dtype)
    _ask(policy, prompt, seed=1)  # caches (and, in bfloat16, a weight copy) of the old weights
    stats = trainer.step([make_sample(prompt[:8], [(prompt[8:14], [])], 1.0)], num_chains=1)
    assert stats["updated"] == 1.0
    policy.weights_changed()
    after = _ask(policy, prompt, seed=2)
    fresh = _ask(TransformersPolicy(copy.deepcopy(trainer.model), tok, stop_ids=(), dtype=dtype), prompt, seed=2)
    assert after.token_ids == fresh.token_ids
    assert after.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)


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

    def split(self, split):
        return ()

    def sample_chain(self, rng, length, split="train"):
        return tuple(Task(f"t{rng.random():.6f}_{k}", "s", k, "say hello", split) for k in range(1, length + 1))

    async def open(self) -> _Env:
        self.opened += 1
        return _Env(self.opened % 2 == 0)

    async def close(self) -> None:
        pass


def _train(tiny, tmp_path, sync_calls: list[int]) -> list[dict]:
    """Three steps of the real loop, sampling with the engine over the trained model itself."""
    from sage_rl.train.checkpoint import open_run
    from sage_rl.train.logging import read_metrics
    from sage_rl.train.loop import train

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    trainer = Trainer(model, tok, TrainerConfig(lr=1e-2), temperature=1.0)
    policy = TransformersPolicy(trainer.model, tok)
    runner = ChainRunner(
        policy,
        _Suite(),
        PromptBuilder(use_skills=False, max_steps=1),
        AgentConfig(max_steps=1, max_tokens_per_turn=8, context_limit=2048),
        SkillsConfig(use_skills=False),
        SamplingParams(temperature=1.0, max_tokens=8, seed=0),
        make_retriever(RetrievalConfig()),
    )
    rollout = RolloutConfig(chain_length=1, group_size=2, groups_per_step=1, no_code_reward=None)
    cfg = LoopConfig(
        rollout=rollout, eval=TrainEvalConfig(before_after=False), steps=3, out_dir=str(tmp_path)
    )
    logger, start = open_run(trainer, tmp_path, resume=False, tensorboard=False)

    def sync() -> None:
        sync_calls.append(trainer.global_step)
        policy.weights_changed()

    try:
        asyncio.run(train(runner, trainer, logger, cfg, seed=0, start=start, sync=sync))
    finally:
        logger.close()
    return read_metrics(tmp_path)


def test_the_training_loop_syncs_the_sampler_after_every_optimizer_step(tiny, tmp_path):
    """The sampler's logprobs of each step's rollouts equal the trainer's (the weights after the
    previous step) only if the loop told the policy about every update: the rollouts of steps 2
    and 3 share their prompt's opening with step 1's, whose cached keys are stale after it."""
    calls: list[int] = []
    rows = _train(tiny, tmp_path / "run", calls)
    assert [r["updated"] for r in rows] == [1.0, 1.0, 1.0]
    assert all(r["logprob_mismatch_max"] < 1e-3 for r in rows), [r["logprob_mismatch_max"] for r in rows]
    assert calls == [1, 2, 3]
