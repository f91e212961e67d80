"""Shared-prefix training is exact: with and without it, the same loss, metrics and gradients
(sage_rl/train/prefix.py), on the tiny model with hand-made samples."""

from __future__ import annotations

import copy

import pytest
import torch
from test_trainer import make_sample

from sage_rl.train.batch import PreparedSample, collate
from sage_rl.train.prefix import common_prefix_len, shareable_len
from sage_rl.train.trainer import Trainer, TrainerConfig

SYSTEM = list(range(100, 140))  # 40 tokens every sample starts with
TASK_A = list(range(200, 230))  # a group's task prompt
TASK_B = list(range(300, 325))


def shared_batch():
    """Two groups (two tasks) of three chains: the system prompt is shared by all six samples, each
    task prompt by its group; episodes differ in turns, lengths and observations. One sample of
    group A repeats another's first generated token (sharing must stop before generated tokens)."""
    a, b = SYSTEM + TASK_A, SYSTEM + TASK_B
    return [
        make_sample(a, [([7, 8, 9], [10, 11]), ([12, 13], [])], 1.0, "a", 0),
        make_sample(a, [([7, 20], [])], -0.5, "a", 0),
        make_sample(a, [([30, 31, 32, 33], [40]), ([41], [42, 43]), ([44, 45], [])], -0.5, "a", 0),
        make_sample(b, [([50, 51], [52, 53, 54])], 0.25, "b", 1),
        make_sample(b, [([60, 61, 62], [])], 0.75, "b", 1),
        make_sample(b, [([70], [71]), ([72, 73, 74, 75, 76], [])], -1.0, "b", 1),
    ]


def unshared_batch():
    """Samples that share nothing (different first tokens)."""
    return [
        make_sample([1, 5, 6], [([7, 8, 9], [10, 11]), ([12, 13], [])], 1.0),
        make_sample([2, 5], [([20], [])], -0.5),
        make_sample([3, 9, 9, 9], [([50, 51], [])], -1.5),
    ]


def grads_and_metrics(model, tok, samples, **cfg):
    trainer = Trainer(copy.deepcopy(model), tok, TrainerConfig(lr=1e-3, shared_prefix_min_tokens=1, **cfg))
    stats = trainer.accumulate_gradients(samples, num_chains=3)
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return grads, stats.as_metrics(), trainer


@pytest.mark.parametrize("micro", [1, 2, 4, 6])
@pytest.mark.parametrize("chunked_head", [True, False])
@pytest.mark.parametrize("old_logprobs", ["same_pass", "recompute"])
def test_shared_prefix_gives_the_same_loss_and_gradients(tiny, micro, chunked_head, old_logprobs):
    model, tok = tiny
    opts = {"micro_batch_size": micro, "chunked_head": chunked_head, "old_logprobs": old_logprobs}
    for samples in (shared_batch(), unshared_batch()):
        g_plain, m_plain, _ = grads_and_metrics(model, tok, samples, shared_prefix=False, **opts)
        g_shared, m_shared, trainer = grads_and_metrics(model, tok, samples, shared_prefix=True, **opts)
        assert trainer.share_prefix  # the probe accepted the tiny Llama
        assert m_shared["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
        for key in ("entropy", "logprob_mismatch", "gen_tokens", "seq_tokens"):
            assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-5, abs=1e-6), key
        assert g_shared.keys() == g_plain.keys() and len(g_plain) > 0
        for name, g in g_plain.items():
            assert (g_shared[name] - g).abs().max() <= 1e-5 * max(g.abs().max(), 1e-8), name
    # the shared batch really ran fewer positions through the model
    _, m_plain, _ = grads_and_metrics(model, tok, shared_batch(), shared_prefix=False, micro_batch_size=micro)
    _, m_shared, _ = grads_and_metrics(model, tok, shared_batch(), shared_prefix=True, micro_batch_size=micro)
    assert m_shared["forward_tokens"] < m_plain["forward_tokens"]


def test_shared_prefix_with_a_kl_reference(tiny):
    model, tok = tiny
    opts = {"micro_batch_size": 2, "kl_coef": 0.1}
    samples = shared_batch()
    # a reference that differs from the trained model, so the k3 term has a gradient
    g_plain, m_plain, _ = grads_and_metrics(model, tok, samples, shared_prefix=False, **opts)
    g_shared, m_shared, _ = grads_and_metrics(model, tok, samples, shared_prefix=True, **opts)
    assert m_shared["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    for name, g in g_plain.items():
        assert torch.allclose(g_shared[name], g, atol=1e-5 * float(g.abs().max()) + 1e-9), name


def _positions(model) -> list[int]:
    """A counter of the token positions ``model`` runs (its embedding's input)."""
    seen = [0]
    model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: seen.__setitem__(0, seen[0] + args[0].numel())
    )
    return seen


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_kl_reference_shares_the_prefix_as_the_policy_does(tiny, kl_coef):
    """The reference runs the step's shared prefix once, as the policy does: the same positions
    as the policy's forward, and the same kl_ref (and loss) as without sharing, against a
    reference that differs from the trained model."""
    model, tok = tiny
    opts = {"micro_batch_size": 2, "kl_coef": kl_coef, "log_kl_ref": True, "shared_prefix_min_tokens": 1}
    results = {}
    for shared in (False, True):
        trainer = Trainer(copy.deepcopy(model), tok, TrainerConfig(lr=1e-3, shared_prefix=shared, **opts))
        with torch.no_grad():
            for p in trainer.ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        policy, ref = _positions(trainer.model), _positions(trainer.ref_model)
        stats = trainer.accumulate_gradients(shared_batch(), num_chains=3).as_metrics()
        results[shared] = (stats, policy[0], ref[0])
    (plain, plain_policy, plain_ref), (shared, shared_policy, shared_ref) = results[False], results[True]
    assert plain["kl_ref"] > 1e-3 and shared["kl_ref"] == pytest.approx(plain["kl_ref"], rel=1e-5)
    assert shared["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    # 3 micro-batches: the 40-token system prompt once for both (it was run 3 times by the reference)
    assert shared_ref == shared_policy < plain_ref == plain_policy


def test_the_kl_reference_projects_only_the_generated_tokens(tiny):
    """The reference (a full copy) gets its logprobs through a chunked LM head, as the policy does:
    its head projects the generated tokens only, not every position of the trained window (the
    observations between turns included) into (B, T, V) logits; kl_ref and loss are the plain path's."""
    model, tok = tiny
    results = {}
    for chunked in (False, True):
        opts = {"micro_batch_size": 2, "kl_coef": 0.1, "log_kl_ref": True, "chunked_head": chunked}
        opts |= {"shared_prefix": False}  # no prefix runs (each projects its last position)
        trainer = Trainer(copy.deepcopy(model), tok, TrainerConfig(lr=1e-3, **opts))
        with torch.no_grad():
            for p in trainer.ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        rows = [0]
        trainer.ref_model.get_output_embeddings().register_forward_hook(
            lambda m, args, out, rows=rows: rows.__setitem__(0, rows[0] + args[0].shape[:-1].numel())
        )
        results[chunked] = (trainer.accumulate_gradients(shared_batch(), num_chains=3).as_metrics(), rows[0])
    (plain, plain_rows), (chunked, chunked_rows) = results[False], results[True]
    assert chunked["kl_ref"] > 1e-3 and chunked["kl_ref"] == pytest.approx(plain["kl_ref"], rel=1e-5)
    assert chunked["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert chunked_rows == chunked["gen_tokens"] == 25 < plain_rows  # shared_batch's 25 generated tokens


def test_a_lora_reference_shares_the_prefix_too(tiny):
    """LoRA: the reference is the base model (adapters off), through the same embedding; with
    the adapters moved, sharing keeps kl_ref, and the reference runs the positions the policy
    does (twice those of the same step without the KL)."""
    from sage_rl.train.config import LoraConfig

    model, tok = tiny
    results = {}
    for shared, kl in ((False, True), (True, True), (True, False)):
        opts = {
            "micro_batch_size": 2,
            "log_kl_ref": kl,
            "shared_prefix_min_tokens": 1,
            "shared_prefix": shared,
        }
        trainer = Trainer(
            copy.deepcopy(model), tok, TrainerConfig(lr=1e-3, lora=LoraConfig(r=4, alpha=8), **opts)
        )
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        seen = _positions(trainer.model)
        results[shared, kl] = (
            trainer.accumulate_gradients(shared_batch(), num_chains=3).as_metrics(),
            seen[0],
        )
    (plain, plain_seen), (shared, shared_seen) = results[False, True], results[True, True]
    assert plain["kl_ref"] > 1e-4 and shared["kl_ref"] == pytest.approx(plain["kl_ref"], rel=1e-5)
    assert shared_seen == 2 * results[True, False][1] < plain_seen


def test_prefix_lengths_by_hand():
    assert common_prefix_len([[1, 2, 3, 4], [1, 2, 3], [1, 2, 9, 9]]) == 2
    assert common_prefix_len([[1, 2], [3]]) == 0
    assert common_prefix_len([]) == 0
    # common prefix 4, but sample 2 is trained from index 3: its suffix must start at index 2
    ids = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7]]
    assert shareable_len(ids, [[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]) == 2
    # a sample without trained tokens keeps its last two tokens
    assert shareable_len([[1, 2, 3, 4], [1, 2, 3, 4, 5]], [[0, 0, 0, 0], [0, 0, 0, 0, 1]]) == 2
    assert shareable_len([[1, 2], [1, 2, 3]], [[0, 1], [0, 0, 1]]) == 0


def test_collate_cuts_the_shared_prefix_and_refuses_a_false_one():
    samples = [PreparedSample.of(s) for s in shared_batch()[:3]]
    n = shareable_len([s.ids for s in samples], [s.mask for s in samples])
    assert n == 69  # 70 prompt tokens shared; the last one stays: its output predicts token 70
    b = collate(samples, 0, torch.device("cpu"), prefix_len=n)
    assert b.prefix_ids == tuple(SYSTEM + TASK_A[:-1])
    assert b.ids_BT[0, :3].tolist() == [229, 7, 8]
    assert b.target_BT[0, :2].tolist() == [7, 8] and b.mask_BT[0, :2].tolist() == [1.0, 1.0]
    assert b.attn_full_BT.shape == (3, 69 + b.ids_BT.shape[1])
    assert b.seq_tokens == sum(len(s.ids) for s in samples)
    with pytest.raises(ValueError, match="do not share their first 71 tokens"):
        collate(samples, 0, torch.device("cpu"), prefix_len=71)


def test_tis_in_the_trainer(tiny):
    """Sampler logprobs of make_sample are -1.0; the tiny model's are ~ -10.8, so exp(old - sampler)
    ~ 5e-5: a cap of 1e-6 binds on every token and scales the whole gradient by 1e-6; a cap of 1e9
    binds nowhere."""
    model, tok = tiny
    samples = shared_batch()
    g_off, m_off, _ = grads_and_metrics(model, tok, samples, micro_batch_size=2)
    g_cap, m_cap, _ = grads_and_metrics(model, tok, samples, micro_batch_size=2, tis_cap=1e-6)
    assert m_off["tis_weight_mean"] == 1.0 and m_off["tis_capped_frac"] == 0.0
    assert m_cap["tis_weight_mean"] == pytest.approx(1e-6) and m_cap["tis_capped_frac"] == 1.0
    for name, g in g_off.items():
        assert torch.allclose(g_cap[name], 1e-6 * g, rtol=1e-4, atol=1e-12), name
    _, m_free, _ = grads_and_metrics(model, tok, samples, micro_batch_size=2, tis_cap=1e9)
    assert m_free["tis_capped_frac"] == 0.0
    assert 1e-6 < m_free["tis_weight_mean"] < 1e-3
