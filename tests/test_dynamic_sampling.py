"""DAPO-style dynamic sampling (``rollout.dynamic_sampling``) and the trainer's skipping of
samples whose gradient is exactly 0 (``trainer.skip_zero_advantage``)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import random

import pytest
import torch
from fakes import FakeEnv
from test_trainer import batch, make_sample, small_model

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.policies.base import Completion, SamplingParams
from sage_rl.rollout.batch import RolloutConfig, rollout_step
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.train.trainer import Trainer, TrainerConfig
from sage_rl.types import Task

torch.set_num_threads(1)


class ScriptedSuite:
    """Hands out task sequences in a fixed order: ``flat`` ones (every chain gets the same reward)
    and ``split`` ones (the chains of a group alternate between success and failure)."""

    name, prompt_dir = "scripted", None

    def __init__(self, kinds):
        self.kinds, self.drawn = itertools.cycle(kinds), []

    def worked_example(self):
        return None

    def split(self, split, limit=None):
        return ()

    def sample_chain(self, rng, length, split="train"):
        kind = f"{next(self.kinds)}{len(self.drawn)}"
        self.drawn.append(kind)
        return tuple(Task(f"{kind}_{k}", kind, k, f"{kind} task {k}", split) for k in range(1, length + 1))

    async def open(self):
        return FakeEnv()

    async def close(self):
        pass


class AlternatingPolicy:
    """Completes every ``flat`` task; on ``split`` tasks, completes every other call."""

    renderer, name = None, "alternating"

    def __init__(self):
        self.calls = 0

    async def generate(self, request):
        self.calls += 1
        text = request.messages[-1]["content"]
        done = "flat" in text or self.calls % 2 == 0
        return Completion(
            "```python\ncomplete()\n```" if done else "```python\nx = 1\n```", completion_tokens=5
        )


def _draw(kinds, **cfg):
    suite = ScriptedSuite(kinds)
    runner = ChainRunner(
        AlternatingPolicy(),
        suite,
        PromptBuilder(),
        AgentConfig(max_steps=1),
        SkillsConfig(use_skills=False),
        SamplingParams(),
        make_retriever(RetrievalConfig()),
    )
    rollout = RolloutConfig(chain_length=1, group_size=2, concurrency=1, **cfg)
    return asyncio.run(rollout_step(runner, random.Random(0), rollout)), suite, rollout


def test_without_dynamic_sampling_one_draw_is_trained_whatever_it_holds():
    batch, suite, _ = _draw(["flat"], groups_per_step=2)
    assert suite.drawn == ["flat0", "flat1"]
    assert batch.trained == batch.drawn and len(batch.drawn) == 2
    assert batch.samples == batch.drawn_samples and batch.num_chains == 4


def test_dynamic_sampling_draws_until_b_groups_have_a_signal():
    # draw 1: flat, split -> 1 with a signal; draw 2: flat, split -> 2: stop
    batch, suite, cfg = _draw(["flat", "split"], groups_per_step=2, dynamic_sampling=True, max_draws=5)
    assert suite.drawn == ["flat0", "split1", "flat2", "split3"]
    assert [g.chains[0].task_ids for g in batch.trained] == [("split1_1",), ("split3_1",)]
    assert all(g.has_signal for g in batch.trained)
    assert not any(g.has_signal for g in batch.drawn if g not in batch.trained)
    # group numbers run on across draws: every chain of the step has its own (group, chain) id
    ids = [(c.group_index, c.chain_index) for c in batch.drawn_chains]
    assert len(set(ids)) == len(ids) == 8
    # the failed chain of a split group: R = 0 against the completed one's 1 -> A = -0.5, +0.5;
    # what is trained is the trained groups' samples, normalised by their chains
    assert sorted(s.advantage for s in batch.samples) == [-0.5, -0.5, 0.5, 0.5]
    assert batch.num_chains == 4 and len(batch.drawn_samples) == 8


def test_dynamic_sampling_stops_at_max_draws_with_nothing_to_train():
    batch, suite, _ = _draw(["flat"], groups_per_step=1, dynamic_sampling=True, max_draws=3)
    assert suite.drawn == ["flat0", "flat1", "flat2"]
    assert batch.trained == () and len(batch.drawn) == 3
    # no group has a signal: the step runs on what was drawn (and makes no update)
    assert batch.samples == batch.drawn_samples and batch.num_chains == 6


def test_rewards_and_advantages_are_computed_once_per_step(monkeypatch):
    """The step's data is built once: one reward computation per drawn chain, however many
    draws, groups and consumers (training, metrics, signal test) read it."""
    from sage_rl.rollout import batch as batch_module

    calls = []
    real = batch_module.chain_rewards
    monkeypatch.setattr(batch_module, "chain_rewards", lambda c, cfg: calls.append(c) or real(c, cfg))
    batch, _, _ = _draw(["flat", "split"], groups_per_step=2, dynamic_sampling=True, max_draws=5)
    assert len(calls) == len(batch.drawn_chains) == 8


def _grads(tr: Trainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean"])
def test_skipping_zero_advantage_samples_leaves_the_gradient_unchanged(agg):
    samples = batch() + [
        make_sample([1, 5, 6], [([9, 9, 9, 9, 9], [])], 0.0),
        make_sample([1, 2], [([33, 34], [35]), ([36], [])], 0.0),
    ]
    model, grads = small_model(), {}
    for skip in (False, True):
        tr = Trainer(copy.deepcopy(model), None, TrainerConfig(loss_agg=agg, skip_zero_advantage=skip))
        stats = tr.accumulate_gradients(samples, num_chains=7)
        assert stats.samples_run == (5 if skip else 7)
        grads[skip] = _grads(tr)
    # the zero-advantage samples still count in the normalisation (7 chains; all tokens)
    assert torch.allclose(grads[False], grads[True], atol=1e-7)


def test_a_step_without_signal_makes_no_update():
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2))
    tr.step(batch(), num_chains=5)  # Adam moments are now nonzero
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    state = copy.deepcopy(tr.optimizer.state_dict()["state"])
    zero = [make_sample([1, 5], [([7, 8], [])], 0.0), make_sample([1, 6], [([9], [])], 0.0)]
    stats = tr.step(zero, num_chains=2)
    assert stats["updated"] == 0.0 and stats["samples_run"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in tr.model.named_parameters())
    after = tr.optimizer.state_dict()["state"]
    assert all(torch.equal(after[i]["exp_avg"], state[i]["exp_avg"]) for i in state)
    assert tr.global_step == 2
    # with a KL term a zero advantage still has a gradient: the sample is run
    kl = Trainer(small_model(), None, TrainerConfig(lr=1e-2, kl_coef=0.1))
    kl.step(batch(), num_chains=5)
    assert kl.step(zero, num_chains=2)["samples_run"] == 2.0


def test_a_training_step_with_no_signal_draws_again_then_leaves_the_weights(tiny, tmp_path):
    """Through the real loop and sandboxed PocketWorld: every answer is a scored failure, so no
    group has a signal; the step draws ``max_draws`` times, counts every drawn token, logs and
    writes every drawn group, and leaves the weights as they were."""
    import json

    from test_sandbox_hostile_run import SMALL, train_forced

    from sage_rl.settings import TrainConfig
    from sage_rl.train.logging import read_metrics

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = TrainConfig(
        **SMALL,
        steps=1,
        out_dir=str(tmp_path / "run"),
        rollout={
            "chain_length": 1,
            "group_size": 2,
            "groups_per_step": 1,
            "dynamic_sampling": True,
            "max_draws": 2,
        },
        eval={"before_after": False},
        tensorboard=False,
    )
    trainer = Trainer(model, tok, cfg.trainer, temperature=cfg.sampling.temperature)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    result = train_forced(cfg, trainer, tok)
    (row,) = read_metrics(cfg.out_dir)
    assert (row["groups_drawn"], row["groups_trained"], row["updated"]) == (2, 0, 0.0)
    chains = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "step_000001.jsonl").open()]
    assert len(chains) == 4 and {c["group_index"] for c in chains} == {0, 1}
    drawn = sum(len(t["gen_ids"]) for c in chains for tr in c["trajectories"] for t in tr["turns"])
    assert row["sampled_tokens"] == result.sampled_tokens == drawn > 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
