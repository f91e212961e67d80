"""Contract tests: the private verl 0.9.1 behaviour that sage-rl's adapter relies on (issue 13).

verl's V1 trainer is marked "move after V1 is stable" and its private names change between minor
versions. Each test pins one fact that ``sage_rl/integrations/verl`` depends on, with the reason,
so that a verl upgrade fails here, loudly, before it silently trains the wrong thing.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

import asyncio  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.v1 import PPOTrainerSync  # noqa: E402
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from sage_rl.integrations.verl import VERL_VERSION, require_verl  # noqa: E402
from sage_rl.integrations.verl.compose import compose_config  # noqa: E402
from sage_rl.integrations.verl.config import VerlRunConfig  # noqa: E402
from sage_rl.integrations.verl.testing import InMemoryTQ, use_tq  # noqa: E402

VERL = Path(verl.__file__).parent


def source(relative: str) -> str:
    return (VERL / relative).read_text()


def test_the_pinned_version_is_installed():
    require_verl()
    assert verl.__version__ == VERL_VERSION


def test_agent_loop_base_constructor_and_run():
    """hydra instantiates our loop with these keyword arguments (AgentLoopWorker._run_agent_loop)."""
    params = inspect.signature(AgentLoopBase.__init__).parameters
    for name in (
        "trainer_config",
        "server_manager",
        "tokenizer",
        "processor",
        "dataset_cls",
        "data_config",
        "hf_model_type",
    ):
        assert name in params
    assert inspect.iscoroutinefunction(AgentLoopBase.run) and "run" in AgentLoopBase.__abstractmethods__


def out(reward: float, n: int = 2, extra: dict | None = None) -> AgentLoopOutput:
    return AgentLoopOutput(
        prompt_ids=[5, 6],
        response_ids=list(range(7, 7 + n)),
        response_mask=[1] * n,
        response_logprobs=[-0.5] * n,
        reward_score=reward,
        metrics=AgentLoopMetrics(),
        extra_fields={"reward_extra_info": {}, "min_global_steps": 1, "max_global_steps": 1, **(extra or {})},
    )


def test_as_dict_puts_the_reward_on_the_last_response_token():
    """Why the agent loop never returns an empty response (bridge._position keeps one masked token)."""
    rm = out(0.7, n=3).as_dict()["rm_scores"]
    assert rm.tolist() == pytest.approx([0.0, 0.0, 0.7])
    with pytest.raises(IndexError):
        out(0.7, n=0).as_dict()


def plain_worker() -> AgentLoopWorkerTQ:
    worker = AgentLoopWorkerTQ.__ray_actor_class__.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    return worker


def test_worker_keys_and_reward_broadcast(monkeypatch):
    """Keys are ``{uid}_{session}_{i}``; the last output's reward and reward_extra_info overwrite the
    earlier outputs' (so each output's own reward must travel in ``sage_reward``)."""
    tq = use_tq(InMemoryTQ(), monkeypatch)
    outputs = [out(2.0, extra={"mine": 0}), out(-1.0, extra={"reward_extra_info": {"x": 9}, "mine": 1})]
    asyncio.run(
        plain_worker()._agent_loop_postprocess(outputs, False, uid="u1", session_id=4, global_steps=3)
    )
    rows = tq.rows["train"]
    assert set(rows) == {"u1_4_0", "u1_4_1"}
    assert float(rows["u1_4_0"]["rm_scores"][-1]) == -1.0  # broadcast: not its own 2.0
    assert rows["u1_4_0"]["extra_fields"]["reward_extra_info"] == {"x": 9}
    assert rows["u1_4_0"]["extra_fields"]["mine"] == 0  # other extra_fields are kept per output
    assert tq.tags["train"]["u1_4_0"]["min_global_steps"] == 1
    bare = [out(1.0), out(1.0)]
    del bare[1].extra_fields["reward_extra_info"]
    with pytest.raises(KeyError):
        asyncio.run(
            plain_worker()._agent_loop_postprocess(bare, False, uid="u2", session_id=0, global_steps=3)
        )


def test_verls_grpo_uses_each_sessions_last_output_and_broadcasts_it():
    """What SageTrainer._compute_advantage replaces: outputs at position 1 get position 2's advantage."""
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    keys = ["u_0_0", "u_0_1", "u_1_0", "u_1_1"]
    rewards = [5.0, 1.0, -5.0, 0.0]  # position 1 differs a lot, position 2 a little
    rm = torch.zeros(4, 2)
    rm[:, -1] = torch.tensor(rewards)
    data = DataProto(
        batch=TensorDict({"token_level_rewards": rm, "response_mask": torch.ones(4, 2)}, batch_size=[4]),
        non_tensor_batch={"uid": np.array(["u"] * 4, dtype=object)},
    )
    out_ = compute_advantage_for_multi_trajectories(
        data, keys, core_algos.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False
    )
    adv = out_.batch["advantages"][:, 0].tolist()
    assert adv == pytest.approx([0.5, 0.5, -0.5, -0.5])  # from (1.0, 0.0) only


def test_padding_rows_copy_a_real_rows_fields_and_are_tagged(monkeypatch):
    """Padding is recognised by its tag: its extra_fields are a real row's (advantages.py)."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    tq = use_tq(InMemoryTQ(), monkeypatch)
    fields = [
        {
            "prompts": torch.tensor([1, 2]),
            "responses": torch.tensor([3, 4, 5]),
            "response_mask": torch.tensor([1, 1, 0]),
            "rm_scores": torch.tensor([0.0, 0.0, 2.0]),
            "extra_fields": {"sage_position": k},
            "uid": "u",
        }
        for k in range(3)
    ]
    keys = ["u_0_0", "u_0_1", "u_0_2"]
    tq.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(fields), tags=[{"x": 1}] * 3)
    meta = upsample_batch_to_divisible_size(
        KVBatchMeta(keys=keys, tags=[{"x": 1}] * 3, partition_id="train"), 4, 0
    )
    assert len(meta) == 4 and meta.keys[3].startswith("pad") and meta.keys[3].endswith("_0_0")
    assert meta.tags[3]["is_padding"] is True
    pad = tq.rows["train"][meta.keys[3]]
    assert pad["extra_fields"] == {"sage_position": 0}
    assert pad["response_mask"].tolist() == [0] and pad["rm_scores"].tolist() == [0.0]


@pytest.fixture(scope="module")
def config():
    return compose_config(VerlRunConfig(model="unused"))


def test_only_the_mode_named_sync_gets_the_sync_replay_buffer(config):
    """The trap SageTrainer avoids by setting trainer_mode back to "sync" before verl's constructor."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config = config
    trainer.trainer_mode = "sync"
    assert type(trainer._build_replay_buffer()) is ReplayBuffer
    trainer.trainer_mode = "sage"
    assert isinstance(trainer._build_replay_buffer(), ReplayBufferAsync)


def test_the_task_runner_picks_the_trainer_by_mode_from_a_per_process_registry():
    from verl.trainer.main_ppo import TaskRunnerV1

    assert "get_trainer_cls(config.trainer.v1.trainer_mode)" in inspect.getsource(
        TaskRunnerV1.__ray_actor_class__.run
    )
    assert "def run_ppo(config, task_runner_class)" in source("trainer/main_ppo.py")


class _Group:
    def update_actor(self, batch):
        self.info = dict(batch.extra_info)
        return {"metrics": {"mfu": [0.0]}}


def test_update_actor_mini_batch_and_loss_divisor_are_ppo_mini_batch_size_times_n(config):
    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config = config.copy()
    trainer.config.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    trainer.config.actor_rollout_ref.rollout.n = 3
    trainer.actor_rollout_wg = _Group()
    trainer._update_actor(KVBatchMeta(keys=["a_0_0"], tags=[{}], partition_id="train"), {})
    info = trainer.actor_rollout_wg.info
    assert (
        info["mini_batch_size"] == info["global_batch_size"] == 12
        and info["epochs"] == config.actor_rollout_ref.actor.ppo_epochs
    )


def test_seq_mean_token_mean_divides_by_the_global_batch_size():
    loss_BT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got = core_algos.agg_loss(loss_BT, mask_BT, "seq-mean-token-mean", dp_size=1, global_batch_size=4)
    assert float(got) == pytest.approx((1.5 + 4.0) / 4)


def test_the_policy_loss_is_linear_in_a_positive_scale_of_the_advantages(config):
    """Why scaling the advantages by D/N gives the paper's loss exactly (advantages.py), dual clip included."""
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor.global_batch_info.update(
        dp_size=1, global_batch_size=5, batch_num_tokens=None, loss_scale_factor=None
    )
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 6, generator=g) * 0.1
    old = logp + torch.tensor([[-1.5, 0.3, 0.0, -0.2, 1.4, 0.1]])  # ratios from ~0.25 to ~4.5: both clips act
    adv = torch.tensor([[1.0], [-2.0], [0.5], [-0.7]]).expand(4, 6)
    mask = torch.ones(4, 6)

    def loss(a):
        return core_algos.compute_policy_loss_vanilla(old, logp, a, mask, "seq-mean-token-mean", actor)

    base, metrics = loss(adv)
    assert metrics["actor/pg_clipfrac"] > 0 and metrics["actor/pg_clipfrac_lower"] > 0
    assert float(loss(adv * 2.4)[0]) == pytest.approx(2.4 * float(base), rel=1e-6)


def test_vllm_server_honours_max_tokens_stop_ids_and_processed_logprobs():
    """Read, not imported: vllm is not installed on CPU machines."""
    server = source("workers/rollout/vllm_rollout/vllm_async_server.py")
    assert 'max_tokens = sampling_params.pop("max_tokens")' in server
    assert "SamplingParams(max_tokens=max_tokens, **sampling_params)" in server  # stop_token_ids pass through
    rollout = OmegaConf.load(VERL / "trainer/config/rollout/rollout.yaml")
    assert (
        rollout.logprobs_mode == "processed_logprobs"
    )  # logprobs after temperature, like sage-rl's policies


def test_the_server_client_reports_weight_versions_and_metrics_need_them():
    client = source("workers/rollout/llm_server.py")
    assert 'output.extra_fields.setdefault("min_global_steps", global_steps)' in client
    trainer = source("trainer/ppo/v1/trainer_base.py")
    assert 'np.array([tag["min_global_steps"] for tag in batch.tags], dtype=int)' in trainer
