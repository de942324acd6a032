"""analysis.load on synthetic run directories with known values, and damaged ones (never a crash)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.load import config_get, load_run, load_runs
from stare_lab.errors import RunError
from stare_lab.platform.runs import RunWriter


def _row(step, entropy, **extra):
    row = {"step": step, "entropy": entropy, "reward": 0.5, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
           "pred_entropy_change": -0.01, "entropy_change": -0.011}
    row.update(extra)
    return row


def _write(run_dir, rows, config=None):
    cfg = {"source": "simulator", "method": "o1", "seed": 3, "loss": {"stare": {"target_entropy": 0.25}}}
    if config is not None:
        cfg = config
    with RunWriter(run_dir, cfg) as w:
        for r in rows:
            w.log(r)
    return run_dir


def test_load_run_known_values(tmp_path):
    d = _write(tmp_path / "run", [_row(i, 1.0 - 0.1 * i, **{"pred/grad_dot": 0.5 * i}) for i in range(5)])
    r = load_run(d)
    assert (r.method, r.source, r.seed, r.target_entropy) == ("o1", "simulator", 3, 0.25)
    assert r.steps.tolist() == [0, 1, 2, 3, 4] and r.steps.dtype == np.int64
    np.testing.assert_allclose(r.column("entropy"), [1.0, 0.9, 0.8, 0.7, 0.6])
    assert r.predictor_keys() == ["pred_entropy_change", "pred/grad_dot"]
    assert np.isnan(r.column("no/such/key")).all() and not r.has("no/such/key")
    assert r.warnings == []


def test_decomposition_terms_and_calibration_observables_are_not_predictors(tmp_path):
    """D terms, D_L+/|D_GRPO|, the L+-above-s* share and W*(t) are logged under pred/ but predict no ΔH."""
    extra = {"pred/grad_dot": 0.1, "pred/d_grpo": -0.1, "pred/d_lplus": 0.2, "pred/d_lminus": -0.1,
             "pred/d_ratio": 2.0, "pred/lplus_above_sstar": 0.5, "pred/w_star": 1.5}
    r = load_run(_write(tmp_path / "run", [_row(i, 1.0 - 0.1 * i, **extra) for i in range(3)]))
    assert r.predictor_keys() == ["pred_entropy_change", "pred/grad_dot"]


def test_truncated_last_line_null_nan_and_missing_keys(tmp_path):
    d = _write(tmp_path / "run", [_row(0, 0.5), _row(1, float("nan")), _row(2, 0.3)])
    with open(d / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "entropy": 0.2, "rew')  # crash mid-write
    # a row without the required keys and with a NaN token (non-strict JSON, as Python's json writes it)
    with open(d / "metrics.jsonl", "r+") as fh:
        text = fh.read()
    lines = text.splitlines()
    lines.insert(2, '{"step": 5, "entropy": NaN, "extra": "text"}')
    (d / "metrics.jsonl").write_text("\n".join(lines))
    r = load_run(d)
    assert r.steps.tolist() == [0, 1, 2, 5]
    h = r.column("entropy")
    assert h[0] == 0.5 and math.isnan(h[1]) and h[2] == 0.3 and math.isnan(h[3])  # null and NaN → missing
    assert math.isnan(r.column("reward")[3])  # key missing in that row
    assert "extra" not in r.columns  # a string-only column is not numeric
    assert any("not valid JSON" in w for w in r.warnings)


def test_duplicate_unsorted_and_bad_steps(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    rows = [_row(2, 0.2), _row(0, 0.5), _row(1, 0.4), _row(1, 0.35), {"step": "x", "entropy": 1.0},
            {"entropy": 2.0}, {"step": 1.5, "entropy": 3.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = load_run(d)
    assert r.steps.tolist() == [0, 1, 2]
    np.testing.assert_allclose(r.column("entropy"), [0.5, 0.35, 0.2])  # the LAST row of step 1 wins
    assert any("duplicate step" in w for w in r.warnings)
    assert any("3 metrics row(s) without a valid integer 'step'" in w for w in r.warnings)
    assert any("config.yaml: missing" in w for w in r.warnings)
    assert any("no 'method'" in w for w in r.warnings) and r.method == "run"
    assert r.source == "unknown"


def test_method_and_seed_from_sweep_layout_and_target_fallback(tmp_path):
    d = _write(tmp_path / "c2" / "seed7", [_row(0, 0.5)], config={"stare": {"target_entropy": 0.4}})
    r = load_run(d)
    assert (r.method, r.seed, r.target_entropy) == ("c2", 7, 0.4)
    d2 = _write(tmp_path / "x", [_row(0, 0.5)], config={"method": "grpo", "source": "trainer"})
    r2 = load_run(d2)
    assert r2.target_entropy is None and r2.seed is None and r2.source == "trainer"
    assert config_get({"a": {"b": 1}}, "a.b") == 1 and config_get({"a": 1}, "a.b", "d") == "d"


def test_load_runs_finds_recursively_and_skips_non_runs(tmp_path):
    for m in ("grpo", "o1"):
        for s in (0, 1):
            _write(tmp_path / "sweep" / m / f"seed{s}", [_row(0, 0.5)], config={"method": m, "seed": s})
    (tmp_path / "sweep" / "figures").mkdir()  # a non-run folder
    (tmp_path / "sweep" / "notes.txt").write_text("hello")
    empty = tmp_path / "sweep" / "broken"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("not json\n")  # a run dir with no valid row
    warnings: list[str] = []
    runs = load_runs([tmp_path / "sweep", tmp_path / "missing"], warnings)
    assert [(r.method, r.seed) for r in runs] == [("grpo", 0), ("grpo", 1), ("o1", 0), ("o1", 1)]
    assert any("missing: does not exist" in w for w in warnings)
    assert any("broken" in w and "skipped" in w for w in warnings)


def test_load_runs_empty_directory_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no runs found under"):
        load_runs(tmp_path / "empty")
    with pytest.raises(RunError, match="no runs found"):
        load_runs([tmp_path / "nope"])


def test_eval_json_read_defensively(tmp_path):
    d = _write(tmp_path / "run", [_row(0, 0.5)])
    (d / "eval.json").write_text("[1, 2]")
    r = load_run(d)
    assert r.eval is None and any("eval.json: not a JSON object" in w for w in r.warnings)
    (d / "eval.json").write_text('{"benchmarks": {"aime24": {"avg@k": 0.25}}}')
    assert load_run(d).eval["benchmarks"]["aime24"]["avg@k"] == 0.25


def test_non_numeric_entropy_counted_and_bad_yaml_named(tmp_path):
    run = _write(tmp_path / "r", [_row(0, "abc"), _row(1, math.nan), _row(2, 0.5), _row(3, None)])
    (run / "config.yaml").write_text("method: o1\nseed: [1\n")
    r = load_run(run)
    assert math.isnan(r.column("entropy")[0]) and r.column("entropy")[2] == 0.5
    # 3 of 4 rows carry a non-finite/non-numeric entropy ('abc', NaN, null); the first one is named
    assert any("3 of 4 metrics rows have a non-numeric or non-finite 'entropy' (first: 'abc')" in w
               for w in r.warnings)
    # PyYAML says "<unicode string>"; the warning names the file, the line and the column (line 3, col 1: EOF)
    yaml_w = [w for w in r.warnings if "config.yaml" in w]
    assert yaml_w == [f"{run / 'config.yaml'}: not valid YAML at line 3, column 1 (while parsing a flow "
                      "sequence expected ',' or ']', but got '<stream end>'); config ignored"]
