"""stare_lab.critical: the critical-strength formulas of docs/theory.md §7 on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from stare_lab.critical import (
    critical_w, measured_critical_w, tolerance, w_star, w_star_at_crossing, w_star_series,
)


def test_w_star_by_hand():
    """O1: W* = 1 − D_GRPO/D_L+: D_GRPO = −0.03, D_L+ = 0.1 → 1.3. C2 with M = 0.5 and D_L− = −0.02: the drift to
    cancel is −0.03 + (0.5 − 1)(−0.02) = −0.02 → W* = 1.2. Drift ≥ 0 → 1 (W = 1 already holds); D_L+ ≤ 0 with a
    negative drift → inf (no W cancels it); missing input → None."""
    assert w_star(-0.03, 0.1) == pytest.approx(1.3)
    assert w_star(-0.03, 0.1, -0.02, m=0.5) == pytest.approx(1.2)
    assert w_star(0.01, 0.1) == 1.0
    assert w_star(-0.01, 0.0) == math.inf and w_star(-0.01, -0.1) == math.inf
    assert w_star(0.01, -0.1) == 1.0
    assert w_star(None, 0.1) is None and w_star(float("nan"), 0.1) is None
    assert w_star(-0.03, 0.1, None, m=0.5) is None  # C2 needs D_L−


def test_series_windows_are_ratios_of_sums():
    """Windows of 2 over D_GRPO = [−1, −3, −2, −2, −9], D_L+ = [1, 1, 2, 2, 9]: sums (−4, 2) → 3, (−4, 4) → 2; the
    partial last window is dropped. Per step: 2, 4, 2, 2, 2."""
    dg, dl = [-1, -3, -2, -2, -9], [1, 1, 2, 2, 9]
    assert w_star_series(dg, dl, window=2) == [3.0, 2.0]
    assert w_star_series(dg, dl) == [2.0, 4.0, 2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="window=0"):
        w_star_series(dg, dl, window=0)
    with pytest.raises(ValueError, match="different lengths"):
        w_star_series(dg, dl[:3])


def test_critical_w_is_the_largest_w_star_of_the_second_half():
    """Steps 0..5: W* per step 5, 4, 1.6, 1.5, 1.2, 1.1 (D_L+ = 1, D_GRPO = 1 − W*): the second half (steps 3..5)
    has max 1.5; the first step's 5 does not count. from_frac = 0 takes all: 5."""
    ws = [5, 4, 1.6, 1.5, 1.2, 1.1]
    dg, dl = [1 - w for w in ws], [1.0] * 6
    assert critical_w(dg, dl) == pytest.approx(1.5)
    assert critical_w(dg, dl, from_frac=0.0) == pytest.approx(5.0)
    assert critical_w([None] * 6, dl) is None


def test_w_star_at_the_crossing():
    """The entropy first falls below 0.4 at index 2; W* there (window 1) = 1 − (−0.05)/0.1 = 1.5; with window 3 the
    sums over indices 1..3: D_GRPO −0.02 − 0.05 − 0.02 = −0.09, D_L+ 0.3 → 1.3. Never below → (None, None)."""
    h = [1.0, 0.5, 0.39, 0.3, 0.2]
    dg = [-0.1, -0.02, -0.05, -0.02, -0.01]
    dl = [0.1, 0.1, 0.1, 0.1, 0.1]
    assert w_star_at_crossing(h, 0.4, dg, dl) == (2, pytest.approx(1.5))
    assert w_star_at_crossing(h, 0.4, dg, dl, window=3) == (2, pytest.approx(1.3))
    assert w_star_at_crossing(h, 0.1, dg, dl) == (None, None)


def test_measured_critical_w_and_tolerance():
    """Band 0.05: W 1.2 misses on one seed (0.063), 1.3 holds on all, 1.5 too → 1.3; a missing value (None) is a
    miss; nothing holds → None. Tolerance: max(0.35 × (1.3 − 1), 0.1) = 0.105; max(0.35 × 0.1, 0.1) = 0.1."""
    devs = {1.1: [0.12, 0.13], 1.2: [0.04, 0.063], 1.3: [0.005, 0.008], 1.5: [0.0, 0.001]}
    assert measured_critical_w(devs, 0.05) == 1.3
    assert measured_critical_w({1.3: [0.01, None]}, 0.05) is None
    assert measured_critical_w({1.1: [0.2]}, 0.05) is None
    assert tolerance(1.3, 0.1) == pytest.approx(0.105)
    assert tolerance(1.1, 0.1) == pytest.approx(0.1)
