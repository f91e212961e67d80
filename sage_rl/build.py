"""Config sections shared by the entry points, and the one place they are turned into objects.

``sage-rl eval``, ``train`` and ``collect`` each have one typed config (``RunConfig`` and its
subclasses); this module builds the policy, the task suite and the chain runner from it
(STYLE.md, principle 7). Heavy imports (torch, transformers) happen only when a model policy is
actually built.
"""

from __future__ import annotations

from typing import Literal

from sage_rl.agent.prompts import DEFAULT_TEMPLATES, PromptBuilder, WorkedExample
from sage_rl.config import Section
from sage_rl.envs.base import Suite
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.policies.base import Policy, SamplingParams
from sage_rl.rollout.chain import ChainRunner, SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.skills.retrieval import make_retriever


class PolicyConfig(Section):
    """Which model acts. ``transformers`` with ``model: null`` is the embedded SmolLM2."""

    kind: Literal["transformers", "openai", "scripted"] = "transformers"
    model: str | None = None  # transformers: a path (HF folder or .gguf); openai: the model name
    base_url: str = "http://127.0.0.1:8000/v1"  # openai
    api_key_env: str = "OPENAI_API_KEY"  # openai: the variable holding the key (never the key itself)
    max_concurrency: int = 16  # openai: requests in flight
    timeout_s: float = 120.0  # openai
    max_batch: int = 8  # transformers: sequences sampled together
    device: str = "auto"  # transformers: "cpu", "cuda" or "auto"
    expert_seed: int = 0  # scripted: seed of its variation in names and doc lookups


class SamplingConfig(Section):
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0

    def params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, max_tokens, self.seed)


class PocketWorldConfig(Section):
    sandbox: bool = True  # run agent code in the sandbox worker (in-process only for debugging)


class RunConfig(Section):
    """What every rollout-driving command shares."""

    env: Literal["pocketworld", "appworld"] = "pocketworld"
    pocketworld: PocketWorldConfig = PocketWorldConfig()
    appworld: AppWorldEnvConfig = AppWorldEnvConfig()
    policy: PolicyConfig = PolicyConfig()
    sampling: SamplingConfig = SamplingConfig()
    agent: AgentConfig = AgentConfig(max_steps=10, max_tokens_per_turn=384, context_limit=8192)
    skills: SkillsConfig = SkillsConfig()
    sandbox: SandboxLimits = SandboxLimits()  # limits for agent code (docs/sandbox.md)
    worked_example: bool = True  # show a solved train task in the prompt
    seed: int = 0


def build_suite(cfg: RunConfig) -> Suite:
    if cfg.env == "appworld":
        from sage_rl.integrations.appworld.env import AppWorldSuite

        return AppWorldSuite(cfg.appworld)
    from sage_rl.envs.pocketworld.env import PocketWorldSuite

    if not cfg.pocketworld.sandbox:
        return PocketWorldSuite()
    from sage_rl.envs.pocketworld.sandboxed import executor_factory

    return PocketWorldSuite(executor_factory=executor_factory(cfg.sandbox))


def build_policy(cfg: RunConfig, model=None, tokenizer=None) -> Policy:
    """The policy for ``cfg.policy``. ``model``/``tokenizer`` reuse an already loaded (trained) model."""
    p = cfg.policy
    params = cfg.sampling.params(cfg.agent.max_tokens_per_turn)
    if p.kind == "scripted":
        from sage_rl.models import load_tokenizer
        from sage_rl.policies.scripted import ScriptedExpert

        tok = load_tokenizer(p.model)  # count the expert's tokens as the default model would
        return ScriptedExpert(
            seed=p.expert_seed, token_counter=lambda text: len(tok.encode(text, add_special_tokens=False))
        )
    if p.kind == "openai":
        import os

        from sage_rl.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(
            base_url=p.base_url,
            model=p.model or "default",
            api_key=os.environ.get(p.api_key_env),
            max_concurrency=p.max_concurrency,
            timeout_s=p.timeout_s,
            params=params,
        )
    from sage_rl.models import load_model
    from sage_rl.policies.transformers_policy import TransformersPolicy

    if model is None:
        model, tokenizer = load_model(p.model, device=p.device)
    return TransformersPolicy(model, tokenizer, params=params, max_batch=p.max_batch)


def worked_example(suite: Suite) -> WorkedExample | None:
    """A solved train task for the prompt (never from an evaluation split)."""
    example = getattr(suite, "worked_example", None)
    if not callable(example):
        return None
    instruction, steps = example()
    return WorkedExample(instruction, tuple(steps))


def build_runner(cfg: RunConfig, policy: Policy, suite: Suite, step: int = 0) -> ChainRunner:
    example = worked_example(suite) if cfg.worked_example else None
    template_dir = getattr(suite, "prompt_dir", DEFAULT_TEMPLATES)  # AppWorld brings its own templates
    prompts = PromptBuilder(
        use_skills=cfg.skills.use_skills,
        max_steps=cfg.agent.max_steps,
        example=example,
        template_dir=template_dir,
    )
    return ChainRunner(
        policy=policy,
        suite=suite,
        prompts=prompts,
        agent=cfg.agent,
        skills=cfg.skills,
        params=cfg.sampling.params(cfg.agent.max_tokens_per_turn),
        retriever=make_retriever(cfg.skills.retrieval),
        step=step,
    )
