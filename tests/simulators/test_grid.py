"""Sweep grids: parsing, the points each method runs, and the critical-W summary on constructed groups."""

from __future__ import annotations

import pytest

from simulators.grid import critical_summary, method_points, parse_grid, point_label
from stare_lab.errors import ConfigError

W = "loss.stare.reweight_w"


def test_parse_grid():
    grid = parse_grid(["stare.reweight_w=1.1,1.3", "lr=0.5,1"])
    assert grid == [(W, [1.1, 1.3]), ("lr", [0.5, 1.0])]
    for bad, msg in ((["lr"], "must look like KEY=V1,V2"), (["lr=1,,2"], "without gaps"),
                     (["lr=1", "lr=2"], "gives lr twice"), (["seed=1,2"], "--seeds"), (["lr=1,1"], "twice")):
        with pytest.raises(ConfigError, match=msg):
            parse_grid(bad)


def test_method_points_drop_stare_keys_for_non_stare_methods():
    grid = [(W, [1.1, 1.3]), ("lr", [0.5, 1.0])]
    assert method_points(grid, is_stare=False) == [{"lr": 0.5}, {"lr": 1.0}]
    assert len(method_points(grid, is_stare=True)) == 4
    assert method_points([(W, [1.1])], is_stare=False) == [{}]
    assert point_label({W: 1.2, "lr": 0.5}) == "W=1.2,lr=0.5"


def test_critical_summary_on_constructed_groups():
    """W grid 1.1/1.2/1.3/1.5, band 0.05: 1.2 misses on one seed (0.063) → measured 1.3; the runs that held are
    five (seed 0 at 1.2, 0.04 < 0.05, without a W*; the four at 1.3 and 1.5), the four with W* have second-half maxima
    1.26, 1.28, 1.27, 1.25 → predicted (median) 1.265, the same number the labelled strength gives; GRPO's W* at the crossing
    1.5, 1.4 → 1.45. Tolerance max(0.35 × 0.3, 0.1) = 0.105 → the prediction (|1.265 − 1.3| = 0.035) is inside."""
    def runs(devs, crit=None):
        return {f"seed{i}": {"mean_abs_dev_second_half": d, "critical_w": (crit or [None] * len(devs))[i],
                             "critical_w_measured_drift": None, "w_star_at_crossing": None,
                             "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4 - d}
                for i, d in enumerate(devs)}

    groups = {
        "grpo": {"method": "grpo", "point": {}, "is_stare": False,
                 "runs": {"seed0": {"w_star_at_crossing": 1.5}, "seed1": {"w_star_at_crossing": 1.4}}},
        "o1 [W=1.1]": {"method": "o1", "point": {W: 1.1}, "is_stare": True, "runs": runs([0.12, 0.13])},
        "o1 [W=1.2]": {"method": "o1", "point": {W: 1.2}, "is_stare": True, "runs": runs([0.04, 0.063])},
        "o1 [W=1.3]": {"method": "o1", "point": {W: 1.3}, "is_stare": True, "runs": runs([0.005, 0.008], [1.26, 1.28])},
        "o1 [W=1.5]": {"method": "o1", "point": {W: 1.5}, "is_stare": True, "runs": runs([0.0, 0.001], [1.27, 1.25])},
    }
    c = critical_summary(groups, [(W, [1.1, 1.2, 1.3, 1.5])], 0.05)["o1"]
    assert c["measured_w"] == 1.3 and c["held_runs"] == 5
    assert c["predicted_w"] == pytest.approx(1.265) and c["predicted_w_grpo"] == pytest.approx(1.45)
    assert c["grid_step"] == pytest.approx(0.1) and c["tolerance"] == pytest.approx(0.105)
    assert c["predicted_w_within_tolerance"] is True
    assert c["deviation_by_w"]["1.2"] == [0.04, 0.063]
    # the same numbers as labelled strengths: measured 1.3 in (1.2, 1.3], predicted 1.265 over 1.25–1.28 (4 held
    # runs), conservative 1.45 over 1.4–1.5; the recommendation is the measured one (precedence)
    kinds = {d["kind"]: d for d in c["strengths"]}
    assert (kinds["measured"]["w"], kinds["measured"]["low"], kinds["measured"]["high"]) == (1.3, 1.2, 1.3)
    assert kinds["predicted"]["w"] == pytest.approx(1.265) and kinds["predicted"]["low"] == 1.25
    assert kinds["conservative"]["w"] == pytest.approx(1.45) and kinds["conservative"]["high"] == 1.5
    assert c["recommended"]["kind"] == "measured" and c["recommended"]["w"] == 1.3
    # an adaptive method's W grid sets its starting W: no measured strength
    adaptive = {k: {**g, "adaptive": g["is_stare"]} for k, g in groups.items()}
    ca = critical_summary(adaptive, [(W, [1.1, 1.2, 1.3, 1.5])], 0.05)["o1"]
    assert ca["measured_w"] is None and ca["recommended"]["kind"] == "predicted"
    assert critical_summary(groups, [("lr", [1.0])], 0.05) == {}


def test_c2_conservative_is_its_own_in_both_tables():
    """Fresh-user item: the C2 entry's ``predicted_w_grpo`` was GRPO's O1 value (1.45 here) while its conservative
    strength is the C2 runs' own W* with M at the crossing (1.9, 2.1 → 2.0); both are now 2.0."""
    def runs(devs, cross):
        return {f"seed{i}": {"mean_abs_dev_second_half": d, "critical_w": None, "critical_w_measured_drift": None,
                             "w_star_at_crossing": cross[i], "target_entropy": 0.4, "band": 0.05,
                             "final_entropy": 0.4 - d} for i, d in enumerate(devs)}

    groups = {
        "grpo": {"method": "grpo", "point": {}, "is_stare": False,
                 "runs": {"seed0": {"w_star_at_crossing": 1.5}, "seed1": {"w_star_at_crossing": 1.4}}},
        "c2 [W=2]": {"method": "c2", "point": {W: 2.0}, "is_stare": True, "m": 0.5,
                     "runs": runs([0.01, 0.02], [1.9, 2.1])},
    }
    c = critical_summary(groups, [(W, [2.0])], 0.05)["c2"]
    kinds = {d["kind"]: d for d in c["strengths"]}
    assert kinds["conservative"]["w"] == pytest.approx(2.0) and c["predicted_w_grpo"] == pytest.approx(2.0)
