"""analysis.compare: grouping, seed aggregation and the per-group tables on runs with known values."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

import analysis
from analysis.compare import compare
from stare_lab.errors import ConfigError
from stare_lab.platform.runs import RunWriter


def _run(path, method, seed, entropy, source="simulator", w=1.1, target=0.3, extra=None, config=None):
    cfg = {"source": source, "method": method, "seed": seed,
           "loss": {"stare": {"target_entropy": target, "reweight_w": w}}, **(config or {})}
    with RunWriter(path, cfg) as wr:
        for i, h in enumerate(entropy):
            row = {"step": i, "entropy": h, "reward": 0.1 * i, "gate_on": int(h < target), "stare_w": w,
                   "stare_m": 1.0, "pred_entropy_change": 0.01 * i, "entropy_change": 0.02 * i + 0.001 * seed,
                   "time/step_s": 0.5}
            row.update((extra or {}).get(i, {}))
            wr.log(row)


def test_groups_seed_mean_and_summary_known_values(tmp_path):
    # grpo: 3 seeds, entropy 1.1·(0.5)^t + seed·0.01 → initial 1.1 + 0.01·seed
    for s in range(3):
        _run(tmp_path / "grpo" / f"seed{s}", "grpo", s, [1.1 * 0.5**t + 0.01 * s for t in range(6)])
    # o1: 2 seeds of different length (5 and 4 steps), constant entropy 0.3 → always in band
    _run(tmp_path / "o1" / "seed0", "o1", 0, [0.3] * 5)
    _run(tmp_path / "o1" / "seed1", "o1", 1, [0.32] * 4)
    cmp = compare(tmp_path)
    assert [g.label for g in cmp.groups] == ["grpo", "o1"]  # KNOWN_METHODS order
    grpo = cmp.group("grpo")
    agg = cmp.series(grpo, "entropy")
    np.testing.assert_allclose(agg.mean, [1.1 * 0.5**t + 0.01 for t in range(6)])  # mean of seeds 0,1,2 → +0.01
    o1 = cmp.series("o1", "entropy")
    assert o1.x.tolist() == [0, 1, 2, 3] and any(n.startswith("o1: series differ in length") and "; for entropy" in n for n in cmp.notes)
    rows = {r["label"]: r for r in cmp.summary_rows()}
    g = rows["grpo"]
    # initial entropies 1.10, 1.11, 1.12 → mean 1.11; thresholds (10%) 0.110, 0.111, 0.112;
    # t=3 gives 0.1375/0.1475/0.1575 (above), t=4 gives 0.06875/0.07875/0.08875 (below) → 4 for every seed
    assert g["initial_entropy"][0] == pytest.approx(1.11)
    assert g["steps_to_threshold"] == (4.0, 3, 3)
    # final H = last entropy + its measured change (0.02·5 + 0.001·seed): mean over seeds 0, 1, 2 → + 0.101
    assert g["final_entropy"][0] == pytest.approx(1.1 * 0.5**5 + 0.01 + 0.101)
    # in band |H − 0.3| ≤ 0.05: only t=2 (0.275, 0.285, 0.295) of 6 steps, for each seed → 1/6
    assert g["frac_in_band"][0] == pytest.approx(1 / 6)
    assert g["wall_time_s"][0] == pytest.approx(3.0)  # 6 steps × 0.5 s
    assert g["final_reward"][0] == pytest.approx(0.5)  # mean of the last max(1, 10% of 6) = 1 step: 0.1·5
    o = rows["o1"]
    assert o["frac_in_band"][0] == 1.0 and o["steps_to_threshold"] == (None, 0, 2)
    assert o["n_runs"] == 2 and o["target_entropy"] == 0.3


def test_prediction_fits_pooled_over_seeds(tmp_path):
    for s in range(2):
        _run(tmp_path / "c2" / f"seed{s}", "c2", s, [0.5] * 10)
    cmp = compare(tmp_path)
    fits = cmp.prediction_fits()
    assert [f["predictor"] for f in fits] == ["pred_entropy_change"]
    fit = fits[0]["fit"]
    # measured = 2·predicted + 0.001·seed over seeds 0, 1 (10 pairs each): slope 2, intercept 0.0005 exactly
    assert fit.n == 20 and fit.slope == pytest.approx(2.0) and fit.intercept == pytest.approx(0.0005)


def test_group_by_mixed_sources_and_quadrants(tmp_path):
    quad = {i: {"quadrant/pos_high/count": 1, "quadrant/pos_low/count": 3, "quadrant/neg_high/count": 0,
                "quadrant/neg_low/count": None, "quadrant/pos_high/dH": 0.002 * i} for i in range(4)}
    _run(tmp_path / "a", "o1", 0, [0.5] * 4, w=1.1, extra=quad)
    _run(tmp_path / "b", "o1", 0, [0.5] * 4, w=1.2)
    _run(tmp_path / "c", "o1", 0, [2.0, 1.0, 0.5, 0.25], source="trainer", w=1.1)
    cmp = compare(tmp_path, group_by=["loss.stare.reweight_w"])
    assert [g.label for g in cmp.groups] == [
        "o1 [simulator] (reweight_w=1.1)", "o1 [simulator] (reweight_w=1.2)", "o1 [trainer] (reweight_w=1.1)"]
    assert cmp.sources == ["simulator", "trainer"]
    assert cmp.has_quadrants()
    rows = [r for r in cmp.quadrant_table() if r["quadrant"] == "pos_high"]
    assert len(rows) == 1
    # counts 1, 3, 0, (null) → share 1/4; dH 0, .002, .004, .006 → mean .003, total .012
    assert rows[0]["share"][0] == pytest.approx(0.25) and rows[0]["count"][0] == 1.0
    assert rows[0]["dH_per_step"][0] == pytest.approx(0.003) and rows[0]["dH_total"][0] == pytest.approx(0.012)
    # trainer run on normalised axes: entropy/initial over fraction of training (steps 0..3)
    norm = cmp.normalised_series(cmp.groups[2]).finite()
    assert norm.mean[0] == 1.0 and norm.mean[-1] == pytest.approx(0.125)
    share = cmp.quadrant_share(cmp.groups[0], "pos_high")
    np.testing.assert_allclose(share.mean, [0.25] * 4)


def test_compare_rejects_bad_settings(tmp_path):
    _run(tmp_path / "r", "grpo", 0, [0.5, 0.4])
    with pytest.raises(ConfigError, match="band_half_width"):
        compare(tmp_path, band_half_width=0)
    with pytest.raises(ConfigError, match="threshold_frac"):
        compare(tmp_path, threshold_frac=2)
    with pytest.raises(ConfigError, match="no group"):
        compare(tmp_path).group("nope")
    cmp = compare(tmp_path, threshold=0.45)  # absolute threshold: 0.4 < 0.45 at step 1
    assert cmp.summary_rows()[0]["steps_to_threshold"] == (1.0, 1, 1)


def test_library_api_accepts_loaded_runs(tmp_path):
    _run(tmp_path / "r", "grpo", 0, [0.5, 0.4, math.nan])
    runs = analysis.load_runs(tmp_path)
    cmp = analysis.compare(runs)
    # the last finite entropy (0.4, step 1) plus that step's measured change 0.02·1
    assert cmp.runs == runs and cmp.summary_rows()[0]["final_entropy"][0] == pytest.approx(0.42)


def test_analysis_imports_point_down_only():
    """analysis reads run directories; it must not import simulators or trainer (docs/design.md)."""
    root = Path(analysis.__file__).parent
    for f in root.glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in ("simulators", "trainer"), f"{f.name} imports {n}"


def test_targets_that_differ_by_seed(tmp_path):
    # a target set relative to each seed's initial entropy (same target_entropy_frac): one group.
    # seed 0: target 0.2, entropy 0.22 → in band; seed 1: target 0.4, entropy 0.22 → out (|0.18| ≥ 0.05)
    _run(tmp_path / "s0", "o1", 0, [0.22] * 3, target=0.2, config={"target_entropy_frac": 0.5})
    _run(tmp_path / "s1", "o1", 1, [0.22] * 3, target=0.4, config={"target_entropy_frac": 0.5})
    cmp = compare(tmp_path)
    assert len(cmp.groups) == 1
    assert cmp.groups[0].target_entropy == pytest.approx(0.3)  # mean of 0.2 and 0.4
    assert any("o1 0.2–0.4 (band at 0.3)" in n for n in cmp.notes)
    assert cmp.summary_rows()[0]["frac_in_band"][0] == pytest.approx(0.5)  # (1 + 0) / 2


def _cfg_run(path, method, seed, config, rows=5, reward=None, extra_row=None):
    cfg = {"source": "simulator", "method": method, "seed": seed, **config}
    with RunWriter(path, cfg) as wr:
        for i in range(rows):
            row = {"step": i, "entropy": 1.0 - 0.1 * i, "reward": (reward or (lambda t: 0.1 * t))(i), "gate_on": 0,
                   "stare_w": 1.0, "stare_m": 1.0, "pred_entropy_change": None, "entropy_change": None}
            row.update((extra_row or (lambda t: {}))(i))
            wr.log(row)


def test_split_by_kind_settings_and_target(tmp_path):
    """Runs of one method differing in simulator kind, loss.stare.* or target are separate, readably labelled."""
    tab = {"simulator": "tabular", "target_entropy_frac": 0.55}
    for s, t in ((0, 0.95), (1, 0.96)):  # relative target: differs by seed, same group
        _cfg_run(tmp_path / "a" / f"s{s}", "c2", s, {**tab, "loss": {"stare": {"reweight_w": 1.1,
                                                                             "target_entropy": t}}})
    _cfg_run(tmp_path / "b", "c2", 0, {**tab, "loss": {"stare": {"reweight_w": 1.3, "target_entropy": 0.95}}})
    _cfg_run(tmp_path / "c", "c2", 0, {"simulator": "transformer", "loss": {"stare": {"reweight_w": 5.0,
                                                                                       "target_entropy": 0.7}}})
    _cfg_run(tmp_path / "d", "c2", 1, {"simulator": "transformer", "loss": {"stare": {"reweight_w": 5.0,
                                                                                       "target_entropy": 0.5}}})
    cmp = compare(tmp_path)
    labels = [g.label for g in cmp.groups]
    assert labels == ["c2 [tabular] (W=1.1)", "c2 [tabular] (W=1.3)", "c2 [transformer] (H_tgt=0.5)",
                      "c2 [transformer] (H_tgt=0.7)"]
    assert [len(g.runs) for g in cmp.groups] == [2, 1, 1, 1]
    assert cmp.groups[0].target_entropy == pytest.approx(0.955)  # (0.95 + 0.96) / 2, the seeds' own targets
    assert cmp.groups[3].target_entropy == 0.7  # never averaged with the tabular 0.95
    assert any("so they are 4 separate groups" in n for n in cmp.notes)
    _cfg_run(tmp_path / "e", "c2", 0, {"loss": {"stare": {"reweight_w": 1.1}}})  # no simulator key at all
    assert "c2 [no simulator/preset key]" in [g.label for g in compare(tmp_path).groups]
    (tmp_path / "e" / "metrics.jsonl").unlink()
    merged = compare(tmp_path, split=False)
    assert [g.label for g in merged.groups] == ["c2"] and len(merged.groups[0].runs) == 5
    assert any("`simulator`" in n and "are averaged together" in n for n in merged.notes)


def test_toys_with_other_task_knobs_are_not_seeds_of_one(tmp_path):
    """Two tabular toys (a calibration's fit runs: other reward coupling and push efficiency, same method, same
    seed, no sweep folder) are two groups labelled by what differs; seeds of one toy stay one group (their seed,
    steps and checkpoints do not split them)."""
    stare = {"loss": {"stare": {"reweight_w": 10.0}}, "simulator": "tabular"}
    _cfg_run(tmp_path / "fit" / "x" / "seed0", "o1", 0, {**stare, "reward_coupling": 0.6, "push_efficiency": None})
    _cfg_run(tmp_path / "fit" / "x" / "seed1", "o1", 1, {**stare, "reward_coupling": 0.6, "push_efficiency": None,
                                                        "steps": 600, "checkpoint_every": 300})
    _cfg_run(tmp_path / "fit" / "y" / "seed0", "o1", 0, {**stare, "reward_coupling": 1.0, "push_efficiency": 0.35})
    cmp = compare(tmp_path)
    assert sorted((g.label, len(g.runs)) for g in cmp.groups) == [
        ("o1 (push_efficiency=0.35, reward_coupling=1)", 1), ("o1 (push_efficiency=None, reward_coupling=0.6)", 2)]


def test_a_calibration_folder_is_read_with_its_sweep(tmp_path):
    """Fresh-user item: analyze on the folder `stare-lab calibrate` wrote pooled the fit runs (other toys) into a
    verdict of their own; they are left out with a note, and analyzing the fit/ folder itself keeps them."""
    stare = {"loss": {"stare": {"reweight_w": 10.0}}, "simulator": "tabular"}
    cal = tmp_path / "cal"
    _cfg_run(cal / "fit" / "reward_coupling=0.8" / "seed0", "o1", 0, {**stare, "reward_coupling": 0.8})
    _cfg_run(cal / "sweep" / "o1" / "seed0", "o1", 0, {**stare, "reward_coupling": 0.6})
    (cal / "calibration.json").write_text("{}")
    cmp = compare(cal)
    assert [len(g.runs) for g in cmp.groups] == [1] and cmp.groups[0].runs[0].path.parent.name == "o1"
    assert any("1 fit run(s) of a calibration (stare-lab calibrate's fit/) left out" in w for w in cmp.warnings)
    assert [len(g.runs) for g in compare(cal / "fit").groups] == [1]


def test_group_by_unknown_or_partial_key(tmp_path):
    _cfg_run(tmp_path / "a", "o1", 0, {"loss": {"stare": {"reweight_w": 1.1}}})
    _cfg_run(tmp_path / "b", "o1", 1, {"lr": 0.1, "loss": {"stare": {"reweight_w": 1.1}}})
    with pytest.raises(ConfigError, match=r"'loss.stare.reweight' is in no run's config.yaml; similar keys "
                                          r"include: loss.stare.reweight_w"):
        compare(tmp_path, group_by=["loss.stare.reweight"])
    cmp = compare(tmp_path, group_by=["lr"])
    assert sorted(g.label for g in cmp.groups) == ["o1 (lr=0.1)", "o1 (lr=None)"]
    assert any("'lr' is missing in 1 of 2 runs" in w for w in cmp.warnings)


def test_final_reward_is_the_mean_of_the_last_tenth(tmp_path):
    # 20 steps, reward 0.1·t → last 2 steps (10% of 20): (1.8 + 1.9) / 2 = 1.85, as simulators/run_stats.py
    _cfg_run(tmp_path / "a", "grpo", 0, {}, rows=20)
    assert compare(tmp_path).summary_rows()[0]["final_reward"][0] == pytest.approx(1.85)


def test_identical_predictors_shown_once(tmp_path):
    # pred/phi_tokens = pred_entropy_change + 1e-17 (a different summation order); pred/grad_dot differs
    def row(t):
        p = -0.01 * (t + 1)
        return {"pred_entropy_change": p, "pred/phi_tokens": p + 1e-17, "pred/grad_dot": 2 * p,
                "entropy_change": 1.1 * p}

    _cfg_run(tmp_path / "a", "grpo", 0, {}, extra_row=row)
    cmp = compare(tmp_path)
    assert cmp.predictor_keys() == ["pred_entropy_change", "pred/grad_dot"]
    assert any("`pred/phi_tokens` equals `pred_entropy_change`" in n for n in cmp.notes)
    assert [f["predictor"] for f in cmp.prediction_fits()] == ["pred_entropy_change", "pred/grad_dot"]
