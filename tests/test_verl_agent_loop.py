"""SAGE's chain agent loop inside verl's own V1 worker, against a fake LLM server (issue 13).

The path is the one a real run takes, minus Ray and vLLM: our ``prepare-data`` parquet -> verl's
``RLHFDataset`` and ``PPOTrainer._next_train_batch`` -> verl's ``AgentLoopWorkerTQ`` (the agent loop
registered by config from ``agent_loops.yaml``) -> verl's post-processing -> TransferQueue (in
memory). The fake server scripts three kinds of chain: an expert that makes a skill in task 1
and uses it in task 2, a policy that writes no code, and one that does task 1 then gives up.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl", reason="verl runs in .venv-verl (bash scripts/setup_verl.sh)")

from sage_rl.integrations.verl import bridge  # noqa: E402
from sage_rl.integrations.verl.compose import compose_config  # noqa: E402
from sage_rl.integrations.verl.config import VerlRunConfig  # noqa: E402
from sage_rl.integrations.verl.data import prepare  # noqa: E402
from sage_rl.integrations.verl.testing import (  # noqa: E402
    FakeServerManager,
    InMemoryTQ,
    make_trainer,
    make_worker,
    rollout,
    save_tiny_model,
    scripted,
    use_tq,
)
from sage_rl.rollout.rewards import ChainOutcomes, RewardKind, compute_rewards  # noqa: E402

K, G, B = 2, 3, 2


def run_config(tmp, **over) -> VerlRunConfig:
    return VerlRunConfig.model_validate(
        {
            "model": str(tmp / "model"),
            "data_dir": str(tmp / "data"),
            "pocketworld": {"sandbox": False},
            "agent": {"max_steps": 6, "max_tokens_per_turn": 1024, "context_limit": 8192},
            "worked_example": False,
            "rollout": {"chain_length": K, "group_size": G, "groups_per_step": B},
            "steps": 2,
            "data": {"val_rows": 2},
            "verl": {"data.dataloader_num_workers": 0},
            **over,
        }
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One rollout batch of B rows x G sessions, stored by verl's worker in an in-memory TQ."""
    tmp = tmp_path_factory.mktemp("verl_loop")
    save_tiny_model(tmp / "model")
    cfg = run_config(tmp)
    prepare(cfg)
    config = compose_config(cfg)
    mp = pytest.MonkeyPatch()
    tq = use_tq(InMemoryTQ(), mp)
    trainer = make_trainer(config)
    batch = trainer._next_train_batch()
    tasks = {uid: bridge.tasks_from_json(t) for uid, t in zip(batch["uid"], batch["sage_tasks"], strict=True)}
    eot = trainer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    server = FakeServerManager(trainer.tokenizer, scripted(tasks), eot_id=eot)
    worker = make_worker(config, server)
    asyncio.run(rollout(worker, batch))
    yield {
        "cfg": cfg,
        "config": config,
        "tq": tq,
        "server": server,
        "tasks": tasks,
        "tok": trainer.tokenizer,
        "trainer": trainer,
    }
    mp.undo()


def outputs(run) -> dict[tuple[str, int, int], dict]:
    """(uid, session, position) -> stored fields, parsed from verl's key format."""
    rows = run["tq"].rows["train"]
    out = {}
    for key, fields in rows.items():
        if key.count("_") == 2:
            uid, session, k = key.rsplit("_", 2)
            out[(uid, int(session), int(k))] = fields
    return out


def test_each_session_is_one_chain_of_k_outputs_of_the_rows_task_sequence(run):
    outs = outputs(run)
    assert set(outs) == {(u, s, k) for u in run["tasks"] for s in range(G) for k in range(K)}
    for (uid, s, k), f in outs.items():
        extra = f["extra_fields"]
        assert (extra["sage_uid"], extra["sage_session"], extra["sage_position"]) == (uid, s, k)
        assert extra["sage_task_id"] == run["tasks"][uid][k].task_id  # all G sessions: the same sequence
        assert extra["sage_ok"] is True
    assert {t["status"] for key, t in run["tq"].tags["train"].items() if "_" not in key} == {"finished"}


def test_tokens_are_exactly_the_sampled_ones_and_observations_are_masked(run):
    for (uid, s, _), f in outputs(run).items():
        prompt, resp, mask = f["prompts"].tolist(), f["responses"].tolist(), f["response_mask"].tolist()
        assert f["input_ids"].tolist() == prompt + resp and f["loss_mask"].tolist() == mask
        turns = [
            c
            for c in run["server"].calls
            if c["request_id"] == f"{uid}-{s}" and c["prompt_ids"][: len(prompt)] == prompt
        ]
        assert turns, "every output was sampled by the server"
        for c in turns:  # the server saw exactly prompt + the response so far: nothing re-tokenised
            done, ids = len(c["prompt_ids"]) - len(prompt), c["token_ids"]
            assert c["prompt_ids"] == prompt + resp[:done]
            assert resp[done : done + len(ids)] == ids and mask[done : done + len(ids)] == [1] * len(ids)
        sampled = [t for c in turns for t in c["token_ids"]]
        assert [t for t, m in zip(resp, mask, strict=True) if m] == sampled
        assert sum(mask) < len(mask)  # observations (and the chat template's pieces) are in, masked out


def test_logprobs_cover_the_response_and_are_the_samplers_on_sampled_tokens(run):
    for (uid, s, _), f in outputs(run).items():
        prompt = f["prompts"].tolist()
        lps, mask = f["rollout_log_probs"].tolist(), f["response_mask"].tolist()
        assert len(lps) == len(mask) == f["responses"].numel()
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
        turns = [
            c
            for c in run["server"].calls
            if c["request_id"] == f"{uid}-{s}" and c["prompt_ids"][: len(prompt)] == prompt
        ]
        sampler = [-0.01 * (i + 1) for c in turns for i in range(len(c["token_ids"]))]  # the fake's logprobs
        assert [lp for lp, m in zip(lps, mask, strict=True) if m] == pytest.approx(sampler)


def test_rewards_are_sage_rls_reward_function_per_position(run):
    by_chain: dict[tuple[str, int], list[dict]] = {}
    for (uid, s, _), f in sorted(outputs(run).items()):
        by_chain.setdefault((uid, s), []).append(f["extra_fields"])
    for (_, s), extras in by_chain.items():
        outcome = ChainOutcomes(
            scores=tuple(e["sage_score"] for e in extras),
            successes=tuple(e["sage_success"] for e in extras),
            produced_code=tuple(e["sage_produced_code"] for e in extras),
            used_from=tuple(tuple(e["sage_used_from"]) for e in extras),
        )
        got = tuple(e["sage_reward"] for e in extras)
        assert got == compute_rewards(RewardKind.SKILL_INTEGRATED, outcome, -1.0)
        if s == 0:  # expert: makes a skill in task 1, uses it in task 2, both succeed (SAGE.md section 4)
            assert got == (2.0, 2.0) and extras[1]["sage_used_from"] == [0]
        if s == 1:  # no code at all: the penalty replaces the reward
            assert got == (-1.0, -1.0)
        if s == 2:  # task 1 succeeded, task 2 gave up: no bonus for anyone
            assert got[0] == 1.0 and got[1] < 1.0


def test_verls_post_processing_broadcasts_the_last_reward_so_each_output_keeps_its_own(run):
    """verl writes the session's last reward into every output's rm_scores (agent_loop_tq.py); the
    output's own reward travels in extra_fields and the trainer restores it (test_verl_trainer)."""
    for (uid, s, k), f in outputs(run).items():
        last = outputs(run)[(uid, s, K - 1)]["extra_fields"]["sage_reward"]
        rm = f["rm_scores"]
        assert float(rm[-1]) == last and float(rm[:-1].abs().sum()) == 0.0
        tag = run["tq"].tags["train"][f"{uid}_{s}_{k}"]
        assert isinstance(tag["min_global_steps"], int) and isinstance(tag["max_global_steps"], int)


def test_requests_carry_stop_ids_turn_budget_and_logprobs(run):
    from sage_rl.agent.render import ChatRenderer

    stop = list(ChatRenderer(run["tok"]).stop_ids)
    for c in run["server"].calls:
        p = c["params"]
        assert p["stop_token_ids"] == stop and p["logprobs"] is True
        assert 0 < p["max_tokens"] <= run["cfg"].agent.max_tokens_per_turn
        assert p["temperature"] == run["config"].actor_rollout_ref.rollout.temperature
        assert "seed" not in p  # fresh randomness each step


def test_a_broken_environment_comes_back_as_k_failed_outputs_not_an_exception(run, monkeypatch):
    from sage_rl.integrations.verl.agent_loop import SageChainAgentLoop, run_config

    world = asyncio.run(bridge.world_for(run_config(run["config"])))

    async def broken():
        raise OSError("sandbox is gone")

    monkeypatch.setattr(world.suite, "open", broken)
    loop = SageChainAgentLoop.__new__(SageChainAgentLoop)
    loop.config, loop.server_manager, loop.tokenizer = run["config"], run["server"], run["tok"]
    uid, tasks = next(iter(run["tasks"].items()))
    outs = asyncio.run(
        loop.run({"temperature": 1.0}, uid=uid, session_id=0, sage_tasks=bridge.tasks_to_json(tasks))
    )
    assert [o.extra_fields["sage_ok"] for o in outs] == [False] * K
    assert "sandbox is gone" in outs[0].extra_fields["sage_error"]
    assert all(len(o.response_ids) == 1 and o.response_mask == [0] for o in outs)
    bad = asyncio.run(loop.run({}, uid=uid, session_id=1, sage_tasks="not json"))
    assert len(bad) == K and "bad dataset row" in bad[0].extra_fields["sage_error"]


def test_verls_trainer_steps_accept_the_batch_padding_advantages_and_metrics(run):
    """What verl's sync step does next on CPU: pad the batch for the data-parallel ranks, SAGE's
    advantage step, verl's metrics, which must report the true per-output rewards."""
    import types

    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    tq, trainer = run["tq"], run["trainer"]
    keys = sorted(k for k in tq.rows["train"] if k.count("_") == 2 and not k.startswith("pad"))
    old = tq.kv_batch_get(keys, "train", ["rollout_log_probs"])  # as _compute_old_log_prob would write
    tq.kv_batch_put(keys, "train", fields=old.rename_key_("rollout_log_probs", "old_log_probs"))
    batch = KVBatchMeta(keys=keys, tags=[tq.tags["train"][k] for k in keys], partition_id="train")
    batch = upsample_batch_to_divisible_size(batch, 16, run["tok"].eos_token_id)
    assert len(batch) == 16 > len(keys)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    trainer.resource_pool_manager = types.SimpleNamespace(get_n_gpus=lambda: 1)  # no GPUs here
    trainer._compute_metrics(batch, metrics, {"step": 1.0, "gen": 0.5}, global_steps=1, epoch=0)
    rewards = [tq.rows["train"][k]["extra_fields"]["sage_reward"] for k in keys]
    assert metrics["critic/score/mean"] == pytest.approx(
        sum(rewards) / len(rewards)
    )  # own rewards, no padding
    assert metrics["sage/chains"] == B * G and metrics["sage/loss_scale"] == pytest.approx(K)
    adv = tq.kv_batch_get(batch.keys, "train", ["advantages"])["advantages"]
    assert all(
        float(a.abs().sum()) == 0.0
        for k, a in zip(batch.keys, adv.unbind(), strict=True)
        if k.startswith("pad")
    )
