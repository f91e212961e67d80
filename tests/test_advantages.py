"""Advantages against cases worked out by hand (SAGE.md section 5)."""

from __future__ import annotations

import math

import pytest

from sage_rl.rollout.advantages import Baseline, compute_advantages, group_sizes

SEQ = ("s1_1", "s1_2")
P0, P1 = (SEQ, 0), (SEQ, 1)
OTHER = (("s2_1", "s2_2"), 0)  # same position, another task sequence: another group

# Interleaved batch: group P0 rewards (1, 0, 2, 1), group P1 rewards (3, 1), group OTHER (5,)
BATCH = [(P0, 1.0), (P1, 3.0), (P0, 0.0), (OTHER, 5.0), (P0, 2.0), (P1, 1.0), (P0, 1.0)]


def approx(xs):
    return pytest.approx(list(xs), abs=1e-9)


def test_mean_baseline_groups_by_sequence_and_position():
    adv = compute_advantages(BATCH)
    # P0 mean 1 -> (0, -1, 1, 0); P1 mean 2 -> (1, -1); OTHER alone -> 0
    assert list(adv.values) == approx([0.0, 1.0, -1.0, 0.0, 1.0, -1.0, 0.0])
    assert adv.keep == (True,) * 7


def test_leave_one_out_baseline():
    adv = compute_advantages(BATCH, baseline=Baseline.LEAVE_ONE_OUT)
    # P0: R=0 -> 0 - (1+2+1)/3 = -4/3; R=2 -> 2 - 2/3 = 4/3; R=1 -> 1 - 1 = 0. P1: 3-1, 1-3.
    assert list(adv.values) == approx([0.0, 2.0, -4 / 3, 0.0, 4 / 3, -2.0, 0.0])


def test_std_normalisation():
    adv = compute_advantages(BATCH, normalize_std=True, eps=0.0)
    s0 = math.sqrt(2 / 3)  # P0: squared deviations 0+1+1+0 = 2, over n-1 = 3
    s1 = math.sqrt(2.0)  # P1: 1+1 over 1
    assert list(adv.values) == approx([0.0, 1 / s1, -1 / s0, 0.0, 1 / s0, -1 / s1, 0.0])


def test_std_normalisation_of_a_constant_group_stays_finite():
    adv = compute_advantages([(P0, 1.0), (P0, 1.0)], normalize_std=True, eps=1e-6)
    assert adv.values == (0.0, 0.0)


def test_drop_near_zero_advantages():
    items = [(P0, 0.0), (P0, 0.01), (P1, 0.0), (P1, 0.03), (OTHER, 1.0), (OTHER, 1.0)]
    adv = compute_advantages(items, drop_below=0.01)
    # P0: +-0.005 dropped; P1: +-0.015 kept; OTHER: 0 dropped
    assert list(adv.values) == approx([-0.005, 0.005, -0.015, 0.015, 0.0, 0.0])
    assert adv.keep == (False, False, True, True, False, False)


def test_empty_and_group_sizes():
    assert compute_advantages([]).values == ()
    assert group_sizes([k for k, _ in BATCH]) == {P0: 4, P1: 2, OTHER: 1}
