"""Group-relative advantages: pure functions from (group key, reward) pairs to advantages.

SAGE.md section 5. A group is every sample with the same ``GroupKey`` = (task sequence, position):
the G samples of task k of G chains that ran the same task sequence. For a sample i of a group g
of size n with rewards R::

    mean baseline (default, LOOP):  A_i = R_i - mean_{j in g} R_j
    leave-one-out baseline (RLOO):  A_i = R_i - mean_{j in g, j != i} R_j = n / (n - 1) * (R_i - mean_g R)
    std normalisation (optional):   A_i <- A_i / (std_g(R) + eps), std with Bessel's correction (n - 1)

A group of one sample has no baseline to compare with: its advantage is 0. With ``drop_below``
set (LOOP uses 0.01), a sample with |A_i| < drop_below is marked not kept: it carries no signal.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from sage_rl.types import GroupKey


class Baseline(enum.StrEnum):
    MEAN = "mean"
    LEAVE_ONE_OUT = "leave_one_out"


@dataclass(frozen=True)
class Advantages:
    """Advantages in input order, and which samples to train on (``keep``)."""

    values: tuple[float, ...]
    keep: tuple[bool, ...]


def _group_advantages(
    rewards: Sequence[float], baseline: Baseline, normalize_std: bool, eps: float
) -> list[float]:
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if baseline is Baseline.LEAVE_ONE_OUT:
        centred = [a * n / (n - 1) for a in centred]
    if normalize_std:
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
        centred = [a / (std + eps) for a in centred]
    return centred


def compute_advantages(
    items: Sequence[tuple[GroupKey | Hashable, float]],
    baseline: Baseline = Baseline.MEAN,
    normalize_std: bool = False,
    eps: float = 1e-6,
    drop_below: float | None = None,
) -> Advantages:
    """Advantages of ``items`` (group key, reward), grouped by key; output in input order.

    Groups may be interleaved in ``items``; each is computed on its own.
    """
    baseline = Baseline(baseline)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, (key, _) in enumerate(items):
        members[key].append(i)
    values = [0.0] * len(items)
    for idx in members.values():
        group = _group_advantages([items[i][1] for i in idx], baseline, normalize_std, eps)
        for i, a in zip(idx, group, strict=True):
            values[i] = a
    keep = [True] * len(items) if drop_below is None else [abs(a) >= drop_below for a in values]
    return Advantages(values=tuple(values), keep=tuple(keep))


def group_sizes(keys: Sequence[Hashable]) -> dict[Hashable, int]:
    """How many samples each group holds (for the group-contract checks and metrics)."""
    sizes: dict[Hashable, int] = defaultdict(int)
    for k in keys:
        sizes[k] += 1
    return dict(sizes)
