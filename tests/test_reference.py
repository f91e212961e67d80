"""The full trainer agrees with the one-file reference GRPO step (STYLE.md, principle 8): the same
loss, the same gradient and the same updated weights, on the tiny model, with micro-batches and
the chunked LM head (the trainer's defaults) on."""

from __future__ import annotations

import copy

import pytest
import torch
from test_trainer import make_sample

from sage_rl.train.reference import grpo_step
from sage_rl.train.trainer import Trainer, TrainerConfig

LR = 1e-3


def batch():
    """Two chains of K = 2 tasks: multi-turn episodes with observations, different lengths."""
    return [
        make_sample([1, 5, 6, 9], [([7, 8, 9], [10, 11]), ([12, 13], [14])], 1.5, "a_1", 0),
        make_sample([1, 5], [([20, 21, 22, 23], [])], -0.5, "a_2", 1),
        make_sample([1, 5, 6], [([30], [31, 32, 33]), ([34, 35], [])], -1.0, "a_1", 0),
        make_sample([1, 7, 8, 9, 10], [([40, 41], [])], 0.25, "a_2", 1),
    ]


def reference(model, tok, optimizer, grad_clip):
    return grpo_step(model, optimizer, batch(), num_chains=2, pad_id=tok.pad_token_id, grad_clip=grad_clip)


@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_trainer_step_equals_the_reference_step(tiny, micro_batch_size):
    model, tok = tiny
    cfg = TrainerConfig(lr=LR, grad_clip=0.5, micro_batch_size=micro_batch_size, seed=0)
    trainer = Trainer(copy.deepcopy(model), tok, cfg, device="cpu")
    assert trainer.head is not None  # the chunked head is what is checked against full logits

    # the gradient, before any clipping: the reference with a no-op optimizer and no clip
    grad_trainer = Trainer(copy.deepcopy(model), tok, cfg, device="cpu")
    grad_trainer.accumulate_gradients(batch(), num_chains=2)
    grad_model = copy.deepcopy(model)
    reference(grad_model, tok, torch.optim.SGD(grad_model.parameters(), lr=0.0), grad_clip=1e9)
    ours = dict(grad_trainer.model.named_parameters())
    for name, p in grad_model.named_parameters():
        # float32 sums in another order (tiles, micro-batches): agreement to 1e-4 of the tensor's scale
        assert (ours[name].grad - p.grad).abs().max() <= 1e-4 * p.grad.abs().max(), name

    # one whole step: loss and updated weights
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=LR, betas=cfg.betas, weight_decay=cfg.weight_decay)
    stats = trainer.step(batch(), num_chains=2)
    ref_loss = reference(ref_model, tok, ref_opt, cfg.grad_clip)
    # on-policy every ratio is 1, so L = -(1 / chains) * sum_i A_i = -(1.5 - 0.5 - 1.0 + 0.25) / 2
    assert ref_loss == pytest.approx(-0.125, abs=1e-6)
    assert stats["loss"] == pytest.approx(ref_loss, abs=1e-6)
    ours, before = trainer.model.state_dict(), model.state_dict()
    for name, w in ref_model.state_dict().items():
        # AdamW's first step moves a weight by about LR whatever its gradient's size, so a wrong
        # gradient shows as a difference of order LR; agreement is to 5% of that
        assert torch.allclose(ours[name], w, atol=0.05 * LR, rtol=0), name
        assert not torch.equal(w, before[name]), name  # every tensor was trained
