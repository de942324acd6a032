"""`stare-lab analyze` states completeness: an unfinished run (fewer steps than its config asks for, or than its
sweep planned) and a run without entropy (not measurable) are named in the verdict line and the report's warnings,
and left out of the held / collapsed counts (the denominators drop to the counted seeds).

The sweep is a real `stare-lab simulate` sweep (collapse preset, 3 seeds, 60 steps); its runs are then damaged by
hand: grpo/seed1 keeps its first 41 rows (interrupted at step 41), c2/seed2 loses its `entropy` field."""

from __future__ import annotations

import json

import pytest

from analysis.analyze import analyze
from stare_lab.cli import main as cli_main
from stare_lab.platform.completeness import expected_steps, run_status, status_clause


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sw") / "sw"
    assert cli_main(["simulate", "--preset", "collapse", "--methods", "grpo,c2", "--seeds", "3", "--out", str(out),
                     "--no-plots", "steps=60"]) == 0
    return out


def _damage(out):
    p = out / "grpo" / "seed1" / "metrics.jsonl"
    p.write_text("".join(p.read_text().splitlines(keepends=True)[:41]))
    p = out / "c2" / "seed2" / "metrics.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    for r in rows:
        r.pop("entropy")
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_interrupted_sweep_is_flagged_in_the_verdict(sweep, tmp_path):
    import shutil

    out = tmp_path / "sw"
    shutil.copytree(sweep, out)
    complete = analyze([out], tmp_path / "rep0").verdict
    assert "seeds complete" not in complete and "measurable" not in complete
    _damage(out)
    res = analyze([out], tmp_path / "rep")
    v = res.verdict
    assert v.startswith("grpo: 2/3 seeds complete; seed 1 stopped at step 41 of 60; "
                        "c2: 2/3 seeds measurable; seed 2 not measurable (no entropy); "), v
    assert "(W=1.1, M=0.9: 0/2 seeds" in v  # counted over the 2 measurable c2 seeds only
    warnings = res.comparison.warnings
    # the whole reason of the evidence check (stare_lab.platform.evidence): its summary.json is the finished run's
    (cut,) = [w for w in warnings if w.startswith(f"{out / 'grpo' / 'seed1'}: ")]
    assert cut.startswith(f"{out / 'grpo' / 'seed1'}: stopped at step 41 of 60; summary.json does not match its "
                          "metrics.jsonl: steps 60 there, 41 from the rows; ")
    assert cut.endswith("; left out of the verdict's held/collapsed counts")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "seed 1 stopped at step 41 of 60" in md


def test_sweep_summary_steps_are_checked(sweep, tmp_path):
    """The sweep's summary.json planned 2000 steps for grpo/seed0 while its own config says 60 (a run directory
    from another sweep): named as such."""
    import shutil

    out = tmp_path / "sw"
    shutil.copytree(sweep, out)
    s = json.loads((out / "summary.json").read_text())
    s["config"]["grpo/seed0"]["steps"] = 2000
    (out / "summary.json").write_text(json.dumps(s))
    v = analyze([out], tmp_path / "rep").verdict
    assert v.startswith("grpo: 2/3 seeds complete; seed 0 ran 60 steps, its sweep planned 2000; "), v


def test_core_rules():
    """Hand cases of stare_lab.platform.completeness."""
    assert expected_steps({"steps": 800}) == 800
    assert expected_steps({"schedule": {"total_steps": 3}, "steps": 9}) == 3
    assert expected_steps({}) is None
    assert run_status({"steps": 2000}, 411, 411) == "stopped at step 411 of 2000"
    assert run_status({"steps": 10}, 10, 9) == "has 9 of 10 steps"
    assert run_status({"steps": 10}, 10, 10) is None
    assert run_status({}, 5, 5, sweep_steps=10) == "stopped at step 5 of 10"
    assert run_status({"steps": 10}, 10, 10, has_entropy=False) == "not measurable (no entropy)"
    assert run_status({"steps": 10}, None, 0) == "stopped at step 0 of 10"
    assert status_clause("grpo", 3, [(1, "stopped at step 411 of 2000")]) == \
        "grpo: 2/3 seeds complete; seed 1 stopped at step 411 of 2000"
    assert status_clause("grpo", 3, []) is None


def test_damaged_and_mismatched_runs_are_left_out(sweep, tmp_path):
    """Issue 29, item 2: every reader of run evidence goes through one check (stare_lab.platform.evidence). In a
    3-seed sweep, grpo/seed2's metrics.jsonl replaced by random bytes is not read (named first in the verdict and in
    the report's warnings),
    and c2/seed0 with a summary.json its rows do not reproduce (held flipped, final entropy changed: a summary left
    from another run) is drawn but left out of the verdict's counts, named "not sound"."""
    import random
    import shutil

    out = tmp_path / "sw"
    shutil.copytree(sweep, out)
    (out / "grpo" / "seed2" / "metrics.jsonl").write_bytes(random.Random(0).randbytes(5000))
    p = out / "c2" / "seed0" / "summary.json"
    s = json.loads(p.read_text())
    s.update(held=not s["held"], final_entropy=s["final_entropy"] + 0.1)
    p.write_text(json.dumps(s))
    res = analyze([out], tmp_path / "rep")
    v = res.verdict
    assert v.startswith(f"1 run not read: {out / 'grpo' / 'seed2'} (metrics.jsonl is damaged: "), v
    assert "c2: 2/3 seeds sound; seed 0 summary.json does not match its metrics.jsonl" in v, v
    warnings = res.comparison.warnings
    assert any(w.startswith(f"{out / 'grpo' / 'seed2'}: not readable as a run (run {out / 'grpo' / 'seed2'}: "
                            "metrics.jsonl is damaged: ") for w in warnings), warnings
    assert [r.seed for r in res.comparison.runs if r.method == "grpo"] == [0, 1]
    (mismatch,) = [w for w in warnings if w.startswith(f"{out / 'c2' / 'seed0'}: ")]
    assert "held " in mismatch and "from the rows" in mismatch
