"""The agent loop and the sequential rollout, with fake policies and environments (no model)."""

import asyncio
import random

import pytest
from fakes import FakeEnv

from sage_rl.agent.parse import NO_CODE_OBSERVATION
from sage_rl.agent.prompts import PromptBuilder
from sage_rl.policies.base import Completion, PolicyRequest, SamplingParams
from sage_rl.rollout.batch import RolloutConfig, check_group_contract, rollout_batch, to_samples
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig, EpisodeSpec, run_episode, turn_room
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards
from sage_rl.skills.library import Library
from sage_rl.skills.record import Provenance, make_skill
from sage_rl.skills.retrieval import RetrievalConfig, make_retriever
from sage_rl.types import CallRecord, ExecResult, StopReason, Task


class ScriptPolicy:
    """Replies with the given texts in order (text-only: no renderer)."""

    renderer = None
    name = "script"

    def __init__(self, replies, tokens_per_reply=10):
        self.replies, self.n, self.requests = list(replies), tokens_per_reply, []

    async def generate(self, request: PolicyRequest) -> Completion:
        self.requests.append(request)
        turn = sum(m["role"] == "assistant" for m in request.messages)
        text = self.replies[min(turn, len(self.replies) - 1)]
        if text == "RAISE":
            raise ConnectionError("server went away")
        return Completion(text=text, completion_tokens=self.n)


TASK = Task("s_1", "s", 1, "Do the thing.", "dev")


class OneEnvSuite:
    """A suite of one environment (the given one), for single-task chains."""

    name, prompt_dir = "one", None

    def __init__(self, env):
        self.env = env

    def split(self, split, limit=None):
        return (TASK,)

    def sample_chain(self, rng, length, split="train"):
        return (TASK,)

    def worked_example(self):
        return None

    async def open(self):
        return self.env

    def record_to(self, run_dir, variant=None):
        self.recorded = [*getattr(self, "recorded", []), (run_dir, variant)]
        return run_dir

    async def close(self):
        pass


def skill(code, uses=0):
    return make_skill(code, provenance=Provenance(scenario_id=TASK.scenario_id), uses=uses)


def _run(policy, cfg=AgentConfig(max_steps=5), library=(), env=None):
    """One task through the chain (which owns the environment around the episode)."""
    env = env or FakeEnv()
    runner = _runner(policy, OneEnvSuite(env), cfg)
    chain = asyncio.run(runner.run((TASK,), Library(library)))
    return chain.trajectories[0], env


def test_run_episode_only_loops_on_a_reset_environment():
    env = FakeEnv()
    asyncio.run(env.reset(TASK))
    spec = EpisodeSpec(TASK, PromptBuilder().messages(TASK))
    policy = ScriptPolicy(["```python\nx = 1\n```", "```python\ncomplete()\n```"])
    episode = asyncio.run(run_episode(policy, env, spec, AgentConfig(max_steps=5), SamplingParams()))
    assert episode.stop is StopReason.COMPLETED and [t.code for t in episode.turns] == ["x = 1", "complete()"]
    assert [r.task_id for r in policy.requests] == [TASK.task_id] * 2


def test_completes_and_records_turns():
    traj, env = _run(ScriptPolicy(["```python\nx = 1\n```", "```python\ncomplete()\n```"]))
    assert traj.stop is StopReason.COMPLETED and traj.outcome.success
    assert [t.code for t in traj.turns] == ["x = 1", "complete()"]
    assert [o for o, _ in env.cells] == ["<cell-0>", "<cell-1>"]
    assert traj.num_generated_tokens == 20


def test_no_code_turn_gets_corrective_observation_and_counts():
    traj, env = _run(ScriptPolicy(["I think I should log in.", "```python\ncomplete()\n```"]))
    assert traj.turns[0].code is None and traj.turns[0].observation == NO_CODE_OBSERVATION
    assert len(env.cells) == 1 and traj.stop is StopReason.COMPLETED and len(traj.turns) == 2


def test_step_limit_and_policy_error_are_data():
    traj, _ = _run(ScriptPolicy(["```python\nx = 1\n```"]), AgentConfig(max_steps=3))
    assert traj.stop is StopReason.STEP_LIMIT and len(traj.turns) == 3 and not traj.outcome.success
    traj, _ = _run(ScriptPolicy(["```python\nx = 1\n```", "RAISE"]))
    assert traj.stop is StopReason.POLICY_ERROR and "server went away" in traj.error and len(traj.turns) == 1


def test_environment_failure_is_data():
    class BrokenEnv(FakeEnv):
        async def execute(self, code, origin):
            raise OSError("worker pipe closed")

    traj, _ = _run(ScriptPolicy(["```python\nx = 1\n```"]), env=BrokenEnv())
    assert traj.stop is StopReason.ENV_ERROR and "worker pipe closed" in traj.error and traj.turns == ()


def test_token_budget_and_context_limit():
    traj, _ = _run(
        ScriptPolicy(["```python\nx = 1\n```"], tokens_per_reply=40),
        AgentConfig(token_budget=100, min_turn_tokens=30),
    )
    assert traj.stop is StopReason.TOKEN_BUDGET and len(traj.turns) == 2  # 100 - 80 = 20 < 30
    assert turn_room(AgentConfig(context_limit=1000, max_tokens_per_turn=300), 900, 0) == (
        100,
        StopReason.CONTEXT_LIMIT,
    )
    assert turn_room(AgentConfig(token_budget=50), 10, 20) == (30, StopReason.TOKEN_BUDGET)


def test_each_turn_asks_for_at_most_the_room_left():
    policy = ScriptPolicy(["```python\nx = 1\n```"], tokens_per_reply=40)
    _run(policy, AgentConfig(token_budget=100, max_tokens_per_turn=64, min_turn_tokens=1, max_steps=4))
    assert [r.params.max_tokens for r in policy.requests] == [64, 60, 20]


def test_library_preamble_runs_first_and_failures_are_dropped():
    traj, env = _run(
        ScriptPolicy(["```python\ncomplete()\n```"]),
        library=(skill("def f():\n    return 1", uses=1), skill("def bad():\n    return 2")),
    )
    assert [o for o, _ in env.cells][:2] == ["<skill:f>", "<skill:bad>"]
    assert traj.library_in == ("f", "bad") and traj.library_dropped == ("bad",)


def test_a_skill_that_fails_to_load_leaves_the_prompt_and_the_chains_library():
    """SAGE.md section 1: a skill whose definition fails is dropped - from what the agent is shown
    and from the library later tasks get - and so is a skill that depends on it."""
    policy = ScriptPolicy(["```python\ncomplete()\n```"])
    lib = (
        skill("def f():\n    return 1", uses=2),
        skill("def bad():\n    return 2", uses=1),
        make_skill(
            "def uses_bad():\n    return bad()", depends_on=("bad",), provenance=Provenance(scenario_id="s")
        ),
    )
    env = FakeEnv()
    runner = _runner(policy, OneEnvSuite(env))
    chain = asyncio.run(runner.run((TASK, TASK), Library(lib)))
    first, second = chain.trajectories
    assert set(first.library_in) == {"f", "bad", "uses_bad"}
    assert first.library_dropped == ("bad", "uses_bad")
    opening = policy.requests[0].messages[1]["content"]
    assert "def f()" in opening and "def bad()" not in opening and "def uses_bad()" not in opening
    assert second.library_in == ("f",) and second.library_dropped == ()
    assert "def bad()" not in policy.requests[1].messages[1]["content"]


class ResetFails(FakeEnv):
    async def reset(self, task):
        raise OSError("the world would not build")


class EvaluateFails(FakeEnv):
    async def evaluate(self):
        raise RuntimeError("the checker crashed")


@pytest.mark.parametrize("broken", [ResetFails, EvaluateFails], ids=["reset", "evaluate"])
def test_an_environment_failure_ends_the_task_as_data_and_the_chain_goes_on(broken):
    bad, good = Task("bad_1", "bad", 1, "Break.", "dev"), Task("bad_2", "bad", 2, "Go on.", "dev")

    class Suite(OneEnvSuite):
        def __init__(self):
            self.opened = 0

        async def open(self):
            self.opened += 1
            return broken() if self.opened == 1 else FakeEnv()

    policy = ScriptPolicy(["```python\ncomplete()\n```"])
    chain = asyncio.run(_runner(policy, Suite()).run((bad, good), Library()))
    failed, fine = chain.trajectories
    assert failed.stop is StopReason.ENV_ERROR and failed.outcome.score == 0.0 and not failed.outcome.success
    assert ("would not build" if broken is ResetFails else "checker crashed") in failed.error
    assert failed.turns == () if broken is ResetFails else len(failed.turns) == 1
    assert fine.stop is StopReason.COMPLETED and fine.outcome.success
    # the batch goes on too. Nothing sampled (reset failed): the task leaves its group, neither a
    # no-code -1 nor a 0 in the others' baseline. The policy played (evaluate failed): scored 0.
    samples = to_samples([[chain, chain]], RolloutConfig(chain_length=2, group_size=2))
    got = [(s.trajectory.task.task_id, s.reward) for s in samples]
    if broken is ResetFails:
        assert got == [("bad_2", 1.0), ("bad_2", 1.0)]
    else:
        assert got == [("bad_1", 0.0), ("bad_2", 1.0), ("bad_1", 0.0), ("bad_2", 1.0)]


def test_a_backend_failure_before_the_first_turn_leaves_its_group():
    """The backend failed before anything was sampled (the server went away; a completion that
    ``checked`` refused): nothing the policy wrote, no token to train. Scored as "no code" (-1) it
    sat in its group's baseline, and the three chains that failed on their own got +0.25 each."""
    fails = _runner(ScriptPolicy(["```python\nx = 1\n```"]), OneEnvSuite(FakeEnv()))
    errs = _runner(ScriptPolicy(["RAISE"]), OneEnvSuite(FakeEnv()))
    chains = [asyncio.run(r.run((TASK,), Library())) for r in (fails, fails, fails, errs)]
    err = chains[3].trajectories[0]
    assert err.stop is StopReason.POLICY_ERROR and err.turns == () and "server went away" in err.error
    samples = to_samples([chains], RolloutConfig(chain_length=1, group_size=4))
    assert len(samples) == 3 and all(s.trajectory.stop is StopReason.STEP_LIMIT for s in samples)
    assert [(s.reward, s.advantage) for s in samples] == [(0.0, 0.0)] * 3


def test_opening_the_environment_can_fail_too():
    class NoEnv(OneEnvSuite):
        async def open(self):
            raise ConnectionError("no sandbox worker")

    chain = asyncio.run(_runner(ScriptPolicy(["x"]), NoEnv(None)).run((TASK,), Library()))
    (traj,) = chain.trajectories
    assert traj.stop is StopReason.ENV_ERROR and "no sandbox worker" in traj.error and traj.turns == ()


def test_task_context_is_rendered_in_the_prompt():
    task = Task(
        "s_1",
        "s",
        1,
        "Do the thing.",
        "dev",
        context={"supervisor": "Ada L <ada@x.org>", "date": "2024-05-01"},
    )
    system, user = PromptBuilder().messages(task, "")
    assert "- supervisor: Ada L <ada@x.org>\n- date: 2024-05-01\n" in user["content"]
    assert user["content"].endswith("# Your task\nDo the thing.")
    assert "supervisor: Ada" not in system["content"]
    _, plain = PromptBuilder().messages(TASK, "")
    assert "About this task" not in plain["content"]  # PocketWorld's tasks have no context


# ------------------------------------------------------------------ chains and groups


class FakeSuite:
    name, prompt_dir = "fake", None

    def worked_example(self):
        return None

    async def close(self):
        pass

    def split(self, split, limit=None):
        return tuple(
            Task(f"s{i}_{k}", f"s{i}", k, f"task {k} of s{i}", split)
            for i in range(min(2, limit or 2))
            for k in (1, 2)
        )

    def sample_chain(self, rng, length, split="train"):
        i = rng.randrange(100)
        return tuple(Task(f"t{i}_{k}", f"t{i}", k, f"task {k}", split) for k in range(1, length + 1))

    async def open(self):
        return FakeEnv()


class SkillPolicy:
    """Task 1 defines and calls skill f; task 2 calls f (which the prompt lists), then completes."""

    renderer = None
    name = "skill"

    async def generate(self, request):
        if "def f()" in request.messages[1]["content"]:
            return Completion("```python\nf()\ncomplete()\n```", completion_tokens=5)
        return Completion("```python\ndef f():\n    return 1\nf()\ncomplete()\n```", completion_tokens=5)


class DefiningEnv(FakeEnv):
    """Reports f as defined in its cell and called from that cell (or from the library), returning
    after a successful API call."""

    async def execute(self, code, origin):
        r = await super().execute(code, origin)
        if origin.startswith("<cell-") and "def f" in code:
            return ExecResult("out", True, calls=(CallRecord("f", origin, 1, 0, 1),), defined=("f",))
        return r


class DefiningSuite(FakeSuite):
    async def open(self):
        return DefiningEnv()


def _runner(policy, suite, agent=AgentConfig(max_steps=3)):
    return ChainRunner(
        policy,
        suite,
        PromptBuilder(),
        agent,
        SkillsConfig(),
        SamplingParams(),
        make_retriever(RetrievalConfig()),
    )


def test_chain_carries_the_library_and_records_used_from():
    suite = DefiningSuite()
    chain = asyncio.run(_runner(SkillPolicy(), suite).run(suite.split("dev")[:2], Library()))
    t1, t2 = chain.trajectories
    assert t1.skills_saved == ("f",) and t1.library_in == ()
    assert t2.library_in == ("f",) and t2.skills_used == ("f",)
    assert chain.used_from == ((), (0,))


class PastingPolicy:
    """Task 1 defines and calls f; task 2 pastes the same f and calls its copy; task 3 calls f."""

    renderer = None
    name = "paste"

    async def generate(self, request):
        if request.task_id.endswith("_3"):
            return Completion("```python\nf()\ncomplete()\n```", completion_tokens=5)
        return Completion("```python\ndef f():\n    return 1\nf()\ncomplete()\n```", completion_tokens=5)


def test_a_pasted_copy_of_a_skill_does_not_take_the_credit_for_making_it():
    """K = 3 (the reward audit of session 26): task 2 saving task 1's code again made nothing, so
    task 3's use of f is task 1's; it was credited to task 2, which then collected a bonus (1, 2, 2)
    for a paste and task 1 lost its own."""
    suite = DefiningSuite()
    tasks = tuple(Task(f"s0_{k}", "s0", k, f"task {k}", "dev") for k in (1, 2, 3))
    chain = asyncio.run(_runner(PastingPolicy(), suite).run(tasks, Library()))
    t1, t2, t3 = chain.trajectories
    assert t1.skills_saved == t2.skills_saved == ("f",)  # the same code: the library keeps task 1's
    assert t2.skills_used == () and t3.skills_used == ("f",)  # task 2 called its own copy
    assert chain.used_from == ((), (), (0,))
    outcomes = ChainOutcomes.from_chain(chain)
    assert compute_rewards(RewardKind.SKILL_INTEGRATED, outcomes, None) == (2.0, 1.0, 2.0)


def test_group_contract_and_samples_grouped_by_position():
    suite = DefiningSuite()
    cfg = RolloutConfig(chain_length=2, group_size=3, groups_per_step=2)
    groups = asyncio.run(rollout_batch(_runner(SkillPolicy(), suite), random.Random(0), cfg))
    assert [len(g) for g in groups] == [3, 3]
    for chains in groups:
        assert len({c.task_ids for c in chains}) == 1
        assert len({c.trajectories[0].library_in for c in chains}) == 1
        assert len({c.start_library for c in chains}) == 1
    samples = to_samples(groups, cfg)
    assert len(samples) == 12
    assert {s.group for s in samples} == {(c.task_ids, k) for g in groups for c in g[:1] for k in (0, 1)}
    # every chain succeeds and task 2 reuses task 1's skill: R = (1 + 1, 1 + 1), advantages 0
    assert all(s.reward == 2.0 and s.advantage == 0.0 for s in samples)


def test_group_contract_violation_is_caught():
    suite = FakeSuite()
    a = asyncio.run(_runner(SkillPolicy(), suite).run(suite.split("dev")[:2], Library()))
    b = asyncio.run(_runner(SkillPolicy(), suite).run(suite.split("dev")[2:], Library()))
    with pytest.raises(AssertionError, match="group contract"):
        check_group_contract([[a, b]])
    # same tasks, but another start library: the contract is about the library the chains start
    # from, not about what retrieval showed task 1
    lib = Library([make_skill("def h():\n    return 0", provenance=Provenance(scenario_id="elsewhere"))])
    c = asyncio.run(_runner(SkillPolicy(), suite).run(suite.split("dev")[:2], lib))
    assert c.trajectories[0].library_in == a.trajectories[0].library_in == ()
    with pytest.raises(AssertionError, match="start libraries"):
        check_group_contract([[a, c]])


def test_run_eval_asks_the_suite_to_keep_its_own_outputs_per_strategy(tmp_path):
    from sage_rl.eval.runner import EvalConfig, run_eval

    suite = OneEnvSuite(FakeEnv())
    runner = _runner(ScriptPolicy(["```python\ncomplete()\n```"]), suite)
    asyncio.run(run_eval(runner, EvalConfig(split="dev"), record_dir=tmp_path))
    assert suite.recorded == [(tmp_path, None)]  # one strategy: no variant
    cfg = EvalConfig(split="dev", strategies=["same_scenario", "bm25"])
    asyncio.run(run_eval(runner, cfg, record_dir=tmp_path))
    assert suite.recorded[1:] == [(tmp_path, "same_scenario"), (tmp_path, "bm25")]
    asyncio.run(run_eval(runner, cfg))  # no folder: nothing recorded
    assert len(suite.recorded) == 3
