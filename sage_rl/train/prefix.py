"""Shared-prefix training: the opening tokens that samples share are run through the model once.

The G chains of a GRPO group start from the same rendered prompt (system prompt + task, ~800
tokens on PocketWorld), and every sample of a batch starts with the same system prompt. The
decoder's keys/values at a position depend only on the tokens up to it, so for samples that share
their first P tokens those keys/values are the same tensor. ``prefix_kv`` computes them once (batch
of one, with grad); the suffixes of the B samples then run with that cache expanded over the batch
(``as_cache``): each suffix token attends to the shared keys/values exactly as it would in its
own full sequence. Backward sums every suffix's gradient into the single prefix computation (the
expansion's gradient is a sum over the batch), so the loss and every parameter gradient equal
those of the plain per-sample forward up to float summation order (``tests/test_prefix.py``).

Two levels, as the trainer uses them:

- the batch's common prefix (``StepPrefix``): computed once per optimizer step; its keys/values
  are handed to each micro-batch as detached leaves, which collect the micro-batches' gradients,
  and one ``backward`` at the end of the step carries the sum through the prefix computation;
- a micro-batch's longer common prefix (the group's task prompt): computed once per micro-batch on
  top of the first, with the graph kept as usual.

The KL reference model (its k3 term in the loss, or only logged) runs the same two levels
(``RefPrefix``), so it costs what the policy's forward does, not a full prefix per micro-batch.

The split is only used when it reproduces the model's own output on a probe (``supported``),
like the chunked head: models whose attention is not a plain causal cache (sliding windows, ...)
fall back to the per-sample forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: per-layer (keys, values), each (batch, kv_heads, positions, head_dim)
KV = list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of ``seqs`` (0 for an empty list)."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n


def shareable_len(ids: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]) -> int:
    """The longest prefix the samples can share: their common prefix, cut so that every sample keeps
    in its suffix the position before its first trained token (whose output predicts it) and at
    least two tokens (a sample with no trained token keeps its last two)."""
    limit = min((m.index(1) if 1 in m else len(m) - 1) - 1 for m in masks)
    return max(0, min(common_prefix_len(ids), limit))


def prefix_kv(model: Any, ids: Sequence[int], device: torch.device, past: KV | None = None) -> KV:
    """Keys/values of every layer over ``ids`` (batch of one), continuing ``past`` when given.
    Graph-connected when grad is enabled."""
    ids_1P = torch.tensor([list(ids)], dtype=torch.long, device=device)
    out = model(input_ids=ids_1P, past_key_values=as_cache(past, 1), use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def as_cache(past: KV | None, batch: int) -> Any:
    """A fresh ``DynamicCache`` holding ``past`` expanded to ``batch`` rows (no copy until the
    model appends to it); None stays None."""
    if past is None:
        return None
    from transformers import DynamicCache

    return DynamicCache([(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in past])


def past_len(past: KV | None) -> int:
    return 0 if not past else int(past[0][0].shape[-2])


@dataclass
class StepPrefix:
    """The batch-wide shared prefix of one optimizer step (module docstring, first level)."""

    ids: tuple[int, ...]
    kv: KV  # graph-connected to the parameters
    leaves: KV  # detached copies that collect the micro-batches' gradients

    @property
    def past(self) -> KV:
        """What each micro-batch continues from: the leaves."""
        return self.leaves

    @classmethod
    def compute(cls, model: Any, ids: Sequence[int], device: torch.device) -> StepPrefix:
        kv = prefix_kv(model, ids, device)
        leaves = [(k.detach().requires_grad_(), v.detach().requires_grad_()) for k, v in kv]
        return cls(tuple(ids), kv, leaves)

    def backward(self, retain: bool = False) -> None:
        """Carry the gradient the micro-batches left on the leaves through the prefix computation,
        and clear the leaves. ``retain``: keep the prefix's graph for another call (a trainer that
        carries each group's share as it finishes: ``trainer.noise_scale``)."""
        pairs = [
            (t, leaf.grad)
            for (k, v), (lk, lv) in zip(self.kv, self.leaves, strict=True)
            for t, leaf in ((k, lk), (v, lv))
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs], retain_graph=retain)
        for lk, lv in self.leaves:
            lk.grad = lv.grad = None


@dataclass(frozen=True)
class RefPrefix:
    """The KL reference model's keys/values over the same shared prefix: computed once per step
    too, without grad (the reference does not train)."""

    ids: tuple[int, ...]
    past: KV  # what each micro-batch's reference forward continues from


#: the support probes' first tokens every row shares (``probe_batch``)
PROBE_PREFIX = [1, 2, 3, 4]


def probe_batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention mask)`` of the support probes: two rows that share ``PROBE_PREFIX``, then
    suffixes of 4 and 2 tokens (the second right-padded)."""
    ids = torch.tensor([[*PROBE_PREFIX, 5, 6, 7, 8], [*PROBE_PREFIX, 9, 10, 0, 0]], device=device)
    return ids, torch.tensor([[1] * 8, [1] * 6 + [0, 0]], device=device)


@torch.no_grad()
def supported(model: Any, device: torch.device) -> bool:
    """Whether prefix + suffix through the cache reproduces the plain forward on ``probe_batch``."""
    was_training = model.training
    model.eval()
    try:
        ids, attn = probe_batch(device)
        whole = model(input_ids=ids, attention_mask=attn).logits
        past = prefix_kv(model, PROBE_PREFIX, device)
        split = model(
            input_ids=ids[:, 4:], attention_mask=attn, past_key_values=as_cache(past, 2), use_cache=True
        ).logits
    except (TypeError, AttributeError, RuntimeError, ValueError):
        return False
    finally:
        model.train(was_training)
    return bool(
        torch.allclose(whole[0, 4:], split[0], atol=1e-4, rtol=1e-4)
        and torch.allclose(whole[1, 4:6], split[1, :2], atol=1e-4, rtol=1e-4)
    )
