"""The config of a SAGE run on verl: sage-rl's own sections, and the verl keys they decide.

A run file (``configs/verl/*.yaml``) holds sage-rl's sections, validated here like every other
sage-rl config (unknown keys and bad values fail at start-up, naming the field), plus a ``verl:``
mapping of verl's own dotted keys for everything verl decides alone (vLLM tensor parallelism,
FSDP offload, memory utilisation). ``derived_verl_keys`` is the crosswalk: the verl keys that
SAGE fixes. ``verl:`` may not set them (``check_overrides``), so a run cannot silently train with
K optimizer steps per batch, a KL term, or the wrong loss scale. docs/verl.md lists every key.

Pure pydantic: nothing here imports verl.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from sage_rl.config import ConfigError, Section
from sage_rl.integrations.appworld.config import AppWorldEnvConfig
from sage_rl.rollout.batch import RolloutConfig
from sage_rl.rollout.chain import SkillsConfig
from sage_rl.rollout.episode import AgentConfig
from sage_rl.sandbox.limits import SandboxLimits
from sage_rl.settings import PocketWorldConfig
from sage_rl.train.config import LossAgg

#: The registered name of sage-rl's agent loop (agent_loops.yaml) and of its trainer.
AGENT_LOOP_NAME = "sage_chain"
TRAINER_MODE = "sage"
AGENT_LOOPS_YAML = Path(__file__).with_name("agent_loops.yaml")


class LossScale(enum.StrEnum):
    """How the policy loss of one batch is normalised (docs/verl.md, "Loss scale").

    ``paper``: sum over a chain's K outputs of each output's token mean, averaged over the B*G
    chains, as SAGE.md section 5 and the local trainer define it. ``verl``: verl's own
    ``seq-mean-token-mean``, the average over the B*K*G outputs, i.e. the paper's loss / K.
    """

    PAPER = "paper"
    VERL = "verl"


class VerlTrainerSection(Section):
    """The optimisation. Names match the local trainer's ``trainer:`` section where they agree."""

    lr: float = Field(1e-6, gt=0, description="constant learning rate (the paper's, at 32B)")
    grad_clip: float = Field(1.0, gt=0)
    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.2, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    loss_agg: LossAgg = LossAgg.SEQ_MEAN_TOKEN_MEAN
    loss_scale: LossScale = LossScale.PAPER
    #: Old logprobs of the PPO ratio. ``recompute``: the trainer recomputes them before its one
    #: step (verl's decoupled mode; ratio = 1 at the step). ``sampler``: vLLM's own logprobs
    #: (verl's bypass mode), so the ratio measures the sampler-vs-trainer mismatch and the clip acts on it.
    old_logprobs: Literal["recompute", "sampler"] = "recompute"
    #: Importance weights trainer/sampler on the loss (verl's rollout correction); null = off.
    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: float = Field(2.0, gt=0, description="truncation of the IS weights (TIS)")


class VerlSamplingSection(Section):
    """How vLLM samples during training (verl's ``actor_rollout_ref.rollout.*``)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = off")


class ClusterSection(Section):
    nnodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(1, ge=1)


class VerlDataSection(Section):
    """What ``prepare-data`` writes into ``data_dir`` (train.parquet, val.parquet)."""

    train_rows: int | None = Field(None, ge=1, description="null = steps * groups_per_step")
    val_split: str = "dev"
    val_rows: int | None = Field(None, ge=1, description="first N scenarios of val_split; null = all")


class VerlRunConfig(Section):
    """One SAGE run on verl. The sage-rl sections mean what they mean for ``sage-rl train``."""

    env: Literal["pocketworld", "appworld"] = "pocketworld"
    pocketworld: PocketWorldConfig = PocketWorldConfig()
    appworld: AppWorldEnvConfig = AppWorldEnvConfig()
    agent: AgentConfig = AgentConfig()  # the paper's limits: 40 steps, 1,500 tokens a turn, 28k context
    skills: SkillsConfig = SkillsConfig()
    sandbox: SandboxLimits = SandboxLimits()
    worked_example: bool = True
    rollout: RolloutConfig = RolloutConfig(groups_per_step=36)  # 36 x K=2 x G=8 = 576 task samples
    trainer: VerlTrainerSection = VerlTrainerSection()
    sampling: VerlSamplingSection = VerlSamplingSection()
    cluster: ClusterSection = ClusterSection()
    data: VerlDataSection = VerlDataSection()
    model: str | None = Field(None, description="HF model folder or hub id, readable on every node")
    data_dir: str = "data/verl/pocketworld"
    out_dir: str = "runs/verl"
    steps: int = Field(100, ge=1)
    save_every: int = Field(10, ge=1)
    project: str = "sage-rl"
    experiment: str = "sage"
    loggers: list[str] = ["console"]
    seed: int = 0
    verl: dict[str, Any] = Field(default_factory=dict, description="verl's own dotted keys")

    @field_validator("verl", mode="before")
    @classmethod
    def _flatten(cls, value: Any) -> Any:
        """``{a: {b: 1}}`` (YAML nesting, or a ``verl.a.b=1`` override) -> ``{"a.b": 1}``."""
        return flatten(value) if isinstance(value, dict) else value

    @field_validator("rollout")
    @classmethod
    def _local_pool_only(cls, value: RolloutConfig) -> RolloutConfig:
        if value.pool != "all":
            raise ValueError(
                "rollout.pool=screened is the local trainer's (sage-rl train); verl draws its own batches"
            )
        return value

    def sage_section(self) -> dict[str, Any]:
        """What travels inside verl's config as ``sage:`` to the agent-loop workers and the trainer."""
        return self.model_dump(mode="json", exclude={"verl"})


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys (leaves only; an empty mapping is a leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def derived_verl_keys(cfg: VerlRunConfig) -> dict[str, Any]:
    """The verl keys SAGE decides, from ``cfg`` (docs/verl.md has the crosswalk table).

    One optimizer step per batch: the batch holds B*G sessions x K outputs, and verl's mini-batch
    is ``ppo_mini_batch_size * rollout.n`` outputs, so ``ppo_mini_batch_size = K * B`` (with
    dynamic batch sizes, which lift verl's mini <= train batch check).
    """
    r, t, a = cfg.rollout, cfg.trainer, cfg.agent
    if cfg.model is None:
        raise ConfigError(
            "model: set the HF model folder (or hub id) to train, e.g. model=/models/Qwen2.5-7B"
        )
    if r.dynamic_sampling:
        raise ConfigError(
            "rollout.dynamic_sampling: the local trainer's (sage-rl train); on verl a step trains "
            "the batch it drew. Set rollout.dynamic_sampling=false"
        )
    data = Path(cfg.data_dir)
    ctx = a.context_limit
    return {
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": TRAINER_MODE,
        "trainer.nnodes": cfg.cluster.nnodes,
        "trainer.n_gpus_per_node": cfg.cluster.gpus_per_node,
        "trainer.total_training_steps": cfg.steps,
        "trainer.total_epochs": cfg.steps,  # the step count binds, never the epoch count
        "trainer.save_freq": cfg.save_every,
        "trainer.test_freq": -1,  # verl's validation scores every output with its chain's last reward
        "trainer.val_before_train": False,
        "trainer.critic_warmup": 0,
        "trainer.default_local_dir": str(Path(cfg.out_dir) / "checkpoints"),
        "trainer.project_name": cfg.project,
        "trainer.experiment_name": cfg.experiment,
        "trainer.logger": list(cfg.loggers),
        "data.train_files": str(data / "train.parquet"),
        "data.val_files": str(data / "val.parquet"),
        "data.train_batch_size": r.groups_per_step,
        "data.filter_overlong_prompts": False,  # the prompt column is a label; sage-rl renders prompts
        "data.max_prompt_length": ctx,
        "data.max_response_length": ctx,
        "data.seed": cfg.seed,
        "actor_rollout_ref.model.path": cfg.model,
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.n": r.group_size,
        "actor_rollout_ref.rollout.temperature": cfg.sampling.temperature,
        "actor_rollout_ref.rollout.top_p": cfg.sampling.top_p,
        "actor_rollout_ref.rollout.top_k": cfg.sampling.top_k or -1,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
        "actor_rollout_ref.rollout.prompt_length": ctx,
        "actor_rollout_ref.rollout.response_length": ctx,
        "actor_rollout_ref.rollout.max_model_len": ctx,
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP_NAME,
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(AGENT_LOOPS_YAML),
        "actor_rollout_ref.actor.ppo_mini_batch_size": r.chain_length * r.groups_per_step,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_epochs": 1,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"
        if t.loss_agg is LossAgg.SEQ_MEAN_TOKEN_MEAN
        else "token-mean",
        "actor_rollout_ref.actor.clip_ratio_low": t.eps_low,
        "actor_rollout_ref.actor.clip_ratio_high": t.eps_high,
        "actor_rollout_ref.actor.grad_clip": t.grad_clip,
        "actor_rollout_ref.actor.optim.clip_grad": t.grad_clip,
        "actor_rollout_ref.actor.optim.lr": t.lr,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
        "actor_rollout_ref.actor.optim.weight_decay": t.weight_decay,
        "algorithm.adv_estimator": "grpo",  # SageTrainer replaces its advantages (trainer.py)
        "algorithm.norm_adv_by_std_in_grpo": r.normalize_std,
        "algorithm.use_kl_in_reward": False,
        "algorithm.rollout_correction.bypass_mode": t.old_logprobs == "sampler",
        "algorithm.rollout_correction.rollout_is": t.rollout_is,
        "algorithm.rollout_correction.rollout_is_threshold": t.rollout_is_threshold,
        "critic.enable": False,
        "reward.reward_model.enable": False,  # rewards come from the agent loop, per output
    }


def check_overrides(cfg: VerlRunConfig) -> None:
    """``verl:`` may not set a key that SAGE derives: it names the sage-rl key to use instead."""
    fixed = set(derived_verl_keys(cfg))
    clash = sorted(k for k in cfg.verl if k.lstrip("+") in fixed)
    if clash:
        raise ConfigError(
            f"verl: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by sage-rl from its own "
            "sections (docs/verl.md, 'Crosswalk'); set the sage-rl key instead"
        )
