"""analysis.stats against hand calculations, numpy and scipy (independent of the code under test)."""

from __future__ import annotations

import importlib
import math
import os

import numpy as np
import pytest

from analysis import stats


def _need(module: str):
    """Import ``module``; skip if missing, but fail under CI=true (tests must not skip silently there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def test_aggregate_seeds_three_seeds_by_hand():
    # Values at step 0: 1, 2, 3 → mean 2, s = 1; step 1: 2, 4, 6 → mean 4, s = 2.
    # t_{0.975, 2} = 4.302652729911275 (Student t table, df = 2); half-width = t·s/√3.
    t975 = 4.302652729911275
    steps = np.array([0, 1])
    agg = stats.aggregate_seeds([(steps, np.array([1.0, 2.0])), (steps, np.array([2.0, 4.0])),
                                 (steps, np.array([3.0, 6.0]))])
    np.testing.assert_allclose(agg.mean, [2.0, 4.0])
    hw = t975 * np.array([1.0, 2.0]) / math.sqrt(3)
    np.testing.assert_allclose(agg.hi - agg.mean, hw, rtol=1e-9)
    np.testing.assert_allclose(agg.mean - agg.lo, hw, rtol=1e-9)
    assert agg.n.tolist() == [3, 3] and agg.n_runs == 3 and agg.note is None


def test_aggregate_seeds_matches_scipy_t_interval():
    sps = _need("scipy.stats")
    rng = np.random.default_rng(0)
    vals = rng.normal(size=(5, 40))
    steps = np.arange(40)
    agg = stats.aggregate_seeds([(steps, v) for v in vals], confidence=0.9)
    lo, hi = sps.t.interval(0.9, df=4, loc=vals.mean(0), scale=sps.sem(vals, axis=0))
    np.testing.assert_allclose(agg.lo, lo, rtol=1e-8)
    np.testing.assert_allclose(agg.hi, hi, rtol=1e-8)


def test_aggregate_seeds_different_lengths_uses_common_steps_and_says_so():
    a = (np.arange(10), np.arange(10, dtype=float))
    b = (np.arange(6), 2 * np.arange(6, dtype=float))
    agg = stats.aggregate_seeds([a, b])
    assert agg.x.tolist() == list(range(6))
    np.testing.assert_allclose(agg.mean, 1.5 * np.arange(6))  # (x + 2x)/2
    assert agg.note is not None and "6 points common" in agg.note


def test_aggregate_seeds_single_seed_and_nan():
    steps = np.arange(3)
    one = stats.aggregate_seeds([(steps, np.array([1.0, np.nan, 3.0]))])
    assert np.isnan(one.lo).all() and np.isnan(one.hi).all()  # a single seed has no band
    assert one.n.tolist() == [1, 0, 1]
    assert np.isnan(one.mean[1])
    assert one.finite().x.tolist() == [0, 2]
    two = stats.aggregate_seeds([(steps, np.array([1.0, np.nan, 3.0])), (steps, np.array([3.0, 5.0, np.nan]))])
    np.testing.assert_allclose(two.mean, [2.0, 5.0, 3.0])  # NaN seeds excluded per step
    assert two.n.tolist() == [2, 1, 1]
    assert np.isfinite(two.lo[0]) and np.isnan(two.lo[1:]).all()
    empty = stats.aggregate_seeds([])
    assert empty.x.size == 0 and empty.n_runs == 0


def test_mean_ci():
    m, hw, n = stats.mean_ci([1.0, None, 3.0, float("nan")])
    # two values 1, 3: mean 2, s = √2, t_{0.975,1} = 12.706204736174707 → hw = 12.7062·√2/√2 = 12.7062
    assert (m, n) == (2.0, 2) and hw == pytest.approx(12.706204736174707, rel=1e-9)
    assert stats.mean_ci([5.0])[:1] == (5.0,) and math.isnan(stats.mean_ci([5.0])[1])
    assert stats.mean_ci([None])[2] == 0


def test_fit_prediction_matches_scipy_linregress_and_r2_definition():
    sps = _need("scipy.stats")
    rng = np.random.default_rng(1)
    p = rng.normal(size=500) * 1e-3
    m = 0.8 * p + 2e-5 + rng.normal(size=500) * 3e-4
    p[7] = np.nan  # a NaN pair is dropped
    fit = stats.fit_prediction(p, m)
    ok = np.isfinite(p)
    ref = sps.linregress(p[ok], m[ok])
    assert fit.n == 499
    assert fit.slope == pytest.approx(ref.slope, rel=1e-10)
    assert fit.intercept == pytest.approx(ref.intercept, rel=1e-8, abs=1e-15)
    assert fit.r2 == pytest.approx(ref.rvalue**2, rel=1e-10)
    # identity-line R² = 1 − SS_res/SS_tot computed with plain numpy
    mm, pp = m[ok], p[ok]
    r2_id = 1 - np.sum((mm - pp) ** 2) / np.sum((mm - mm.mean()) ** 2)
    assert fit.r2_identity == pytest.approx(r2_id, rel=1e-10)
    assert fit.rmse == pytest.approx(np.sqrt(np.mean((mm - pp) ** 2)), rel=1e-10)


def test_fit_prediction_exact_and_degenerate():
    p = np.linspace(-1, 1, 11)
    exact = stats.fit_prediction(p, p)
    assert exact.slope == pytest.approx(1.0) and exact.intercept == pytest.approx(0.0, abs=1e-15)
    assert exact.r2 == pytest.approx(1.0) and exact.r2_identity == pytest.approx(1.0) and exact.reason is None
    const = stats.fit_prediction(np.ones(5), np.arange(5.0))
    assert math.isnan(const.slope) and "constant" in const.reason
    few = stats.fit_prediction([1.0, 2.0], [1.0, 2.0])
    assert few.n == 2 and math.isnan(few.r2) and "3" in few.reason
    none = stats.fit_prediction([np.nan], [1.0])
    assert none.n == 0 and none.reason


def test_binned_fit_matches_linregress_per_bin():
    sps = _need("scipy.stats")
    rng = np.random.default_rng(2)
    x = np.repeat(np.arange(100.0), 3)  # 3 seeds pooled
    p = rng.normal(size=x.size)
    m = (1 + x / 100) * p + rng.normal(size=x.size) * 0.5
    centers, slope, r2, cnt = stats.binned_fit(x, p, m, n_bins=4)
    edges = np.linspace(0, 99, 5)
    np.testing.assert_allclose(centers, (edges[:-1] + edges[1:]) / 2)
    for i in range(4):
        sel = (x >= edges[i]) & ((x < edges[i + 1]) if i < 3 else (x <= edges[i + 1]))
        ref = sps.linregress(p[sel], m[sel])
        assert cnt[i] == sel.sum()
        assert slope[i] == pytest.approx(ref.slope, rel=1e-9)
        assert r2[i] == pytest.approx(ref.rvalue**2, rel=1e-9)
    # a bin with < 3 pairs is NaN
    _, s2, r22, c2 = stats.binned_fit([0, 1, 10, 10.5, 10.7, 11], [1, 2, 1, 2, 3, 4], [1, 2, 1, 2, 3, 4], n_bins=2)
    assert c2.tolist() == [2, 4] and math.isnan(s2[0]) and s2[1] == pytest.approx(1.0)


def test_steps_to_threshold_and_band():
    steps = np.array([10, 20, 30, 40, 50])
    h = np.array([0.6, np.nan, 0.07, 0.05, 0.04])
    # 10% of 0.6 = 0.06: first value strictly below is 0.05 at step 40 (NaN at 20 ignored)
    assert stats.steps_to_threshold(steps, h, 0.1 * 0.6) == 40
    assert stats.steps_to_threshold(steps, h, 0.04) is None  # 0.04 is not < 0.04
    # band 0.3 ± 0.05: values 0.26, 0.34 in; 0.249, 0.4 out → 2 / 4 (NaN ignored)
    assert stats.fraction_in_band(np.array([0.26, 0.34, 0.249, 0.4, np.nan]), 0.3, 0.05) == 0.5
    # the band is closed (stare_lab.platform.summary): 0.75 and 0.25 lie exactly 0.25 from 0.5 (exact in binary) → in
    assert stats.fraction_in_band(np.array([0.75, 0.25, 0.76]), 0.5, 0.25) == pytest.approx(2 / 3)
    assert stats.fraction_in_band(np.array([0.3]), None) is None
    assert stats.fraction_in_band(np.array([np.nan]), 0.3) is None
    assert stats.first_finite(np.array([np.nan, 2.0, 3.0])) == 2.0
    assert stats.last_finite(np.array([1.0, 2.0, np.nan])) == 2.0
    assert stats.first_finite(np.array([np.nan])) is None


def test_normalised_curve():
    grid = np.linspace(0, 1, 5)
    # steps 100..300, entropy 2 → 1 linearly: x = 0..1, y = 1 → 0.5
    y, reason = stats.normalised_curve(np.array([100, 200, 300]), np.array([2.0, 1.5, 1.0]), grid)
    assert reason is None
    np.testing.assert_allclose(y, [1.0, 0.875, 0.75, 0.625, 0.5])
    y, reason = stats.normalised_curve(np.array([1, 2]), np.array([0.0, 1.0]), grid)
    assert np.isnan(y).all() and "0" in reason
    y, reason = stats.normalised_curve(np.array([1, 2]), np.array([1.0, np.nan]), grid)
    assert np.isnan(y).all() and reason


def test_moving_average():
    y = np.array([1.0, 2.0, 3.0, np.nan, 5.0])
    # window 3, centred, NaN skipped, truncated ends: [(1+2)/2, 2, (2+3)/2, (3+5)/2, 5]
    np.testing.assert_allclose(stats.moving_average(y, 3), [1.5, 2.0, 2.5, 4.0, 5.0])
    assert stats.moving_average(y, 1) is not None and np.array_equal(stats.moving_average(y, 1), y, equal_nan=True)


def test_tail_mean():
    from analysis.stats import tail_mean

    # by hand: 30 values 0..29 → last 3 (10%) = 27, 28, 29 → 28; 5 values → last 1; NaN skipped; empty → None
    assert tail_mean(np.arange(30.0)) == pytest.approx(28.0)
    assert tail_mean(np.arange(5.0)) == 4.0
    assert tail_mean(np.array([1.0, 2.0] + [np.nan] * 8 + [3.0, np.nan] + [0.0] * 8)) == pytest.approx(0.0)
    assert tail_mean(np.array([1.0] * 18 + [5.0, np.nan])) == 5.0
    assert tail_mean(np.array([])) is None and tail_mean(np.array([np.nan])) is None


def test_known_range_and_clipped_interval():
    """Review finding: an in-band fraction shown as 0.577 ± 1.1 and a wall time as 6.89 ± 34 s. The interval is cut
    to the statistic's possible values: [0.577 − 1.1, 0.577 + 1.1] ∩ [0, 1] = [0, 1]; [6.89 − 34, 6.89 + 34] ∩
    [0, ∞) = [0, 40.89]; an interval inside the range is left as it is."""
    for key in ("frac_in_band", "final/accuracy", "final/pass@8", "gate_on", "quadrant/pos_high/share/5"):
        assert stats.known_range(key) == (0.0, 1.0), key
    for key in ("entropy", "final_entropy", "wall_time_s", "time/step_s", "quadrant/neg_low/count"):
        assert stats.known_range(key) == (0.0, math.inf), key
    for key in ("final_reward", "reward", "quadrant/pos_high/dH", "pred_entropy_change"):
        assert stats.known_range(key) == (-math.inf, math.inf), key
    assert stats.clipped_interval(0.577, 1.1, (0.0, 1.0)) == (0.0, 1.0, True)
    lo, hi, cut = stats.clipped_interval(6.89, 34.0, (0.0, math.inf))
    assert (lo, cut) == (0.0, True) and hi == pytest.approx(40.89)
    lo, hi, cut = stats.clipped_interval(0.5, 0.1, (0.0, 1.0))
    assert (lo, hi, cut) == (pytest.approx(0.4), pytest.approx(0.6), False)
    assert all(map(math.isnan, stats.clipped_interval(0.5, math.nan, (0.0, 1.0))[:2]))
    # a seed band: 3 seeds 0, 0, 0.3 → mean 0.1, s = 0.1732, half-width 4.3027·0.1732/√3 = 0.4303 → lo cut at 0
    agg = stats.aggregate_seeds([(np.array([0]), np.array([v])) for v in (0.0, 0.0, 0.3)]).clipped((0.0, 1.0))
    assert agg.lo[0] == 0.0 and agg.hi[0] == pytest.approx(0.1 + 4.302652729911275 * 0.1, rel=1e-9)
