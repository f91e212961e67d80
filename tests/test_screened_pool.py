"""The screened task pool (``rollout.pool: screened``, issue 27): RL draws only from templates whose
sampled success under the current model lies strictly between 0 and 1, re-screened every
``screen_every`` steps, its screens' tokens counted as sampled tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections import Counter

import pytest
from fakes import FakeEnv

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.policies.base import Completion, SamplingParams
from sage_rl.rollout import pool as pool_module
from sage_rl.rollout.batch import RolloutConfig, rollout_step
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.rollout.pool import ScreenedPool, informative, screen, screen_due
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.train import loop as loop_module
from sage_rl.train.config import LoopConfig, TrainEvalConfig
from sage_rl.train.logging import MetricsLogger
from sage_rl.types import Task

#: the fake policy's success by template: known, so the pool is known
SUCCESS = {"always": 1.0, "never": 0.0, "half": 0.5, "quarter": 0.25}


class TemplateSuite:
    """Train templates by name; a task's instruction names its template."""

    name, prompt_dir = "templated", None

    def __init__(self, names=tuple(SUCCESS)):
        self.train_templates = tuple(names)

    def scoped(self, names):
        return TemplateSuite(names)

    def worked_example(self):
        return None

    def split(self, split, limit=None):
        return ()

    def sample_chain(self, rng, length, split="train"):
        name = self.train_templates[rng.randrange(len(self.train_templates))]
        sid = f"{name}-s{rng.randrange(10**9)}"
        return tuple(Task(f"{sid}_{k}", sid, k, f"{name} task {k}", split) for k in range(1, length + 1))

    async def open(self):
        return FakeEnv()

    async def close(self):
        pass


class TemplatePolicy:
    """Completes a template's tasks at exactly its ``SUCCESS`` rate: the n-th call on template t
    succeeds when floor(n * s) grows (1 of 2 for 0.5, 1 of 4 for 0.25)."""

    renderer, name = None, "by-template"

    def __init__(self):
        self.calls: Counter[str] = Counter()

    async def generate(self, request):
        text = request.messages[-1]["content"]
        name = next(n for n in SUCCESS if f"{n} task" in text)
        self.calls[name] += 1
        n, s = self.calls[name], SUCCESS[name]
        done = int(n * s) > int((n - 1) * s)
        return Completion(
            "```python\ncomplete()\n```" if done else "```python\nx = 1\n```", completion_tokens=5
        )

    def weights_changed(self):
        pass


def _runner(suite=None) -> ChainRunner:
    return ChainRunner(
        TemplatePolicy(),
        suite or TemplateSuite(),
        PromptBuilder(),
        AgentConfig(max_steps=1),
        SkillsConfig(use_skills=False),
        SamplingParams(),
        make_retriever(RetrievalConfig()),
    )


def test_informative_keeps_strictly_between_0_and_1():
    assert informative({"a": 0.0, "b": 0.5, "c": 1.0, "d": 0.25, "e": 0.999}) == ("b", "d", "e")
    assert informative({"a": 0.0, "c": 1.0}) == ()
    assert [s for s in range(9) if screen_due(s, 4)] == [0, 4, 8]


def test_a_screen_measures_each_templates_sampled_success():
    # 4 samples of one task: the policy's rates are exact (0.25 -> 1 of 4)
    result = asyncio.run(screen(_runner(), random.Random(0), 1, 4, "train", step=0, concurrency=8))
    assert dict(result.success) == SUCCESS
    assert result.pool == ("half", "quarter") and result.tokens == 4 * 4 * 5
    assert json.loads(json.dumps(result.row()))["pool"] == ["half", "quarter"]


class NumberedSuite(TemplateSuite):
    """Scenarios numbered 0, 1, 2, ... in the order they are drawn; the number is in the instruction."""

    def __init__(self, names=tuple(SUCCESS)):
        super().__init__(names)
        self.drawn: list[str] = []

    def scoped(self, names):
        child = NumberedSuite(names)
        child.drawn = self.drawn  # one count across narrowed copies
        return child

    def sample_chain(self, rng, length, split="train"):
        name = self.train_templates[rng.randrange(len(self.train_templates))]
        sid = f"{name}-s{len(self.drawn)}"
        self.drawn.append(sid)
        return tuple(Task(f"{sid}_{k}", sid, k, f"{sid} task {k}", split) for k in range(1, length + 1))


class EvenScenarioPolicy:
    """Solves every task of an even-numbered scenario and none of an odd one."""

    renderer, name = None, "even-scenarios"

    async def generate(self, request):
        number = int(request.messages[-1]["content"].split(" task ")[0].rsplit("-s", 1)[1])
        code = "complete()" if number % 2 == 0 else "x = 1"
        return Completion(f"```python\n{code}\n```", completion_tokens=5)

    def weights_changed(self):
        pass


def test_a_screen_pools_each_templates_scenarios():
    # success that depends on the scenario, not the sample: one scenario per template calls each
    # template solved or hopeless; two (one even, one odd) show every template at 0.5
    def run(scenarios):
        suite = NumberedSuite()
        runner = dataclasses.replace(_runner(suite), policy=EvenScenarioPolicy())
        result = asyncio.run(
            screen(runner, random.Random(0), 2, 3, "train", step=0, concurrency=8, scenarios=scenarios)
        )
        return result, suite.drawn

    one, drawn = run(1)
    assert sorted(one.success.values()) == [0.0, 0.0, 1.0, 1.0] and one.pool == ()
    assert len(drawn) == 4 and one.tokens == 4 * 1 * 3 * 2 * 5
    two, drawn = run(2)
    assert dict(two.success) == dict.fromkeys(SUCCESS, 0.5) and two.pool == tuple(sorted(SUCCESS))
    assert len(set(drawn)) == 8  # a fresh scenario each: templates x scenarios
    assert [d.split("-s")[0] for d in drawn] == [n for n in SUCCESS for _ in range(2)]
    assert two.tokens == 4 * 2 * 3 * 2 * 5  # templates x scenarios x samples x K tasks x 5 tokens


def test_a_screen_confirms_the_templates_it_found_all_solved_or_all_failed():
    # 2 samples of one task per scenario. By hand, with the policy's counters: always T T, never
    # F F, half F T, quarter F F (its 4th call is its first success). Without confirming, quarter
    # looks hopeless. Confirming gives the three extremes 2 more scenarios (4 more samples each):
    # always 6 of 6, never 0 of 6, quarter calls 3-6 F T F F: 1 of 6; half is not sampled again.
    class CountingSuite(TemplateSuite):
        drawn: list = []

        def scoped(self, names):
            return CountingSuite(names)

        def sample_chain(self, rng, length, split="train"):
            chain = super().sample_chain(rng, length, split)
            CountingSuite.drawn.append(chain[0].scenario_id)
            return chain

    def run(confirm):
        suite = CountingSuite()
        CountingSuite.drawn = []
        runner = _runner(suite)
        done = asyncio.run(screen(runner, random.Random(0), 1, 2, "train", step=0, concurrency=8, confirm=confirm))
        return done, suite.drawn, runner.policy.calls

    plain, drawn, _ = run(0)
    assert plain.pool == ("half",) and plain.success["quarter"] == 0.0 and len(drawn) == 4
    confirmed, drawn, calls = run(2)
    assert dict(confirmed.success) == {"always": 1.0, "never": 0.0, "half": 0.5, "quarter": 1 / 6}
    assert confirmed.pool == ("half", "quarter")
    assert calls == {"always": 6, "never": 6, "half": 2, "quarter": 6}
    assert len(set(drawn)) == 4 + 3 * 2  # fresh scenarios for the confirmation
    assert confirmed.tokens == (4 * 2 + 3 * 2 * 2) * 5  # every sampled task paid for


def test_the_pool_confirms_as_its_config_says(tmp_path):
    for confirm, pool in ((0, ["half"]), (2, ["half", "quarter"])):
        cfg = RolloutConfig(chain_length=1, pool="screened", screen_samples=2, screen_confirm=confirm)
        run_dir = tmp_path / str(confirm)
        run_dir.mkdir()
        asyncio.run(ScreenedPool(_runner(), cfg, 0, run_dir, 0).runner_for(0))
        assert [r["pool"] for r in pool_module.screens(run_dir)] == [pool]


def test_the_pool_draws_only_templates_with_success_strictly_between_0_and_1(tmp_path):
    runner = _runner()
    cfg = RolloutConfig(chain_length=1, group_size=2, groups_per_step=6, pool="screened", screen_samples=4)
    pool = ScreenedPool(runner, cfg, seed=0, run_dir=tmp_path, first_step=0)
    drawn = Counter()
    for step in range(3):
        step_runner, row = asyncio.run(pool.runner_for(step))
        assert row["pool/size"] == 2
        batch = asyncio.run(rollout_step(step_runner, random.Random(step), cfg, step=step))
        drawn.update(c.trajectories[0].task.instruction.split()[0] for c in batch.drawn_chains)
    assert set(drawn) == {"half", "quarter"}  # never the solved or the hopeless template
    assert [r["step"] for r in pool_module.screens(tmp_path)] == [0]  # screen_every 4: once


def test_an_empty_pool_draws_from_every_template(tmp_path):
    cfg = RolloutConfig(chain_length=1, group_size=2, pool="screened", screen_samples=4)
    pool = ScreenedPool(_runner(TemplateSuite(("always", "never"))), cfg, 0, tmp_path, 0)
    step_runner, row = asyncio.run(pool.runner_for(0))
    assert row["pool/size"] == 0 and step_runner.suite.train_templates == ("always", "never")


def test_a_suite_without_templates_is_refused_in_one_line(tmp_path):
    class Plain:  # a suite that samples chains but has no templates to screen
        name = "plain"
        sample_chain = TemplateSuite.sample_chain

    with pytest.raises(ValueError, match="rollout.pool=screened needs a suite that lists and narrows"):
        ScreenedPool(_runner(Plain()), RolloutConfig(pool="screened"), 0, tmp_path, 0)


def test_pocketworld_lists_and_narrows_its_train_templates():
    suite = PocketWorldSuite(templates=["notes_count_tag", "todo_count_open", "phone_count_relationship"])
    assert suite.train_templates == ("notes_count_tag", "todo_count_open", "phone_count_relationship")
    narrowed = suite.scoped(["todo_count_open"])
    chain = narrowed.sample_chain(random.Random(0), 2)
    assert narrowed.train_templates == ("todo_count_open",)
    assert {t.spec["template"] for t in chain} == {"todo_count_open"} and chain[0].split == "train"
    assert len(PocketWorldSuite().train_templates) == 30


class _NoTrainer:
    def step(self, samples, num_chains):
        return {"updated": False}


def test_the_training_loop_rescreens_and_counts_screen_tokens(tmp_path, monkeypatch):
    monkeypatch.setattr(loop_module, "save_checkpoint", lambda *a, **k: None)
    rollout = RolloutConfig(
        chain_length=1, group_size=2, groups_per_step=2, pool="screened", screen_every=2, screen_samples=4
    )
    cfg = LoopConfig(
        rollout=rollout, eval=TrainEvalConfig(before_after=False), steps=3, out_dir=str(tmp_path)
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    result = asyncio.run(loop_module.train(_runner(), _NoTrainer(), logger, cfg, 0, 0, sync=lambda: None))
    logger.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in pool_module.screens(tmp_path)] == [0, 2]
    screen_tokens = 4 * 4 * 5  # 4 templates x 4 samples x one 5-token task
    assert [r.get("pool/screen_tokens", 0) for r in rows] == [screen_tokens, 0, screen_tokens]
    rollout_tokens = 2 * 2 * 5  # B x G one-task chains of 5 tokens
    assert [r["sampled_tokens"] for r in rows] == [
        rollout_tokens + screen_tokens,
        rollout_tokens,
        rollout_tokens + screen_tokens,
    ]
    assert result.sampled_tokens == rows[-1]["sampled_tokens_total"] == 3 * rollout_tokens + 2 * screen_tokens
    assert all(r["pool/size"] == 2 for r in rows)
    for step in (1, 2, 3):
        for line in (tmp_path / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines():
            instruction = json.loads(line)["trajectories"][0]["task"]["instruction"]
            assert instruction.split()[0] in {"half", "quarter"}


def test_the_default_pool_is_every_template():
    assert RolloutConfig().pool == "all"


def test_a_pool_without_templates_is_refused_at_load():
    from sage_rl.config import ConfigError, load_config
    from sage_rl.integrations.verl.config import VerlRunConfig
    from sage_rl.settings import TrainConfig

    assert load_config(TrainConfig, None, ["rollout.pool=screened"]).rollout.pool == "screened"
    with pytest.raises(ConfigError, match="appworld has none to screen"):
        load_config(TrainConfig, None, ["env=appworld", "rollout.pool=screened"])
    with pytest.raises(ConfigError, match="verl draws its own batches"):
        load_config(VerlRunConfig, None, ["rollout.pool=screened"])
