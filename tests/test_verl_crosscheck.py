"""The verl path and the local trainer agree on the same batch of chains (issue 13, "Must hold").

G = 3 chains of one K = 2 task sequence are run once (through the verl adapter's policy and
bridge, against a fake LLM server). Then:

- local: ``rollout.batch.to_samples`` -> ``train.trainer.Trainer.accumulate_gradients``;
- verl: the agent loop's outputs -> verl's worker post-processing -> ``SageTrainer._compute_advantage``
  -> verl's own actor loss ``workers.utils.losses.ppo_loss`` (what the FSDP actor runs) -> backward.

Same advantages; same gradient with ``loss_scale=paper``, and the gradient / K with ``verl``.
"""

from __future__ import annotations

import asyncio
import copy
import types

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from sage_rl.integrations.verl import bridge  # noqa: E402
from sage_rl.integrations.verl.agent_loop import SageChainAgentLoop, run_config  # noqa: E402
from sage_rl.integrations.verl.compose import compose_config  # noqa: E402
from sage_rl.integrations.verl.config import VerlRunConfig  # noqa: E402
from sage_rl.integrations.verl.policy import VerlServerPolicy  # noqa: E402
from sage_rl.integrations.verl.testing import (  # noqa: E402
    FakeServerManager,
    InMemoryTQ,
    make_worker,
    save_tiny_model,
    scripted,
)
from sage_rl.integrations.verl.trainer import SageTrainer  # noqa: E402
from sage_rl.models import tiny_model  # noqa: E402
from sage_rl.rollout.batch import to_samples  # noqa: E402
from sage_rl.train.loss import clipped_surrogate  # noqa: E402
from sage_rl.train.trainer import Trainer, TrainerConfig  # noqa: E402

K, G = 2, 3
UID = "row0"


def cfg_for(tmp, loss_scale: str) -> VerlRunConfig:
    return VerlRunConfig.model_validate(
        {
            "model": str(tmp / "model"),
            "pocketworld": {"sandbox": False},
            "agent": {"max_steps": 6, "max_tokens_per_turn": 1024, "context_limit": 8192},
            "worked_example": False,
            "rollout": {"chain_length": K, "group_size": G, "groups_per_step": 1},
            "trainer": {"loss_scale": loss_scale},
        }
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl_cross")
    save_tiny_model(tmp / "model")
    model, tok = tiny_model(0)
    cfg = cfg_for(tmp, "paper")
    tasks = bridge.train_sequences(cfg, 1, seed=7)[0]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    server = FakeServerManager(tok, scripted({UID: tasks}), eot_id=eot)
    params = bridge.sampling_params({"temperature": 1.0}, cfg.agent.max_tokens_per_turn)

    async def chains():
        world = await bridge.world_for(cfg)
        return [
            await bridge.run_chain(
                world, VerlServerPolicy(server, tok, f"{UID}-{s}"), tasks, params, s, step=1
            )
            for s in range(G)
        ]

    return {"tmp": tmp, "model": model, "tok": tok, "server": server, "chains": asyncio.run(chains())}


@pytest.fixture(scope="module")
def verl(setup):
    """loss_scale -> the chains through verl's post-processing and SageTrainer's advantage step."""
    done: dict[str, tuple[TensorDict, SageTrainer]] = {}

    def get(loss_scale: str) -> tuple[TensorDict, SageTrainer]:
        if loss_scale not in done:
            with pytest.MonkeyPatch.context() as mp:
                done[loss_scale] = verl_batch(setup, loss_scale, mp)
        return done[loss_scale]

    return get


def verl_batch(setup, loss_scale: str, monkeypatch) -> tuple[TensorDict, SageTrainer]:
    cfg = cfg_for(setup["tmp"], loss_scale)
    config = compose_config(cfg)
    tq = InMemoryTQ()
    for name in (
        "verl.trainer.ppo.v1.agent_loop_tq",
        "verl.trainer.ppo.v1.trainer_base",
        "sage_rl.integrations.verl.trainer",
    ):
        monkeypatch.setattr(name + ".tq", tq)
    worker = make_worker(config, setup["server"])
    steps = types.SimpleNamespace(min_step=None, max_step=None)
    for s, chain in enumerate(setup["chains"]):
        outs = bridge.chain_outputs(chain, cfg.rollout, pad_id=0)
        agent_outputs = [SageChainAgentLoop._output(o, steps, UID, s, 1) for o in outs]
        asyncio.run(
            worker._agent_loop_postprocess(
                agent_outputs, False, uid=UID, session_id=s, global_steps=1, raw_prompt=[]
            )
        )
    keys = [f"{UID}_{s}_{k}" for s in range(G) for k in range(K)]
    lps = tq.kv_batch_get(keys, "train", ["rollout_log_probs"])
    tq.kv_batch_put(
        keys, "train", fields=TensorDict({"old_log_probs": lps["rollout_log_probs"]}, batch_size=[len(keys)])
    )
    trainer = SageTrainer.__new__(SageTrainer)
    trainer.config, trainer.sage = config, run_config(config)
    meta = trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[{}] * len(keys), partition_id="train"), {})
    fields = ["prompts", "responses", "input_ids", "response_mask", "advantages", "extra_fields"]
    return tq.kv_batch_get(meta.keys, "train", fields), trainer


def response_logprobs(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """log p(token) of the last ``n`` tokens of ``ids`` (logits of the prompt are not needed)."""
    logits = model(input_ids=ids[None], logits_to_keep=n + 1).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[-n:, None])[:, 0]


def verl_grads(setup, data: TensorDict, trainer: SageTrainer, old_shift: float = 0.0):
    """One backward of verl's actor loss on ``data`` (dp = 1), with the tiny model."""
    model = copy.deepcopy(setup["model"]).train()
    full, old = [], []
    for ids, resp in zip(data["input_ids"].unbind(), data["responses"].unbind(), strict=True):
        lp = response_logprobs(model, ids, len(resp))
        # verl's layout: entry j of a sequence is log p(token j+1); only the response part is read
        full.append(torch.cat([lp.new_zeros(len(ids) - len(resp) - 1), lp, lp.new_zeros(1)]))
        old.append(lp.detach() + old_shift)
    td = data.select("prompts", "responses", "response_mask", "advantages")
    td["old_log_probs"] = torch.nested.as_nested_tensor(old, layout=torch.jagged)
    tu.assign_non_tensor(td, dp_size=1, global_batch_size=trainer.mini_batch_outputs())
    tu.assign_non_tensor(td, batch_num_tokens=int(data["response_mask"].values().sum()))
    actor = omega_conf_to_dataclass(trainer.config.actor_rollout_ref.actor)
    loss, _ = ppo_loss(actor, {"log_probs": torch.nested.as_nested_tensor(full, layout=torch.jagged)}, td)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def local(setup):
    """The local trainer's advantages, loss and gradient on the chains (computed once)."""
    samples = to_samples([setup["chains"]], cfg_for(setup["tmp"], "paper").rollout)
    trainer = Trainer(
        copy.deepcopy(setup["model"]), setup["tok"], TrainerConfig(micro_batch_size=2), device="cpu"
    )
    stats = trainer.accumulate_gradients(samples, num_chains=G)
    grads = {
        n.removeprefix("module."): p.grad.clone()
        for n, p in trainer.model.named_parameters()
        if p.grad is not None
    }
    return samples, stats.loss, grads


def test_same_advantages_and_same_gradient_as_the_local_trainer(setup, local, verl):
    samples, local_loss, local = local
    data, trainer = verl("paper")
    rewards = [e["sage_reward"] for e in data["extra_fields"]]
    assert len(set(rewards)) > 1, "the scripted chains must differ in reward, or nothing is compared"
    assert rewards == [s.reward for s in samples]
    for a_BT, m, s in zip(data["advantages"].unbind(), data["response_mask"].unbind(), samples, strict=True):
        assert (a_BT[m.bool()] / K).tolist() == pytest.approx(
            [s.advantage] * int(m.sum()), abs=1e-6
        )  # scale D/N = K
    loss, grads = verl_grads(setup, data, trainer)
    assert loss == pytest.approx(local_loss, abs=1e-6)
    assert set(grads) == set(local) and len(grads) > 5
    for name, g in local.items():
        torch.testing.assert_close(grads[name], g, rtol=2e-4, atol=1e-7, msg=name)


def test_verl_scale_is_the_paper_loss_divided_by_k(setup, local, verl):
    _, _, local = local
    data, trainer = verl("verl")
    _, grads = verl_grads(setup, data, trainer)
    for name, g in local.items():
        torch.testing.assert_close(grads[name] * K, g, rtol=2e-4, atol=1e-7, msg=name)


def test_same_clipped_loss_off_policy(setup, verl):
    """Old logprobs shifted (ratio != 1, the clip active): verl's loss = sage-rl's clipped_surrogate."""
    data, trainer = verl("paper")
    loss_verl, _ = verl_grads(setup, data, trainer, old_shift=0.3)
    model = copy.deepcopy(setup["model"])
    logp, old, adv, mask = [], [], [], []
    with torch.no_grad():
        for ids, resp, m, a in zip(
            data["input_ids"].unbind(),
            data["responses"].unbind(),
            data["response_mask"].unbind(),
            data["advantages"].unbind(),
            strict=True,
        ):
            lp = response_logprobs(model, ids, len(resp))
            logp.append(lp), old.append(lp + 0.3), mask.append(m.float())
            adv.append(float(a[m.bool()][0]) / K if m.any() else 0.0)
    pad = torch.nn.utils.rnn.pad_sequence
    out = clipped_surrogate(pad(logp, True), pad(old, True), torch.tensor(adv), pad(mask, True), num_chains=G)
    assert out.clip_frac_low + out.clip_frac_high > 0.1  # the clip really acts
    assert loss_verl == pytest.approx(float(out.loss), rel=1e-5)
