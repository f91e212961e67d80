"""RL training attention through one causal mask per forward (sage_rl/train/causal.py) and
micro-batches capped by padded tokens: the same loss and gradients as transformers' padding-mask
path, and a forward that keeps one mask, not one per layer."""

from __future__ import annotations

import copy

import pytest
import torch
from test_prefix import grads_and_metrics as _run
from test_prefix import shared_batch, unshared_batch
from test_trainer import make_sample

from sage_rl.train import causal
from sage_rl.train.batch import PreparedSample, collate, micro_batches
from sage_rl.train.trainer import Trainer, TrainerConfig

INF = float("-inf")


def test_the_mask_by_hand():
    """Two queries at the last two of four positions: the first sees keys 0-2, the second all four."""
    got = causal.causal_mask(2, 4, torch.float32, torch.device("cpu"))
    assert got.tolist() == [[0.0, 0.0, 0.0, INF], [0.0, 0.0, 0.0, 0.0]]
    assert causal.causal_mask(3, 3, torch.float32, torch.device("cpu")).tolist() == [
        [0.0, INF, INF],
        [0.0, 0.0, INF],
        [0.0, 0.0, 0.0],
    ]


@pytest.mark.parametrize("micro", [2, 6])
@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("chunked_head", [True, False])
def test_causal_attention_gives_the_padding_masks_loss_and_gradients(tiny, micro, shared_prefix, chunked_head):
    """Right-padded micro-batches of samples of different lengths (with and without a prefix
    cache, the chunked head and the plain logits), the KL reference measured too."""
    model, tok = tiny
    opts = {
        "micro_batch_size": micro,
        "shared_prefix": shared_prefix,
        "chunked_head": chunked_head,
        "log_kl_ref": True,
    }
    for samples in (shared_batch(), unshared_batch()):
        g_hf, m_hf, t_hf = _run(model, tok, samples, causal_attention=False, **opts)
        g_ours, m_ours, t_ours = _run(model, tok, samples, causal_attention=True, **opts)
        assert t_ours.causal and not t_hf.causal  # the probe accepted the tiny Llama
        for key in ("loss", "entropy", "logprob_mismatch", "kl_ref"):
            assert m_ours[key] == pytest.approx(m_hf[key], rel=1e-5, abs=1e-6), key
        assert g_ours.keys() == g_hf.keys() and len(g_hf) > 0
        for name, g in g_hf.items():
            assert (g_ours[name] - g).abs().max() <= 1e-5 * max(g.abs().max(), 1e-8), name


def _saved_masks(trainer, batch):
    """Bytes of the distinct tensors shaped like an attention mask over ``batch`` that the
    forward keeps for backward (a float (T, L) mask, or a (B, 1, T, L) one per layer)."""
    T = batch.ids_BT.shape[1]
    kept: dict[int, int] = {}

    def pack(t):
        if tuple(t.shape[-2:]) == (T, T) and t.dtype == torch.float32:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.model.train()
        trainer._logprobs(trainer.model, batch, with_entropy=False)
    return sum(kept.values())


def test_a_forward_keeps_one_mask_not_one_per_layer(tiny):
    model, tok = tiny
    samples = [PreparedSample.of(s) for s in unshared_batch()]
    batch = collate(samples, 0, torch.device("cpu"))
    B, T = batch.ids_BT.shape
    layers = model.config.num_hidden_layers
    ours = Trainer(copy.deepcopy(model), tok, TrainerConfig(shared_prefix=False))
    hf = Trainer(copy.deepcopy(model), tok, TrainerConfig(shared_prefix=False, causal_attention=False))
    assert _saved_masks(ours, batch) == T * T * 4  # one float (T, T) mask for every layer
    assert _saved_masks(hf, batch) == layers * B * T * T * 4  # torch's own float copy per layer


def test_a_model_with_a_sliding_window_keeps_its_own_attention():
    """Mistral with a window shorter than the probe: ``causal_attention`` refuses it (the window
    would be ignored), so the trainer keeps transformers' path."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=3,
        attn_implementation="sdpa",
    )
    model = MistralForCausalLM(config)
    assert not causal.supported(model, torch.device("cpu"))
    assert model.config._attn_implementation == "sdpa"  # switched back


def test_micro_batches_capped_by_padded_tokens():
    def sample(n):
        return PreparedSample(tuple(range(n)), (0,) + (1,) * (n - 1), (0.0,) * n, 1.0)

    samples = [sample(n) for n in (6, 10, 3, 5)]
    lengths = [[len(s.ids) for s in chunk] for chunk in micro_batches(samples, 2)]
    assert lengths == [[10, 6], [5, 3]]
    # 10 + its partner would be 2 x 10 = 20 padded tokens > 12: alone; 6 and 5 pad to 12
    lengths = [[len(s.ids) for s in chunk] for chunk in micro_batches(samples, 2, max_tokens=12)]
    assert lengths == [[10], [6, 5], [3]]
    lengths = [[len(s.ids) for s in chunk] for chunk in micro_batches(samples, 3, max_tokens=5)]
    assert lengths == [[10], [6], [5], [3]]  # each longer than the cap runs alone


def test_capped_micro_batches_give_the_same_gradients(tiny):
    model, tok = tiny
    long = make_sample([1, 2, 3], [(list(range(10, 40)), [5, 6]), (list(range(40, 60)), [])], 1.0)
    samples = [*unshared_batch(), long]
    g_one, m_one, _ = _run(model, tok, samples, micro_batch_size=4)
    g_cap, m_cap, _ = _run(model, tok, samples, micro_batch_size=4, micro_batch_tokens=30)
    assert m_cap["loss"] == pytest.approx(m_one["loss"], rel=1e-5, abs=1e-6)
    for name, g in g_one.items():
        assert (g_cap[name] - g).abs().max() <= 1e-5 * max(g.abs().max(), 1e-8), name
