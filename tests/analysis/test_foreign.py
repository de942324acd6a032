"""analysis.foreign: a TRL output folder (trainer_state.json log_history) read as a run, on hand-written logs whose
values are known, next to a stare_lab run directory."""

from __future__ import annotations

import json

import numpy as np

from analysis.foreign import find_foreign_runs, read_foreign_run
from analysis.load import load_run, load_runs
from stare_lab.runs import RunWriter


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
    assert (run.method, run.seed, run.source, run.config["framework"]) == ("grpo", 7, "trainer", "trl")
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
    with RunWriter(stare / "stare_run", {"source": "trainer", "method": "c2", "seed": 0}) as w:
        w.log({"step": 1, "entropy": 1.0, "reward": 0.0, "gate_on": 1, "stare_w": 1.1, "stare_m": 0.9,
               "pred_entropy_change": None, "entropy_change": None})
    plain = _trl_folder(tmp_path / "plain", _history())
    assert find_foreign_runs([tmp_path]) == [plain]
    runs = load_runs(tmp_path)
    assert sorted(r.path.name for r in runs) == ["plain", "stare_run"]


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
