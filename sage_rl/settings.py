"""The typed config of each rollout-driving command, part of the composition root (``build.py``).

A command's config is ``RunConfig`` (what every command that runs chains shares: environment,
policy, sampling, agent limits, skills, sandbox) plus the section of the layer that does the work,
whose keys sit at the top level of the YAML file:

    sage-rl eval     EvalRunConfig  = RunConfig + eval.runner.EvalConfig   + out_dir
    sage-rl train    TrainConfig    = RunConfig + train.loop.LoopConfig    + trainer, model, logging
    sage-rl collect  CollectConfig  = RunConfig + collect.CollectSettings  (scripted expert by default)

Only this layer may combine them: the AppWorld section comes from ``integrations/``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from sage_rl.collect import CollectSettings
from sage_rl.config import Section
from sage_rl.eval.runner import EvalConfig
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.policies.base import SamplingParams
from sage_rl.rollout.chain import SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.train.config import LoopConfig, TrainerConfig
from sage_rl.train.sft_config import SFTDataOptions, SFTLora, SFTOptim


class PolicyConfig(Section):
    """Which model acts. ``transformers`` with ``model: null`` is the embedded SmolLM2."""

    kind: Literal["transformers", "openai", "scripted"] = "transformers"
    model: str | None = None  # transformers: a path (HF folder or .gguf); openai: the model name
    base_url: str = "http://127.0.0.1:8000/v1"  # openai
    api_key_env: str = "OPENAI_API_KEY"  # openai: the variable holding the key (never the key itself)
    max_concurrency: int = Field(16, ge=1, description="openai: requests in flight")
    timeout_s: float = Field(120.0, gt=0, description="openai: seconds per request")
    max_batch: int = Field(8, ge=1, description="transformers: sequences sampled together")
    device: str = "auto"  # transformers: "cpu", "cuda" or "auto"
    #: transformers: the sampling engine's compute dtype. null = the model's own on a CPU (float32
    #: for SmolLM2: logprobs match the trainer's), bf16 on a CUDA GPU; "float32" = float32 anywhere;
    #: "bfloat16"; "auto" = bf16 where the CPU or GPU has
    #: fast bf16 (the trainer recomputes old logprobs in its own precision: docs/policies.md).
    dtype: Literal["auto", "bfloat16", "float32"] | None = None
    cache_gib: float = Field(2.0, gt=0, description="transformers: KV caches kept between turns")
    threads: int | None = Field(
        None,
        gt=0,
        description="transformers on CPU: torch threads for sampling and training in this process "
        "(null = torch's default, one per core, and sampling drops to the cores other processes "
        "leave free, measured each step: docs/policies.md); 1 where processes share the cores",
    )
    #: transformers on CPU: the engine's few-row products through column blocks of the weights
    #: (engine/packed.py; a second copy of them) and its decode pool (engine/pool.py; the decode
    #: batch's caches in one tensor). null = where they pay (docs/policies.md); false = off.
    column_blocks: bool | None = None
    decode_pool: bool | None = None
    expert_seed: int = 0  # scripted: seed of its variation in names and doc lookups


class SamplingConfig(Section):
    temperature: float = Field(0.7, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = off")
    seed: int | None = 0

    def params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, max_tokens, self.seed)


class PocketWorldConfig(Section):
    sandbox: bool = True  # run agent code in the sandbox worker (in-process only for debugging)
    #: A scope of train templates (null = all 30): ``train`` and ``train_heldout`` list and sample
    #: only these (``recipe.templates`` sets it for every stage of the recipe).
    templates: list[str] | None = None

    @model_validator(mode="after")
    def _known_templates(self) -> PocketWorldConfig:
        if self.templates is not None:
            from sage_rl.envs.pocketworld.env import check_scope

            check_scope(self.templates)
        return self


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

    @model_validator(mode="after")
    def _policy_can_act(self) -> RunConfig:
        if self.env == "appworld":
            from sage_rl.integrations.appworld.config import SetupError, check_policy

            try:
                check_policy(self.policy.kind)
            except SetupError as e:  # a config error: named at load, before anything starts
                raise ValueError(str(e)) from None
        return self

    @model_validator(mode="after")
    def _scope_is_pocketworlds(self) -> RunConfig:
        if self.env != "pocketworld" and self.pocketworld.templates is not None:
            raise ValueError(f"pocketworld.templates scopes PocketWorld's train templates; env is {self.env}")
        return self

    @model_validator(mode="after")
    def _known_splits(self) -> RunConfig:
        """A split typo fails here, at load, before any model is loaded (issue 11)."""
        known = known_splits(self.env)
        for key, split in self.splits():
            if split not in known:
                raise ValueError(
                    f"{key}={split!r} is not a split of {self.env}; choose from {', '.join(known)}"
                )
        return self

    def splits(self) -> list[tuple[str, str]]:
        """(config key, split name) of every split this command reads."""
        return []


class EvalRunConfig(RunConfig, EvalConfig):
    """``sage-rl eval``."""

    out_dir: str = "runs/eval"

    def splits(self) -> list[tuple[str, str]]:
        return [("split", self.split)]


class RecipeCollect(Section):
    """The expert stage of the recipe (``sage-rl collect`` on the train split, scripted expert)."""

    num_scenarios: int = Field(150, ge=1)
    tasks_per_scenario: int = Field(3, ge=1)
    keep_first_n: int = Field(2, ge=0)
    expert_seed: int = 0
    concurrency: int = Field(4, ge=1)


class RecipeSFT(Section):
    """The SFT stage (``sage-rl sft`` on the collected examples; docs/sft.md for every key)."""

    data: SFTDataOptions = SFTDataOptions()
    optim: SFTOptim = SFTOptim()
    lora: SFTLora = SFTLora()
    eval_every: int = Field(0, ge=0, description="optimizer steps between held-out loss passes")
    keep: Literal["best", "last"] = "best"
    save_every_s: float | None = Field(
        600, ge=0, description="seconds between SFT resume points (null = none)"
    )


class RecipeEval(Section):
    """The scenario-ordered evaluations before and after every stage (greedy)."""

    splits: list[str] = Field(["train_heldout", "dev"], min_length=1)
    scenarios: int | None = Field(None, ge=1, description="the first N scenarios of each split; null = all")
    concurrency: int = Field(8, ge=1, description="scenarios in flight")
    #: The base model's generated tokens per task (null = ``agent.token_budget``): it does not
    #: follow the format and writes until any budget ends, so a smaller one only saves time.
    base_token_budget: int | None = Field(None, ge=1)


class RecipeSettings(Section):
    """The recipe that ``sage-rl recipe`` runs (issue 17, docs/recipe.md): make the SFT model
    (expert collection, SFT), then train SAGE from it, evaluating before and after each stage."""

    #: The curriculum (PocketWorld): the train templates that collection, SFT, SAGE's rollouts and
    #: the ``train_heldout`` evaluations draw (``pocketworld.templates`` of every stage); null = all.
    templates: list[str] | None = None
    collect: RecipeCollect = RecipeCollect()
    sft: RecipeSFT = RecipeSFT()
    eval: RecipeEval = RecipeEval()

    @model_validator(mode="after")
    def _known_templates(self) -> RecipeSettings:
        if self.templates is not None:
            from sage_rl.envs.pocketworld.env import check_scope

            check_scope(self.templates)
        return self


class TrainConfig(RunConfig, LoopConfig):
    """``sage-rl train``."""

    trainer: TrainerConfig = TrainerConfig()
    #: start from this checkpoint (e.g. the SFT model; it must exist); null = ``policy.model``
    init_from: str | None = None
    #: the stages of ``sage-rl recipe`` (collect -> SFT -> train); ``sage-rl train`` ignores it
    recipe: RecipeSettings | None = None
    tensorboard: bool = True
    wandb_project: str | None = None
    trackio_project: str | None = None

    def reported_splits(self) -> set[str]:
        """The splits whose results are reported (``train_heldout`` and the recipe's): choosing a
        model on one of them (``eval.keep: best``) would fit what it reports."""
        return {"train_heldout", *(self.recipe.eval.splits if self.recipe else [])}

    def splits(self) -> list[tuple[str, str]]:
        out = [("rollout.split", self.rollout.split), ("eval.split", self.eval.split)]
        return out + [("recipe.eval.splits", s) for s in (self.recipe.eval.splits if self.recipe else [])]

    @model_validator(mode="after")
    def _not_on_test_data(self) -> TrainConfig:
        if self.env == "appworld":
            self.appworld.check_training_split(self.rollout.split, "rollout.split")
            # The periodic evaluation picks the run's checkpoints: tuning on test data, too.
            self.appworld.check_training_split(
                self.eval.split, "eval.split", "choosing checkpoints by its evaluations"
            )
        _not_heldout("rollout.split", self.rollout.split)
        if self.eval.keep == "best" and self.eval.split in self.reported_splits():
            raise ValueError(
                f"eval.keep=best chooses the run's model by its evaluations on eval.split={self.eval.split!r}, "
                "a split whose results are reported: the choice would fit them. Choose on a split of its own "
                "(pocketworld: train_val)"
            )
        return self

    @model_validator(mode="after")
    def _pool_has_templates(self) -> TrainConfig:
        if self.rollout.pool == "screened" and self.env != "pocketworld":
            raise ValueError(
                f"rollout.pool=screened screens PocketWorld's train templates; {self.env} has none to "
                "screen (use rollout.pool=all)"
            )
        return self

    @model_validator(mode="after")
    def _groups_compare(self) -> TrainConfig:
        if self.rollout.group_size < 2:
            raise ValueError(
                f"rollout.group_size={self.rollout.group_size}: GRPO compares the chains of a group, so "
                "training needs at least 2"
            )
        if self.sampling.temperature == 0:
            raise ValueError(
                "sampling.temperature=0: RL trains the distribution the rollouts are sampled from, "
                "softmax(logits / temperature), and greedy decoding is not one; set it > 0 (e.g. 1.0)"
            )
        return self


class CollectConfig(RunConfig, CollectSettings):
    """``sage-rl collect``: every key is documented in docs/collect.md."""

    policy: PolicyConfig = PolicyConfig(kind="scripted")

    @model_validator(mode="after")
    def _fail_rate_is_scripted(self) -> CollectConfig:
        if self.scripted_fail_rate and self.policy.kind != "scripted":
            raise ValueError("scripted_fail_rate applies only to policy.kind=scripted")
        return self

    def splits(self) -> list[tuple[str, str]]:
        return [("split", self.split)]

    @model_validator(mode="after")
    def _not_on_test_data(self) -> CollectConfig:
        """Expert data for SFT from a test split contaminates it as training on it would."""
        if self.env == "appworld":
            self.appworld.check_training_split(self.split)
        _not_heldout("split", self.split)
        return self

    def identity(self) -> dict[str, Any]:
        """The settings that decide what a (scenario, temperature) job produces and keeps.

        A collection folder may be resumed with more temperatures or scenarios, or other
        concurrency and formats, but not with a different identity.
        """
        p = self.policy
        return {
            "env": self.env,
            "split": self.split,
            "seed": self.seed,
            "policy": {
                "kind": p.kind,
                "model": p.model,
                "base_url": p.base_url,
                "expert_seed": p.expert_seed,
            },
            "sampling": self.sampling.model_dump(mode="json", exclude={"temperature"}),
            "agent": self.agent.model_dump(mode="json"),
            "skills": self.skills.model_dump(mode="json"),
            "tasks_per_scenario": self.tasks_per_scenario,
            "keep_first_n": self.keep_first_n,
            "keep_failed_tasks": self.keep_failed_tasks,
            "scripted_fail_rate": self.scripted_fail_rate,
        }


#: Evaluation-only splits: what they measure is void once they are trained or collected on.
HELDOUT_SPLITS = ("train_heldout", "train_val")


def _not_heldout(key: str, split: str) -> None:
    if split in HELDOUT_SPLITS:
        raise ValueError(
            f"{key}={split!r} is held out for evaluation (scenario seeds training never draws); "
            "train and collect on 'train'"
        )


def known_splits(env: str) -> tuple[str, ...]:
    """The split names environment ``env`` has (whether or not its data is installed)."""
    if env == "appworld":
        from sage_rl.integrations.appworld.paths import SPLITS

        return SPLITS
    from sage_rl.envs.pocketworld.tasks import split_names

    return split_names()


__all__ = [
    "CollectConfig",
    "EvalRunConfig",
    "PocketWorldConfig",
    "PolicyConfig",
    "RecipeSettings",
    "RunConfig",
    "SamplingConfig",
    "TrainConfig",
    "known_splits",
]
