"""The trainer's optimisation step: exact tokens, masks, micro-batching, metrics, options."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from sage_rl.train.trainer import LoraConfig, Trainer, TrainerConfig
from sage_rl.types import ExecResult, Outcome, Sample, StopReason, Task, Trajectory, Turn

torch.set_num_threads(1)
VOCAB = 64


def small_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def make_sample(prompt, turns, adv, task_id="t_1", position=0):
    """turns: list of (gen_ids, obs_ids); sampler logprobs are -1.0 per generated token."""
    task = Task(task_id=task_id, scenario_id="t", position=1, instruction="", split="train")
    tt = tuple(
        Turn(
            gen_ids=tuple(g),
            gen_logprobs=(-1.0,) * len(g),
            text="",
            code="x",
            result=ExecResult("", True),
            obs_ids=tuple(o),
        )
        for g, o in turns
    )
    traj = Trajectory(
        task=task, prompt_ids=tuple(prompt), turns=tt, outcome=Outcome(0.0, False), stop=StopReason.COMPLETED
    )
    return Sample(group=((task_id,), position), trajectory=traj, reward=0.0, advantage=adv)


def batch():
    """Five samples of different prompt lengths, turn counts and observation tokens."""
    return [
        make_sample([1, 5, 6], [([7, 8, 9], [10, 11]), ([12, 13], [])], 1.0),
        make_sample([1, 5], [([20], [])], -0.5),
        make_sample(
            [1, 5, 6, 7, 8, 9, 3], [([30, 31, 32, 33], [40]), ([41], [42, 43]), ([44, 45], [])], 0.25
        ),
        make_sample([1, 2, 3, 4], [([50, 51], [])], -1.5),
        make_sample([1], [([60, 61, 62], [])], 0.75),
    ]


def reference_grads(model, samples, num_chains, token_mean=False):
    """A naive re-derivation, one unpadded sequence at a time, full logits, log_softmax: at ratio 1 the
    loss is -(1/N) sum_i A_i mean_t logp_it (or the token mean)."""
    model = copy.deepcopy(model)
    total_tokens = sum(sum(s.trajectory.token_arrays()[1]) for s in samples)
    for s in samples:
        ids, mask, _ = s.trajectory.token_arrays()
        ids_t = torch.tensor([ids])
        logp = torch.log_softmax(model(input_ids=ids_t).logits[0, :-1], -1).gather(-1, ids_t[0, 1:, None])[
            :, 0
        ]
        m = torch.tensor(mask[1:], dtype=torch.float32)
        if token_mean:
            loss = -s.advantage * (logp * m).sum() / total_tokens
        else:
            loss = -s.advantage * (logp * m).sum() / m.sum() / num_chains
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean"])
def test_accumulated_gradient_equals_full_batch_and_reference(agg):
    base = small_model()
    ref = reference_grads(base, batch(), num_chains=2, token_mean=agg == "token_mean")
    for mbs in (1, 2, 5):
        tr = Trainer(copy.deepcopy(base), None, TrainerConfig(micro_batch_size=mbs, loss_agg=agg))
        tr.optimizer.zero_grad()
        stats = tr.accumulate_gradients(batch(), num_chains=2)
        for n, p in tr.model.named_parameters():
            assert torch.allclose(p.grad, ref[n], atol=1e-6, rtol=1e-4), (mbs, n)
        # at ratio 1 the loss is -(sum of advantages) / num_chains (per-sample token means are all 1)
        if agg == "seq_mean_token_mean":
            assert stats.loss == pytest.approx(-(1.0 - 0.5 + 0.25 - 1.5 + 0.75) / 2, abs=1e-6)


def test_step_metrics_and_update():
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2, micro_batch_size=2))
    before = [p.detach().clone() for p in tr.model.parameters()]
    m = tr.step(batch(), num_chains=5)
    assert tr.global_step == 1
    assert m["gen_tokens"] == 3 + 2 + 1 + 4 + 1 + 2 + 2 + 3
    assert m["seq_tokens"] == sum(len(s.trajectory.token_arrays()[0]) for s in batch())
    assert m["clip_frac_low"] == m["clip_frac_high"] == 0.0  # strictly on-policy: ratio 1
    assert m["ratio_min"] == m["ratio_max"] == 1.0
    assert 0 < m["entropy"] <= math.log(VOCAB) + 1e-5  # near uniform for a random model
    assert m["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters(), strict=True))


def test_warmup_by_hand_and_through_the_trainer():
    from sage_rl.train.optim import warmup_lr

    assert [warmup_lr(1e-3, u, 4) for u in (1, 2, 4, 9)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
    assert warmup_lr(1e-3, 1, 0) == 1e-3
    with pytest.raises(ValueError, match="from 1"):
        warmup_lr(1e-3, 0, 4)
    # Adam's first update moves every parameter by ~lr whatever the gradient's size, so the first
    # update's size scales with the warmed-up lr: a quarter of it at warmup_steps=4.
    moved = {}
    for warm in (0, 4):
        tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2, micro_batch_size=5, warmup_steps=warm))
        before = [p.detach().clone() for p in tr.model.parameters()]
        lrs = [tr.step(batch(), num_chains=5)["lr"]]
        moved[warm] = max(float((p.detach() - b).abs().max()) for p, b in zip(tr.model.parameters(), before, strict=True))
        lrs += [tr.step(batch(), num_chains=5)["lr"] for _ in range(4)]
        assert lrs == pytest.approx([1e-2] * 5 if warm == 0 else [2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2])
    assert moved[4] == pytest.approx(moved[0] / 4, rel=1e-3)
    # a step with no signal makes no update, so it does not advance the warm-up
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2, micro_batch_size=5, warmup_steps=4))
    tr.step([replace(s, advantage=0.0) for s in batch()], num_chains=5)
    assert tr.step(batch(), num_chains=5)["lr"] == pytest.approx(2.5e-3)


def test_logprob_mismatch_against_the_sampler():
    model = small_model()
    ids = [1, 5, 6, 7, 8]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], -1)
    true = [logp[t - 1, ids[t]].item() for t in (3, 4)]

    def with_logprobs(lps):
        s = make_sample(ids[:3], [(ids[3:], [])], 1.0)
        turn = s.trajectory.turns[0]
        t2 = Turn(
            gen_ids=turn.gen_ids, gen_logprobs=tuple(lps), text="", code="x", result=ExecResult("", True)
        )
        traj = Trajectory(
            s.trajectory.task, s.trajectory.prompt_ids, (t2,), s.trajectory.outcome, s.trajectory.stop
        )
        return Sample(s.group, traj, 0.0, 1.0)

    exact = Trainer(copy.deepcopy(model), None, TrainerConfig()).step([with_logprobs(true)], 1)
    assert exact["logprob_mismatch"] == pytest.approx(0.0, abs=1e-5)
    off = Trainer(copy.deepcopy(model), None, TrainerConfig()).step(
        [with_logprobs([v - 0.5 for v in true])], 1
    )
    assert off["logprob_mismatch"] == pytest.approx(0.5, abs=1e-5)


@pytest.mark.parametrize("chunked", [True, False])
def test_the_trained_policy_is_the_one_that_sampled_at_its_temperature(chunked):
    """Rollouts sampled at temperature 0.5 came from softmax(logits / 0.5): a trainer told so
    computes exactly the sampler's logprobs (and that distribution's entropy); one at 1 does not."""
    model, ids, temp = small_model(), [1, 5, 6, 7, 8], 0.5
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    tempered = torch.log_softmax(logits / temp, -1)
    sampler = [tempered[t - 1, ids[t]].item() for t in (3, 4)]
    entropy = [-(tempered[t - 1].exp() * tempered[t - 1]).sum().item() for t in (3, 4)]
    s = make_sample(ids[:3], [(ids[3:], [])], 1.0)
    turn = replace(s.trajectory.turns[0], gen_logprobs=tuple(sampler))
    sample = Sample(s.group, replace(s.trajectory, turns=(turn,)), 0.0, 1.0)
    cfg = TrainerConfig(chunked_head=chunked)
    at_t = Trainer(copy.deepcopy(model), None, cfg, temperature=temp).step([sample], 1)
    assert at_t["logprob_mismatch"] == pytest.approx(0.0, abs=1e-5)
    assert at_t["entropy"] == pytest.approx(sum(entropy) / 2, abs=1e-5)
    at_1 = Trainer(copy.deepcopy(model), None, cfg).step([sample], 1)
    assert at_1["logprob_mismatch"] > 0.01
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Trainer(small_model(), None, cfg, temperature=0.0)


def test_recompute_mode_gives_the_same_gradient():
    base = small_model()
    grads = []
    for mode in ("same_pass", "recompute"):
        tr = Trainer(copy.deepcopy(base), None, TrainerConfig(old_logprobs=mode, micro_batch_size=2))
        tr.accumulate_gradients(batch(), num_chains=2)
        grads.append(torch.cat([p.grad.flatten() for p in tr.model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-7)


def test_grad_clip_bounds_the_update():
    tr = Trainer(small_model(), None, TrainerConfig(grad_clip=1e-3, lr=1.0))
    tr.accumulate_gradients(batch(), num_chains=1)
    norm = torch.nn.utils.clip_grad_norm_(list(tr.model.parameters()), 1e-3)
    assert norm > 1e-3
    total = torch.sqrt(sum((p.grad**2).sum() for p in tr.model.parameters()))
    assert total.item() == pytest.approx(1e-3, rel=1e-3)


def test_lora_trains_only_adapters_and_kl_reference_is_the_base():
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-1, lora=LoraConfig(r=4, alpha=8), kl_coef=0.1))
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    first = tr.step(batch(), num_chains=5)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # LoRA B starts at 0: model == base
    second = tr.step(batch(), num_chains=5)
    assert second["kl_ref"] > 0


def test_full_model_kl_reference_is_a_frozen_copy():
    tr = Trainer(small_model(), None, TrainerConfig(lr=1e-2, kl_coef=0.5))
    tr.step(batch(), num_chains=5)
    assert tr.step(batch(), num_chains=5)["kl_ref"] > 0
    assert all(not p.requires_grad for p in tr.ref_model.parameters())


def test_kl_to_the_start_model_is_logged_without_training_on_it():
    """trainer.log_kl_ref: kl_ref is measured (0 at the start, > 0 once the weights moved) and the
    weights follow exactly the run that does not measure it (kl_coef 0: not in the loss)."""
    plain = Trainer(small_model(), None, TrainerConfig(lr=1e-2))
    logged = Trainer(small_model(), None, TrainerConfig(lr=1e-2, log_kl_ref=True))
    kl = [logged.step(batch(), num_chains=5)["kl_ref"] for _ in range(2)]
    assert [plain.step(batch(), num_chains=5)["kl_ref"] for _ in range(2)] == [0.0, 0.0]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[1] > 1e-6
    for (name, p), q in zip(plain.model.named_parameters(), logged.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert all(not p.requires_grad for p in logged.ref_model.parameters())


def test_a_logged_kl_measured_in_every_nth_micro_batch_is_the_mean_over_those(monkeypatch):
    """trainer.kl_ref_every = N: the reference runs in micro-batches 0, N, 2N, ... and kl_ref is the
    token-weighted mean of their KL, the figure every = 1 gives over the same micro-batches (worked
    from its per-micro-batch values); the weights are untouched by it (the KL is not in the loss)."""
    from sage_rl.config import ConfigError, load_config
    from sage_rl.train import trainer as trainer_mod

    per_batch, calls = [], []
    real_add, real_ref = trainer_mod.StepStats.add, Trainer._ref_logprobs

    def add(self, m, b):
        per_batch.append((m.kl_measured, m.loss.kl_ref, m.loss.num_tokens))
        real_add(self, m, b)

    monkeypatch.setattr(trainer_mod.StepStats, "add", add)
    monkeypatch.setattr(Trainer, "_ref_logprobs", lambda self, *a: calls.append(1) or real_ref(self, *a))
    opts = {"lr": 1e-2, "log_kl_ref": True, "micro_batch_size": 1, "shared_prefix": False}
    every = {n: Trainer(small_model(), None, TrainerConfig(**opts, kl_ref_every=n)) for n in (1, 2, 3)}
    logged = {}
    for n, tr in every.items():
        tr.step(batch(), num_chains=5)  # the weights move; the next step's KL is > 0
        per_batch.clear(), calls.clear()
        logged[n] = tr.step(batch(), num_chains=5)["kl_ref"]
        assert [k for k, *_ in per_batch] == [i % n == 0 for i in range(5)] and len(calls) == len(range(0, 5, n))
        if n == 1:
            kls = [(kl, t) for _, kl, t in per_batch]
    for n in (2, 3):
        picked = kls[::n]
        assert logged[n] == pytest.approx(sum(k * t for k, t in picked) / sum(t for _, t in picked), rel=1e-6)
        assert logged[n] != pytest.approx(logged[1], rel=1e-3)  # a subsample, not the whole step's figure
        for p, q in zip(every[1].model.parameters(), every[n].model.parameters(), strict=True):
            assert torch.equal(p, q)
    with pytest.raises(ConfigError, match="kl_ref_every=4 with kl_coef=0.1"):
        load_config(TrainerConfig, None, ["kl_coef=0.1", "kl_ref_every=4"])


def test_bad_inputs_are_named():
    tr = Trainer(small_model(), None, TrainerConfig())
    with pytest.raises(ValueError, match="empty prompt"):
        tr.step([make_sample([], [([1, 2], [])], 1.0)], 1)
    with pytest.raises(ValueError, match="num_chains"):
        tr.step(batch(), 0)


def test_bf16_autocast_path_runs_and_tracks_fp32():
    base = small_model()
    grads = {}
    for dtype in ("float32", "bfloat16"):
        tr = Trainer(copy.deepcopy(base), None, TrainerConfig(dtype=dtype, micro_batch_size=2))
        assert (tr.autocast_dtype is None) == (dtype == "float32")
        stats = tr.accumulate_gradients(batch(), num_chains=2)
        assert math.isfinite(stats.loss)
        grads[dtype] = torch.cat([p.grad.flatten() for p in tr.model.parameters()])
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # fp32 master weights
    cos = torch.nn.functional.cosine_similarity(grads["float32"], grads["bfloat16"], dim=0)
    assert cos > 0.98


def test_token_logprobs_alignment_and_entropy():
    from sage_rl.train.logprobs import _entropy, token_logprobs

    logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens at positions 0, 1; position 2 is dropped
    logits[0, 1] = torch.tensor([0.0, 0.0, 0.0, math.log(3.0)])  # p = (1/6, 1/6, 1/6, 1/2)
    logp, ent = token_logprobs(logits, torch.tensor([[2, 3]]), with_entropy=True)
    assert logp[0].tolist() == pytest.approx([math.log(1 / 4), math.log(1 / 2)])
    assert ent[0].tolist() == pytest.approx(
        [math.log(4), -(3 * (1 / 6) * math.log(1 / 6) + 0.5 * math.log(0.5))]
    )
    z = torch.randn(2, 7, 5)
    assert torch.allclose(_entropy(z, torch.logsumexp(z, -1), chunk=3), _entropy(z, torch.logsumexp(z, -1)))


def test_chunked_head_matches_the_plain_path():
    base = small_model()
    grads, losses = [], []
    for chunked in (True, False):
        tr = Trainer(copy.deepcopy(base), None, TrainerConfig(chunked_head=chunked, micro_batch_size=3))
        assert (tr.head is not None) == chunked
        if chunked:
            # several tiles per micro-batch, each recomputed in backward
            tr.head = type(tr.head)(tr.head.decoder, tr.head.head, chunk=4, max_saved_logits=0)
        stats = tr.accumulate_gradients(batch(), num_chains=2)
        losses.append((stats.loss, stats.entropy_sum))
        grads.append(torch.cat([p.grad.flatten() for p in tr.model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_chunked_head_is_refused_when_the_split_changes_the_logits():
    from sage_rl.train.logprobs import ChunkedHead

    model = small_model()
    model.config.logit_scale = 2.0  # not used by Llama: the split still matches
    assert ChunkedHead.of(model, torch.device("cpu")) is not None
    original = model.forward

    def scaled_forward(*args, **kwargs):  # a model that post-processes its logits
        out = original(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    model.forward = scaled_forward
    assert ChunkedHead.of(model, torch.device("cpu")) is None


def test_optional_backends_are_skipped_when_not_installed(tmp_path):
    import importlib.util

    from sage_rl.train.logging import MetricsLogger

    if importlib.util.find_spec("wandb") or importlib.util.find_spec("trackio"):
        pytest.skip("wandb or trackio is installed here; this checks their absence")
    with pytest.warns(UserWarning, match="not installed"):
        log = MetricsLogger(tmp_path, tensorboard=False, wandb_project="p", trackio_project="p")
    log.log(1, {"loss": 1.0})
    log.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
