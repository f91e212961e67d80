"""Exact tokens through the whole agent loop: what the policy is asked to continue is exactly the
sequence the trajectory records, and the trained mask covers exactly the sampled ids."""

import asyncio

from fakes import FakeEnv

from sage_rl.agent.prompts import PromptBuilder
from sage_rl.agent.render import ChatRenderer
from sage_rl.policies.base import SamplingParams
from sage_rl.policies.transformers_policy import TransformersPolicy
from sage_rl.rollout.episode import AgentConfig, EpisodeSpec, run_episode
from sage_rl.types import Outcome, Task, Trajectory


class Recording(TransformersPolicy):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = []

    async def generate(self, request):
        self.seen.append(tuple(request.prompt_ids))
        return await super().generate(request)


def test_episode_sequence_is_exactly_what_was_sampled_and_observed(tiny):
    model, tok = tiny
    policy = Recording(model, tok, max_batch=1)
    task = Task("s_1", "s", 1, "Say hello.", "dev")
    spec = EpisodeSpec(task, PromptBuilder(use_skills=False).messages(task))
    cfg = AgentConfig(max_steps=3, max_tokens_per_turn=12, context_limit=4096)
    episode = asyncio.run(run_episode(policy, FakeEnv(), spec, cfg, SamplingParams(temperature=1.0, seed=3)))
    traj = Trajectory(task, episode.prompt_ids, episode.turns, Outcome(0.0, False), episode.stop)
    assert len(traj.turns) == 3 and len(policy.seen) == 3
    assert policy.renderer is not None  # the loop rendered with the policy's own renderer
    renderer = ChatRenderer(tok)
    assert list(traj.prompt_ids) == renderer.prompt_ids(spec.messages)
    prefix = list(traj.prompt_ids)
    for seen, turn in zip(policy.seen, traj.turns, strict=True):
        assert list(seen) == prefix  # the policy continued exactly the recorded sequence
        assert list(turn.obs_ids) == renderer.observation_ids(turn.observation, turn.gen_ids)
        assert len(turn.gen_logprobs) == len(turn.gen_ids) > 0
        prefix += [*turn.gen_ids, *turn.obs_ids]
    ids, mask, lps = traj.token_arrays()
    assert ids == prefix
    gen = [i for t in traj.turns for i in t.gen_ids]
    assert [i for i, m in zip(ids, mask, strict=True) if m] == gen
    assert sum(mask) == len(gen) and sum(1 for lp in lps if lp != 0.0) <= len(gen)
