"""The composition root: where configs become objects, and where their lifetimes are owned.

Everything below this module receives built objects and holds no process-wide state
(ARCHITECTURE.md, principle 8). The run functions (``sage_rl/runs/``, one per command, which the
commands in ``sage_rl/cli``, the recipe and verl's entry point call) compose a run from these pieces:

    async with open_suite(cfg) as suite:              # the task suite, and its sandbox: closed on exit
        policy = build_policy(cfg)                    # or open_training(cfg, resume).policy
        runner = build_runner(cfg, policy, suite)     # built once; the step goes to runner.run
        result = await run_eval(runner, cfg)          # or train(...), collect(...)

The typed config of each command is defined here too (``settings.py``): they combine the sections
of the layers below, so only this layer may know all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sage_rl.agent.prompts import DEFAULT_TEMPLATES, PromptBuilder, WorkedExample
from sage_rl.envs.base import Suite
from sage_rl.policies.base import Policy
from sage_rl.rollout.chain import ChainRunner
from sage_rl.settings import CollectConfig, PolicyConfig, RunConfig, TrainConfig
from sage_rl.skills.retrieval import make_retriever
from sage_rl.train.logging import MetricsLogger
from sage_rl.types import SamplingParams

if TYPE_CHECKING:  # torch: imported where a trainer is built, not by a scripted run
    from sage_rl.train.trainer import Trainer

__all__ = [
    "BuildError",
    "Training",
    "build_collect_policy",
    "build_policy",
    "build_runner",
    "open_suite",
    "open_training",
    "sampling_params",
    "worked_example",
]


class BuildError(RuntimeError):
    """A run could not be composed (missing AppWorld data, an unknown split, no sandbox here...).
    The message is one line for the user."""


@contextlib.asynccontextmanager
async def open_suite(cfg: RunConfig, split: str | None = None) -> AsyncIterator[Suite]:
    """The suite ``cfg.env`` names, with its sandbox when agent code runs in one; both are closed
    when the block ends. ``split``, when given, is checked to exist first (``BuildError``)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            suite = _suite(cfg, stack)
        except Exception as e:
            raise BuildError(str(e) or type(e).__name__) from e
        stack.push_async_callback(suite.close)
        if split is not None:
            try:
                suite.split(split, 1)
            except Exception as e:  # a missing split or missing data is a one-line user error
                raise BuildError(str(e) or type(e).__name__) from e
        yield suite


def _suite(cfg: RunConfig, stack: contextlib.AsyncExitStack) -> Suite:
    if cfg.env == "appworld":
        from sage_rl.integrations.appworld.env import AppWorldSuite

        return AppWorldSuite(cfg.appworld)
    from sage_rl.envs.pocketworld.env import PocketWorldSuite

    scope = cfg.pocketworld.templates
    if not cfg.pocketworld.sandbox:
        return PocketWorldSuite(templates=scope)  # in-process: for debugging only
    from sage_rl.envs.pocketworld.sandboxed import SandboxExecutors
    from sage_rl.sandbox import Sandbox

    sandbox = stack.enter_context(Sandbox(cfg.sandbox))  # starts the template (once, ~1 s)
    assert sandbox.isolation is not None
    print(f"[sage-rl] {sandbox.isolation.line()}", file=sys.stderr)
    return PocketWorldSuite(SandboxExecutors(sandbox), templates=scope)


def build_policy(cfg: RunConfig, model=None, tokenizer=None) -> Policy:
    """The policy for ``cfg.policy``. ``model``/``tokenizer`` reuse an already loaded (trained) model.
    It samples with each request's params (``sampling_params``, through the runner)."""
    p = cfg.policy
    if p.kind == "scripted":
        from sage_rl.envs.pocketworld.expert import ScriptedExpert
        from sage_rl.models import token_counter

        return ScriptedExpert(
            seed=p.expert_seed,
            token_counter=token_counter(p.model),  # count the expert's tokens as the default model would
            inline=not cfg.skills.use_skills,  # no library in the prompt: solve inline, no def
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
        )
    from sage_rl.policies.transformers_policy import TransformersPolicy

    set_threads(p)
    if model is None:
        model, tokenizer = load_or_build_error(p.model, p.device, "policy.model")
    return TransformersPolicy(
        model,
        tokenizer,
        max_batch=p.max_batch,
        dtype=p.dtype,
        cache_bytes=int(p.cache_gib * 2**30),
        threads=p.threads or "auto",  # null: sampling gives up the cores other processes use
        column_blocks=p.column_blocks,
        decode_pool=p.decode_pool,
    )


def load_or_build_error(source: str | None, device: str, field: str) -> tuple[Any, Any]:
    """``load_model(source)``; a model that cannot be loaded is a ``BuildError`` naming ``field``."""
    from sage_rl.models import ModelLoadError, load_model

    try:
        return load_model(source, device=device)
    except ModelLoadError as e:
        raise BuildError(f"{field}: {e}") from None


def set_threads(p: PolicyConfig) -> None:
    """torch's CPU threads for this process, when ``policy.threads`` names them: two OpenMP
    threads per process on a shared 2-core machine wait on each other (docs/LOG.md, issue 16)."""
    if p.kind == "transformers" and p.threads:
        import torch

        torch.set_num_threads(p.threads)


def build_collect_policy(cfg: CollectConfig) -> Policy:
    """The expert of ``sage-rl collect``: the scripted one (with its give-up rate) or any policy."""
    if cfg.policy.kind == "scripted":
        from sage_rl.envs.pocketworld.expert import ScriptedExpert

        return ScriptedExpert(
            seed=cfg.policy.expert_seed, fail_rate=cfg.scripted_fail_rate, inline=not cfg.skills.use_skills
        )
    return build_policy(cfg)


def worked_example(suite: Suite) -> WorkedExample | None:
    """A solved train task for the prompt, when the suite has one (never from an evaluation split)."""
    example = suite.worked_example()
    if example is None:
        return None
    instruction, steps = example
    return WorkedExample(instruction, tuple(steps))


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The rollouts' sampling parameters (``sampling`` with the agent's per-turn token cap), made
    here only: the runner samples every turn with them, and a trainer trains the distribution they
    sample from, softmax(logits / their temperature) (``open_training``)."""
    return cfg.sampling.params(cfg.agent.max_tokens_per_turn)


def build_runner(cfg: RunConfig, policy: Policy, suite: Suite) -> ChainRunner:
    """The chain runner shared by every chain of a run (training, evaluation, collection)."""
    prompts = PromptBuilder(
        use_skills=cfg.skills.use_skills,
        max_steps=cfg.agent.max_steps,
        example=worked_example(suite) if cfg.worked_example else None,
        template_dir=suite.prompt_dir or DEFAULT_TEMPLATES,
    )
    return ChainRunner(
        policy=policy,
        suite=suite,
        prompts=prompts,
        agent=cfg.agent,
        skills=cfg.skills,
        params=sampling_params(cfg),
        retriever=make_retriever(cfg.skills.retrieval),
    )


@dataclasses.dataclass
class Training:
    """A training run's objects: the trainer (and the model it owns), the policy sampling from
    that very model, the metrics logger, and the steps already done (resume)."""

    trainer: Trainer
    policy: Policy
    logger: MetricsLogger
    start: int
    model_source: str | None

    def sync(self) -> None:
        """Tell the policy that the trainer changed the weights in place (the training loop calls
        it after every optimizer step; ``Policy.weights_changed``)."""
        self.policy.weights_changed()


def open_training(cfg: TrainConfig, resume: bool) -> Training:
    """Load the model (``init_from`` when set, else ``policy.model``), wrap it
    in a ``Trainer``, open the run folder (resuming from its last checkpoint when asked) and build
    the policy over the trained model. Raises ``FileExistsError`` for a used run folder without
    ``resume``. The caller closes ``logger``. The policy is built after the checkpoint (or
    ``init_from``) is loaded, so it starts from those weights; every later in-place change goes
    through ``Training.sync``."""
    from sage_rl.train.checkpoint import open_run
    from sage_rl.train.trainer import Trainer

    set_threads(cfg.policy)
    source = cfg.init_from or cfg.policy.model  # runs.train.check_start: a set init_from exists
    field = "init_from" if cfg.init_from else "policy.model"
    model, tokenizer = load_or_build_error(source, cfg.policy.device, field)
    trainer = Trainer(model, tokenizer, cfg.trainer, temperature=sampling_params(cfg).temperature)
    logger, start = open_run(
        trainer,
        Path(cfg.out_dir),
        resume,
        tensorboard=cfg.tensorboard,
        wandb_project=cfg.wandb_project,
        trackio_project=cfg.trackio_project,
    )
    policy = build_policy(cfg, model=trainer.model, tokenizer=tokenizer)
    return Training(trainer, policy, logger, start, source)
