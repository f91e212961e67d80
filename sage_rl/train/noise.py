"""The gradient noise scale of every step, live (``trainer.noise_scale``; issue 27).

A GRPO step's gradient is the mean of its groups' gradients ``g_i`` (the group: one task sequence's
G chains, all its positions). How much of it is the reward's signal and how much the draw's noise
is McCandlish et al.'s (2018) question, with the group as the unit:

    |G|^2     = mean over i != j of g_i . g_j      (unbiased: independent groups)
    tr(Sigma) = mean of |g_i|^2 - |G|^2            (the variance of one group's gradient)
    B_simple  = tr(Sigma) / |G|^2                  (groups a step at which signal and noise are equal)

Both need only two sums, ``|sum g_i|^2`` and ``sum |g_i|^2``, not the groups' Gram matrix. With
``noise_scale`` on, the trainer runs each group's micro-batches together (and, with a step prefix,
carries that group's share through it before the next group starts): group i's gradient is what
its micro-batches added to ``.grad`` (``Delta_i``) times the number of groups ``n``, since the step's
loss is normalised over all of them (``seq_mean_token_mean``: ``mean g_i`` is the batch gradient).
Groups whose every sample was skipped for a zero advantage are groups with ``g_i = 0``.

Cost: one gradient-sized buffer; and, with a shared step prefix, that prefix's backward once per
group instead of once per step. One step's figures are one draw: over a run they are what a
benchmark's many steps show (``benchmarks/grad_noise.py`` gives one step's intervals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def noise_from_sums(n: int, total_sq: float, sum_sq: float) -> dict[str, float]:
    """The noise-scale figures of ``n >= 2`` group gradients from ``total_sq = |sum g_i|^2`` and
    ``sum_sq = sum |g_i|^2`` (pure). ``b_simple`` is inf where no signal is resolved (``signal <=
    0``); ``signal_share`` is the signal's part of the batch gradient's expected squared norm at
    ``n`` groups, ``|G|^2 / (|G|^2 + tr(Sigma) / n)`` (0 where the signal is not positive)."""
    if n < 2:
        raise ValueError(f"noise_from_sums: at least 2 groups, got {n}")
    signal = (total_sq - sum_sq) / (n * (n - 1))
    trace = sum_sq / n - signal
    positive = signal > 0
    return {
        "signal": signal,
        "trace": trace,
        "b_simple": trace / signal if positive else math.inf,
        "signal_share": signal / (signal + trace / n) if positive else 0.0,
    }


def _sq_norm(tensors: Sequence[torch.Tensor | None]) -> float:
    return sum(float(torch.linalg.vector_norm(t, dtype=torch.float64) ** 2) for t in tensors if t is not None)


class GroupGradients:
    """What each group's micro-batches add to the parameters' ``.grad``, as they finish."""

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        self.before: list[torch.Tensor | None] = [None] * len(self.params)
        self.sum_sq = 0.0  # sum over finished groups of |Delta_i|^2

    def group_done(self) -> None:
        """Close a group: add ``|Delta_i|^2`` and remember ``.grad`` as the next group's start (one
        buffer, overwritten in place: one parameter's difference at a time besides it)."""
        for i, p in enumerate(self.params):
            g, b = p.grad, self.before[i]
            if g is None:  # no group has reached it yet
                continue
            self.sum_sq += _sq_norm([g if b is None else g - b])
            if b is None:
                self.before[i] = g.detach().clone()
            else:
                b.copy_(g)

    def figures(self, groups: int) -> dict[str, float]:
        """The step's ``noise/*`` metrics over its ``groups`` groups (those that never ran included),
        from the accumulated gradient (before clipping); none with fewer than 2 groups."""
        self.before = [None] * len(self.params)
        if groups < 2:
            return {}
        n2 = float(groups) ** 2  # g_i = n Delta_i
        out = noise_from_sums(groups, n2 * _sq_norm([p.grad for p in self.params]), n2 * self.sum_sq)
        row = {f"noise/{k}": v for k, v in out.items() if math.isfinite(v)}
        return row | {"noise/groups": float(groups)}
