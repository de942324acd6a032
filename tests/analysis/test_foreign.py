"""Runs of other frameworks in ``stare-lab analyze`` (analysis.foreign): verl's file-logger output and the run
directory the verl plugin writes, alone and next to a stare_lab simulator run in one report.

The verl file-logger lines are written here in verl's format (``{"step": N, "data": {...}}``, verl/utils/tracking.py
FileLogger; the verl environment's tests write one with verl's own logger); expected columns are the values written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.analyze import analyze
from analysis.foreign import detect, find_foreign
from analysis.load import load_run, load_runs
from analysis.synthetic import write_synthetic_run
from stare_lab.errors import RunError
from stare_lab.runs import RunWriter


def write_verl_log(path: Path, steps: int = 30, stare: bool = True, truncated: bool = False) -> Path:
    """A verl file log: the initial validation at step 0, then one record per step (H from 0.6 down by 0.01 per
    step, reward 0.1 + 0.01·t, gate on from H < 0.45, W 1.1, M 0.9, 2 s per step)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": 0, "data": {"val-core/gsm8k/acc/mean@1": 0.1}})]
    for t in range(1, steps + 1):
        h = 0.6 - 0.01 * t
        data = {"actor/entropy": h, "critic/score/mean": 0.1 + 0.01 * t, "timing_s/step": 2.0,
                "actor/pg_loss": -0.01, "response_length/mean": 100.0 + t}
        if stare:
            data.update({"stare/entropy": h, "stare/gate_on": float(h < 0.45), "stare/w": 1.1, "stare/m": 0.9,
                         "stare/num_pos_selected": 12.0, "stare/frac_pos_selected": 0.05})
        lines.append(json.dumps({"step": t, "data": data}))
    text = "\n".join(lines) + "\n"
    if truncated:
        text += '{"step": 99, "da'
    path.write_text(text)
    return path


def test_verl_file_log_reads_as_a_run(tmp_path):
    """The run-format keys come from verl's metrics (entropy ← stare/entropy, reward ← critic/score/mean, gate/W/M ←
    stare/…, time/step_s ← timing_s/step); verl's own keys stay; a truncated last line is a warning, not an error."""
    log = write_verl_log(tmp_path / "logs" / "proj" / "exp.jsonl", truncated=True)
    assert detect(log) == "verl-file" and find_foreign(tmp_path) == [log]
    (run,) = load_runs(log)
    assert (run.source, run.method, run.n_steps) == ("verl", "stare", 30)  # the step-0 validation is no step
    assert run.config["validation_only_records"] == [{"step": 0, "val-core/gsm8k/acc/mean@1": 0.1}]
    assert not [w for w in run.warnings if "entropy" in w]
    assert run.column("entropy")[0] == pytest.approx(0.59) and run.column("reward")[29] == pytest.approx(0.4)
    assert run.column("gate_on")[4] == 0 and run.column("gate_on")[19] == 1 and run.column("stare_w")[3] == 1.1
    assert run.column("time/step_s")[2] == 2.0 and run.column("response_length/mean")[0] == 101.0
    assert run.column("stare/num_pos_selected")[4] == 12.0
    assert any("not valid JSON" in w for w in run.warnings)


def test_plain_verl_log_is_grpo_and_other_files_are_not_runs(tmp_path):
    """Without STARE metrics the run is plain GRPO (gate 0, W = M = 1, entropy ← actor/entropy); a JSONL that is not
    a verl log is no run."""
    (run,) = load_runs(write_verl_log(tmp_path / "plain.jsonl", stare=False))
    assert run.method == "grpo" and run.column("gate_on")[3] == 0 and run.column("stare_m")[3] == 1.0
    assert run.column("entropy")[1] == pytest.approx(0.58)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "x", "score": 1}) + "\n")
    assert detect(other) is None
    with pytest.raises(RunError, match="not a log any reader recognises"):
        load_run(other)


def test_the_plugins_run_directory_is_a_verl_run(tmp_path):
    """The verl plugin's run directory (config source ``verl``) loads without an unknown-source warning."""
    with RunWriter(tmp_path / "stare_run", {"source": "verl", "method": "c2", "seed": 1,
                                            "loss": {"stare": {"target_entropy": 0.3}}}) as w:
        w.log({"step": 1, "entropy": 0.5, "reward": 0.2, "gate_on": 0, "stare_w": 1.1, "stare_m": 0.9,
               "pred_entropy_change": None, "entropy_change": None})
    run = load_run(tmp_path / "stare_run")
    assert (run.source, run.method, run.target_entropy) == ("verl", "c2", 0.3)
    assert not [w for w in run.warnings if "source" in w]


def test_analyze_puts_a_verl_run_and_a_simulator_run_in_one_report(tmp_path):
    """``analyze`` on a simulator run directory and a verl file log: one report whose runs table names both
    sources, with figures and a verdict; a lone log file gets its report beside it."""
    sim = write_synthetic_run(tmp_path / "sim" / "grpo" / "seed0", method="grpo", steps=30)
    log = write_verl_log(tmp_path / "verl" / "exp.jsonl")
    res = analyze([sim, log], tmp_path / "report")
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert {r["source"] for r in report["tables"]["runs"]} == {"simulator", "verl"}
    assert any(Path(f).suffix == ".png" and Path(f).is_file() for f in res.files.figures.values())
    assert res.verdict
    alone = analyze([log])
    assert (tmp_path / "verl" / "figures" / "report.md").is_file() and alone.verdict
