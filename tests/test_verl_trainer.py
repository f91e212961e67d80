"""SAGE's advantage step and the one-optimizer-step rule in verl's trainer (issue 13).

Hand-worked batch: two task sequences ("a", "b"), G = 3 chains of K = 2, verl's padding rows, and
one chain of "b" whose environment broke (``sage_ok=False``)::

    a, position 1: R = (2, -1, 1)    mean 2/3   A = (4/3, -5/3, 1/3)
    a, position 2: R = (2, -1, 0.5)  mean 1/2   A = (3/2, -3/2, 0)
    b, position 1: R = (1, 1, -)     mean 1     A = (0, 0, -)
    b, position 2: R = (0, 1, -)     mean 1/2   A = (-1/2, 1/2, -)

Chains N = 5; verl divides by D = ppo_mini_batch_size * n = K*B*G = 12, so the paper's loss needs
A * 12/5.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

import torch  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from sage_rl.config import ConfigError  # noqa: E402
from sage_rl.integrations.verl.advantages import OutputRow, batch_advantages, loss_scale  # noqa: E402
from sage_rl.integrations.verl.compose import compose_config  # noqa: E402
from sage_rl.integrations.verl.config import LossScale, VerlRunConfig  # noqa: E402
from sage_rl.integrations.verl.testing import InMemoryTQ, use_tq  # noqa: E402
from sage_rl.integrations.verl.trainer import SageTrainer, check_invariants  # noqa: E402
from sage_rl.rollout.advantages import compute_advantages  # noqa: E402
from sage_rl.rollout.batch import RolloutConfig  # noqa: E402
from sage_rl.train.loss import LossAgg  # noqa: E402

K, G, B = 2, 3, 2
REWARDS = {
    ("a", 0): (2.0, -1.0, 1.0),
    ("a", 1): (2.0, -1.0, 0.5),
    ("b", 0): (1.0, 1.0, 0.0),
    ("b", 1): (0.0, 1.0, 0.0),
}
EXPECTED = {
    ("a", 0): (4 / 3, -5 / 3, 1 / 3),
    ("a", 1): (1.5, -1.5, 0.0),
    ("b", 0): (0.0, 0.0, 0.0),
    ("b", 1): (-0.5, 0.5, 0.0),
}


def extra(uid: str, s: int, k: int) -> dict:
    ok = not (uid == "b" and s == 2)
    return {
        "sage_uid": uid,
        "sage_session": s,
        "sage_position": k,
        "sage_task_id": f"{uid}-task{k}",
        "sage_reward": REWARDS[(uid, k)][s] if ok else 0.0,
        "sage_ok": ok,
        "sage_success": REWARDS[(uid, k)][s] >= 1.0,
        "sage_used_skill": k == 1 and s == 0,
        "sage_produced_code": REWARDS[(uid, k)][s] != -1.0,
        "sage_error": "" if ok else "OSError: sandbox is gone",
    }


def batch_rows() -> list[tuple[str, dict, dict]]:
    """(verl key, extra_fields, tag) in verl's order, then two padding rows copying row 0."""
    rows = [(f"{u}_{s}_{k}", extra(u, s, k), {}) for u in "ab" for s in range(G) for k in range(K)]
    return rows + [(f"padxyz_{i}_0", extra("a", 0, 0), {"is_padding": True}) for i in range(2)]


def rollout_cfg(**kw) -> RolloutConfig:
    return RolloutConfig(chain_length=K, group_size=G, groups_per_step=B, **kw)


def test_batch_advantages_match_hand_numbers_and_compute_advantages():
    rows = [OutputRow.of(e, padding=bool(t)) for _, e, t in batch_rows()]
    adv = batch_advantages(rows, rollout_cfg(), LossScale.PAPER, LossAgg.SEQ_MEAN_TOKEN_MEAN, K * B * G)
    assert adv.num_chains == 5 and adv.scale == pytest.approx(12 / 5)
    for row, a, scaled in zip(rows, adv.unscaled, adv.values, strict=True):
        want = 0.0 if row.padding or not row.ok else EXPECTED[(row.uid, row.position)][row.session]
        assert a == pytest.approx(want) and scaled == pytest.approx(want * 12 / 5)
    live = [r for r in rows if r.ok and not r.padding]
    ref = compute_advantages([((r.uid, r.position), r.reward) for r in live])
    assert [a for r, a in zip(rows, adv.unscaled, strict=True) if r.ok and not r.padding] == pytest.approx(
        ref.values
    )
    assert adv.metrics["sage/failed_chains"] == 1.0 and adv.metrics["sage/chains"] == 5.0
    assert adv.metrics["sage/reward/pos1"] == pytest.approx((2 - 1 + 1 + 1 + 1) / 5)
    assert adv.metrics["sage/skill_use/pos2"] == pytest.approx(2 / 5)


def test_options_reach_compute_advantages_and_the_scale():
    rows = [OutputRow.of(e, padding=bool(t)) for _, e, t in batch_rows()]
    cfg = rollout_cfg(baseline="leave_one_out", normalize_std=True, drop_below=0.01)
    adv = batch_advantages(rows, cfg, LossScale.VERL, LossAgg.SEQ_MEAN_TOKEN_MEAN, 12)
    live = [r for r in rows if r.ok and not r.padding]
    ref = compute_advantages(
        [((r.uid, r.position), r.reward) for r in live], "leave_one_out", True, drop_below=0.01
    )
    want = [a if keep else 0.0 for a, keep in zip(ref.values, ref.keep, strict=True)]
    assert [a for r, a in zip(rows, adv.values, strict=True) if r.ok and not r.padding] == pytest.approx(want)
    assert adv.scale == 1.0 and adv.metrics["sage/dropped"] == sum(not k for k in ref.keep) > 0
    assert loss_scale(LossScale.PAPER, LossAgg.TOKEN_MEAN, 12, 5) == 1.0  # token mean: same divisor in both


def test_a_group_with_two_task_sequences_is_an_error():
    rows = [OutputRow.of(e, padding=bool(t)) for _, e, t in batch_rows()]
    rows[2] = OutputRow(**{**rows[2].__dict__, "task_id": "other"})
    with pytest.raises(AssertionError, match="several task ids"):
        batch_advantages(rows, rollout_cfg(), LossScale.PAPER, LossAgg.SEQ_MEAN_TOKEN_MEAN, 12)
    with pytest.raises(KeyError, match="sage_chain"):
        OutputRow.of({"sage_uid": "a"}, padding=False)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    cfg = VerlRunConfig.model_validate(
        {"model": "unused", "rollout": {"chain_length": K, "group_size": G, "groups_per_step": B}}
    )
    return compose_config(cfg)


def put_batch(tq: InMemoryTQ) -> KVBatchMeta:
    """The batch as verl's worker and padding store it: response lengths 3..5, rewards broadcast."""
    rows = batch_rows()
    fields = []
    for i, (_, e, tag) in enumerate(rows):
        n = 3 + i % 3
        mask = torch.tensor([1] * (n - 1) + [0]) if not tag else torch.zeros(1, dtype=torch.long)
        last = REWARDS[(e["sage_uid"], K - 1)][e["sage_session"]]
        rm = torch.zeros(mask.shape)
        rm[-1] = 0.0 if tag else last
        lp = -0.1 * mask.float()
        fields.append(
            {
                "uid": e["sage_uid"],
                "response_mask": mask,
                "rm_scores": rm,
                "rollout_log_probs": lp,
                "old_log_probs": lp,
                "extra_fields": e,
            }
        )
    keys = [k for k, _, _ in rows]
    tq.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(fields), tags=[t for _, _, t in rows])
    return KVBatchMeta(keys=keys, tags=[t for _, _, t in rows], partition_id="train")


def trainer_for(config) -> SageTrainer:
    from sage_rl.integrations.verl.agent_loop import run_config

    trainer = SageTrainer.__new__(SageTrainer)
    trainer.config, trainer.sage = config, run_config(config)
    return trainer


def test_compute_advantage_writes_sage_advantages_and_true_rewards(config, monkeypatch):
    tq = use_tq(InMemoryTQ(), monkeypatch)
    batch = put_batch(tq)
    metrics: dict = {}
    out = trainer_for(config)._compute_advantage(batch, metrics)
    data = tq.kv_batch_get(
        out.keys, "train", ["advantages", "returns", "rm_scores", "response_mask", "extra_fields"]
    )
    for key, a, ret, rm, mask, e in zip(
        out.keys,
        data["advantages"].unbind(),
        data["returns"].unbind(),
        data["rm_scores"].unbind(),
        data["response_mask"].unbind(),
        data["extra_fields"],
        strict=True,
    ):
        pad = key.startswith("pad")
        ok = e["sage_ok"] and not pad
        want = EXPECTED[(e["sage_uid"], e["sage_position"])][e["sage_session"]] * 12 / 5 if ok else 0.0
        assert a.tolist() == pytest.approx((want * mask.float()).tolist())  # only generated tokens
        assert torch.equal(a, ret)
        assert float(rm[-1]) == pytest.approx(
            e["sage_reward"] if ok else 0.0
        )  # its own reward, not the last one
        assert float(rm[:-1].abs().sum()) == 0.0
    assert metrics["sage/loss_scale"] == pytest.approx(12 / 5)


def test_a_batch_where_every_chain_failed_raises_with_the_error(config, monkeypatch):
    tq = use_tq(InMemoryTQ(), monkeypatch)
    rows = [
        (f"u_{s}_{k}", {**extra("b", 2, k), "sage_uid": "u", "sage_session": s})
        for s in range(G)
        for k in range(K)
    ]
    fields = [
        {
            "uid": "u",
            "response_mask": torch.zeros(1, dtype=torch.long),
            "rm_scores": torch.zeros(1),
            "rollout_log_probs": torch.zeros(1),
            "old_log_probs": torch.zeros(1),
            "extra_fields": e,
        }
        for _, e in rows
    ]
    tq.kv_batch_put(
        [k for k, _ in rows], "train", fields=list_of_dict_to_tensordict(fields), tags=[{}] * len(rows)
    )
    batch = KVBatchMeta(keys=[k for k, _ in rows], tags=[{}] * len(rows), partition_id="train")
    with pytest.raises(RuntimeError, match="sandbox is gone"):
        trainer_for(config)._compute_advantage(batch, {})


class FakeActorGroup:
    def __init__(self):
        self.extra_info = None

    def update_actor(self, batch):
        self.extra_info = dict(batch.extra_info)
        return {"metrics": {"mfu": [0.0], "pg_loss": [0.0]}}


def test_one_optimizer_step_per_rollout_batch(config):
    """verl's actor splits the batch into mini-batches of ``mini_batch_size`` (one optimizer step each,
    ``engine_workers.train_mini_batch``): with K*B*G outputs that is exactly one."""
    from verl.utils import tensordict_utils as tu

    trainer = trainer_for(config)
    trainer.actor_rollout_wg = FakeActorGroup()
    keys = [f"u{b}_{s}_{k}" for b in range(B) for s in range(G) for k in range(K)]
    trainer._update_actor(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), {})
    info = trainer.actor_rollout_wg.extra_info
    assert (
        info["mini_batch_size"] == info["global_batch_size"] == len(keys) == K * B * G and info["epochs"] == 1
    )
    data = td_of(len(keys))
    steps = sum(
        1
        for _ in tu.make_iterator(
            data, mini_batch_size=info["mini_batch_size"], epochs=info["epochs"], seed=0
        )
    )
    assert steps == 1
    two = [f"x{k}" for k in range(2 * K * B * G)]
    with pytest.raises(RuntimeError, match="one optimizer step"):
        trainer._update_actor(KVBatchMeta(keys=two, tags=[{}] * len(two), partition_id="train"), {})


def td_of(n: int):
    from tensordict import TensorDict

    return TensorDict({"x": torch.arange(n)}, batch_size=[n])


def test_trainer_runs_verls_sync_branches_and_checks_sages_invariants(config):
    from omegaconf import open_dict
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    assert config.trainer.v1.trainer_mode == "sage"
    trainer = SageTrainer(config.copy())
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    bad = config.copy()
    with open_dict(bad):
        bad.actor_rollout_ref.actor.ppo_mini_batch_size = B  # verl's usual value: K optimizer steps
        bad.actor_rollout_ref.actor.use_kl_loss = True
    with pytest.raises(ConfigError, match="ppo_mini_batch_size=2 .needs 4.*use_kl_loss"):
        check_invariants(bad, trainer.sage)
