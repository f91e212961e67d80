"""A sage-rl ``Policy`` over verl's LLM server client: token ids in, sampled ids and logprobs out.

verl's rollout servers (vLLM) are token-in, token-out: ``server_manager.generate(request_id,
prompt_ids=..., sampling_params=...)`` returns the sampled ``token_ids`` and their ``log_probs``.
The prompt ids come from sage-rl's agent loop, which renders them with ``ChatRenderer`` and
appends each observation as a new chat message: nothing is decoded and re-encoded. The text of a
completion is decoded only so the agent loop can find the code in it.

One policy serves one verl session (one chain), with a sticky ``request_id`` so that the server's
prefix cache is reused from turn to turn. It records the weight versions (verl's global steps)
its turns were sampled with: verl's metrics need them on every output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sage_rl.agent.render import ChatRenderer
from sage_rl.types import Completion, PolicyRequest, SamplingParams


class VerlServerPolicy:
    """``Policy`` for one verl session. ``extra`` holds verl's other sampling keys (e.g.
    ``repetition_penalty``); ``stop_ids`` default to the chat template's end of turn and eos."""

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        request_id: str,
        name: str = "verl",
        extra: Mapping[str, Any] | None = None,
        stop_ids: Sequence[int] | None = None,
        renderer: ChatRenderer | None = None,
    ) -> None:
        self.server_manager, self.tokenizer, self.request_id, self.name = (
            server_manager,
            tokenizer,
            request_id,
            name,
        )
        self.renderer = renderer or ChatRenderer(tokenizer)
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else self.renderer.stop_ids
        self.extra = dict(extra or {})
        self.min_step: int | None = None
        self.max_step: int | None = None

    def request_params(self, params: SamplingParams) -> dict[str, Any]:
        """vLLM sampling params for one turn (vLLM's ``top_k=-1`` is off; logprobs always on)."""
        out = {
            **self.extra,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "max_tokens": params.max_tokens,
            "stop_token_ids": list(self.stop_ids),
            "logprobs": True,
        }
        if params.seed is not None:
            out["seed"] = params.seed
        return out

    def weights_changed(self) -> None:
        """Nothing to do: verl syncs its own weights into its rollout servers after each actor
        update (docs/verl.md); the server's ``global_steps`` say which weights answered."""

    async def generate(self, request: PolicyRequest) -> Completion:
        """One turn. Raises (the episode records POLICY_ERROR) when the server returns nothing or
        no logprob per token: training needs both."""
        if request.prompt_ids is None:
            raise ValueError("VerlServerPolicy is token-exact: the request needs prompt_ids")
        out = await self.server_manager.generate(
            self.request_id,
            prompt_ids=list(request.prompt_ids),
            sampling_params=self.request_params(request.params),
        )
        ids, lps = list(out.token_ids), out.log_probs
        if not ids:
            raise RuntimeError(f"the rollout server returned no tokens (stop_reason={out.stop_reason!r})")
        if lps is None or len(lps) != len(ids):
            raise RuntimeError(
                f"the rollout server returned {0 if lps is None else len(lps)} logprobs for {len(ids)} "
                "tokens; set actor_rollout_ref.rollout.calculate_log_probs=true"
            )
        self._note_steps(out.extra_fields or {})
        stopped = ids[-1] in self.stop_ids
        body = ids[:-1] if stopped else ids
        return Completion(
            text=self.tokenizer.decode(body, skip_special_tokens=False),
            token_ids=tuple(ids),
            logprobs=tuple(float(x) for x in lps),
            finish_reason="stop" if stopped else "length",
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(ids),
        )

    def _note_steps(self, extra: Mapping[str, Any]) -> None:
        lo, hi = extra.get("min_global_steps"), extra.get("max_global_steps")
        if lo is not None:
            self.min_step = int(lo) if self.min_step is None else min(self.min_step, int(lo))
        if hi is not None:
            self.max_step = int(hi) if self.max_step is None else max(self.max_step, int(hi))
