"""The Policy protocol: tokens (or messages) in, tokens, logprobs and text out.

Rollout code talks only to this protocol and never imports a backend (STYLE.md, principle 9).
Weights that change announce themselves: whoever updates them calls ``weights_changed()``. Its
request and completion types live with the other core types (``sage_rl.types``) and are
re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sage_rl.types import Completion, PolicyRequest, SamplingParams

if TYPE_CHECKING:
    from sage_rl.agent.render import ChatRenderer

__all__ = ["Completion", "Policy", "PolicyRequest", "SamplingParams"]


@runtime_checkable
class Policy(Protocol):
    name: str
    #: The chat renderer of a token-exact policy (its tokenizer's chat template), else None. The
    #: agent loop renders the prompt with it and appends each observation as one new chat message
    #: (never re-tokenising), so the ids it sends are the ids the policy samples from.
    renderer: ChatRenderer | None

    async def generate(self, request: PolicyRequest) -> Completion: ...

    def weights_changed(self) -> None:
        """The weights this policy samples from changed in place (an optimizer step, a loaded
        state dict, adapters switched): later samples must come from the new ones. A policy
        caching anything computed from its weights (KV caches, converted copies) drops it here;
        a policy without local weights (a server, a script) does nothing. Policies never detect a
        change themselves: the caller that changed the weights calls this (docs/architecture.md)."""
        ...
