"""stare_lab.theory.critical: the critical-strength formulas of docs/theory.md §7 on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from stare_lab.platform.summary import run_summary

from stare_lab.theory.critical import (
    KIND_MEANING, STRENGTH_KINDS, CriticalStrength, auto_entries, auto_line, auto_strength, critical_w,
    decomposition_summary, measured_critical_w, measured_strength, pushes_ran, recommend, recommendation_text,
    recommended_clause, run_strengths, tolerance, w_star, w_star_at_crossing, w_star_series,
)
from stare_lab.errors import ConfigError, DataError


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
    sums over indices 1..3: D_GRPO −0.02 − 0.05 − 0.02 = −0.09, D_L+ 0.3 → 1.3. Never below, or below from the
    first step (a target above the initial entropy: fresh-user item, it printed "recommended W 1") → (None, None)."""
    h = [1.0, 0.5, 0.39, 0.3, 0.2]
    dg = [-0.1, -0.02, -0.05, -0.02, -0.01]
    dl = [0.1, 0.1, 0.1, 0.1, 0.1]
    assert w_star_at_crossing(h, 0.4, dg, dl) == (2, pytest.approx(1.5))
    assert w_star_at_crossing(h, 0.4, dg, dl, window=3) == (2, pytest.approx(1.3))
    assert w_star_at_crossing(h, 0.1, dg, dl) == (None, None)
    assert w_star_at_crossing(h, 1.9, dg, dl) == (None, None)


def test_measured_critical_w_and_tolerance():
    """Band 0.05: W 1.2 misses on one seed (0.063), 1.3 holds on all, 1.5 too → 1.3; a missing value (None) is a
    miss; nothing holds → None. Tolerance: max(0.35 × (1.3 − 1), 0.1) = 0.105; max(0.35 × 0.1, 0.1) = 0.1."""
    devs = {1.1: [0.12, 0.13], 1.2: [0.04, 0.063], 1.3: [0.005, 0.008], 1.5: [0.0, 0.001]}
    assert measured_critical_w(devs, 0.05) == 1.3
    assert measured_critical_w({1.3: [0.01, None]}, 0.05) is None
    assert measured_critical_w({1.1: [0.2]}, 0.05) is None
    # with H_tgt 0.08 the held band is min(0.05, 0.08/4) = 0.02: a deviation of 0.03 no longer holds
    assert measured_critical_w({1.1: [0.03]}, 0.05) == 1.1
    assert measured_critical_w({1.1: [0.03]}, 0.05, target_entropy=0.08) is None
    assert tolerance(1.3, 0.1) == pytest.approx(0.105)
    assert tolerance(1.1, 0.1) == pytest.approx(0.1)


def test_recommendation_precedence():
    """measured > calibrated > predicted > conservative (docs/theory.md §7), per M; within a kind the largest W. A
    measured record with no held grid W up to 1.5 rules out the predicted 1.3 and the conservative 1.4: the
    recommendation is then that measured record ("above 1.5"), unless an estimate lies above 1.5."""
    meas = CriticalStrength("measured", 1.3, None, 1.2, 1.3, "o1 W sweep")
    cal = CriticalStrength("calibrated", 1.25, None, 1.2, 1.35, "calibration.json")
    pred = CriticalStrength("predicted", 1.28, None, 1.27, 1.3, "held runs")
    cons = CriticalStrength("conservative", 1.35, None, 1.3, 1.4, "grpo")
    c2 = CriticalStrength("conservative", 1.25, 0.9, None, None, "c2")
    assert recommend([cons, pred, cal, meas, c2]) is meas
    assert recommend([cons, pred, cal, c2]) is cal
    assert recommend([cons, pred, c2]) is pred
    assert recommend([cons, c2]) is cons
    assert recommend([cons, pred, meas], m=0.9) is None and recommend([cons, c2], m=0.9) is c2
    assert recommend([pred, CriticalStrength("predicted", 1.4, None, None, None, "other")]).w == 1.4
    none_held = CriticalStrength("measured", None, None, 1.5, None, "o1 W sweep")
    assert recommend([none_held, pred, cons]) is none_held
    high = CriticalStrength("conservative", 1.7, None, None, None, "grpo")
    assert recommend([none_held, pred, high]) is high
    assert "above 1.5" in recommendation_text([none_held, pred])
    text = recommendation_text([cons, pred, meas])
    assert text.startswith("recommended W for O1: 1.3 (measured: ") and "also: predicted 1.28, conservative 1.35" in text
    assert CriticalStrength("predicted", 1.2, 1.0).m is None  # M = 1 is O1


def test_measured_strength_from_held_runs():
    """Grid 1.1 (no seed held), 1.2 (one of two), 1.3 and 1.5 (both): measured 1.3, range (1.2, 1.3]. A grid whose
    smallest W holds: no lower end. Nothing held: W None, low = the largest grid W (1.5). A None (no band
    criterion) is a miss."""
    s = measured_strength({1.1: [False, False], 1.2: [True, False], 1.3: [True, True], 1.5: [True, True]})
    assert (s.kind, s.w, s.low, s.high) == ("measured", 1.3, 1.2, 1.3) and s.range_text() == "(1.2, 1.3]"
    s = measured_strength({1.1: [True, True], 1.3: [True, True]})
    assert (s.w, s.low) == (1.1, None) and s.range_text() == "≤ 1.1"
    s = measured_strength({1.1: [False], 1.5: [True, None]})
    assert s.w is None and s.low == 1.5 and "no grid W held" in s.describe()
    assert measured_strength({}) is None


def test_strength_records_round_trip_and_refuse_bad_values():
    s = CriticalStrength("calibrated", 1.27, 0.9, 1.2, 1.35, "calibration.json")
    d = s.to_dict()
    assert d["meaning"] == KIND_MEANING["calibrated"] and CriticalStrength.from_dict(d) == s
    with pytest.raises(ConfigError, match="kind='guessed' is not one of"):
        CriticalStrength("guessed", 1.2)
    with pytest.raises(ConfigError, match="w='1.2'"):
        CriticalStrength("measured", "1.2")
    with pytest.raises(DataError, match="must be a mapping with a 'kind'"):
        CriticalStrength.from_dict({"w": 1.2})


def test_run_strengths_by_hand():
    """grpo runs cross H_tgt at W* 1.3 and 1.4 → conservative O1 1.35 (1.3–1.4); o1-adaptive: two runs held the
    band (critical W 1.28, 1.32), one did not (1.9, ignored) → predicted 1.3; c2 (M 0.9): held run 1.1, its own
    crossing W* 1.2 → predicted 1.1 and conservative 1.2 at M 0.9."""
    held = {"mean_abs_dev_second_half": 0.001, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4}
    missed = {**held, "mean_abs_dev_second_half": 0.1}
    groups = [
        {"label": "grpo", "stare": False, "m": None, "grpo": True,
         "runs": [{"w_star_at_crossing": 1.3}, {"w_star_at_crossing": 1.4}]},
        {"label": "o1-adaptive", "stare": True, "m": None,
         "runs": [{**held, "critical_w": 1.28}, {**held, "critical_w": 1.32}, {**missed, "critical_w": 1.9}]},
        {"label": "c2", "stare": True, "m": 0.9, "runs": [{**held, "critical_w": 1.1, "w_star_at_crossing": 1.2}]},
    ]
    got = {(s.kind, s.m): s for s in run_strengths(groups)}
    assert got[("conservative", None)].w == pytest.approx(1.35) and got[("conservative", None)].low == 1.3
    assert got[("predicted", None)].w == pytest.approx(1.3) and got[("predicted", None)].high == 1.32
    assert got[("predicted", 0.9)].w == 1.1 and got[("conservative", 0.9)].w == 1.2
    assert "2 held runs of o1-adaptive" in got[("predicted", None)].source


def test_decomposition_with_a_share_of_the_push_by_hand():
    """A push applied at a share e (a tabular toy's push_efficiency) needs 1/e of the first-order push: constant
    D_GRPO −0.3, D_L+ 0.1, D_L− −0.05 over 8 steps, the entropy crossing 0.5 at step 2. O1: W* = 1 + 0.3/0.1 = 4 at
    e 1 and 1 + 0.3/(0.5·0.1) = 7 at e 0.5. C2 at M 0.5, e 0.5: W* = 1 − (−0.3 + (−0.5)·0.5·(−0.05))/(0.5·0.1)
    = 6.75."""
    rows = [{"step": i + 1, "entropy": 1.0 - 0.2 * i, "pred/d_grpo": -0.3, "pred/d_lplus": 0.1,
             "pred/d_lminus": -0.05} for i in range(8)]
    whole = decomposition_summary(rows, 0.5)
    assert whole["critical_w"] == pytest.approx(4.0) and whole["w_star_at_crossing"] == pytest.approx(4.0)
    half = decomposition_summary(rows, 0.5, push_efficiency=0.5)
    assert half["critical_w"] == pytest.approx(7.0) and half["w_star_at_crossing"] == pytest.approx(7.0)
    assert run_summary(rows, target_entropy=0.5)["crossing_step"] == 4  # entropy 0.4 < 0.5 first at index 3
    c2 = decomposition_summary(rows, 0.5, reweight_m=0.5, push_efficiency=0.5)
    assert c2["critical_w"] == pytest.approx(6.75) and c2["w_star_at_crossing"] == pytest.approx(6.75)


HELD = {"mean_abs_dev_second_half": 0.001, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4}


def test_a_plugins_baseline_is_not_pooled_with_grpo():
    """Issue 29: a plugin method's runs (a baseline, not GRPO) were pooled with GRPO's in the conservative W: "1.6 (…
    4 runs of grpo, half-grpo)" where GRPO alone gives 1.43. GRPO's W* 1.4, 1.43, 1.46 → 1.43 from 3 runs of grpo;
    half-grpo's 2.0, 2.1 are not in it."""
    groups = [
        {"label": "grpo", "stare": False, "m": None, "grpo": True,
         "runs": [{"w_star_at_crossing": w} for w in (1.4, 1.43, 1.46)]},
        {"label": "half-grpo", "stare": False, "m": None, "grpo": False,
         "runs": [{"w_star_at_crossing": w} for w in (2.0, 2.1)]},
    ]
    (cons,) = run_strengths(groups)
    assert cons.kind == "conservative" and cons.w == pytest.approx(1.43) and (cons.low, cons.high) == (1.4, 1.46)
    assert cons.source == "3 runs of grpo"
    assert run_strengths(groups[1:]) == []  # a baseline that is not GRPO gives no conservative W


def test_a_fixed_w_held_on_every_seed_bounds_the_recommendation():
    """Issue 29: simulate recommended W 1.12 (predicted) where promote called the W 1.1 that held on every seed "an
    upper bound". c2 at W 1.1, M 0.9 held 3/3 seeds; its runs' first-order critical W 1.10, 1.12, 1.14 → predicted
    1.12; the measured record of its W says ≤ 1.1 and is the recommendation (measurement first), "an upper bound of
    the critical W" as promote says it. A W that failed on a seed is a lower bound: "above 1.1"."""
    runs = [{**HELD, "critical_w": w, "push_ratio": 1.0} for w in (1.10, 1.12, 1.14)]
    got = run_strengths([{"label": "c2", "stare": True, "m": 0.9, "w": 1.1, "runs": runs, "sampled": False}])
    rec = recommend(got, 0.9)
    assert rec.kind == "measured" and rec.w == 1.1 and rec.low is None and rec.range_text() == "≤ 1.1"
    assert "an upper bound of the critical W" in rec.describe()
    assert next(s for s in got if s.kind == "predicted").w == pytest.approx(1.12)
    failed = [{**HELD, "mean_abs_dev_second_half": 0.1}] + runs[1:]
    (meas, *_) = run_strengths([{"label": "o1", "stare": True, "m": None, "w": 1.1, "runs": failed}])
    assert meas.kind == "measured" and meas.w is None and meas.low == 1.1 and meas.value_text() == "above 1.1"


def test_first_order_strengths_from_sampled_runs_or_a_weak_push_are_lower_bounds():
    """Issue 29: on collapse (G = 8 sampled) the screen said "try stare.reweight_w ≥ 1.32" and a sweep then held at
    1.5 only. A first-order W from sampled rollouts, or from runs whose push acted below 98 % of its first-order size,
    is labelled a lower bound ("at least"); from mean-field runs at a full push it is not."""
    runs = [{**HELD, "critical_w": 1.32, "push_ratio": 0.99}]
    (pred,) = run_strengths([{"label": "o1-adaptive", "stare": True, "m": None, "runs": runs, "sampled": True}])
    assert pred.lower_bound.startswith("sampled rollouts") and pred.value_text() == "at least 1.32"
    assert "a lower bound: sampled rollouts" in pred.describe()
    assert CriticalStrength.from_dict(pred.to_dict()) == pred
    weak = [{**HELD, "critical_w": 1.3, "push_ratio": 0.94}]
    (pred,) = run_strengths([{"label": "o1-adaptive", "stare": True, "m": None, "runs": weak, "sampled": False}])
    assert pred.lower_bound == "the push acted at 94% of its first-order size" and pred.value_text() == "at least 1.3"
    full = [{**HELD, "critical_w": 1.3, "push_ratio": 0.99}]
    (pred,) = run_strengths([{"label": "o1-adaptive", "stare": True, "m": None, "runs": full, "sampled": False}])
    assert pred.lower_bound == "" and pred.value_text() == "1.3"


HELD = {"mean_abs_dev_second_half": 0.001, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4}
MISSED = {**HELD, "mean_abs_dev_second_half": 0.1}


def test_recommendation_precedence_with_the_auto_kind():
    """measured > auto > calibrated > predicted > conservative: an auto run's 1.29 beats a calibrated 1.4, a
    predicted 1.5 and a conservative 1.6 although it is the smallest, and loses to a measured 1.3; a measured record
    with no held grid W up to 1.3 rules the auto 1.29 out (the calibrated 1.4 is next)."""
    meas = CriticalStrength("measured", 1.3, None, 1.2, 1.3, "o1 W sweep")
    auto = CriticalStrength("auto", 1.29, None, 1.27, 1.29, "3/3 runs of o1-auto held the band")
    cal = CriticalStrength("calibrated", 1.4, None, 1.3, 1.5, "calibration.json")
    pred = CriticalStrength("predicted", 1.5, None, None, None, "held runs")
    cons = CriticalStrength("conservative", 1.6, None, None, None, "grpo")
    assert STRENGTH_KINDS == ("measured", "auto", "calibrated", "predicted", "conservative")
    assert recommend([cons, pred, cal, auto, meas]) is meas
    assert recommend([cons, pred, cal, auto]) is auto
    assert recommend([cons, pred, cal]) is cal
    none_held = CriticalStrength("measured", None, None, 1.3, None, "o1 W sweep")
    assert recommend([none_held, auto, cal]) is cal
    # an auto run that did not hold is a bound, like a sweep in which no W held: a larger estimate of a later kind
    # wins (conservative 1.6 above at least 1.29), a smaller one is ruled out (it is returned itself then)
    failed = CriticalStrength("auto", 1.29, None, 1.27, 1.29, "1/3 runs", "the band did not hold on 2/3 seeds")
    assert recommend([failed, cons]) is cons and recommend([failed, CriticalStrength("predicted", 1.2)]) is failed
    assert recommend([failed, meas]) is meas
    assert "from an auto run" in auto.describe() and "from an auto run" in auto.describe(meaning=False)
    assert auto.describe(meaning=False) == "1.29 (auto: from an auto run; range 1.27–1.29; 3/3 runs of o1-auto held " \
                                           "the band)"


def test_auto_strength_by_hand():
    """o1-auto, 3 runs: two held with balance_w_max 1.28 and 1.30 (mean balance W 1.2, 1.24), one did not (1.9, left
    out) → W = median(1.28, 1.30) = 1.29, range 1.28–1.3, a lower bound (the band did not hold on 1/3 seeds, W never
    at its cap). c2-auto, 2 runs, neither held (balance_w_max
    1.5, 1.7; W at its cap 2 on 30 % and 60 % of the steps from the crossing on) → at least median 1.6, M = 1/1.6 =
    0.625, the reason names 2/2 seeds and the largest cap share."""
    o1 = {"label": "o1-auto", "auto": True, "variant": "O1", "w_cap": 20.0, "runs": [
        {**HELD, "balance_w_max": 1.28, "balance_w": 1.2, "w_cap_share": 0.0},
        {**HELD, "balance_w_max": 1.30, "balance_w": 1.24, "w_cap_share": 0.0},
        {**MISSED, "balance_w_max": 1.9, "balance_w": 1.5, "w_cap_share": 0.0}]}
    c2 = {"label": "c2-auto", "auto": True, "variant": "C2", "w_cap": 2.0, "runs": [
        {**MISSED, "balance_w_max": 1.5, "balance_w": 1.4, "w_cap_share": 0.3},
        {**MISSED, "balance_w_max": 1.7, "balance_w": 1.6, "w_cap_share": 0.6}]}
    a = auto_strength([o1, c2], "O1")
    assert (a.kind, a.w, a.m, a.low, a.high) == ("auto", pytest.approx(1.29), None, 1.28, 1.30)
    assert a.lower_bound == "the band did not hold on 1/3 seeds" and a.value_text() == "at least 1.29"
    assert a.source == "2/3 runs of o1-auto held the band; mean balance W 1.22 (range 1.2–1.24)"
    b = auto_strength([o1, c2], "C2")
    assert b.w == pytest.approx(1.6) and b.m == pytest.approx(1 / 1.6) and b.value_text() == "at least 1.6 at M=0.625"
    assert b.lower_bound == ("the band did not hold on 2/2 seeds (W at its cap auto_w_max=2 on 60% of the steps from "
                             "the crossing on)")
    assert b.variant == "C2 (M=0.625)"
    # run_strengths: the auto groups give the auto kind only; GRPO still gives O1's conservative W
    grpo = {"label": "grpo", "stare": False, "grpo": True, "m": None, "runs": [{"w_star_at_crossing": 1.35}]}
    got = sorted((x.kind, round(x.m or 1.0, 9)) for x in run_strengths(
        [grpo, {**o1, "stare": True}, {**c2, "stare": True, "m": 0.9}]))
    assert got == [("auto", 0.625), ("auto", 1.0), ("conservative", 1.0)]
    assert pushes_ran([grpo, {**o1, "stare": True}, {**c2, "stare": True}], [a, b]) == ["O1", "C2 (M=0.625)"]


def test_auto_line_says_the_w_it_found_the_cap_and_the_measured_w():
    """The screen's line for an auto group: held 3/3, the W it found 1.29 (median of 1.28, 1.29, 1.30) with its
    range and the mean balance W (median of 1.2, 1.22, 1.24), the cap share when W sat there (10 % on one run: it
    held, so no lower bound, but the cap is said), the measured W of the same variant (O1, not C2's)."""
    g = {"label": "o1-auto", "auto": True, "variant": "O1", "w_cap": 20.0, "runs": [
        {**HELD, "balance_w_max": 1.28, "balance_w": 1.2, "w_cap_share": 0.1},
        {**HELD, "balance_w_max": 1.30, "balance_w": 1.24, "w_cap_share": 0.0},
        {**HELD, "balance_w_max": 1.29, "balance_w": 1.22, "w_cap_share": 0.0}]}
    (entry,) = auto_entries([g, {"label": "grpo", "stare": False, "runs": []}])
    assert (entry["held"], entry["n"], entry["balance_w"], entry["cap_share"]) == (3, 3, pytest.approx(1.22), 0.1)
    meas = CriticalStrength("measured", 1.3, None, 1.2, 1.3, "o1 W sweep: grid 1.1, 1.2, 1.3; 3 seeds")
    line = auto_line(entry, [CriticalStrength("measured", 1.2, 0.9, None, 1.2, "c2 W sweep"), meas])
    assert line == ("o1-auto: held 3/3 seeds; the W it found: 1.29 (range 1.28–1.3; from an auto run: the balance W "
                    "of the strongest stretch of its hold; mean balance W 1.22, range 1.2–1.24); W at its cap "
                    "auto_w_max=20 on 10% of the steps from the crossing on; measured critical W 1.3 (W sweep)")
    # one that did not hold: "at least", the reason with the cap in it (said once)
    g["runs"][2] = {**MISSED, "balance_w_max": 1.9, "balance_w": 1.5, "w_cap_share": 0.0}
    line = auto_line(auto_entries([g])[0])
    assert "held 2/3 seeds; the W it found: at least 1.29 (" in line
    assert line.endswith("a lower bound: the band did not hold on 1/3 seeds (W at its cap auto_w_max=20 on 10% of "
                         "the steps from the crossing on))") and line.count("at its cap") == 1


def test_the_recommended_clause_names_one_number_per_push():
    """A block with O1 measured 1.3 and C2 (M=0.9) predicted 1.18: one clause, O1 first, each number once with its
    kind; a push that did not run (``ran``) is left out."""
    o1 = CriticalStrength("measured", 1.3, None, 1.2, 1.3, "o1 W sweep").to_dict()
    c2 = CriticalStrength("predicted", 1.18, 0.9, None, None, "3 held runs of c2").to_dict()
    entry = {"point": {}, "strengths": [c2, o1], "recommended": {"C2 (M=0.9)": c2, "O1": o1}}
    block = {"slice": {}, "slices": {"": entry}}
    assert recommended_clause(block) == ("recommended W: O1 1.3 (measured: range (1.2, 1.3]; o1 W sweep), C2 (M=0.9) "
                                         "1.18 (predicted: 3 held runs of c2)")
    block["slices"][""]["ran"] = ["C2 (M=0.9)"]
    assert recommended_clause(block) == "recommended W: C2 (M=0.9) 1.18 (predicted: 3 held runs of c2)"
