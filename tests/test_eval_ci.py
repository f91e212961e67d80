"""Bootstrap intervals (eval/ci.py) against numbers worked out by hand, and on the metrics."""

import numpy as np
import pytest

from sage_rl.eval.ci import (
    bootstrap_ci,
    cluster_resample_means,
    draw_indices,
    format_ci,
    paired_difference,
    paired_outcomes,
    percentile_interval,
    resample_means,
)
from sage_rl.eval.metrics import compute_metrics
from sage_rl.eval.report import headline_rows
from sage_rl.types import Chain, CheckResult, Outcome, StopReason, Task, Trajectory


def test_percentile_interval_by_hand():
    # 4 sorted stats; q = 0.25 -> h = 0.75: 0 + 0.75 * (25 - 0) = 18.75;
    # q = 0.75 -> h = 2.25: 50 + 0.25 * (100 - 50) = 62.5
    assert percentile_interval([50, 0, 100, 25], level=0.5) == (18.75, 62.5)
    # level 0.95 over 0..100 (101 values): quantiles 0.025 and 0.975 -> h = 2.5 and 97.5
    assert percentile_interval(list(range(101)), level=0.95) == pytest.approx((2.5, 97.5))
    with pytest.raises(ValueError, match="level"):
        percentile_interval([1.0], level=1.0)


def test_resample_means_by_hand():
    values = [0, 100, 100, 0]
    sets = np.array([[0, 0, 0, 0], [1, 1, 2, 2], [0, 1, 2, 3], [3, 3, 3, 1]])
    assert resample_means(values, sets).tolist() == [0.0, 100.0, 50.0, 25.0]
    # the interval of those four bootstrap means, as above
    assert percentile_interval(list(resample_means(values, sets)), 0.5) == (18.75, 62.5)


def test_bootstrap_ci_edges_seed_and_width():
    assert bootstrap_ci([]) == (0.0, 0.0)
    assert bootstrap_ci([100.0] * 7) == (100.0, 100.0) and bootstrap_ci([0.0] * 3) == (0.0, 0.0)
    half = [100.0] * 50 + [0.0] * 50
    lo, hi = bootstrap_ci(half)
    assert bootstrap_ci(half) == (lo, hi)  # fixed seed: the same interval every time
    # normal approximation: 50 +- 1.96 * sqrt(0.25 / 100) * 100 = 50 +- 9.8
    assert 38 <= lo <= 42 and 58 <= hi <= 62
    spread = [float(v) for v in range(100)]
    assert bootstrap_ci(spread, seed=1) != bootstrap_ci(spread, seed=0)  # the seed is the only randomness
    idx = draw_indices(5, resamples=3, seed=0)
    assert idx.shape == (3, 5) and idx.min() >= 0 and idx.max() < 5


def test_paired_difference():
    before, after = [0, 0, 100, 100], [100, 0, 100, 100]
    diff, (lo, hi) = paired_difference(before, after)
    assert diff == 25.0 and 0.0 <= lo <= 25.0 <= hi <= 100.0
    assert paired_difference(after, after) == (0.0, (0.0, 0.0))  # no unit differs: no uncertainty
    with pytest.raises(ValueError, match="length"):
        paired_difference([1], [1, 2])


def test_cluster_resample_means_by_hand():
    # scenarios a (2 tasks: 100, 0), b (1 task: 100), c (3 tasks: 0, 0, 0); clusters in first-seen order
    values = [100, 0, 100, 0, 0, 0]
    clusters = ["a", "a", "b", "c", "c", "c"]
    sets = np.array([[0, 0, 0], [1, 1, 2], [0, 1, 2], [2, 2, 2]])
    # [a a a]: 300 / 6 = 50; [b b c]: 200 / 5 = 40; [a b c]: 200 / 6; [c c c]: 0 / 9
    assert cluster_resample_means(values, clusters, sets).tolist() == pytest.approx([50.0, 40.0, 100 / 3, 0.0])


def test_cluster_bootstrap_is_wider_than_the_task_bootstrap_for_correlated_tasks():
    # 20 scenarios of 3 tasks each, all-or-nothing within a scenario: 60 tasks but 20 independent units
    values = [100.0 if s % 2 else 0.0 for s in range(20) for _ in range(3)]
    clusters = [s for s in range(20) for _ in range(3)]
    lo_t, hi_t = bootstrap_ci(values)
    lo_c, hi_c = bootstrap_ci(values, clusters=clusters)
    assert (hi_c - lo_c) > 1.4 * (hi_t - lo_t)  # ~sqrt(3) wider: the design effect of 3 identical tasks
    # clusters of one unit each: the task bootstrap exactly (same draws)
    assert bootstrap_ci(values, clusters=list(range(60))) == (lo_t, hi_t)
    with pytest.raises(ValueError, match="cluster"):
        bootstrap_ci(values, clusters=clusters[:-1])


def test_paired_outcomes_resample_scenarios():
    a = [("s1_1", "s1", 0), ("s1_2", "s1", 0), ("s2_1", "s2", 1), ("s3_1", "s3", 1)]
    b = [("s1_1", "s1", 1), ("s1_2", "s1", 1), ("s2_1", "s2", 1), ("x_1", "x", 1)]
    diff, (lo, hi) = paired_outcomes(a, b)  # common tasks s1_1, s1_2, s2_1: +100, +100, 0
    assert diff == pytest.approx(200 / 3)
    assert (lo, hi) == paired_difference([0, 0, 100], [100, 100, 100], clusters=["s1", "s1", "s2"])[1]
    assert lo == 0.0 and hi == 100.0  # a resample of only s2 differs by 0, of only s1 by 100
    assert paired_outcomes(a, [("y_1", "y", 1)]) is None


def _t(scn: str, pos: int, ok: bool) -> Trajectory:
    task = Task(f"{scn}_{pos}", scn, pos, "x", "dev")
    return Trajectory(task, (), (), Outcome.from_checks((CheckResult("a", ok),)), StopReason.COMPLETED)


def test_metrics_carry_the_intervals_and_reports_show_them():
    chains = [Chain(i, 0, tuple(_t(f"s{i}", p, i < 2 or p == 1) for p in (1, 2, 3))) for i in range(4)]
    m = compute_metrics(chains)  # tasks: 6 + 2 of 12 pass; scenarios: 2 of 4
    assert m.tgc == pytest.approx(100 * 8 / 12) and m.sgc == 50.0
    task_pct = [100.0] * 3 + [100.0] * 3 + [100.0, 0, 0] * 2
    assert m.tgc_ci == bootstrap_ci(task_pct, clusters=[f"s{i}" for i in range(4) for _ in range(3)])
    assert m.tgc_ci != bootstrap_ci(task_pct)  # scenarios are resampled, not tasks
    assert m.sgc_ci == bootstrap_ci([100.0, 100.0, 0.0, 0.0])
    assert m.tgc_ci[0] < m.tgc < m.tgc_ci[1]
    rows = dict(headline_rows(m))
    assert rows["TGC (%)"] == format_ci(m.tgc, m.tgc_ci) and rows["SGC (%)"].startswith("50.0 [")
