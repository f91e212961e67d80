"""Token-level SFT data: encode chat examples with a loss mask, split, pack or pad into batches.

Masking rule (issue 7): a token carries loss exactly when it is one the policy generates at rollout
time in a trained assistant message: the message's content tokens and its end-of-turn token. The
system prompt, the task, observations, chat-template headers and untrained assistant messages carry
none. The ids and the mask come from ``ChatRenderer.conversation``, the same renderer the agent
loop uses, so SFT trains on the tokens the policy will produce.

Shared openings (``optim.shared_prefix`` with packing): the examples of a packed row that start
with the same tokens (the system prompt) keep one copy of them at the head of the row; each
example's remaining tokens attend to that copy and to themselves, with the positions they have in
the example. A row then computes exactly what its examples compute alone (tested), on fewer tokens.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from sage_rl.data.records import ChatExample, DatasetError
from sage_rl.train.prefix import shareable_len

#: shorter shared openings are not worth a row layout of their own
MIN_SHARED = 16

#: ``messages -> (ids, mask)`` with mask 1 on every assistant message's generated tokens.
Conversation = Callable[[list[dict[str, str]]], tuple[list[int], list[int]]]

IGNORE = -100  # label of tokens that carry no loss (torch's cross_entropy ignore_index)


@dataclass(frozen=True)
class Encoded:
    """One tokenised example. ``mask[t] = 1`` iff token t carries loss."""

    ids: tuple[int, ...]
    mask: tuple[int, ...]

    @property
    def num_trained(self) -> int:
        return sum(self.mask)


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of consecutive 1s in ``mask``, in order."""
    runs, start = [], None
    for t, m in enumerate([*mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def encode_example(conversation: Conversation, example: ChatExample) -> Encoded:
    """Tokenise ``example``; assistant messages with ``train=False`` get their mask zeroed.

    The renderer masks every assistant message, one run of 1s each, in order; the k-th run is the
    k-th assistant message. A renderer that does not give one run per assistant message is an
    error, not something to guess around.
    """
    ids, mask = conversation(example.chat())
    assistants = [m for m in example.messages if m.role == "assistant"]
    runs = mask_runs(mask)
    if len(runs) != len(assistants):
        raise DatasetError(
            f"example {example.task_id or '?'}: renderer gave {len(runs)} trained spans for "
            f"{len(assistants)} assistant messages"
        )
    out = list(mask)
    for (start, end), msg in zip(runs, assistants, strict=True):
        if not msg.train:
            out[start:end] = [0] * (end - start)
    return Encoded(tuple(ids), tuple(out))


def fit_length(encoded: Sequence[Encoded], max_length: int) -> tuple[list[Encoded], int]:
    """Truncate examples longer than ``max_length`` (keeping the start); drop those left with no
    trained token. Returns (kept, number truncated)."""
    kept, truncated = [], 0
    for e in encoded:
        if len(e.ids) > max_length:
            truncated += 1
            e = Encoded(e.ids[:max_length], e.mask[:max_length])
        if e.num_trained:
            kept.append(e)
    return kept, truncated


def split_by_scenario(
    examples: Sequence[ChatExample], eval_fraction: float, seed: int
) -> tuple[list[ChatExample], list[ChatExample]]:
    """(train, eval): whole scenarios are held out, so no scenario is in both.

    ``round(eval_fraction * n_scenarios)`` scenarios go to eval, at least one when the fraction is
    above 0 and at most all but one. Examples without a scenario id count as their own scenario.
    """
    key = [ex.scenario_id or f"task:{ex.task_id}:{i}" for i, ex in enumerate(examples)]
    groups = sorted(set(key))
    random.Random(seed).shuffle(groups)
    n_eval = min(max(1, round(eval_fraction * len(groups))), len(groups) - 1) if eval_fraction > 0 else 0
    held = set(groups[:n_eval])
    train = [ex for ex, k in zip(examples, key, strict=True) if k not in held]
    evals = [ex for ex, k in zip(examples, key, strict=True) if k in held]
    return train, evals


def pack(encoded: Sequence[Encoded], max_length: int) -> list[list[Encoded]]:
    """First-fit packing of whole examples into rows of at most ``max_length`` tokens."""
    rows: list[list[Encoded]] = []
    room: list[int] = []
    for e in encoded:
        for r, free in enumerate(room):
            if len(e.ids) <= free:
                rows[r].append(e)
                room[r] -= len(e.ids)
                break
        else:
            rows.append([e])
            room.append(max_length - len(e.ids))
    return rows


def shared_len(row: Sequence[Encoded]) -> int:
    """Tokens the examples of a packed row share at its head (0 for one example or < MIN_SHARED).
    Sharing stops before any example's first trained token (its predecessor's output is trained)."""
    if len(row) < 2:
        return 0
    n = shareable_len([e.ids for e in row], [e.mask for e in row])
    return n if n >= MIN_SHARED else 0


def row_length(row: Sequence[Encoded], share: bool) -> int:
    """Tokens of a packed row: the shared head once, then each example's remainder."""
    n = shared_len(row) if share else 0
    return n + sum(len(e.ids) - n for e in row)


def pack_shared(encoded: Sequence[Encoded], max_length: int) -> list[list[Encoded]]:
    """Packing for shared openings: examples in token order (those with the same opening next to
    each other), each added to the current row while the row, its shared head counted once, fits
    in ``max_length`` tokens."""
    rows: list[list[Encoded]] = []
    row: list[Encoded] = []
    for e in sorted(encoded, key=lambda e: e.ids):
        if row and row_length([*row, e], share=True) > max_length:
            rows.append(row)
            row = []
        row.append(e)
    return [*rows, row] if row else rows


HEAD, PAD = -2, -1  # segment ids of a row's shared head and of its padding (examples: 0, 1, ...)


@dataclass(frozen=True)
class Batch:
    """Model inputs for rows of one or more examples each.

    ``attn_B1TT`` is an additive mask: causal within an example, nothing across examples or onto
    padding; positions restart at 0 for each example. So a packed row computes exactly what the
    examples would compute alone (tested).
    """

    input_ids_BT: torch.Tensor
    labels_BT: torch.Tensor  # token t's label; IGNORE where it carries no loss
    position_ids_BT: torch.Tensor
    attn_B1TT: torch.Tensor
    segment_BT: torch.Tensor  # each token's example in its row; HEAD the shared head, PAD padding

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device``."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **moved)

    @property
    def num_trained(self) -> int:
        return int((self.labels_BT[:, 1:] != IGNORE).sum())  # token 0 has nothing to predict it

    @property
    def loss_positions_K(self) -> torch.Tensor:
        """Positions t whose next token carries loss in some row: the only logits the loss needs."""
        return (self.labels_BT[:, 1:] != IGNORE).any(dim=0).nonzero().flatten()


def collate(rows: Sequence[Sequence[Encoded]], pad_id: int, share: bool = False) -> Batch:
    """Right-pad rows of examples to the longest row. ``share``: a row's shared opening
    (``shared_len``) is laid out once at its head (module docstring)."""
    heads = [shared_len(row) if share else 0 for row in rows]
    T = max(n + sum(len(e.ids) - n for e in row) for n, row in zip(heads, rows, strict=True))
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    segment = torch.full((B, T), PAD, dtype=torch.long)
    for b, (h, row) in enumerate(zip(heads, rows, strict=True)):
        ids[b, :h] = torch.tensor(row[0].ids[:h], dtype=torch.long)
        pos[b, :h] = torch.arange(h)
        segment[b, :h] = HEAD
        t = h
        for s, e in enumerate(row):
            n = len(e.ids) - h
            ids[b, t : t + n] = torch.tensor(e.ids[h:])
            labels[b, t : t + n] = torch.where(torch.tensor(e.mask[h:]) == 1, torch.tensor(e.ids[h:]), IGNORE)
            pos[b, t : t + n] = torch.arange(h, h + n)
            segment[b, t : t + n] = s
            t += n
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    # an example's tokens see their own example and the shared head; the head sees itself
    same = (segment[:, :, None] == segment[:, None, :]) | (segment[:, None, :] == HEAD)
    # Padding attends to itself only, so no row of the mask is empty (softmax stays finite).
    allowed = (causal & same & (segment[:, :, None] != PAD)) | torch.eye(T, dtype=torch.bool)
    attn = torch.zeros((B, 1, T, T)).masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
    return Batch(ids, labels, pos, attn, segment)


def make_rows(
    encoded: Sequence[Encoded], packing: bool, max_length: int, share: bool = False
) -> list[list[Encoded]]:
    """Rows of one example each (padding), packed rows, or packed rows with shared openings."""
    if not packing:
        return [[e] for e in encoded]
    return pack_shared(encoded, max_length) if share else pack(encoded, max_length)


def nll_sum(logits_BKV: torch.Tensor, targets_BK: torch.Tensor) -> torch.Tensor:
    """Sum of -log p(target) over the targets that are not ``IGNORE``."""
    V = logits_BKV.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits_BKV.reshape(-1, V).float(), targets_BK.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )


#: positions whose logits exist at once in ``chunked_nll_sum``: 256 x 49k fp32 logits = 50 MB, where
#: a 1,000-token row's at once (with their log-softmax and gradient) held ~0.6 GB (issue 32)
LOSS_CHUNK = 256


def _chunk_nll(
    weight: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    return nll_sum(torch.nn.functional.linear(h, weight, bias), y)


def chunked_nll_sum(
    hidden_BKD: torch.Tensor, head: torch.nn.Linear, targets_BK: torch.Tensor, chunk: int = LOSS_CHUNK
) -> torch.Tensor:
    """``nll_sum(head(hidden), targets)`` computed ``chunk`` positions at a time, each chunk's
    logits recomputed in the backward pass instead of kept (activation checkpointing): the same
    sum and gradients, the memory of one chunk's logits."""
    total = hidden_BKD.new_zeros(())
    for i in range(0, hidden_BKD.shape[1], chunk):
        h, y = hidden_BKD[:, i : i + chunk], targets_BK[:, i : i + chunk]
        if not torch.is_grad_enabled():
            total = total + _chunk_nll(head.weight, head.bias, h, y)
            continue
        total = total + torch.utils.checkpoint.checkpoint(
            _chunk_nll, head.weight, head.bias, h, y, use_reentrant=False
        )
    return total


def token_loss_sum(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Sum over trained tokens of -log p(token): logits at t predict the token at t + 1."""
    return nll_sum(logits_BTV[:, :-1], labels_BT[:, 1:])
