"""stare_lab.platform.summary: the one run-summary definition, on rows whose every statistic is worked out by hand."""

from __future__ import annotations

import math

import pytest

from stare_lab.errors import ConfigError
from stare_lab.platform.summary import (
    SUMMARY_KEYS,
    band_held,
    held_band,
    fit_prediction,
    fraction_in_band,
    run_summary,
    summary_settings,
    tail_mean,
)


def _rows():
    """10 rows, steps 1..10. Entropies (nats): 1.0, 0.75, None, 0.5, 0.25, 0.125, 0.0625, 0.09375, 0.5, 0.5 with a
    measured change only on the last row (−0.25). Rewards 0..9 (row i: i), accuracy 0.1·i, gate on (True) on the
    last 5 rows, time/step_s 0.5 each, predictions p = 0.1·i with measured 2p + 0.01 on rows 0, 1, 2, 3."""
    ents = [1.0, 0.75, None, 0.5, 0.25, 0.125, 0.0625, 0.09375, 0.5, 0.5]
    rows = []
    for i, h in enumerate(ents):
        rows.append({"step": i + 1, "entropy": h, "reward": float(i), "accuracy": 0.1 * i, "gate_on": i >= 5,
                     "time/step_s": 0.5, "pred_entropy_change": 0.1 * i if i < 4 else None,
                     "entropy_change": (2 * 0.1 * i + 0.01) if i < 4 else (-0.25 if i == 9 else None)})
    return rows


def test_every_statistic_by_hand():
    s = run_summary(_rows(), target_entropy=0.5, band=0.25, collapse_frac=0.1)
    assert tuple(s) == SUMMARY_KEYS
    assert s["steps"] == 10 and s["initial_entropy"] == 1.0
    # final: last row's 0.5 plus its measured −0.25 → 0.25; min over entropies and the final: 0.0625
    assert s["final_entropy"] == 0.25 and s["min_entropy"] == 0.0625
    # first entropy < 0.1 × 1.0 (strictly): 0.0625 at step 7
    assert s["steps_to_collapse"] == 7
    # last max(1, ⌊0.1·10⌋) = 1 row: reward 9, accuracy 0.9
    assert s["final_reward"] == 9.0 and s["final_accuracy"] == pytest.approx(0.9)
    # closed band 0.5 ± 0.25 over the 9 finite entropies: 0.75, 0.5, 0.25 (edges included), 0.5, 0.5 → 5/9
    assert s["time_in_band"] == pytest.approx(5 / 9)
    # second half (rows 5..9): |0.125−0.5| + |0.0625−0.5| + |0.09375−0.5| + 0 + 0 = 1.21875 over 5
    assert s["mean_abs_dev_second_half"] == pytest.approx(1.21875 / 5)
    assert s["gate_on_frac"] == 0.5 and s["wall_s"] == 5.0
    # measured = 2·pred + 0.01 exactly on 4 pairs: slope 2, intercept 0.01, R² 1
    assert s["pred_n"] == 4 and s["pred_slope"] == pytest.approx(2.0) and s["pred_intercept"] == pytest.approx(0.01)
    assert s["pred_r2"] == pytest.approx(1.0)
    # ‖m − p‖/‖m‖ with p = 0, .1, .2, .3 and m = .01, .21, .41, .61: ‖(.01,.11,.21,.31)‖ / ‖m‖
    num = math.sqrt(0.01**2 + 0.11**2 + 0.21**2 + 0.31**2)
    assert s["pred_rel_err"] == pytest.approx(num / math.sqrt(0.01**2 + 0.21**2 + 0.41**2 + 0.61**2))
    assert (s["target_entropy"], s["band"], s["collapse_frac"]) == (0.5, 0.25, 0.1)


def test_tail_of_thirty_rows_and_the_fit_needs_three_pairs():
    # 30 rows: the last ⌊0.1·30⌋ = 3 (0.1·30 is 3.0000000000000004 in binary; the allowance keeps it 3)
    assert tail_mean(list(range(30))) == 28.0
    assert tail_mean([1.0, None, float("nan")]) is None and tail_mean([]) is None
    two = fit_prediction([0.0, 1.0], [1.0, 3.0])  # a line through 2 points says nothing
    assert two["n"] == 2 and two["slope"] is None and two["r2"] is None and "3" in two["reason"]
    assert two["rmse"] == pytest.approx(math.sqrt((1 + 4) / 2))  # identity-line numbers exist from 1 pair
    flat = fit_prediction([0.0, 1.0, 2.0], [0.5, 0.5, 0.5])  # constant measurement: r² = 0 (linregress)
    assert flat["slope"] == 0.0 and flat["r2"] == 0.0 and flat["r2_identity"] is None
    const = fit_prediction([1.0, 1.0, 1.0], [0.0, 1.0, 2.0])
    assert const["slope"] is None and "constant" in const["reason"]


def test_undefined_values_are_none_not_nan():
    s = run_summary([{"step": 0, "entropy": None, "reward": None}], target_entropy=None)
    assert s["steps"] == 1 and all(s[k] is None for k in SUMMARY_KEYS
                                   if k not in ("steps", "band", "collapse_frac", "pred_n"))
    assert run_summary([], target_entropy=float("inf"))["target_entropy"] is None  # no band at an infinite target
    assert fraction_in_band([0.3], None) is None and fraction_in_band([None], 0.3) is None


def test_settings_from_a_run_config_and_bad_settings():
    cfg = {"loss": {"stare": {"target_entropy": 0.4}}, "band": 0.1, "collapse_frac": 0.2}
    assert summary_settings(cfg) == {"target_entropy": 0.4, "band": 0.1, "collapse_frac": 0.2, "w_max": None,
                                     "variant": "O1", "schedule": None}
    assert summary_settings({"loss": {"stare": {"variant": "c2"}}}) == {
        "target_entropy": None, "band": 0.05, "collapse_frac": 0.1, "w_max": None, "variant": "C2", "schedule": None}
    adaptive = {"loss": {"stare": {"target_entropy": 0.4, "adaptive": True, "w_max": 1.5}}}
    assert summary_settings(adaptive)["w_max"] == 1.5  # the cap only matters with the adaptive schedule
    assert summary_settings(adaptive)["schedule"] == "paper"
    auto = {"loss": {"stare": {"adaptive": True, "schedule": "auto", "auto_w_max": 20.0}}}
    assert (summary_settings(auto)["w_max"], summary_settings(auto)["schedule"]) == (20.0, "auto")
    assert summary_settings(None)["band"] == 0.05 and summary_settings(None)["variant"] is None
    with pytest.raises(ConfigError, match="band"):
        run_summary([], band=-1)
    with pytest.raises(ConfigError, match="collapse_frac"):
        run_summary([], collapse_frac=2)


def test_a_collapsed_run_is_never_held():
    """H_tgt 0.08 nats, band 0.05, 10 rows. A GRPO run whose entropy fell from 1.0 to 0.04 nats (4 % of its
    initial entropy: collapsed): second-half entropies (rows 5..9) 0.05, 0.04, 0.04, 0.04, 0.04 → mean deviation
    (0.03 + 4·0.04)/5 = 0.038 < 0.05, so the fixed 0.05-nat band called it held; the held band is
    min(0.05, 0.08/4) = 0.02 → not held. A run at H_tgt (0.08 ± 0.005) holds (mean deviation 0.005 < 0.02)."""
    collapsed = [{"step": i, "entropy": h} for i, h in enumerate([1.0, 0.5, 0.2, 0.1, 0.07, 0.05, 0.04, 0.04, 0.04,
                                                                 0.04])]
    s = run_summary(collapsed, target_entropy=0.08, band=0.05)
    assert s["mean_abs_dev_second_half"] == pytest.approx(0.038)
    assert s["mean_abs_dev_second_half"] < 0.05 and s["held"] is False and band_held(s) is False
    assert held_band(0.05, 0.08) == pytest.approx(0.02) and held_band(0.05, 0.4) == 0.05
    steady = [{"step": i, "entropy": h} for i, h in enumerate([1.0, 0.5, 0.2, 0.1, 0.085, 0.075, 0.085, 0.075,
                                                              0.085, 0.075])]
    s = run_summary(steady, target_entropy=0.08, band=0.05)
    assert s["mean_abs_dev_second_half"] == pytest.approx(0.005) and s["held"] is True


def test_a_late_collapse_is_not_held_and_old_summaries_work():
    """H_tgt 0.4, band 0.05, 20 rows: the second half (rows 10..19) sits at 0.4 for 9 rows, then the last entropy
    is 0.1: mean deviation 0.3/10 = 0.03 < 0.05, but the final entropy 0.1 < H_tgt/2 = 0.2 → not held.
    band_held reads a summary.json written before the ``held`` key existed (no ``held``; band keys only)."""
    rows = [{"step": i, "entropy": 1.0 - 0.06 * i} for i in range(10)] + [
        {"step": 10 + i, "entropy": 0.4} for i in range(9)] + [{"step": 19, "entropy": 0.1}]
    s = run_summary(rows, target_entropy=0.4, band=0.05)
    assert s["mean_abs_dev_second_half"] == pytest.approx(0.03) and s["final_entropy"] == 0.1
    assert s["held"] is False
    old = {"mean_abs_dev_second_half": 0.01, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.41}
    assert band_held(old) is True and band_held({**old, "target_entropy": None}) is None


def test_adaptive_w_mean_and_share_at_the_cap():
    """8 rows, w_max 1.5: second half (rows 4..7) W = 1.49, 1.5, 1.5, 1.48 → mean 5.97/4 = 1.4925, at the cap
    2 of 4 = 0.5; without w_max (no adaptive schedule) both are None."""
    ws = [1.1, 1.2, 1.3, 1.4, 1.49, 1.5, 1.5, 1.48]
    rows = [{"step": i, "entropy": 0.4, "stare_w": w} for i, w in enumerate(ws)]
    s = run_summary(rows, target_entropy=0.4, w_max=1.5)
    assert s["w_mean_second_half"] == pytest.approx(1.4925) and s["w_cap_share"] == 0.5
    s = run_summary(rows, target_entropy=0.4)
    assert s["w_mean_second_half"] is None and s["w_cap_share"] is None


def test_auto_cap_share_counts_from_the_crossing_and_balance_m_is_c2_only():
    """10 rows, H_tgt 0.5, cap 3. Rows 0..3 above the target (W 2, gate off), row 4 the first below it; W from row 4
    on: 3, 3, 3, 2.5, 2, 2 → at the cap on 3 of those 6 rows = 0.5 (the auto schedule). The paper schedule counts
    the second half, rows 5..9 (W 3, 3, 2.5, 2, 2): 2 of 5 = 0.4. The mean W over the second half is
    (3 + 3 + 2.5 + 2 + 2)/5 = 2.5 for both. balance_m over rows 5..9 with M 0.5 and the gate on at rows 5..7:
    1 − 3·0.5/5 = 0.7 for C2, None for O1 (it never applies M) and without a variant."""
    ent = [0.9, 0.8, 0.7, 0.6, 0.45, 0.48, 0.49, 0.51, 0.5, 0.5]
    ws = [2.0] * 4 + [3.0, 3.0, 3.0, 2.5, 2.0, 2.0]
    gates = [0] * 4 + [1, 1, 1, 1, 0, 0]
    rows = [{"step": i + 1, "entropy": h, "stare_w": w, "stare_m": 0.5, "gate_on": g}
            for i, (h, w, g) in enumerate(zip(ent, ws, gates))]
    auto = run_summary(rows, target_entropy=0.5, w_max=3.0, schedule="auto", variant="C2")
    paper = run_summary(rows, target_entropy=0.5, w_max=3.0, schedule="paper", variant="O1")
    assert auto["w_cap_share"] == pytest.approx(0.5) and paper["w_cap_share"] == pytest.approx(0.4)
    assert auto["w_mean_second_half"] == pytest.approx(2.5) == paper["w_mean_second_half"]
    assert auto["balance_m"] == pytest.approx(0.7)
    assert paper["balance_m"] is None and run_summary(rows, target_entropy=0.5)["balance_m"] is None
    # no row below the target: the auto schedule never moved its W, there is no share to give
    assert run_summary(rows[:4], target_entropy=0.5, w_max=3.0, schedule="auto")["w_cap_share"] is None
