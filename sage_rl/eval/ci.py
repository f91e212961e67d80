"""Bootstrap confidence intervals for TGC and SGC (pure functions, fixed seed).

Which bootstrap: the **percentile bootstrap** (Efron). Draw ``RESAMPLES`` samples of the units
with replacement, each the size of the original, compute the statistic (a mean) on each, and take
the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of those statistics (linear
interpolation between order statistics, numpy's default ``quantile`` method). The units are tasks
for TGC (each task's success) and scenarios for SGC (each scenario's all-tasks success), as the
metrics define them (SAGE.md section 8).

Tasks of one scenario are not independent (task 2 uses the skill task 1 made, and a template's
tasks share their difficulty), so an interval that resamples tasks is too narrow. Given the
tasks' scenarios (``clusters``), TGC's interval is a **cluster bootstrap**: each resample draws
whole scenarios with replacement and takes the mean over all the tasks drawn (sum of the drawn
scenarios' task values over the number of tasks drawn; issue 27). SGC's units are scenarios by
construction. ``paired_difference`` gives the interval of the difference between two evaluations
of the *same* tasks (each resample draws the same scenarios, or tasks, for both), the right
statistic to say whether one model beats another on a split.

The random draws come from ``numpy.random.default_rng(seed)``: the same inputs give the same
interval on every run and machine.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


def percentile_interval(stats: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``stats`` (linear interpolation:
    quantile q of n sorted values is ``v[h]`` interpolated at ``h = q * (n - 1)``)."""
    if not stats:
        raise ValueError("percentile_interval needs at least one statistic")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(np.asarray(stats, dtype=float), [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def resample_means(values: Sequence[float], index_sets: np.ndarray) -> np.ndarray:
    """The mean of ``values`` over each row of ``index_sets`` (one bootstrap sample per row)."""
    return np.asarray(values, dtype=float)[np.asarray(index_sets)].mean(axis=1)


def draw_indices(n: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """``resamples`` rows of ``n`` indices drawn uniformly with replacement from ``range(n)``."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def cluster_resample_means(
    values: Sequence[float], clusters: Sequence[Hashable], index_sets: np.ndarray
) -> np.ndarray:
    """For each row of ``index_sets`` (indices into the distinct clusters, in order of first
    appearance), the mean of ``values`` over every unit of the clusters drawn: the drawn clusters'
    sums over the drawn clusters' sizes (a cluster drawn twice counts twice)."""
    order = list(dict.fromkeys(clusters))
    pos = {c: i for i, c in enumerate(order)}
    sums, sizes = np.zeros(len(order)), np.zeros(len(order))
    for v, c in zip(values, clusters, strict=True):
        sums[pos[c]] += float(v)
        sizes[pos[c]] += 1
    idx = np.asarray(index_sets)
    return sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)


def _means(values: Sequence[float], clusters: Sequence[Hashable] | None, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means of ``values``: over units, or over whole clusters when ``clusters`` is given."""
    if clusters is None:
        return resample_means(values, draw_indices(len(values), resamples, seed))
    if len(clusters) != len(values):
        raise ValueError(f"{len(values)} values but {len(clusters)} cluster labels")
    n = len(set(clusters))
    return cluster_resample_means(values, clusters, draw_indices(n, resamples, seed))


def bootstrap_ci(
    values: Sequence[float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
    clusters: Sequence[Hashable] | None = None,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``values`` (e.g. 100 * success per task),
    resampling whole ``clusters`` (e.g. each task's scenario id) when given, else single values.
    No values: ``(0.0, 0.0)``, like the metrics' own empty convention."""
    if len(values) == 0:
        return (0.0, 0.0)
    return percentile_interval(list(_means(values, clusters, resamples, seed)), level)


def paired_difference(
    before: Sequence[float],
    after: Sequence[float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
    clusters: Sequence[Hashable] | None = None,
) -> tuple[float, tuple[float, float]]:
    """``mean(after) - mean(before)`` over the same units (same order) and its percentile-bootstrap
    interval, each bootstrap sample drawing the same units (or whole ``clusters``) for both."""
    if len(before) != len(after):
        raise ValueError(f"paired values differ in length: {len(before)} and {len(after)}")
    if len(before) == 0:
        return 0.0, (0.0, 0.0)
    diff = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    return float(diff.mean()), percentile_interval(list(_means(list(diff), clusters, resamples, seed)), level)


def paired_outcomes(
    a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]]
) -> tuple[float, tuple[float, float]] | None:
    """Paired TGC difference (b - a, in points) over the tasks both evaluated, resampling scenarios.

    ``a`` and ``b`` are outcome rows ``(task_id, scenario_id, success)`` (a recipe stage's
    ``outcomes``); None when they share no task."""
    sa = {row[0]: (row[1], 100.0 * row[2]) for row in a}
    sb = {row[0]: 100.0 * row[2] for row in b}
    common = [t for t in sa if t in sb]
    if not common:
        return None
    return paired_difference(
        [sa[t][1] for t in common], [sb[t] for t in common], clusters=[sa[t][0] for t in common]
    )


def format_ci(value: float, ci: tuple[float, float], fmt: str = "{:.1f}") -> str:
    """``"40.0 [30.0, 50.0]"``."""
    return f"{fmt.format(value)} [{fmt.format(ci[0])}, {fmt.format(ci[1])}]"
