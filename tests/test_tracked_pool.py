"""The tracked pool (rollout/tracking.py): a screened pool that follows the model between screens
from the steps' own groups, and looks outside itself."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections import Counter

import pytest
from test_screened_pool import TemplateSuite, _NoTrainer, _runner

from sage_rl.config import ConfigError, load_config
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.policies.base import Completion
from sage_rl.recipe.controls import screened_templates
from sage_rl.rollout import pool as pool_module
from sage_rl.rollout import tracking
from sage_rl.rollout.batch import RolloutConfig, rollout_step
from sage_rl.rollout.pool import ScreenedPool, replay
from sage_rl.settings import TrainConfig
from sage_rl.train import loop as loop_module
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.logging import MetricsLogger
from sage_rl.types import StopReason


class NamedSuite(TemplateSuite):
    """TemplateSuite that names each task's template (its scenario id is ``<template>-s<seed>``)."""

    @staticmethod
    def template_name(task):
        return task.scenario_id.split("-s")[0]


class RatePolicy:
    """Completes template t's tasks at ``rates[t]``, exactly: the n-th call on t succeeds when
    floor(n * rate) grows. ``rates`` may change between steps (the model changes)."""

    renderer, name = None, "by-rate"

    def __init__(self, rates):
        self.rates, self.calls = dict(rates), Counter()

    async def generate(self, request):
        text = request.messages[-1]["content"]
        name = next(n for n in self.rates if f"{n} task" in text)
        self.calls[name] += 1
        n, s = self.calls[name], self.rates[name]
        done = int(n * s) > int((n - 1) * s)
        return Completion(
            "```python\ncomplete()\n```" if done else "```python\nx = 1\n```", completion_tokens=5
        )

    def weights_changed(self):
        pass


RATES = {"always": 1.0, "never": 0.0, "half": 0.5, "quarter": 0.25}


def _tracked_runner(rates=RATES):
    return dataclasses.replace(_runner(NamedSuite()), policy=RatePolicy(rates))


def _cfg(**kw):
    base = dict(
        chain_length=1, group_size=4, groups_per_step=4, pool="screened", screen_samples=4, screen_every=100
    )
    return RolloutConfig(**(base | kw))


def _step(pool, runner, cfg, step):
    """One step as the training loop makes it: the pool, its draw, the groups, the observation."""
    step_runner, row = asyncio.run(pool.runner_for(step))
    batch = asyncio.run(rollout_step(step_runner, random.Random(step), cfg, step=step, draw=pool.draw))
    pool.observe(step, batch.drawn_chains)
    return row, [c.trajectories[0].task.instruction.split()[0] for c in batch.drawn_chains[:: cfg.group_size]]


def test_the_record_keeps_each_templates_last_outcomes_in_order():
    record = tracking.remember({"a": (True, False)}, [("a", True), ("b", False), ("a", True)], memory=3)
    assert record == {"a": (False, True, True), "b": (False,)}
    assert tracking.success_of(record) == {"a": 2 / 3, "b": 0.0}
    assert tracking.remember(record, [("a", False)], memory=1) == {"a": (False,), "b": (False,)}
    assert tracking.pairs(tracking.grouped([("a", True), ("b", False), ("a", False)])) == [
        ("a", True),
        ("a", False),
        ("b", False),
    ]


def test_a_draw_splits_between_the_pool_and_outside_it():
    assert tracking.split_draw(8, 2, ("x",), ("y",)) == (6, 2)
    assert tracking.split_draw(8, 2, (), ("x", "y")) == (8, 0)  # no pool: every template
    assert tracking.split_draw(8, 2, ("x", "y"), ()) == (8, 0)  # nothing outside it
    suite = NamedSuite()
    for seed in range(20):
        seqs = tracking.draw(suite, random.Random(seed), 6, 1, "train", ("half", "quarter"), explore=2)
        names = [s[0].instruction.split()[0] for s in seqs]
        assert set(names[:4]) <= {"half", "quarter"} and set(names[4:]) <= {"always", "never"}
        assert len(names) == 6


def test_without_explore_the_draw_is_the_scoped_suites_as_before():
    # a run resumed under this code draws the sequences it drew before it existed
    suite, pool = NamedSuite(), ("half", "quarter")
    seqs = tracking.draw(suite, random.Random(3), 5, 2, "train", pool, explore=0)
    rng = random.Random(3)
    assert seqs == [suite.scoped(pool).sample_chain(rng, 2, "train") for _ in range(5)]


def test_a_template_that_degrades_re_enters_the_pool_and_a_solved_one_leaves(tmp_path):
    for memory, explore in ((8, 1), (None, 1), (8, 0)):
        runner = _tracked_runner()
        cfg = _cfg(pool_memory=memory, pool_explore=explore)
        (tmp_path / f"{memory}-{explore}").mkdir()
        pool = ScreenedPool(runner, cfg, 0, tmp_path / f"{memory}-{explore}", 0)
        row, _ = _step(pool, runner, cfg, 0)
        assert pool.pool == ("half", "quarter") and row["pool/size"] == 2
        runner.policy.rates |= {"always": 0.5, "half": 1.0}  # training moved the model
        for step in range(1, 9):
            _step(pool, runner, cfg, step)
        _, row = asyncio.run(pool.runner_for(9))
        if memory and explore:  # "always" explored at 0.5: mixed; "half" solved 8 times in a row
            assert pool.pool == ("always", "quarter") and row["pool/size"] == 2
        elif memory:  # "half" leaves, and nothing outside the pool is looked at again
            assert pool.pool == ("quarter",)
        else:  # the screen stays in force
            assert pool.pool == ("half", "quarter")


def test_explored_groups_come_from_outside_the_pool_each_draw(tmp_path):
    runner = _tracked_runner()
    cfg = _cfg(pool_memory=8, pool_explore=1)
    pool = ScreenedPool(runner, cfg, 0, tmp_path, 0)
    for step in range(4):
        _, drawn = _step(pool, runner, cfg, step)
        assert pool.pool == ("half", "quarter")  # the pool this step drew from
        assert len(drawn) == 4 and sum(n not in pool.pool for n in drawn) == 1  # one explored
    rows = [json.loads(x) for x in (tmp_path / tracking.OBSERVED).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(sum(len(v) for v in r["outcomes"].values()) == 4 * 4 for r in rows)  # B x G x K tasks


def test_a_resumed_pool_rebuilds_the_record_of_one_that_never_stopped(tmp_path):
    runner = _tracked_runner()
    cfg = _cfg(pool_memory=6, pool_explore=1)
    pool = ScreenedPool(runner, cfg, 0, tmp_path, 0)
    records = []
    for step in range(4):
        _step(pool, runner, cfg, step)
        records.append(pool.record)
    resumed = ScreenedPool(runner, cfg, 0, tmp_path, 2)  # stopped during step 2: steps 2, 3 again
    assert resumed.record == records[1]
    assert [json.loads(x)["step"] for x in (tmp_path / tracking.OBSERVED).read_text().splitlines()] == [0, 1]
    (tmp_path / tracking.OBSERVED).write_text(
        (tmp_path / tracking.OBSERVED).read_text()
        + '{"step": 2, "outcomes": {"half": [1, 0.5]}}\n{"step": 2, "out'
    )
    assert ScreenedPool(runner, cfg, 0, tmp_path, 3).record == records[1]  # damaged rows left out


def test_a_screen_row_without_outcomes_cannot_be_tracked(tmp_path):
    row = {"step": 0, "pool": ["half"], "success": {"half": 0.5, "always": 1.0}, "tokens": 5, "seconds": 1.0}
    (tmp_path / pool_module.SCREENS).write_text(json.dumps(row) + "\n")
    assert ScreenedPool(_tracked_runner(), _cfg(), 0, tmp_path, 1).last.pool == (
        "half",
    )  # untracked: as before
    with pytest.raises(ValueError, match="screen of step 0 in screens.jsonl has no outcomes"):
        ScreenedPool(_tracked_runner(), _cfg(pool_memory=4), 0, tmp_path, 1)
    with pytest.raises(ValueError, match="names each task's template"):
        ScreenedPool(_runner(), _cfg(pool_memory=4), 0, tmp_path, 0)


def test_tracking_is_refused_without_a_screened_pool_or_with_no_draw_left_to_it():
    with pytest.raises(ConfigError, match="need rollout.pool=screened"):
        load_config(TrainConfig, None, ["rollout.pool_memory=8"])
    with pytest.raises(ConfigError, match="pool_explore=8 leaves no draw to the pool"):
        load_config(TrainConfig, None, ["rollout.pool=screened", "rollout.pool_explore=8"])
    cfg = load_config(
        TrainConfig, None, ["rollout.pool=screened", "rollout.pool_memory=16", "rollout.pool_explore=2"]
    )
    assert (cfg.rollout.pool_memory, cfg.rollout.pool_explore) == (16, 2)


def test_pocketworld_names_each_tasks_template():
    suite = PocketWorldSuite()
    chain = suite.scoped(["todo_count_open"]).sample_chain(random.Random(1), 2)
    assert [suite.template_name(t) for t in chain] == ["todo_count_open"] * 2


def test_the_training_loop_tracks_the_pool_each_step(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    rollout = _cfg(pool_memory=8, pool_explore=1, screen_every=2)
    cfg = LoopConfig(
        rollout=rollout, eval=TrainEvalConfig(before_after=False), steps=3, out_dir=str(tmp_path)
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    asyncio.run(loop_module.train(_tracked_runner(), _NoTrainer(), logger, cfg, 0, 0, sync=lambda: None))
    logger.close()
    rows = [json.loads(x) for x in (tmp_path / tracking.OBSERVED).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    screens = pool_module.screens(tmp_path)
    assert [s["step"] for s in screens] == [0, 2] and screens[0]["outcomes"]["always"] == [1, 1, 1, 1]
    drawn = Counter(
        json.loads(line)["trajectories"][0]["task"]["instruction"].split()[0]
        for step in (1, 2, 3)
        for line in (tmp_path / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()
    )
    assert drawn["always"] + drawn["never"] == 3 * 4  # one of 4 groups of G = 4 a step, explored


def test_a_task_the_policy_took_no_turn_on_is_not_counted():
    # the environment or the backend failed first: it says nothing of the policy (rewards.nothing_sampled)
    cfg = RolloutConfig(chain_length=2, group_size=1, groups_per_step=1)
    chain = asyncio.run(rollout_step(_tracked_runner(), random.Random(0), cfg)).drawn_chains[0]
    first, second = chain.trajectories
    failed = dataclasses.replace(second, stop=StopReason.POLICY_ERROR, turns=())
    name = NamedSuite.template_name(first.task)
    assert tracking.chain_outcomes([chain], NamedSuite.template_name) == [
        (name, first.outcome.success),
        (name, second.outcome.success),
    ]
    cut = dataclasses.replace(chain, trajectories=(first, failed))
    assert tracking.chain_outcomes([cut], NamedSuite.template_name) == [(name, first.outcome.success)]


def test_the_templates_a_tracked_arm_drew_are_every_steps_pool(tmp_path):
    runner = _tracked_runner()
    cfg = _cfg(pool_memory=8, pool_explore=1)
    (tmp_path / "config.yaml").write_text("rollout:\n  pool_memory: 8\n")
    pool = ScreenedPool(runner, cfg, 0, tmp_path, 0)
    pools = {}
    for step in range(6):
        _step(pool, runner, cfg, step)
        pools[step] = pool.pool
        if step == 0:
            runner.policy.rates |= {"always": 0.5}
    assert "always" in pool.pool  # explored, mixed, in
    steps = [json.loads(x) for x in (tmp_path / tracking.OBSERVED).read_text().splitlines()]
    assert replay(pool_module.screens(tmp_path), steps, 8)[1] == pools  # each step's, as drawn
    assert (
        screened_templates(tmp_path)
        == {t for p in pools.values() for t in p}
        == {"always", "half", "quarter"}
    )
    assert replay(pool_module.screens(tmp_path), [], 8)[1] == {}
    (tmp_path / "config.yaml").write_text("rollout:\n  pool_memory: null\n")  # untracked: the screens' pools
    assert screened_templates(tmp_path) == {"half", "quarter"}
