"""Runs of other frameworks in ``stare-lab analyze`` (analysis.foreign): TRL's ``trainer_state.json`` log history,
verl's file-logger output and the run directories the integrations write, alone and next to a stare_lab simulator
run in one report.

The verl file-logger lines are written here in verl's format (``{"step": N, "data": {...}}``, verl/utils/tracking.py
FileLogger; the verl environment's tests write one with verl's own logger); expected columns are the values written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.analyze import analyze
from analysis.foreign import READERS, find_foreign_runs, read_foreign_run
from analysis.load import load_run, load_runs
from analysis.synthetic import write_synthetic_run
from stare_lab.errors import RunError
from stare_lab.platform.runs import RunWriter


def _history(steps: int = 4) -> list[dict]:
    """What TRL logs with logging_steps=1 (keys as GRPOTrainer and STAREGRPOTrainer write them), an evaluation
    entry at step 2 and the end-of-training summary."""
    out = []
    for s in range(1, steps + 1):
        out.append({"loss": -0.1 * s, "grad_norm": 1.5, "learning_rate": 1e-6, "num_tokens": 100.0 * s,
                    "completions/mean_length": 7.0, "reward": 0.25 * s, "reward_std": 0.5, "entropy": 2.0 - 0.25 * s,
                    "clip_ratio/region_mean": 0.0, "stare/gate_on": float(s >= 3), "stare/w": 1.0 + 0.1 * s,
                    "stare/m": 1.0 - 0.1 * s, "quadrant/pos_high/count": 3.0, "quadrant/pos_low/count": 1.0,
                    "quadrant/neg_high/count": 2.0, "quadrant/neg_low/count": 2.0, "step_time": 0.5,
                    "epoch": 0.1 * s, "step": s})
        if s == 2:
            out.append({"eval_loss": 0.3, "eval_reward": 0.7, "epoch": 0.2, "step": 2})
    out.append({"train_runtime": 3.0, "train_loss": -0.2, "total_flos": 0.0, "epoch": 0.4, "step": steps})
    return out


def _trl_folder(path, history, *, checkpoint: int | None = None):
    target = path / f"checkpoint-{checkpoint}" if checkpoint else path
    target.mkdir(parents=True, exist_ok=True)
    (target / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": history}))
    return path


def test_trl_log_history_becomes_run_rows(tmp_path):
    """Each training entry is one row (values from _history): TRL's entropy/reward/stare keys land on the run-row keys, namespaced keys keep
    their names, plain ones go under trl/, the eval entry joins its step as eval/…, the summary entry is dropped."""
    folder = _trl_folder(tmp_path / "grpo" / "seed7", _history())  # <method>/seed<k>, as load_run names runs
    run = load_run(folder)
    assert (run.method, run.seed, run.source, run.config["framework"]) == ("grpo", 7, "trl", "trl")
    assert run.steps.tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(run.column("entropy"), [1.75, 1.5, 1.25, 1.0])
    np.testing.assert_allclose(run.column("reward"), [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(run.column("gate_on"), [0, 0, 1, 1])
    np.testing.assert_allclose(run.column("stare_w"), [1.1, 1.2, 1.3, 1.4])
    np.testing.assert_allclose(run.column("loss/total"), [-0.1, -0.2, -0.3, -0.4])
    np.testing.assert_allclose(run.column("time/step_s"), [0.5] * 4)
    np.testing.assert_allclose(run.column("trl/grad_norm"), [1.5] * 4)
    assert run.column("eval/reward")[1] == 0.7 and np.isnan(run.column("eval/reward")[0])
    assert not run.has("pred_entropy_change") and "trl/train_runtime" not in run.columns


def test_latest_checkpoint_is_read_when_the_folder_has_no_state(tmp_path):
    """Without a top-level trainer_state.json the latest checkpoint-N's (largest N, not the last listed) is read."""
    folder = _trl_folder(tmp_path / "run", _history(2), checkpoint=2)
    _trl_folder(folder, _history(4), checkpoint=10)
    run = read_foreign_run(folder)
    assert [r["step"] for r in run.metrics] == [1, 2, 3, 4]
    assert find_foreign_runs([tmp_path]) == [folder]  # the checkpoint folders are not runs of their own


def test_a_folder_with_a_stare_lab_run_is_left_to_it(tmp_path):
    """A TRL output folder holding the integration's stare_run/ is read through that run directory only; a plain
    TRL folder next to it is read through its log: two runs."""
    stare = _trl_folder(tmp_path / "stare", _history())
    with RunWriter(stare / "stare_run", {"source": "trl", "method": "c2", "seed": 0}) as w:
        w.log({"step": 1, "entropy": 1.0, "reward": 0.0, "gate_on": 1, "stare_w": 1.1, "stare_m": 0.9,
               "pred_entropy_change": None, "entropy_change": None})
    plain = _trl_folder(tmp_path / "plain", _history())
    assert find_foreign_runs([tmp_path]) == [plain]
    runs = load_runs(tmp_path)
    assert sorted(r.path.name for r in runs) == ["plain", "stare_run"]


def test_a_trainer_runs_checkpoints_are_not_framework_logs(tmp_path):
    """Fresh-user item: the stare-lab trainer keeps ``checkpoint/step_N/trainer_state.json`` (its own state, no
    ``log_history``) inside the run directory; reading the run finds one run and no warning about that file."""
    run = tmp_path / "run"
    with RunWriter(run, {"source": "trainer", "method": "grpo", "seed": 0}) as w:
        w.log({"step": 1, "entropy": 1.0, "reward": 0.0, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
               "pred_entropy_change": None, "entropy_change": None})
    (run / "checkpoint" / "step_1").mkdir(parents=True)
    (run / "checkpoint" / "step_1" / "trainer_state.json").write_text(json.dumps({"step": 1}))
    assert find_foreign_runs([tmp_path]) == [] and find_foreign_runs([run]) == []
    runs = load_runs(tmp_path)
    assert [r.path for r in runs] == [run] and not [w for r in runs for w in r.warnings if "checkpoint" in w]


def test_analyze_puts_a_trl_run_in_the_report(tmp_path):
    """The report of a TRL folder and a stare_lab run directory together: figures and a verdict naming both."""
    from analysis.analyze import analyze

    _trl_folder(tmp_path / "runs" / "trl_grpo", _history())
    with RunWriter(tmp_path / "runs" / "sim", {"source": "simulator", "method": "o1", "seed": 0,
                                               "loss": {"loss_mode": "stare", "stare": {"target_entropy": 1.0}}}) as w:
        for s in range(1, 5):
            w.log({"step": s, "entropy": 1.0, "reward": 0.5, "gate_on": 1, "stare_w": 1.1, "stare_m": 0.9,
                   "pred_entropy_change": None, "entropy_change": None})
    result = analyze([tmp_path / "runs"], tmp_path / "report")
    assert "trl_grpo" in result.verdict and "o1" in result.verdict
    assert (tmp_path / "report" / "dynamics.png").is_file() and (tmp_path / "report" / "report.md").is_file()



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
    assert READERS["verl-file"].claims(log) and find_foreign_runs([tmp_path]) == [log]
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
    assert not any(r.claims(other) for r in READERS.values())
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
