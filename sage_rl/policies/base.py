"""The Policy protocol: tokens (or messages) in, tokens, logprobs and text out.

Rollout code talks only to this protocol and never imports a backend (STYLE.md, principle 9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sage_rl.types import Task


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_tokens: int = 1500  # per turn (SAGE.md section 1)
    seed: int | None = None


@dataclass(frozen=True)
class PolicyRequest:
    """One turn's request.

    Token-exact policies (transformers, vLLM completions) read ``prompt_ids``, the whole episode so
    far. Text policies (chat APIs) read ``messages``. ``task`` and ``library`` are for scripted
    policies only; a model policy must ignore them.
    """

    messages: tuple[Mapping[str, str], ...]
    prompt_ids: tuple[int, ...] | None
    params: SamplingParams = field(default_factory=SamplingParams)
    task: Task | None = None
    library: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...] = ()  # exactly the sampled ids (empty for text-only backends)
    logprobs: tuple[float, ...] = ()  # one per sampled id, under the sampling distribution
    finish_reason: str = "stop"  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class Policy(Protocol):
    name: str
    #: A Hugging Face tokenizer when the policy is token-exact, else None. The agent loop renders
    #: prompts with it and appends observations as new chat messages (never re-tokenising).
    tokenizer: Any | None

    async def generate(self, request: PolicyRequest) -> Completion: ...
