"""SAGE's sequential rollout as a verl agent loop: one session = one chain of K tasks -> K outputs.

verl's V1 worker runs the ``rollout.n`` = G sessions of one dataset row concurrently, each with a
fresh instance of this class, and stores each returned output under ``{uid}_{session}_{k}``.
Every session of a row reads the same task sequence from the row (``sage_tasks``), so the G chains
of a group run the same sequence, each with its own library (SAGE.md section 3).

Each output carries its own reward and position in ``extra_fields`` (``sage_*``; the keys are
listed in ``advantages.EXTRA_KEYS``). verl copies the last output's ``reward_score`` and
``reward_extra_info`` onto the earlier outputs of a session, so ``reward_extra_info`` holds only
chain-level values, and the trainer reads each output's own reward from ``sage_reward``.

Failures come back as data: one exception would make verl drop the whole group (all G chains).
A chain that cannot run returns K placeholder outputs with ``sage_ok=False`` and the error text.

Registered by config: ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` points at
``agent_loops.yaml`` (``config.derived_verl_keys``), which each worker process loads.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from sage_rl.agent.render import ChatRenderer
from sage_rl.integrations.verl import bridge
from sage_rl.integrations.verl.bridge import PositionOutput
from sage_rl.integrations.verl.config import AGENT_LOOP_NAME, VerlRunConfig
from sage_rl.integrations.verl.policy import VerlServerPolicy

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def _parse(sage_json: str) -> VerlRunConfig:
    return VerlRunConfig.model_validate(json.loads(sage_json))


def run_config(config: Any) -> VerlRunConfig:
    """The run's sage-rl config, carried inside verl's config as ``sage:`` (``compose.py``)."""
    section = config.get("sage") if hasattr(config, "get") else None
    if section is None:
        raise KeyError(
            "verl's config has no `sage` section: launch with python -m sage_rl.integrations.verl.main"
        )
    return _parse(json.dumps(OmegaConf.to_container(section, resolve=True), sort_keys=True))


_RENDERERS: dict[int, ChatRenderer] = {}


def _renderer(tokenizer: Any) -> ChatRenderer:
    """One ChatRenderer per tokenizer per process (the sessions of a worker share it)."""
    if id(tokenizer) not in _RENDERERS:
        _RENDERERS[id(tokenizer)] = ChatRenderer(tokenizer)
    return _RENDERERS[id(tokenizer)]


@register(AGENT_LOOP_NAME)
class SageChainAgentLoop(AgentLoopBase):
    """``run`` returns K ``AgentLoopOutput``s, one per task of the row's sequence, in order."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        cfg = run_config(self.config)
        uid, session = str(kwargs.get("uid", "")), int(kwargs.get("session_id", 0))
        step = int(kwargs.get("global_steps", 0) or 0)
        policy = VerlServerPolicy(
            self.server_manager,
            self.tokenizer,
            request_id=f"{uid}-{session}",
            name=f"verl:{self.config.actor_rollout_ref.model.path}",
            extra={"repetition_penalty": sampling_params.get("repetition_penalty", 1.0)},
            renderer=_renderer(self.tokenizer),
        )
        outputs = await self._chain(cfg, policy, sampling_params, kwargs.get("sage_tasks"), session, step)
        return [self._output(o, policy, uid, session, step) for o in outputs]

    async def _chain(
        self, cfg: VerlRunConfig, policy: VerlServerPolicy, sampling: dict, row: Any, session: int, step: int
    ) -> list[PositionOutput]:
        pad, k = self._pad_id(), cfg.rollout.chain_length
        try:
            tasks = bridge.tasks_from_json(str(row))
        except ValueError as e:
            return bridge.failed_outputs(["<missing>"] * k, f"bad dataset row: {e}", pad)
        if len(tasks) != k:
            error = f"the row holds {len(tasks)} tasks but rollout.chain_length={k} (rerun prepare-data)"
            return bridge.failed_outputs(["<missing>"] * k, error, pad)
        params = bridge.sampling_params(sampling, cfg.agent.max_tokens_per_turn)
        try:
            chain = await bridge.run_chain(await bridge.world_for(cfg), policy, tasks, params, session, step)
            return bridge.chain_outputs(chain, cfg.rollout, pad)
        except Exception as e:  # the environment, not the policy: data, so the group survives
            logger.exception("sage-rl chain failed (session %s)", session)
            return bridge.failed_outputs([t.task_id for t in tasks], f"{type(e).__name__}: {e}", pad)

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    @staticmethod
    def _output(
        o: PositionOutput, policy: VerlServerPolicy, uid: str, session: int, step: int
    ) -> AgentLoopOutput:
        extra = {
            "sage_uid": uid,
            "sage_session": session,
            "sage_position": o.position,
            "sage_task_id": o.task_id,
            "sage_reward": o.reward,
            "sage_ok": o.ok,
            "sage_success": o.success,
            "sage_used_skill": bool(o.used_from),
            "sage_used_from": list(o.used_from),
            "sage_score": o.score,
            "sage_produced_code": o.produced_code,
            "sage_stop": o.stop,
            "sage_error": o.error,
            # verl's metrics cast these to int: a chain that never sampled reports this step
            "min_global_steps": step if policy.min_step is None else policy.min_step,
            "max_global_steps": step if policy.max_step is None else policy.max_step,
            "reward_extra_info": {},
        }
        return AgentLoopOutput(
            prompt_ids=list(o.prompt_ids),
            response_ids=list(o.response_ids),
            response_mask=list(o.response_mask),
            response_logprobs=list(o.response_logprobs),
            reward_score=o.reward,
            num_turns=2 * o.turns + 1,
            metrics=AgentLoopMetrics(generate_sequences=o.policy_s, tool_calls=o.env_s),
            extra_fields=extra,
        )
