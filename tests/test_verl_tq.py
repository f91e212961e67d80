"""The in-memory TransferQueue of the CPU tests against the real one, on a local Ray cluster.

The other verl tests run verl's worker and trainer against ``testing.InMemoryTQ``. This module
checks, once, that it stores and returns what TransferQueue 0.1.11 does (nested tensors, non-tensor
stacks, unknown and partial fields, returned metadata), and runs SAGE's advantage step on the real
queue. It starts Ray with 4 logical CPUs (TransferQueue's controller and two storage units take
one each) and takes about half a minute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

import torch  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from sage_rl.integrations.verl.testing import InMemoryTQ  # noqa: E402


@pytest.fixture(scope="module")
def real_tq():
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="sage-rl-tests")
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


def as_plain(td: TensorDict) -> dict:
    out = {}
    for key in sorted(td.keys()):
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            rows = value.unbind() if value.is_nested or value.dim() > 0 else [value]
            out[key] = (type(value).__name__, value.is_nested, [r.tolist() for r in rows], value.dtype)
        else:
            out[key] = ("nontensor", isinstance(value, NonTensorStack), list(value))
    return out


ROWS = [
    {
        "responses": torch.tensor([1, 2, 3]),
        "mask": torch.tensor([1, 1, 0]),
        "extra_fields": {"a": 1, "b": [1, 2]},
        "uid": "u",
        "n": 3,
    },
    {
        "responses": torch.tensor([4, 5, 6]),
        "mask": torch.tensor([1, 0, 0]),
        "extra_fields": {"a": 2, "b": []},
        "uid": "u",
        "n": 4,
    },
    {
        "responses": torch.tensor([7]),
        "mask": torch.tensor([1]),
        "extra_fields": {"a": 3, "b": [3]},
        "uid": "v",
        "n": 5,
    },
]


def test_in_memory_queue_matches_transfer_queue(real_tq):
    fake = InMemoryTQ()
    keys, tags = ["u_0_0", "u_0_1", "v_0_0"], [{"t": 1}, {"t": 2, "is_padding": False}, {"t": 3}]
    for store in (real_tq, fake):
        meta = store.kv_batch_put(
            keys=keys, partition_id="p", fields=list_of_dict_to_tensordict(ROWS), tags=tags
        )
        assert meta.keys == keys and meta.tags == tags and sorted(meta.fields) == sorted(ROWS[0])
    assert as_plain(real_tq.kv_batch_get(keys=keys, partition_id="p")) == as_plain(
        fake.kv_batch_get(keys, "p")
    )
    same_len = keys[:2][::-1]  # equal lengths still come back nested
    pick = ["mask", "extra_fields", "not_a_field"]
    assert as_plain(real_tq.kv_batch_get(keys=same_len, partition_id="p", select_fields=pick)) == as_plain(
        fake.kv_batch_get(same_len, "p", pick)
    )
    update = list_of_dict_to_tensordict(
        [{"adv": torch.tensor([1.0])}, {"adv": torch.tensor([0.5, 0.5, 0.0])}]
    )
    for store in (real_tq, fake):  # a put of fields only returns the stored tags (padding is found by them)
        meta = store.kv_batch_put(keys=["v_0_0", "u_0_0"], partition_id="p", fields=update)
        assert meta.tags == [{"t": 3}, {"t": 1}]
    both = ["v_0_0", "u_0_0"]
    assert as_plain(
        real_tq.kv_batch_get(keys=both, partition_id="p", select_fields=["adv", "responses"])
    ) == as_plain(fake.kv_batch_get(both, "p", ["adv", "responses"]))
    for store in (real_tq, fake):  # a field that one of the keys lacks is left out, as an unknown one
        picked = store.kv_batch_get(keys=keys, partition_id="p", select_fields=["adv", "mask"])
        assert set(picked.keys()) == {"mask"}
        assert "adv" not in set(store.kv_batch_get(keys=keys, partition_id="p").keys())
    for store in (real_tq, fake):
        store.kv_clear(keys=keys, partition_id="p")


def test_sage_advantage_step_on_the_real_queue(real_tq):
    from test_verl_trainer import EXPECTED, put_batch, trainer_for

    from sage_rl.integrations.verl.compose import compose_config
    from sage_rl.integrations.verl.config import VerlRunConfig

    config = compose_config(
        VerlRunConfig.model_validate(
            {"model": "unused", "rollout": {"chain_length": 2, "group_size": 3, "groups_per_step": 2}}
        )
    )
    batch = put_batch(real_tq)
    metrics: dict = {}
    out = trainer_for(config)._compute_advantage(batch, metrics)
    data = real_tq.kv_batch_get(
        keys=out.keys, partition_id="train", select_fields=["advantages", "response_mask", "extra_fields"]
    )
    for key, a, mask, e in zip(
        out.keys,
        data["advantages"].unbind(),
        data["response_mask"].unbind(),
        data["extra_fields"],
        strict=True,
    ):
        ok = e["sage_ok"] and not key.startswith("pad")
        want = EXPECTED[(e["sage_uid"], e["sage_position"])][e["sage_session"]] * 12 / 5 if ok else 0.0
        assert a.tolist() == pytest.approx((want * mask.float()).tolist())
    assert metrics["sage/chains"] == 5.0
    real_tq.kv_clear(keys=out.keys, partition_id="train")
