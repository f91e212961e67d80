"""Weights that announce themselves (issue 31): whoever changes the weights calls
``Policy.weights_changed()``, and the training loop's ``sync`` does it after every optimizer step.

Nothing watches the parameters, so these tests fail when the call is missing: the sampling engine
would keep its prompt-prefix caches (and, in another dtype, its converted weight copy) from before
the step. The loop's side: tests/test_train_loop.py.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from test_trainer import make_sample

from sage_rl.policies.base import PolicyRequest, SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.train.trainer import Trainer, TrainerConfig

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
    fresh = _ask(
        TransformersPolicy(copy.deepcopy(trainer.model), tok, stop_ids=(), dtype=dtype), prompt, seed=2
    )
    assert after.token_ids == fresh.token_ids
    assert after.logprobs == pytest.approx(fresh.logprobs, abs=1e-5)
