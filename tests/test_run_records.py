"""Issue 30, item 2: results are written as they finish and survive any text. A reply with a lone
surrogate ("\\ud800") from an OpenAI-compatible server ran, then ``write_run`` crashed: the
trajectories file was left at 0 bytes and no metrics were written."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from fakes import FakeEnv, FakeServer, chat_reply
from test_episode import TASK, FakeSuite, ScriptPolicy, _runner

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.agent.render import ChatRenderer
from sage_rl.eval import report
from sage_rl.eval.report import ReportError, write_run
from sage_rl.eval.runner import EvalConfig, run_eval
from sage_rl.policies.base import SamplingParams
from sage_rl.policies.openai_policy import OpenAIPolicy
from sage_rl.rollout.episode import AgentConfig, EpisodeSpec, run_episode
from sage_rl.types import Chain, Completion, ExecResult, StopReason

BAD = "a lone \ud800 surrogate, a NUL \x00, a low \udfff"
DONE = "```python\ncomplete()\n```"


class Suite(FakeSuite):
    """Two scenarios of two tasks each, in fresh fake environments."""

    def record_to(self, run_dir, variant=None):
        return run_dir


def _evaluate(policy, out, concurrency=1):
    runner = _runner(policy, Suite())
    return asyncio.run(run_eval(runner, EvalConfig(split="dev", concurrency=concurrency), record_dir=out))


def _chains(path):
    return [Chain.from_dict(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def test_an_eval_against_a_server_sending_a_lone_surrogate_writes_everything(tmp_path):
    server = FakeServer(lambda path, body, headers: (200, chat_reply(f"{BAD}\n{DONE}"), {}, 0.0))
    try:
        result = _evaluate(OpenAIPolicy(server.url, "m", max_retries=0), tmp_path)
    finally:
        server.close()
    write_run(tmp_path, result.metrics, result.chains, "k: v\n", "title")
    chains = _chains(tmp_path / "trajectories.same_scenario.jsonl")
    assert len(chains) == 2 and all(t.outcome.success for c in chains for t in c.trajectories)
    text = chains[0].trajectories[0].turns[0].text
    assert text.startswith("a lone \ufffd surrogate, a NUL \x00, a low \ufffd")  # U+FFFD at the policy
    assert json.loads((tmp_path / "metrics.json").read_text())["same_scenario"]["tgc"] == 100.0
    assert (tmp_path / "report.md").stat().st_size > 0 and (tmp_path / "by_position.png").stat().st_size > 0


def test_records_keep_any_text_exactly(tmp_path):
    """Where no policy cleaned it (a scripted policy, agent output), text is written as it was:
    a lone surrogate as its JSON escape, which reads back as the same string."""
    huge = "x" * 1_000_000
    result = _evaluate(ScriptPolicy([f"{BAD}{huge}\n{DONE}"]), tmp_path)
    chain = result.chains["same_scenario"][0]
    turn = chain.trajectories[0].turns[0]
    weird = dataclasses.replace(turn, result=ExecResult(BAD, ok=True))
    traj = dataclasses.replace(chain.trajectories[0], turns=(weird,))
    chain = dataclasses.replace(chain, trajectories=(traj,))
    write_run(tmp_path, result.metrics, {"same_scenario": [chain]}, f"note: {BAD}\n", "title")
    (back,) = _chains(tmp_path / "trajectories.same_scenario.jsonl")
    assert back == chain and back.trajectories[0].turns[0].text.startswith(BAD)
    assert "\\ud800" in (tmp_path / "trajectories.same_scenario.jsonl").read_text(encoding="utf-8")


class Crash(BaseException):
    """Something that ends the whole run (a bug, an interrupt), not one episode."""


class CrashOnSecondScenario(ScriptPolicy):
    def __init__(self, out):
        super().__init__([DONE])
        self.out, self.seen = out, []

    async def generate(self, request):
        if request.task_id.startswith("s1"):
            path = self.out / "trajectories.same_scenario.jsonl"
            self.seen.append(path.read_text() if path.exists() else "")
            raise Crash()
        return await super().generate(request)


def test_each_chain_is_on_disk_as_soon_as_it_finishes(tmp_path):
    policy = CrashOnSecondScenario(tmp_path)
    with pytest.raises(Crash):
        _evaluate(policy, tmp_path)
    (first,) = _chains(tmp_path / "trajectories.same_scenario.jsonl")  # the run died; this stayed
    assert first.trajectories[0].task.scenario_id == "s0" and first.trajectories[1].outcome.success
    assert policy.seen[0].count("\n") == 1  # already written while the next scenario ran


def test_a_failing_report_step_loses_nothing_else(tmp_path, monkeypatch):
    result = _evaluate(ScriptPolicy([DONE]), tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(report, "markdown_report", broken)
    with pytest.raises(ReportError, match=r"report\.md \(RuntimeError: no fonts\)"):
        write_run(tmp_path, result.metrics, result.chains, "k: v\n", "title")
    assert len(_chains(tmp_path / "trajectories.same_scenario.jsonl")) == 2
    assert json.loads((tmp_path / "metrics.json").read_text())["same_scenario"]["tgc"] == 100.0
    assert (tmp_path / "by_position.png").stat().st_size > 0  # the step after the failed one ran
    assert not (tmp_path / "report.md").exists()


def test_a_failed_rewrite_leaves_the_streamed_trajectories(tmp_path, monkeypatch):
    result = _evaluate(ScriptPolicy([DONE]), tmp_path)
    streamed = (tmp_path / "trajectories.same_scenario.jsonl").read_text()

    def broken(obj):
        raise OSError("disk full")

    monkeypatch.setattr(report, "dumps", broken)
    with pytest.raises(ReportError, match="trajectories.same_scenario.jsonl"):
        write_run(tmp_path, result.metrics, result.chains, "k: v\n", "title")
    assert (tmp_path / "trajectories.same_scenario.jsonl").read_text() == streamed != ""
    assert (tmp_path / "metrics.json").is_file() and not list(tmp_path.glob("*.tmp"))


class SurrogateOutput(FakeEnv):
    """Every cell's output holds the bad text (as AppWorld could pass on what agent code printed)."""

    async def execute(self, code, origin):
        return dataclasses.replace(await super().execute(code, origin), observation=BAD)


class TokenExact:
    """Replies ``print(1)``, then completes; token-exact, so observations are tokenized."""

    name = "exact"

    def __init__(self, tok):
        self.renderer, self.tok, self.turn = ChatRenderer(tok), tok, 0

    async def generate(self, request):
        text = "```python\nprint(1)\n```" if self.turn == 0 else DONE
        self.turn += 1
        ids = (*self.tok.encode(text, add_special_tokens=False), self.renderer.eot_id)
        return Completion(text, ids, (0.0,) * len(ids), completion_tokens=len(ids))


def test_an_observation_with_a_lone_surrogate_is_tokenized(tiny):
    env = SurrogateOutput()
    asyncio.run(env.reset(TASK))
    spec = EpisodeSpec(TASK, PromptBuilder().messages(TASK))
    episode = asyncio.run(
        run_episode(TokenExact(tiny[1]), env, spec, AgentConfig(max_steps=3), SamplingParams())
    )
    assert episode.stop is StopReason.COMPLETED and len(episode.turns) == 2
    assert episode.turns[0].observation == "a lone \ufffd surrogate, a NUL \x00, a low \ufffd"
