"""Run directory format (docs/design.md §4): config.yaml, append-only flushed metrics.jsonl, summary.json."""

from __future__ import annotations

import json
import math

import pytest

from stare_lab.platform.runs import REQUIRED_KEYS, RunWriter, find_runs, is_run_dir, read_run
from stare_lab.errors import RunError


def row(step, **extra):
    base = dict(step=step, entropy=1.0, reward=0.5, gate_on=0, stare_w=1.1, stare_m=0.9,
                pred_entropy_change=-0.01, entropy_change=None)
    base.update(extra)
    return base


def test_write_and_read_back(tmp_path):
    run = tmp_path / "r"
    with RunWriter(run, {"source": "simulator", "method": "grpo", "seed": 0}) as w:
        for s in range(3):
            w.log(row(s, **{"loss/pg": float(s)}))
            # flushed every step: readable while the writer is still open
            assert len(read_run(run).metrics) == s + 1
        w.write_summary({"final_entropy": 0.1})
    r = read_run(run)
    assert r.config["method"] == "grpo" and r.config["source"] == "simulator"
    assert "torch" in r.config["versions"] or "python" in r.config["versions"]
    assert [m["step"] for m in r.metrics] == [0, 1, 2]
    assert r.summary == {"final_entropy": 0.1}
    assert r.column("loss/pg") == [0.0, 1.0, 2.0]
    assert r.warnings == []


def test_required_keys_enforced(tmp_path):
    w = RunWriter(tmp_path / "r", {"method": "grpo"})
    bad = row(0)
    del bad["gate_on"]
    with pytest.raises(RunError, match="gate_on"):
        w.log(bad)
    assert set(REQUIRED_KEYS) == set(row(0))


def test_non_finite_written_as_null(tmp_path):
    w = RunWriter(tmp_path / "r", {"method": "grpo"})
    w.log(row(0, entropy=float("nan"), reward=float("inf")))
    w.close()
    line = (tmp_path / "r" / "metrics.jsonl").read_text()
    assert "NaN" not in line and "Infinity" not in line
    m = read_run(tmp_path / "r").metrics[0]
    assert m["entropy"] is None and m["reward"] is None


def test_tensor_values_serialised(tmp_path):
    torch = pytest.importorskip("torch")
    w = RunWriter(tmp_path / "r", {"method": "grpo"})
    w.log(row(0, entropy=torch.tensor(0.25), reward=torch.tensor([1.0, 2.0])))
    w.close()
    m = read_run(tmp_path / "r").metrics[0]
    assert m["entropy"] == 0.25 and m["reward"] == [1.0, 2.0]


def test_refuses_to_clobber_and_resume_truncates(tmp_path):
    run = tmp_path / "r"
    w = RunWriter(run, {"method": "grpo"})
    for s in range(5):
        w.log(row(s))
    w.close()
    with pytest.raises(RunError, match="already holds a run"):
        RunWriter(run, {"method": "grpo"})
    w = RunWriter(run, {"method": "grpo"}, resume=True)
    assert w.truncate_after(2) == 3
    w.log(row(3))
    w.close()
    assert [m["step"] for m in read_run(run).metrics] == [0, 1, 2, 3]
    w = RunWriter(run, {"method": "grpo"}, overwrite=True)
    w.close()
    assert read_run(run).metrics == []


def _one_row_then(run, tail: bytes):
    """A run with one logged row (step 0), then ``tail`` appended to its metrics.jsonl; read back."""
    w = RunWriter(run, {"method": "grpo"})
    w.log(row(0))
    w.close()
    with open(run / "metrics.jsonl", "ab") as fh:
        fh.write(tail)
    r = read_run(run)
    assert [m["step"] for m in r.metrics] == [0]
    return r


def test_truncated_last_line_is_skipped_with_warning(tmp_path):
    r = _one_row_then(tmp_path / "r", b'{"step": 1, "entropy": 0.')  # crash mid-write
    assert any("truncated" in msg for msg in r.warnings)


def test_a_non_utf8_line_is_named_as_such(tmp_path):
    """A line of bytes that are not UTF-8 (0xff 0xfe) is skipped with a warning that says so, not "truncated"."""
    run = tmp_path / "r"
    r = _one_row_then(run, b"\xff\xfe\n")
    assert [m for m in r.warnings if "metrics.jsonl:2" in m] == [f"{run / 'metrics.jsonl'}:2: not valid UTF-8; skipped"]


def test_unwritable_and_missing(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(RunError, match="cannot create run directory"):
        RunWriter(f / "sub", {"method": "grpo"})
    with pytest.raises(RunError, match="does not exist"):
        read_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="not a run directory"):
        read_run(tmp_path / "empty")


def test_find_runs(tmp_path):
    for m in ("grpo", "o1"):
        for s in range(2):
            RunWriter(tmp_path / m / f"seed{s}", {"method": m}).close()
    (tmp_path / "figures").mkdir()
    runs = find_runs([tmp_path])
    assert len(runs) == 4 and all(is_run_dir(r) for r in runs)
    assert find_runs([tmp_path / "grpo" / "seed0"]) == [tmp_path / "grpo" / "seed0"]
