"""The SFT loop's schedule: which examples each epoch sees, held-out loss by chain position, and
the best weights by held-out loss (early stopping).

Why positions matter (issue 17): in expert data every scenario gives one example per chain
position. At position 1 the expert writes the skills (Generate, hundreds of tokens); at later
positions it only calls them (Use, a few dozen tokens). ``data.position_weights`` sets how often
each position's examples are seen per epoch, and the held-out loss is logged per position so a run
shows whether the skill-writing turns are learned, not only the short calls.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


def epoch_selection(
    positions: Sequence[int], weights: Mapping[int, float], epoch: int, seed: int
) -> list[int]:
    """Indices of the examples that epoch ``epoch`` trains on (order irrelevant: rows are shuffled).

    An example at chain position p appears ``w = weights.get(p, 1.0)`` times per epoch: ``floor(w)``
    whole copies, plus, for the fraction f, ``round(f * n_p)`` of the n_p examples of that position,
    taken from a fixed seeded order as a window that moves by that many each epoch (so every example
    of the position is seen once in ``ceil(1 / f)`` epochs, and the counts are exact every epoch).
    """
    by_pos: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(positions):
        by_pos[p].append(i)
    out: list[int] = []
    for p, idx in sorted(by_pos.items()):
        w = float(weights.get(p, 1.0))
        whole, frac = math.floor(w), w - math.floor(w)
        out += idx * whole
        k = round(frac * len(idx))
        if k:
            order = list(idx)
            random.Random(f"{seed}:position:{p}").shuffle(order)
            start = (epoch * k) % len(order)
            out += [order[(start + j) % len(order)] for j in range(k)]
    return out


def eval_by_position(
    loss_of: Callable[[Sequence[Any]], float | None],
    encoded: Sequence[Any],
    positions: Sequence[int],
    tokens_of: Callable[[Any], int],
) -> dict[str, float]:
    """Held-out loss overall (``eval_loss``, mean NLL per trained token) and per chain position
    (``eval_loss/p<k>``). ``loss_of(examples)`` is the mean NLL per trained token of a subset;
    the overall value is the token-weighted mean of the positions' values, i.e. exactly the mean
    over all trained tokens."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for e, p in zip(encoded, positions, strict=True):
        groups[p].append(e)
    out: dict[str, float] = {}
    total, tokens = 0.0, 0
    for p, group in sorted(groups.items()):
        loss = loss_of(group)
        if loss is None:
            continue
        n = sum(tokens_of(e) for e in group)
        out[f"eval_loss/p{p}"] = loss
        total, tokens = total + loss * n, tokens + n
    if tokens:
        out["eval_loss"] = total / tokens
    return out


class BestWeights:
    """Keeps a copy of the trainable parameters at the lowest held-out loss seen; says when
    ``patience`` evaluations in a row brought no improvement (``None`` = never stop early).

    With ``spill`` (a file path) the copy is written there (safetensors) instead of held in memory:
    a full copy of SmolLM2's fp32 weights is 0.54 GB of resident memory for the whole SFT (issue 32);
    ``discard()`` removes the file."""

    def __init__(self, patience: int | None, spill: Path | None = None) -> None:
        self.patience = patience
        self.spill = spill
        self.best_loss = math.inf
        self.best_step: int | None = None
        self.bad_evals = 0
        self._state: dict[str, torch.Tensor] | None = None
        self._kept = False

    def update(self, model: torch.nn.Module, step: int, loss: float) -> bool:
        """Record the loss at ``step``; keep the weights if it is the best so far. Returns True
        when training should stop (patience exhausted)."""
        if loss < self.best_loss:
            self.best_loss, self.best_step, self.bad_evals = loss, step, 0
            copy = self.spill is None  # spilled: written from the parameters, no 0.5 GB copy first
            state = {
                n: p.detach().to("cpu", copy=copy) for n, p in model.named_parameters() if p.requires_grad
            }
            if self.spill is None:
                self._state = state
            else:
                self.spill.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.spill.with_name(self.spill.name + ".tmp")
                save_file({n: t.contiguous() for n, t in state.items()}, str(tmp))
                tmp.replace(self.spill)
            self._kept = True
            return False
        self.bad_evals += 1
        return self.patience is not None and self.bad_evals >= self.patience

    @torch.no_grad()
    def restore(self, model: torch.nn.Module) -> bool:
        """Put the best weights back into ``model``; False when none were kept."""
        if not self._kept:
            return False
        state = self._state if self.spill is None else load_file(str(self.spill))
        assert state is not None
        params = dict(model.named_parameters())
        for name, value in state.items():
            params[name].copy_(value.to(params[name].device))
        return True

    def resumed(self) -> bool:
        """After ``best_step`` was set from a resume point: the spilled copy is the kept one.
        False when a best step is named but its copy is not on disk."""
        self._kept = self.best_step is not None and self.spill is not None and self.spill.exists()
        return self.best_step is None or self._kept

    def discard(self) -> None:
        """Drop the kept copy (and its file)."""
        self._state, self._kept = None, False
        if self.spill is not None:
            self.spill.unlink(missing_ok=True)
