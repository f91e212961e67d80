"""The agent loop: one task, one policy, one environment (SAGE.md section 1).

prompt -> policy turn -> parse the code -> execute -> observe, until ``complete_task``, the step
limit, or the context / token budget. Tokens are exact: the sampled ids are appended as they
came, and each observation is rendered as one new chat message and appended
(ARCHITECTURE.md, principle 3). The loop knows nothing of skills beyond running the library's
definitions first; extraction and usage are the chain's business (``rollout/chain.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from sage_rl.agent.parse import NO_CODE_OBSERVATION, parse_reply
from sage_rl.config import Section
from sage_rl.envs.base import Environment
from sage_rl.policies.base import Policy, PolicyRequest, SamplingParams
from sage_rl.types import ExecResult, StopReason, Task, Trajectory, Turn, cell_origin, skill_origin


class AgentConfig(Section):
    """Limits of one episode. Defaults are the paper's (SAGE.md section 1)."""

    max_steps: int = 40
    max_tokens_per_turn: int = 1500
    context_limit: int = 28_000  # prompt + everything generated and observed so far
    token_budget: int | None = None  # total generated tokens per episode; None = no budget
    min_turn_tokens: int = 16  # a turn with less room than this is not started


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """What one episode starts from: the task, its opening messages and the library to load."""

    task: Task
    messages: tuple[dict[str, str], ...]
    preamble: tuple[tuple[str, str], ...] = ()  # (skill name, definition code), in load order


async def run_episode(
    policy: Policy, env: Environment, spec: EpisodeSpec, cfg: AgentConfig, params: SamplingParams
) -> Trajectory:
    """Run one task to its end and evaluate it. Never raises for policy or agent-code failures."""
    await env.reset(spec.task)
    loaded, dropped = await load_library(env, spec.preamble)
    renderer = _renderer(policy)
    messages = list(spec.messages)
    ids = renderer.prompt_ids(messages) if renderer else []
    prompt_ids, turns, stop, error = tuple(ids), [], StopReason.STEP_LIMIT, ""
    for step in range(cfg.max_steps):
        room, limit = turn_room(cfg, len(ids), sum(t.num_tokens for t in turns))
        if room < min(cfg.min_turn_tokens, cfg.max_tokens_per_turn):
            stop = limit
            break
        request = PolicyRequest(
            tuple(messages),
            tuple(ids) if renderer else None,
            dataclasses.replace(params, max_tokens=room),
            spec.task,
            loaded,
        )
        t0 = time.perf_counter()
        try:
            completion = await policy.generate(request)
        except Exception as e:  # a backend failure ends the episode as data (STYLE.md, 12)
            stop, error = StopReason.POLICY_ERROR, f"{type(e).__name__}: {e}"
            break
        t1 = time.perf_counter()
        code = parse_reply(completion.text).code
        try:
            result = (
                await env.execute(code, cell_origin(step))
                if code
                else ExecResult(NO_CODE_OBSERVATION, ok=False)
            )
        except Exception as e:  # the environment itself failed (agent-code errors come back as observations)
            stop, error = StopReason.ENV_ERROR, f"{type(e).__name__}: {e}"
            break
        obs_ids = renderer.observation_ids(result.observation, completion.token_ids) if renderer else []
        ids += [*completion.token_ids, *obs_ids]
        messages += [
            {"role": "assistant", "content": completion.text},
            {"role": "user", "content": result.observation},
        ]
        turns.append(_turn(completion, code, result, obs_ids, t1 - t0, time.perf_counter() - t1))
        if env.completed:
            stop = StopReason.COMPLETED
            break
    outcome = await env.evaluate()
    return Trajectory(
        spec.task,
        prompt_ids,
        tuple(turns),
        outcome,
        stop,
        library_in=tuple(n for n, _ in spec.preamble),
        library_dropped=dropped,
        policy=policy.name,
        error=error,
    )


async def load_library(
    env: Environment, preamble: Sequence[tuple[str, str]]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Execute each library skill's definition into the task's interpreter, in order.

    Returns (loaded, dropped): a skill whose definition fails is dropped (SAGE.md section 1).
    """
    loaded, dropped = [], []
    for name, code in preamble:
        result = await env.execute(code, skill_origin(name))
        (loaded if result.ok else dropped).append(name)
    return tuple(loaded), tuple(dropped)


def turn_room(cfg: AgentConfig, context_used: int, generated: int) -> tuple[int, StopReason]:
    """Tokens the next turn may generate, and which limit binds if it is too few."""
    by_context = cfg.context_limit - context_used
    if cfg.token_budget is None or by_context <= cfg.token_budget - generated:
        return min(cfg.max_tokens_per_turn, by_context), StopReason.CONTEXT_LIMIT
    return min(cfg.max_tokens_per_turn, cfg.token_budget - generated), StopReason.TOKEN_BUDGET


def _renderer(policy: Policy) -> Any:
    if policy.tokenizer is None:
        return None
    from sage_rl.agent.render import ChatRenderer

    return ChatRenderer(policy.tokenizer)


def _turn(completion, code, result: ExecResult, obs_ids, policy_s: float, env_s: float) -> Turn:
    return Turn(
        gen_ids=tuple(completion.token_ids),
        gen_logprobs=tuple(completion.logprobs),
        text=completion.text,
        code=code,
        observation=result.observation,
        obs_ids=tuple(obs_ids),
        exec_ok=result.ok,
        timed_out=result.timed_out,
        calls=result.calls,
        defined=result.defined,
        completion_tokens=completion.completion_tokens,
        policy_s=policy_s,
        env_s=env_s,
    )
