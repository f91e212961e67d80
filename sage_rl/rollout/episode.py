"""The agent loop: one task, one policy, one environment (SAGE.md section 1).

prompt -> policy turn -> parse the code -> execute -> observe, until ``complete_task``, the step
limit, or the context / token budget. Tokens are exact: the sampled ids are appended as they
came, and each observation is rendered as one new chat message by the policy's own renderer and
appended (ARCHITECTURE.md, principle 3).

The loop only loops. The chain (``rollout/chain.py``) owns the environment around it: it resets
the environment, loads the library, renders the opening messages from what loaded, and evaluates
the world afterwards.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Sequence

from pydantic import Field

from sage_rl.agent.parse import NO_CODE_OBSERVATION, parse_reply
from sage_rl.agent.syntax import CodeError, parse_code
from sage_rl.config import Section
from sage_rl.envs.base import Environment
from sage_rl.policies.base import Policy, PolicyRequest, SamplingParams
from sage_rl.text import valid_text
from sage_rl.types import Completion, ExecResult, StopReason, Task, Turn, cell_origin

#: What a turn without code gets back: a corrective observation, and no execution.
NO_CODE_RESULT = ExecResult(NO_CODE_OBSERVATION, ok=False)


class AgentConfig(Section):
    """Limits of one episode. Defaults are the paper's (SAGE.md section 1)."""

    max_steps: int = Field(40, ge=1)
    max_tokens_per_turn: int = Field(1500, ge=1)
    context_limit: int = Field(28_000, ge=1, description="prompt + everything generated and observed so far")
    token_budget: int | None = Field(None, ge=1, description="generated tokens per episode; null = no budget")
    min_turn_tokens: int = Field(16, ge=1, description="a turn with less room than this is not started")


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """What one episode starts from: the task and its opening [system, user] messages."""

    task: Task
    messages: tuple[dict[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Episode:
    """What the loop produced: the exact prompt ids, the turns, why it stopped (and the error
    text when a policy or environment failure stopped it)."""

    prompt_ids: tuple[int, ...]
    turns: tuple[Turn, ...]
    stop: StopReason
    error: str = ""


async def run_episode(
    policy: Policy, env: Environment, spec: EpisodeSpec, cfg: AgentConfig, params: SamplingParams
) -> Episode:
    """Loop on a reset environment until the episode ends. Never raises for policy, agent-code or
    environment failures: they end the episode as data (STYLE.md, principle 12)."""
    renderer = policy.renderer
    messages = list(spec.messages)
    ids = renderer.prompt_ids(messages) if renderer else []
    prompt_ids, turns = tuple(ids), []

    def end(stop: StopReason, error: Exception | None = None) -> Episode:
        return Episode(prompt_ids, tuple(turns), stop, f"{type(error).__name__}: {error}" if error else "")

    for step in range(cfg.max_steps):
        room, limit = turn_room(cfg, len(ids), sum(t.num_tokens for t in turns))
        if room < min(cfg.min_turn_tokens, cfg.max_tokens_per_turn):
            return end(limit)
        turn_params = dataclasses.replace(params, max_tokens=room)
        request = PolicyRequest(
            tuple(messages), tuple(ids) if renderer else None, turn_params, spec.task.task_id
        )
        t0 = time.perf_counter()
        try:
            completion = checked(await policy.generate(request))
        except Exception as e:  # a backend failure, or a reply no trainer could use
            return end(StopReason.POLICY_ERROR, e)
        t1 = time.perf_counter()
        code = parse_reply(completion.text).code
        try:
            result = await _execute(env, code, step)
        except Exception as e:  # the environment itself failed (agent-code errors are observations)
            return end(StopReason.ENV_ERROR, e)
        obs_ids = renderer.observation_ids(result.observation, completion.token_ids) if renderer else []
        ids += [*completion.token_ids, *obs_ids]
        messages += [
            {"role": "assistant", "content": completion.text},
            {"role": "user", "content": result.observation},
        ]
        turns.append(_turn(completion, code, result, obs_ids, t1 - t0, time.perf_counter() - t1))
        if env.completed:
            return end(StopReason.COMPLETED)
    return end(StopReason.STEP_LIMIT)


async def _execute(env: Environment, code: str | None, step: int) -> ExecResult:
    """Run the turn's cell. A turn without code, or with code nested too deeply for the parent to
    analyse (``agent/syntax.py``), runs nothing and fails with an observation saying so."""
    if not code:
        return NO_CODE_RESULT
    tree = parse_code(code)
    if isinstance(tree, CodeError) and tree.too_deep:
        return ExecResult(tree.message, ok=False)
    result = await env.execute(code, cell_origin(step))
    # The observation is text from outside too: a lone surrogate in it would stop the tokenizer.
    observation = valid_text(result.observation)
    if observation != result.observation:
        result = dataclasses.replace(result, observation=observation)
    return result


def checked(c: Completion) -> Completion:
    """``c`` when a trainer can use it, else ``ValueError`` saying what is wrong (the episode then
    ends as a policy error, not the run): text a string; token ids and log-probabilities both
    sequences, of equal length (or the log-probabilities empty, from a text-only backend), every
    log-probability a finite number at most 0. The shipped backends hold to this; a server or a
    new backend that breaks it would otherwise crash the turn's record or put NaN into a PPO ratio."""
    if not isinstance(c.text, str):
        raise ValueError(f"the completion's text is a {type(c.text).__name__}, not a string")
    if not isinstance(c.token_ids, Sequence) or not isinstance(c.logprobs, Sequence):
        raise ValueError("the completion's token_ids and logprobs must be sequences")
    if c.logprobs and len(c.logprobs) != len(c.token_ids):
        raise ValueError(f"{len(c.token_ids)} token ids but {len(c.logprobs)} log-probabilities")
    bad = next((x for x in c.logprobs if not (isinstance(x, numbers.Real) and -math.inf < x <= 1e-4)), None)
    if bad is not None:
        raise ValueError(f"a log-probability is {bad!r}: every one must be a finite number <= 0")
    return c


def turn_room(cfg: AgentConfig, context_used: int, generated: int) -> tuple[int, StopReason]:
    """Tokens the next turn may generate, and which limit binds if it is too few."""
    by_context = cfg.context_limit - context_used
    if cfg.token_budget is None or by_context <= cfg.token_budget - generated:
        return min(cfg.max_tokens_per_turn, by_context), StopReason.CONTEXT_LIMIT
    return min(cfg.max_tokens_per_turn, cfg.token_budget - generated), StopReason.TOKEN_BUDGET


def _turn(
    completion: Completion,
    code: str | None,
    result: ExecResult,
    obs_ids: list[int],
    policy_s: float,
    env_s: float,
) -> Turn:
    return Turn(
        gen_ids=tuple(completion.token_ids),
        gen_logprobs=tuple(completion.logprobs),
        text=completion.text,
        code=code,
        result=result,
        obs_ids=tuple(obs_ids),
        completion_tokens=completion.completion_tokens,
        policy_s=policy_s,
        env_s=env_s,
    )
