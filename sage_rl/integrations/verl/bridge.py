"""The one module of the verl adapter that touches sage-rl's rollout internals.

Everything the adapter needs from the rollout core goes through here: building the suite (with
its sandbox or AppWorld workers) and the chain runner once per worker process, running one chain,
reading its trajectories, and computing its rewards with the core's pure reward function. The
agent loop, the trainer and the data preparation call these functions and never reach into
``rollout/``, ``envs/`` or ``types.py`` themselves, so a change of the core's API is a change here.

A verl session is one chain: ``run_chain`` runs the K tasks in order with one growing library
(``ChainRunner.run``), and ``chain_outputs`` turns the chain into K ``PositionOutput``s with the
exact sampled tokens, the observation tokens masked out, and each position's own reward.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sage_rl.build import build_runner, open_suite
from sage_rl.envs.base import Suite
from sage_rl.eval.runner import scenarios_of
from sage_rl.integrations.verl.config import VerlRunConfig
from sage_rl.policies.base import Policy
from sage_rl.rollout.batch import RolloutConfig, chain_rewards
from sage_rl.rollout.chain import ChainRunner
from sage_rl.rollout.rewards import nothing_sampled
from sage_rl.settings import PocketWorldConfig, RunConfig
from sage_rl.skills.library import Library
from sage_rl.text import to_jsonable
from sage_rl.types import Chain, SamplingParams, Task, Trajectory


@dataclass(frozen=True)
class PositionOutput:
    """Task k of one chain, as one verl output: tokens after the prompt, mask 1 on sampled ids only.

    ``ok`` is False when the chain could not run at all (a broken environment, not the policy):
    its outputs then carry one masked token and no reward, and the trainer leaves them out of
    their groups (``advantages.py``).
    """

    position: int
    task_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    reward: float
    ok: bool = True
    score: float = 0.0
    success: bool = False
    produced_code: bool = False
    used_from: tuple[int, ...] = ()  # earlier positions whose skills this task used
    turns: int = 0
    stop: str = ""
    error: str = ""
    policy_s: float = 0.0
    env_s: float = 0.0


@dataclass(frozen=True)
class World:
    """What one worker process keeps for all its sessions: the suite and a runner template."""

    suite: Suite
    runner: ChainRunner


_WORLDS: dict[str, World] = {}
#: The suites (and sandboxes) of this process's worlds, open for the life of the worker process.
_OPEN = contextlib.AsyncExitStack()


def _run_config(cfg: VerlRunConfig, sandbox: bool | None = None) -> RunConfig:
    pocket = cfg.pocketworld if sandbox is None else PocketWorldConfig(sandbox=sandbox)
    return RunConfig(
        env=cfg.env,
        pocketworld=pocket,
        appworld=cfg.appworld,
        agent=cfg.agent,
        skills=cfg.skills,
        sandbox=cfg.sandbox,
        worked_example=cfg.worked_example,
        seed=cfg.seed,
    )


async def world_for(cfg: VerlRunConfig) -> World:
    """This process's ``World`` for ``cfg`` (built on first use: it may start a sandbox).

    Cached per process: an agent-loop worker lives for the whole run. Its suite stays open until
    ``close_worlds`` (tests) or the process ends (the sandbox template and AppWorld's workers
    exit when their parent's end of the connection closes).
    """
    key = json.dumps(cfg.sage_section(), sort_keys=True)
    if key not in _WORLDS:
        run = _run_config(cfg)
        suite = await _OPEN.enter_async_context(open_suite(run))
        _WORLDS[key] = World(suite, build_runner(run, policy=None, suite=suite))  # type: ignore[arg-type]
    return _WORLDS[key]


async def close_worlds() -> None:
    """Close every suite this process opened (and forget the worlds)."""
    _WORLDS.clear()
    await _OPEN.aclose()


def sampling_params(verl_params: Mapping[str, object], max_tokens: int) -> SamplingParams:
    """sage-rl's sampling params from the dict verl hands an agent loop (validation: greedy).

    No seed: vLLM draws fresh randomness per request. A fixed seed per chain index would make
    every step resample the same tokens for the same prompt.
    """
    top_k = int(verl_params.get("top_k", -1) or -1)  # type: ignore[call-overload]
    return SamplingParams(
        temperature=float(verl_params.get("temperature", 1.0)),  # type: ignore[arg-type]
        top_p=float(verl_params.get("top_p", 1.0)),  # type: ignore[arg-type]
        top_k=max(top_k, 0),
        max_tokens=max_tokens,
        seed=None,
    )


async def run_chain(
    world: World,
    policy: Policy,
    tasks: Sequence[Task],
    params: SamplingParams,
    chain_index: int,
    step: int,
) -> Chain:
    """Tasks in order, one library grown from empty (SAGE.md section 3), sampled by ``policy``."""
    runner = dataclasses.replace(world.runner, policy=policy, params=params)
    return await runner.run(tasks, Library(), group_index=0, chain_index=chain_index, step=step)


def chain_outputs(chain: Chain, rollout: RolloutConfig, pad_id: int) -> list[PositionOutput]:
    """The chain's K outputs, each with its own reward from the core's reward function."""
    rs = chain_rewards(chain, rollout)
    used = chain.used_from or tuple(() for _ in chain.trajectories)
    return [
        _position(k, traj, r, tuple(u), pad_id)
        for k, (traj, r, u) in enumerate(zip(chain.trajectories, rs, used, strict=True))
    ]


def _position(k: int, traj: Trajectory, reward: float, used: tuple[int, ...], pad_id: int) -> PositionOutput:
    ids, mask, lps = traj.token_arrays()
    n = len(traj.prompt_ids)
    resp, resp_mask, resp_lps = ids[n:], mask[n:], lps[n:]
    if not resp:  # no turn at all: verl puts the reward on the last response token, so keep one (masked)
        resp, resp_mask, resp_lps = [pad_id], [0], [0.0]
    return PositionOutput(
        position=k,
        task_id=traj.task.task_id,
        prompt_ids=tuple(ids[:n]),
        response_ids=tuple(resp),
        response_mask=tuple(resp_mask),
        response_logprobs=tuple(resp_lps),
        reward=float(reward),
        ok=not nothing_sampled(traj),  # nothing sampled: left out of its group, like to_samples
        error=traj.error,
        score=traj.outcome.score,
        success=traj.outcome.success,
        produced_code=traj.produced_code,
        used_from=used,
        turns=len(traj.turns),
        stop=traj.stop.value,
        policy_s=sum(t.policy_s for t in traj.turns),
        env_s=sum(t.env_s for t in traj.turns),
    )


def failed_outputs(task_ids: Sequence[str], error: str, pad_id: int) -> list[PositionOutput]:
    """One placeholder output per position of a chain that could not run (``ok=False``: no
    reward, nothing to train on)."""
    return [
        PositionOutput(k, t, (pad_id,), (pad_id,), (0,), (0.0,), 0.0, ok=False, error=error)
        for k, t in enumerate(task_ids)
    ]


def tasks_to_json(tasks: Sequence[Task]) -> str:
    return json.dumps([to_jsonable(t) for t in tasks], sort_keys=True)


def tasks_from_json(text: str) -> tuple[Task, ...]:
    """The task sequence of one dataset row; a clear ``ValueError`` when it is not one."""
    try:
        items = json.loads(text)
        tasks = tuple(Task.from_dict(d) for d in items)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"sage_tasks is not a JSON list of sage-rl tasks: {e}") from None
    if not tasks:
        raise ValueError("sage_tasks holds no task")
    return tasks


def train_sequences(cfg: VerlRunConfig, n: int, seed: int) -> list[tuple[Task, ...]]:
    """``n`` task sequences of K tasks of one scenario, from ``rollout.split`` (seeded)."""
    rng = random.Random(f"sage-rl-verl:{seed}")
    k, split = cfg.rollout.chain_length, cfg.rollout.split
    return _listing(cfg, lambda suite: [tuple(suite.sample_chain(rng, k, split)) for _ in range(n)])


def eval_sequences(cfg: VerlRunConfig, split: str, limit: int | None) -> list[tuple[Task, ...]]:
    """The first K tasks of each scenario of ``split``, in scenario order (first ``limit``)."""
    k = cfg.rollout.chain_length
    return _listing(cfg, lambda suite: [tuple(s[:k]) for s in scenarios_of(suite.split(split, limit))])


def _listing(cfg: VerlRunConfig, read):
    """``read(suite)`` on a suite opened without a sandbox (listing tasks runs no agent code)."""

    async def run():
        async with open_suite(_run_config(cfg, sandbox=False)) as suite:
            return read(suite)

    return asyncio.run(run())
