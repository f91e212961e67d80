"""Frozen bottom layers (sage_rl/train/freeze.py, ``optim.freeze_layers``): what trains gets
exactly the full backward's gradient, nothing below the frozen layers gets one, and SFT leaves the
frozen layers' weights as they were."""

import copy

import pytest
import torch

from sage_rl.agent.render import ChatRenderer
from sage_rl.train.freeze import frozen_bottom
from sage_rl.train.sft import train_sft
from tests.test_sft import config, examples


def _grads(model, ids, n: int) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    with frozen_bottom(m, n):
        m(input_ids=ids, labels=ids).loss.backward()
    assert all(p.requires_grad for p in m.parameters())  # restored on exit
    return {k: p.grad for k, p in m.named_parameters() if p.grad is not None}


def test_the_top_layers_get_the_full_gradient_and_nothing_below_gets_one(tiny):
    model, _ = tiny
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    full, frozen = _grads(model, ids, 0), _grads(model, ids, 1)
    assert not [k for k in frozen if "layers.0." in k]  # the frozen layer: no gradient at all
    top = [k for k in full if "layers.1." in k or k == "model.norm.weight"]
    assert len(top) == 10 and set(top) <= set(frozen)  # layer 1: 7 projections, 2 norms; the final norm
    for k in top:
        torch.testing.assert_close(frozen[k], full[k], rtol=0, atol=0)  # the same backward, bit for bit
    emb = "model.embed_tokens.weight"  # tied to the head: it trains through the head only
    assert model.config.tie_word_embeddings and emb in frozen
    assert not torch.equal(frozen[emb], full[emb])  # no gradient reached it through the decoder


def test_freeze_layers_must_leave_a_layer_to_train(tiny):
    model = copy.deepcopy(tiny[0])
    match = r"optim.freeze_layers=2: the model has 2 decoder layers, so 0 to 1"
    with pytest.raises(ValueError, match=match), frozen_bottom(model, 2):
        pass


def test_sft_leaves_the_frozen_layers_as_they_were(tiny, tmp_path):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = config(tmp_path, optim={"max_steps": 2, "lr": 1e-2, "grad_accum": 1, "freeze_layers": 1})
    trained, result = train_sft(
        model, tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False
    )
    after = trained.state_dict()
    assert result.steps == 2
    assert all(torch.equal(after[k], before[k]) for k in before if ".layers.0." in k)
    assert not torch.equal(
        after["model.layers.1.mlp.up_proj.weight"], before["model.layers.1.mlp.up_proj.weight"]
    )
    assert all(p.requires_grad for p in trained.parameters())
    out = trained.get_input_embeddings()(torch.tensor([[1, 2]]))
    assert out.requires_grad  # the hook that stopped the gradient is gone


def test_freezing_reaches_through_lora_adapters(tiny, tmp_path):
    """With LoRA the frozen layers' adapters stay as they were; the top layer's train."""
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    cfg = config(
        tmp_path,
        optim={"max_steps": 2, "lr": 1e-2, "grad_accum": 1, "freeze_layers": 1},
        lora={"enabled": True, "r": 4, "dropout": 0.0, "merge": False},
    )
    trained, _ = train_sft(model, tok, examples(), cfg, ChatRenderer(tok).conversation, show_progress=False)
    lora_b = {k: v for k, v in trained.state_dict().items() if "lora_B" in k}
    assert lora_b and all(torch.count_nonzero(v) == 0 for k, v in lora_b.items() if ".layers.0." in k)
    assert any(torch.count_nonzero(v) > 0 for k, v in lora_b.items() if ".layers.1." in k)  # B starts at 0
