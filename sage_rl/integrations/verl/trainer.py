"""verl's synchronous V1 trainer with SAGE's advantage step, and the task runner that selects it.

``SageTrainer`` is verl's ``PPOTrainerSync`` with two changes:

- ``_compute_advantage`` computes SAGE's advantages: one group per (dataset row, position), each
  output with its own reward (``advantages.batch_advantages``); a batch in which every chain
  failed stops here with the errors. It then runs verl's own step (which applies the optional
  sampler-vs-trainer rollout correction) and replaces verl's GRPO advantages, computed from each
  session's last output and broadcast to its other outputs, with SAGE's: it writes back
  ``advantages``, ``returns`` and the true per-output ``rm_scores``.
- ``_update_actor`` refuses a batch that verl would train in more than one optimizer step.

verl builds its trainer inside a Ray actor from ``trainer.v1.trainer_mode``, through a registry
that lives per process. ``SageTaskRunner`` is verl's task runner defined in this module, so the
actor imports this module, which registers ``SageTrainer`` as ``sage``. verl takes its async
replay-buffer branches for every mode name other than ``sync``, so ``SageTrainer`` sets the mode
back to ``sync`` before verl's constructor reads it.
"""

from __future__ import annotations

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls, register_trainer

from sage_rl.config import ConfigError
from sage_rl.integrations.verl.advantages import BatchAdvantages, OutputRow, batch_advantages
from sage_rl.integrations.verl.agent_loop import run_config
from sage_rl.integrations.verl.config import TRAINER_MODE, VerlRunConfig


def check_invariants(config: DictConfig, sage: VerlRunConfig) -> None:
    """The verl keys that SAGE's math relies on (set by ``compose.py``; checked again here because
    a run may also be launched through verl's own entry point)."""
    actor, rollout, r = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, sage.rollout
    want = {
        "actor_rollout_ref.rollout.n": (rollout.n, r.group_size),
        "actor_rollout_ref.actor.ppo_mini_batch_size": (
            actor.ppo_mini_batch_size,
            r.chain_length * r.groups_per_step,
        ),
        "data.train_batch_size": (config.data.train_batch_size, r.groups_per_step),
        "actor_rollout_ref.actor.ppo_epochs": (actor.ppo_epochs, 1),
        "actor_rollout_ref.actor.use_kl_loss": (bool(actor.use_kl_loss), False),
        "actor_rollout_ref.actor.entropy_coeff": (float(actor.entropy_coeff), 0.0),
        "algorithm.use_kl_in_reward": (bool(config.algorithm.use_kl_in_reward), False),
        "algorithm.adv_estimator": (str(config.algorithm.adv_estimator), "grpo"),
    }
    wrong = {k: got for k, (got, expected) in want.items() if got != expected}
    if wrong:
        raise ConfigError(
            "verl config breaks SAGE's invariants (one optimizer step per batch, no KL, the paper's loss): "
            + ", ".join(f"{k}={got!r} (needs {want[k][1]!r})" for k, got in wrong.items())
        )


@register_trainer(TRAINER_MODE)
class SageTrainer(PPOTrainerSync):
    """verl's sync trainer with per-(row, position) advantages and the paper's loss scale."""

    def __init__(self, config: DictConfig):
        self.sage = run_config(config)
        check_invariants(config, self.sage)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def mini_batch_outputs(self) -> int:
        """Outputs per optimizer step, and verl's loss divisor: ``ppo_mini_batch_size * rollout.n``
        (``PPOTrainer._update_actor``)."""
        cfg = self.config.actor_rollout_ref
        return int(cfg.actor.ppo_mini_batch_size) * int(cfg.rollout.n)

    def _compute_advantage(self, batch, metrics: dict):
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        extras = [dict(e) for e in data["extra_fields"]]
        rows = [
            OutputRow.of(e, padding=bool(tag.get("is_padding", False)))
            for e, tag in zip(extras, batch.tags, strict=True)
        ]
        t = self.sage.trainer
        adv = batch_advantages(rows, self.sage.rollout, t.loss_scale, t.loss_agg, self.mini_batch_outputs())
        if (
            adv.num_chains == 0
        ):  # checked first: verl's own step fails obscurely on a batch with no token to train
            errors = sorted({str(e.get("sage_error", "")) for e in extras} - {""})
            raise RuntimeError(f"every chain of this batch failed; errors: {errors[:3]}")
        batch = super()._compute_advantage(batch, metrics)  # verl's rollout correction, if configured
        # read the mask after verl's step: its rejection sampling (rollout_rs) may have cut tokens out
        mask = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"]
        )
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=per_token_fields(adv, mask["response_mask"]),
        )
        metrics.update(adv.metrics)
        return batch

    def _update_actor(self, batch, metrics: dict):
        outputs, epochs = self.mini_batch_outputs(), int(self.config.actor_rollout_ref.actor.ppo_epochs)
        if len(batch) != outputs or epochs != 1:
            raise RuntimeError(
                f"the batch has {len(batch)} outputs and {epochs} epoch(s); one optimizer step per rollout "
                f"batch needs exactly one mini-batch of {outputs} outputs (each session must return K outputs)"
            )
        return super()._update_actor(batch, metrics)


def per_token_fields(adv: BatchAdvantages, response_mask: torch.Tensor) -> TensorDict:
    """Nested per-token ``advantages`` = ``returns`` (A_i on generated tokens) and ``rm_scores``
    (R_i on the last response token, as verl's agent loop writes it), one row per output."""
    masks = response_mask.unbind()
    advantages = [a * m.float() for a, m in zip(adv.values, masks, strict=True)]
    scores = []
    for r, m in zip(adv.rewards, masks, strict=True):
        s = torch.zeros(m.shape, dtype=torch.float32)
        s[-1] = r
        scores.append(s)

    def nested(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(xs, layout=torch.jagged)

    return TensorDict(
        {"advantages": nested(advantages), "returns": nested(advantages), "rm_scores": nested(scores)},
        batch_size=len(masks),
    )


class _SageTaskRunner(TaskRunnerV1.__ray_actor_class__):  # type: ignore[name-defined]
    """verl's V1 task runner; importing this module in the actor registers ``SageTrainer``."""

    def run(self, config: DictConfig) -> None:
        assert get_trainer_cls(TRAINER_MODE) is SageTrainer
        super().run(config)


SageTaskRunner = ray.remote(_SageTaskRunner)
