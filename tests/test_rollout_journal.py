"""A training run stopped in the middle of a step loses no rollout (``rollout/journal.py``), and a
resumed run with a screened pool neither screens again nor counts a screen twice (issue 27: the
laptop experiment's sessions end mid-step)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from test_screened_pool import TemplatePolicy, TemplateSuite, _NoTrainer

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.policies.base import SamplingParams
from sage_rl.rollout import pool as pool_module
from sage_rl.rollout.batch import RolloutConfig, rollout_step
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.rollout.journal import StepJournal, weights_digest
from sage_rl.rollout.pool import Screen, in_force
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.text import dumps
from sage_rl.train import loop as loop_module
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.logging import MetricsLogger


class Stopped(BaseException):
    """The run was stopped (the machine went away): nothing on the way catches it."""


class StoppingPolicy(TemplatePolicy):
    """TemplatePolicy that stops the run at its ``stop_at``-th call (never when None)."""

    def __init__(self, stop_at: int | None = None):
        super().__init__()
        self.stop_at, self.n = stop_at, 0

    async def generate(self, request):
        self.n += 1
        if self.n == self.stop_at:
            raise Stopped
        return await super().generate(request)


def _runner(policy) -> ChainRunner:
    return ChainRunner(
        policy,
        TemplateSuite(),
        PromptBuilder(),
        AgentConfig(max_steps=1),
        SkillsConfig(use_skills=False),
        SamplingParams(),
        make_retriever(RetrievalConfig()),
    )


# one group at a time (concurrency // group_size = 1): a stop leaves the groups before it whole
ROLLOUT = RolloutConfig(chain_length=1, group_size=2, groups_per_step=4, concurrency=2)


def test_a_stopped_step_samples_only_the_groups_it_lacks(tmp_path):
    path = tmp_path / "step_000001.partial.jsonl"
    policy = StoppingPolicy(stop_at=5)  # groups 0 and 1 (calls 1-4) finish, group 2 stops
    with pytest.raises(Stopped):
        asyncio.run(rollout_step(_runner(policy), random.Random(7), ROLLOUT, journal=StepJournal(path, "w1")))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"key": "w1"} and [json.loads(x)["group"] for x in lines[1:]] == [0, 1]
    kept = [json.loads(x)["chains"] for x in lines[1:]]
    with open(path, "a") as f:
        f.write('{"group": 2, "chains": [{"group_in')  # the line a kill cut short

    again, journal = StoppingPolicy(), StepJournal(path, "w1")
    batch = asyncio.run(rollout_step(_runner(again), random.Random(7), ROLLOUT, journal=journal))
    assert again.n == 4 and journal.reused == 2  # groups 2 and 3 only, 2 chains each
    assert [g.chains[0].group_index for g in batch.drawn] == [0, 1, 2, 3]
    assert [[json.loads(dumps(c)) for c in g.chains] for g in batch.drawn[:2]] == kept
    fresh = asyncio.run(rollout_step(_runner(StoppingPolicy()), random.Random(7), ROLLOUT))
    assert [g.chains[0].task_ids for g in batch.drawn] == [g.chains[0].task_ids for g in fresh.drawn]


def test_a_journal_of_other_weights_or_tasks_is_not_reused(tmp_path):
    path = tmp_path / "step_000001.partial.jsonl"
    asyncio.run(
        rollout_step(_runner(StoppingPolicy()), random.Random(7), ROLLOUT, journal=StepJournal(path, "w1"))
    )
    other = StepJournal(path, "w2")  # the weights changed: moved aside, nothing reused
    assert not path.exists() and path.with_suffix(".stale").is_file() and other.reused == 0
    asyncio.run(
        rollout_step(_runner(StoppingPolicy()), random.Random(7), ROLLOUT, journal=StepJournal(path, "w1"))
    )
    journal, policy = StepJournal(path, "w1"), StoppingPolicy()
    asyncio.run(rollout_step(_runner(policy), random.Random(8), ROLLOUT, journal=journal))  # other tasks
    assert journal.reused == 0 and policy.n == 8


def test_the_weights_digest_changes_with_any_step():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.Linear(300, 2))
    before = weights_digest(model)
    assert weights_digest(model) == before and weights_digest(object()) == ""
    with torch.no_grad():
        model[0].weight.add_(1e-3 * torch.randn_like(model[0].weight))  # as an optimizer step does
    assert weights_digest(model) != before


def test_the_screen_in_force_after_a_resume():
    rows = [Screen(s, {"a": 0.5}, 10, 1.0).row() for s in (0, 4)]
    assert in_force(rows, 5, 4).step == 4 and in_force(rows, 4, 4).step == 4
    assert in_force(rows, 3, 4).step == 0
    assert in_force(rows[:1], 4, 4) is None  # step 4 is due and its screen is not on record
    assert in_force([], 3, 4) is None


def _train(tmp_path, policy, start: int, steps: int = 3, concurrency: int = 2):
    rollout = RolloutConfig(
        **(ROLLOUT.model_dump() | {"pool": "screened", "screen_every": 2, "screen_samples": 4, "concurrency": concurrency})
    )
    cfg = LoopConfig(
        rollout=rollout, eval=TrainEvalConfig(before_after=False), steps=steps, out_dir=str(tmp_path)
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    try:
        return asyncio.run(
            loop_module.train(_runner(policy), _NoTrainer(), logger, cfg, 0, start, sync=lambda: None)
        )
    finally:
        logger.close()


def test_a_run_stopped_mid_step_resumes_with_its_screen_and_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    result = _train(whole, StoppingPolicy(), 0)
    # screen at step 0: 16 calls, step 1: 8; step 2's groups 0 and 1 finish, group 2 stops
    with pytest.raises(Stopped):
        _train(stopped, StoppingPolicy(stop_at=16 + 8 + 5), 0)
    assert (stopped / "rollouts" / "step_000002.partial.jsonl").is_file()
    again = StoppingPolicy()
    resumed = _train(stopped, again, 1)  # from the checkpoint after step 1
    assert again.n == 4 + 16 + 8  # step 2's last two groups, then step 3's screen and groups
    rows = [json.loads(x) for x in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["groups_reused"] for r in rows] == [0, 2, 0]
    assert (
        [r["step"] for r in pool_module.screens(stopped)]
        == [0, 2]
        == [r["step"] for r in pool_module.screens(whole)]
    )
    assert resumed.sampled_tokens == result.sampled_tokens  # every screen and group counted once
    assert not list((stopped / "rollouts").glob("*.partial.jsonl"))


def test_a_resume_with_more_chains_in_flight_keeps_the_steps_groups(tmp_path, monkeypatch):
    """``rollout.concurrency`` may change on a resume (``same_run.MAY_DIFFER``): how many chains are
    in flight is not what they were sampled under, so the stopped step's journal is taken back."""
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    with pytest.raises(Stopped):  # as above: step 2's groups 0 and 1 finish, group 2 stops
        _train(tmp_path, StoppingPolicy(stop_at=16 + 8 + 5), 0)
    again = StoppingPolicy()
    _train(tmp_path, again, 1, concurrency=4)
    assert again.n == 4 + 16 + 8  # step 2's last two groups only, then step 3
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["groups_reused"] for r in rows] == [0, 2, 0]
    assert not list((tmp_path / "rollouts").glob("*.stale"))


def test_a_run_stopped_after_its_screen_takes_it_back_and_pays_it_once(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    with pytest.raises(Stopped):  # step 0 screened (16 calls), then stopped in its first group
        _train(tmp_path, StoppingPolicy(stop_at=16 + 1), 0, steps=2)
    again = StoppingPolicy()
    _train(tmp_path, again, 0, steps=2)
    assert again.n == 8 + 8  # no second screen at step 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("pool/screen_tokens", 0) for r in rows] == [16 * 5, 0]
    assert [r["step"] for r in pool_module.screens(tmp_path)] == [0]


def test_a_screen_row_cut_short_is_left_out_and_screened_again(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    with pytest.raises(Stopped):  # step 0 screened, then stopped in its first group
        _train(tmp_path, StoppingPolicy(stop_at=16 + 1), 0, steps=1)
    log = tmp_path / pool_module.SCREENS
    log.write_text(log.read_text()[:-20])  # the kill cut the screen's row
    assert pool_module.screens(tmp_path) == []
    again = StoppingPolicy()
    _train(tmp_path, again, 0, steps=1)
    assert again.n == 8  # the screen's 16 chains came back from the step's journal
    assert [r["step"] for r in pool_module.screens(tmp_path)] == [0]
