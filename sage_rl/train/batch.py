"""Training tensors from samples: the exact token arrays of each sample, padded into micro-batches.

Layout of a micro-batch of B sequences right-padded to length T. ``f`` is the first position
that any sequence of the micro-batch trains on (mask = 1); logits are asked for positions f-1 ..
T-1 only (``logits_to_keep``), and logits at t predict the token at t + 1. So every ``_BT`` tensor
of the trained window has T - f columns, aligned with ``target_BT = ids_BT[:, f:]``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from sage_rl.types import Sample


@dataclass(frozen=True)
class PreparedSample:
    """One sample's exact token arrays and advantage, checked."""

    ids: list[int]
    mask: list[int]
    sampler_logprobs: list[float]
    advantage: float

    @classmethod
    def of(cls, s: Sample) -> PreparedSample:
        ids, mask, lps = s.trajectory.token_arrays()
        task = s.trajectory.task.task_id
        if not (len(ids) == len(mask) == len(lps)):
            raise ValueError(f"sample of task {task}: ids, mask and logprobs differ in length")
        if not ids or mask[0]:
            raise ValueError(f"sample of task {task}: empty prompt (the first token cannot be trained)")
        return cls(ids, mask, lps, float(s.advantage))

    @property
    def opening(self) -> tuple[int, ...]:
        """The tokens before the first generated one (the rendered prompt)."""
        return tuple(self.ids[: self.mask.index(1)] if 1 in self.mask else self.ids)

    def suffix(self, start: int) -> PreparedSample:
        """The sample from token ``start`` on (itself when ``start`` is 0)."""
        if not start:
            return self
        return PreparedSample(
            self.ids[start:], self.mask[start:], self.sampler_logprobs[start:], self.advantage
        )


@dataclass(frozen=True)
class TokenBatch:
    ids_BT: torch.Tensor  # whole sequences, right-padded with pad_id
    attn_BT: torch.Tensor  # 1 on real tokens, 0 on padding
    target_BT: torch.Tensor  # ids_BT[:, f:], the tokens whose logprobs are computed
    mask_BT: torch.Tensor  # loss mask over target_BT: 1 on generated tokens only
    sampler_logp_BT: torch.Tensor  # the sampler's logprobs over target_BT (0 off the mask)
    adv_B: torch.Tensor
    logits_to_keep: int  # T - f + 1
    seq_tokens: int  # real (non-pad) tokens of the whole samples, prefix included
    prefix_ids: tuple[int, ...] = ()  # the opening every sample shares, cut off ids_BT

    @property
    def attn_full_BT(self) -> torch.Tensor:
        """The attention mask over prefix + suffix (what the model is given with a prefix cache)."""
        if not self.prefix_ids:
            return self.attn_BT
        ones = torch.ones((self.attn_BT.shape[0], len(self.prefix_ids)), dtype=self.attn_BT.dtype)
        return torch.cat([ones.to(self.attn_BT.device), self.attn_BT], dim=1)

    @property
    def gen_tokens(self) -> int:
        return int(self.mask_BT.sum().item())


def micro_batches(
    samples: Sequence[PreparedSample], size: int, by_prompt: bool = False, max_tokens: int | None = None
) -> list[list[PreparedSample]]:
    """Chunks of at most ``size``, longest first, so that sequences of similar length are padded
    together. ``by_prompt``: samples with the same opening (the tokens before their first generated
    one) are kept together first (so a micro-batch is a GRPO group and shares its prompt), longest
    first within it. ``max_tokens``: a chunk also holds at most that many padded tokens (its
    samples times its longest; a longer sample is a chunk of its own)."""
    if by_prompt:
        ordered = sorted(samples, key=lambda s: (s.opening, -len(s.ids)))
    else:
        ordered = sorted(samples, key=lambda s: len(s.ids), reverse=True)
    chunks: list[list[PreparedSample]] = []
    for s in ordered:
        last = chunks[-1] if chunks else None
        longest = max(len(s.ids), *(len(x.ids) for x in last)) if last else 0
        if last and len(last) < size and (max_tokens is None or (len(last) + 1) * longest <= max_tokens):
            last.append(s)
        else:
            chunks.append([s])
    return chunks


def grouped_micro_batches(
    keyed: Sequence[tuple[PreparedSample, Hashable]],
    size: int,
    by_prompt: bool = False,
    max_tokens: int | None = None,
) -> tuple[list[list[PreparedSample]], set[int]]:
    """``micro_batches`` of each group's samples (``keyed``: sample, group) in turn, in the order the
    groups first appear, and the indices of the chunks that end a group (``trainer.noise_scale``)."""
    chunks: list[list[PreparedSample]] = []
    ends: set[int] = set()
    for key in dict.fromkeys(k for _, k in keyed):
        chunks += micro_batches([p for p, k in keyed if k == key], size, by_prompt, max_tokens)
        ends.add(len(chunks) - 1)
    return chunks, ends


def collate(
    samples: Sequence[PreparedSample], pad_id: int, device: torch.device, prefix_len: int = 0
) -> TokenBatch:
    """Right-pad ``samples`` into one ``TokenBatch`` (nothing is truncated). ``prefix_len``: cut off
    that many opening tokens, which every sample must share (ValueError otherwise)."""
    prefix = tuple(samples[0].ids[:prefix_len])
    if any(tuple(s.ids[:prefix_len]) != prefix for s in samples):
        raise ValueError(f"collate: the samples do not share their first {prefix_len} tokens")
    full = samples
    samples = [s.suffix(prefix_len) for s in samples]
    T = max(len(s.ids) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    lps = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
        lps[i, :n] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    trained_cols = mask.sum(0).nonzero()
    f = int(trained_cols[0].item()) if len(trained_cols) else T - 1  # no generated token: a 1-column window
    return TokenBatch(
        ids_BT=ids.to(device),
        attn_BT=attn.to(device),
        target_BT=ids[:, f:].to(device),
        mask_BT=mask[:, f:].to(device),
        sampler_logp_BT=lps[:, f:].to(device),
        adv_B=torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
        logits_to_keep=T - f + 1,
        seq_tokens=sum(len(s.ids) for s in full),
        prefix_ids=prefix,
    )
