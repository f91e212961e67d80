"""Lean activations (sage_rl/train/lean.py, issue 32): the same forward to the bit, the same
gradients up to rounding, and exactly the bytes worked out by hand no longer kept for backward."""

import copy

import pytest
import torch

from sage_rl.train.lean import lean_activations, switchable


def _run(model, ids, lean: bool):
    """(hidden, parameter grads, bytes autograd kept, modules switched) of one decoder forward and
    backward of ``sum(hidden * w)``."""
    m = copy.deepcopy(model)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    with lean_activations(m, lean) as n, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = m.get_decoder()(input_ids=ids).last_hidden_state
    w = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
    (hidden * w).sum().backward()
    grads = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
    return hidden.detach(), grads, sum(kept.values()), n, m


def test_lean_keeps_exactly_the_hand_counted_bytes_less_with_the_same_numbers(tiny):
    model, _ = tiny
    cfg = model.config
    T = 37
    ids = torch.randint(0, 1000, (1, T), generator=torch.Generator().manual_seed(0))
    h0, g0, b0, n0, _ = _run(model, ids, lean=False)
    h1, g1, b1, n1, m1 = _run(model, ids, lean=True)
    L, H, W = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    assert (n0, n1) == (0, L + 2 * L + 1)  # every MLP, both norms of each layer and the final norm
    assert torch.equal(h0, h1)  # the module's own forward, op for op
    assert g0.keys() == g1.keys()
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6 * float(g0[k].abs().max()), msg=k)
    # Not kept per token: silu(gate) and silu(gate) * up in each MLP (2 W floats, W the MLP width), the normalised
    # input of each norm (H floats; 2 a layer and the final one), 4 bytes each.
    assert b0 - b1 == T * 4 * (L * (2 * W + 2 * H) + H)
    assert not any("forward" in vars(m) for m in m1.modules())  # the block restores every module


def test_lean_is_off_where_the_module_is_not_what_it_assumes(tiny):
    model, _ = tiny
    m = copy.deepcopy(model)
    mlp = m.get_decoder().layers[0].mlp
    mlp.up_proj = torch.nn.Linear(mlp.up_proj.in_features, mlp.up_proj.out_features, bias=True)
    switched = {id(x) for x, _ in switchable(m)}
    assert id(mlp) not in switched and id(m.get_decoder().layers[1].mlp) in switched
    ids = torch.randint(0, 1000, (1, 9), generator=torch.Generator().manual_seed(2))
    with lean_activations(m) as n:
        out = m.get_decoder()(input_ids=ids).last_hidden_state
    assert n == len(switched) and torch.equal(out, m.get_decoder()(input_ids=ids).last_hidden_state)


@pytest.mark.parametrize("need", ["input", "weights"])
def test_lean_gradients_for_frozen_weights_or_a_frozen_input(tiny, need):
    """Only the gradients asked for are computed, and they are the module's own."""
    model, _ = tiny
    mlp = copy.deepcopy(model.get_decoder().layers[0].mlp)
    x = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    x.requires_grad_(need == "input")
    for p in mlp.parameters():
        p.requires_grad_(need == "weights")
    outs = []
    for lean in (False, True):
        for p in [x, *mlp.parameters()]:
            p.grad = None
        with lean_activations(mlp, lean):
            mlp(x).pow(2).sum().backward()
        outs.append([t.grad for t in [x, *mlp.parameters()]])
    for a, b in zip(*outs, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lean", [True, False])
def test_the_trainer_and_sft_run_lean_when_asked(tiny, monkeypatch, lean):
    """``trainer.lean_activations`` and ``optim.lean_activations`` reach the forward passes that
    train (counted by the MLP function's calls), and the gradients do not depend on them."""
    from sage_rl.train import lean as lean_mod
    from sage_rl.train.sft import forward_loss_sum
    from sage_rl.train.sft_data import collate, encode_example, make_rows
    from sage_rl.train.trainer import Trainer, TrainerConfig
    from tests.test_trainer import batch

    calls = []
    real = lean_mod.SwiGLU.forward

    def counted(ctx, *a):
        calls.append(1)
        return real(ctx, *a)

    monkeypatch.setattr(lean_mod.SwiGLU, "forward", staticmethod(counted))
    model, tok = tiny
    tr = Trainer(copy.deepcopy(model), None, TrainerConfig(lean_activations=lean, micro_batch_size=5))
    tr.accumulate_gradients(batch(), num_chains=2)
    layers = model.config.num_hidden_layers
    assert len(calls) == (layers if lean else 0)
    grads = torch.cat([p.grad.flatten() for p in tr.model.parameters()])
    ref = Trainer(copy.deepcopy(model), None, TrainerConfig(lean_activations=not lean, micro_batch_size=5))
    ref.accumulate_gradients(batch(), num_chains=2)
    torch.testing.assert_close(grads, torch.cat([p.grad.flatten() for p in ref.model.parameters()]))

    from sage_rl.agent.render import ChatRenderer
    from sage_rl.data.records import ChatExample, Message

    calls.clear()
    ex = ChatExample(messages=(Message("user", "hi"), Message("assistant", "x = 1")), scenario_id="s")
    enc = [encode_example(ChatRenderer(tok).conversation, ex)]
    m = copy.deepcopy(model)
    forward_loss_sum(m, collate(make_rows(enc, True, 64, True)[0:1], tok.eos_token_id, True), lean=lean)
    assert len(calls) == (layers if lean else 0)
