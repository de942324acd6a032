"""stare_lab.theory.regime: a run's regime and the mismatch check, on rows worked out by hand."""

from __future__ import annotations

import json

import pytest

from stare_lab.errors import DataError, RunError
from stare_lab.theory.regime import calibrated_strengths, read_calibration, regime_mismatches, run_regime


def test_run_regime_at_the_crossing_by_hand():
    """Entropies 1.0, 0.8, 0.5, 0.3, 0.2, 0.1 with H_tgt 0.4: first below at index 3; window 3 → rows 2..4. D_GRPO
    −0.1, −0.2, −0.3 and D_L+ 0.1, 0.4, 0.7 there: ΣD_L+/|ΣD_GRPO| = 1.2/0.6 = 2 (a ratio of sums; the mean of the
    per-row ratios would be (1 + 2 + 2.33)/3 = 1.78); mean entropy (0.5 + 0.3 + 0.2)/3 = 1/3; H_tgt / ln 2 from the
    config; mode from the config. Without a target: every row; a trainer run samples."""
    h = [1.0, 0.8, 0.5, 0.3, 0.2, 0.1]
    dg = [-0.5, -0.5, -0.1, -0.2, -0.3, -0.5]
    dl = [9.0, 9.0, 0.1, 0.4, 0.7, 9.0]
    rows = [{"entropy": a, "pred/d_grpo": b, "pred/d_lplus": c, "pred/lplus_above_sstar": 0.5} for a, b, c in
            zip(h, dg, dl)]
    reg = run_regime(rows, 0.4, {"reward_optimal_entropy": 0.6931, "mode": "expected"}, window=3)
    assert reg["d_ratio"] == pytest.approx(2.0) and reg["entropy"] == pytest.approx(1 / 3)
    assert reg["target_over_optimal"] == pytest.approx(0.4 / 0.6931) and reg["mode"] == "expected"
    assert reg["lplus_above_sstar"] == 0.5
    whole = run_regime(rows, None, {"source": "trainer"})
    assert whole["d_ratio"] == pytest.approx(sum(dl) / -sum(dg)) and whole["mode"] == "sampled"
    logged = run_regime([{"entropy": 2.0, "pred/d_ratio": 20.0}, {"entropy": 2.1, "pred/d_ratio": 40.0}])
    assert logged["d_ratio"] == 30.0 and logged["mode"] is None  # only the logged ratio: its mean


def test_regime_mismatches_name_both_numbers():
    """Factor 2: 2 vs 4.5 (2.25x) and 2 vs −1 (signs) differ, 2 vs 3.9 does not; modes differ; a missing number is
    not compared."""
    a = {"d_ratio": 2.0, "mode": "expected", "entropy": 0.4}
    (d, mode) = regime_mismatches(a, {"d_ratio": 4.5, "mode": "sampled"}, ("toy", "model"))
    assert d.startswith("D_L+/|D_GRPO| is 2 in toy at H 0.4 nats and 4.5 in model (more than 2x apart)")
    assert mode.startswith("toy ran in the mean-field limit") and "model samples G responses" in mode
    assert len(regime_mismatches(a, {"d_ratio": -1.0})) == 1
    assert regime_mismatches(a, {"d_ratio": 3.9, "mode": "expected"}) == []
    assert regime_mismatches({"target_over_optimal": 0.6}, {"target_over_optimal": 1.5})[0].startswith(
        "H_tgt is 0.6 x the reward-optimal entropy in the source and 1.5 x in the target")
    assert regime_mismatches({}, {"d_ratio": 50.0, "mode": "sampled"}) == []


def test_read_calibration_and_its_strengths(tmp_path):
    cal = {"kind": "calibrated", "probe": {"run": "p"}, "critical": {"o1": {"w": 1.12, "low": 1.08, "high": 1.2},
                                                                     "c2": {"w": 1.08, "m": 0.92}}}
    (tmp_path / "calibration.json").write_text(json.dumps(cal))
    data = read_calibration(tmp_path)  # the folder stare-lab calibrate wrote
    o1, c2 = calibrated_strengths(data)
    assert (o1.kind, o1.w, o1.m, o1.low, o1.high) == ("calibrated", 1.12, None, 1.08, 1.2)
    assert (c2.w, c2.m) == (1.08, 0.92) and "probe p" in c2.source
    with pytest.raises(RunError, match="does not exist"):
        read_calibration(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text(json.dumps({**cal, "kind": "measured"}))
    with pytest.raises(DataError, match="kind='measured'; a calibration has kind 'calibrated'"):
        read_calibration(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DataError, match="bad.json:1: not valid JSON"):
        read_calibration(tmp_path / "bad.json")
