"""Segment attention for packed SFT rows (train/segments.py): the layouts by hand, and the loss and
every gradient equal to the dense-mask computation on rows with a shared head, plain packing and
padding, in one batch."""

from __future__ import annotations

import copy

import pytest
import torch

from sage_rl.train.segments import RowLayout, layouts, segment_attention
from sage_rl.train.sft import forward_loss_sum
from sage_rl.train.sft_data import Encoded, collate


def test_layouts_by_hand():
    segment = torch.tensor(
        [
            [-2, -2, -2, 0, 0, 1, 1, 1, -1],  # head 3, two examples, one pad
            [0, 0, 0, 0, 1, 1, 2, -1, -1],  # plain packing: no head
            [0, 0, 0, 0, 0, 0, 0, 0, 0],  # one example, no padding
        ]
    )
    assert layouts(segment) == (
        RowLayout(3, ((3, 5), (5, 8))),
        RowLayout(0, ((0, 4), (4, 6), (6, 7))),
        RowLayout(0, ((0, 9),)),
    )


def _encoded(head: tuple[int, ...], tails: list[tuple[int, ...]]) -> list[Encoded]:
    # each example trains on its tail after its first token
    return [Encoded((*head, *t), (0,) * (len(head) + 1) + (1,) * (len(t) - 1)) for t in tails]


def test_segment_attention_gives_the_dense_masks_loss_and_gradients(tiny):
    g = torch.Generator().manual_seed(0)
    ids = lambda n: tuple(int(x) for x in torch.randint(5, 4000, (n,), generator=g))  # noqa: E731
    shared = _encoded(ids(20), [ids(7), ids(11), ids(5)])  # a shared 20-token head, three examples
    plain = [Encoded(ids(9), (0, 0, *[1] * 7)), Encoded(ids(6), (0, 1, 1, 1, 1, 1))]  # no head
    batch = collate([shared, plain], pad_id=0, share=True)
    lay = layouts(batch.segment_BT)
    assert lay[0].head == 20 and len(lay[0].spans) == 3 and lay[1].head == 0 and len(lay[1].spans) == 2
    assert lay[1].spans[-1][1] < batch.input_ids_BT.shape[1]  # the second row is padded
    results = {}
    for attention in ("dense", "segments"):
        model = copy.deepcopy(tiny[0])
        loss = forward_loss_sum(model, batch, attention)
        loss.backward()
        results[attention] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (l_dense, g_dense), (l_seg, g_seg) = results["dense"], results["segments"]
    assert l_seg == pytest.approx(l_dense, rel=1e-5)
    for name, grad in g_dense.items():
        assert (g_seg[name] - grad).abs().max() <= 1e-5 * grad.abs().max() + 1e-9, name
    assert model.config._attn_implementation != "sage_segments"  # switched back after the forward


def test_segment_attention_needs_its_layouts():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="layouts"):
        segment_attention(None, q, q, q, None)


def test_chunked_loss_gives_the_full_logits_sum_and_gradients():
    """chunked_nll_sum (logits recomputed per chunk in the backward pass) = nll_sum over all the
    logits at once: the sum, and the gradients of the head and of the hidden states."""
    from sage_rl.train.sft_data import IGNORE, chunked_nll_sum, nll_sum

    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(6, 11, bias=True)
    hidden = torch.randn(2, 7, 6, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (2, 7), generator=g)
    targets[0, 2] = targets[1, 6] = IGNORE
    full = nll_sum(head(hidden), targets)
    grads_full = torch.autograd.grad(full, [head.weight, head.bias, hidden])
    chunked = chunked_nll_sum(hidden, head, targets, chunk=3)  # chunks of 3, 3 and 1 positions
    grads_chunked = torch.autograd.grad(chunked, [head.weight, head.bias, hidden])
    assert chunked.item() == pytest.approx(full.item(), rel=1e-6)
    for a, b in zip(grads_full, grads_chunked, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    with torch.no_grad():
        assert chunked_nll_sum(hidden, head, targets, chunk=2).item() == pytest.approx(full.item(), rel=1e-6)


def test_a_capped_head_keeps_the_models_own_logits(tiny, monkeypatch):
    """Where the model post-processes its logits (softcapping), the loss comes from its own forward."""
    from sage_rl.train import sft as sft_mod

    model = tiny[0]
    assert isinstance(sft_mod.plain_head(model), torch.nn.Linear)
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    assert sft_mod.plain_head(model) is None
