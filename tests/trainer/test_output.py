"""Trainer output people can follow (issue 16): the per-step line, the end-of-run report, and what
``configure_output`` hides (engine noise; vLLM's rotary-embedding reload warning) and keeps. The real run's output
is checked in test_data_verl.py (the tiny-cpu preset)."""

from __future__ import annotations

import json
import logging
import warnings

from trainer.cli import final_report
from trainer.output import _BelowLevel, _DropRotaryReload
from trainer.run.runlog import step_line

ROW = {"step": 3, "reward": 0.125, "accuracy": 0.0625, "entropy": 1.23456, "gate_on": 1, "stare_w": 1.1,
       "stare_m": 0.9, "time/rollout_tokens_per_s": 812.4, "time/step_s": 14.25, "gen_rounds": 1,
       "kept_group_fraction": 1.0, "skipped": 0}


def test_step_line_has_every_field():
    line = step_line(ROW, 100, eta_s=3725.0)
    assert line == ("step 3/100 | reward 0.125 | acc 0.062 | entropy 1.235 | gate on W 1.100 M 0.900 | 812 tok/s | "
                    "14.2 s/step | ETA 1:02:05")


def test_step_line_for_a_skipped_dynamic_sampling_step():
    row = {**ROW, "entropy": None, "gate_on": 0, "gen_rounds": 3, "kept_group_fraction": 0.0, "skipped": 1}
    line = step_line(row, 10, eta_s=None)
    assert "entropy - | gate off" in line and "kept 0.00 in 3 rounds | update skipped | ETA -" in line


def test_final_report_says_where_and_what(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({**ROW, "loss/total": 0.5, "grad_norm": 0.25,
                                                        "eval/math500/avg@4": 0.1}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 3, "final_reward": 0.125, "final_accuracy": 0.0625,
                                                       "final_entropy": 1.23456}))
    (tmp_path / "final_model").mkdir()
    (tmp_path / "final_model" / "config.json").write_text("{}")
    text = final_report(tmp_path)
    assert text.splitlines()[0] == f"run finished: 3 steps in {tmp_path}"
    assert "final reward 0.1250, accuracy 0.0625, entropy 1.2346 nats" in text
    assert "gate on, W 1.100, M 0.900, loss 0.5000, grad norm 0.2500" in text
    assert "last evaluation: math500/avg@4 0.1000" in text
    assert str(tmp_path / "metrics.jsonl") in text and str(tmp_path / "final_model") in text


def _record(name: str, level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_rotary_reload_warning_is_dropped_and_other_load_failures_kept():
    f = _DropRotaryReload()
    assert not f.filter(_record("vllm.x", logging.WARNING, "RotaryEmbedding: Failed to load weights"))
    assert not f.filter(_record("vllm.x", logging.WARNING, "Llama3RotaryEmbedding: Failed to load weights"))
    assert f.filter(_record("vllm.x", logging.WARNING, "ParallelLMHead: Failed to load weights"))  # a real bug


def test_engine_records_below_error_are_hidden_and_others_kept():
    f = _BelowLevel(logging.ERROR, ("vllm", "DeepSpeed"))
    assert not f.filter(_record("vllm.triton_utils.importing", logging.WARNING, "Triton is installed, but ..."))
    assert not f.filter(_record("DeepSpeed", logging.INFO, "Setting accelerator to CPU"))
    assert f.filter(_record("vllm.engine", logging.ERROR, "a real error"))
    assert f.filter(_record("trainer.step.collect", logging.WARNING, "kept 2 of 4 groups"))  # the trainer's own
    assert f.filter(_record("vllmish", logging.INFO, "not a child of vllm"))


def test_configure_output_hides_future_warnings_unless_verbose(monkeypatch):
    from trainer.output import configure_output

    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_output(verbose=True)
        warnings.warn("shown with --verbose", FutureWarning)
        configure_output(verbose=False)
        warnings.warn("hidden by default", FutureWarning)
    assert [str(w.message) for w in caught] == ["shown with --verbose"]
    import os

    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert logging.getLogger("trainer.progress").level == logging.INFO
