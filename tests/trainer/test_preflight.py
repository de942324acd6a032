"""Fresh-user review items of the trainer / evaluate commands (fast: no model, vLLM or DeepSpeed is built).

Every expected message is the one the code promises in its docstring; every "nothing left behind" check looks at
the file system after the failed command.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stare_lab.cli import main as cli_main
from stare_lab.errors import ConfigError, RunError
from trainer import paths
from trainer.run import preflight
from trainer.config import load_trainer_config
from trainer.data import load_records
from trainer.run.runlog import RunLogger, export_final_model, read_rows, summary_from_rows

from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE as GSM8K  # bundled with the package (trainer/assets/)


def _data(tmp_path: Path, lines: list[str]) -> Path:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(line + "\n" for line in lines))
    return f


GOOD = json.dumps({"problem": "1+1?", "answer": "2"})


# -- train CLI: errors are one line, exit 1, and leave no OUT/model behind ------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["--preset", "nope"], "--preset 'nope' is not one of: tiny-cpu"),
])
def test_train_bad_preset_is_one_line(argv, expected, capsys):
    """Review item 14: an unknown preset is a one-line error with exit 1 (was: argparse usage, exit 2)."""
    assert cli_main(["train", *argv]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"stare-lab train: error: {expected}"]


def test_train_out_errors_before_building_anything(tmp_path, capsys):
    """Review item 4: --out an existing file, or under /proc (cannot be created), is one line, exit 1."""
    data = _data(tmp_path, [GOOD])
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(afile)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stare-lab train: error: --out={str(afile)!r} exists and is not a directory"]
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(afile / "sub")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", "/proc/x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stare-lab train: error: --out='/proc/x' cannot be created")


@pytest.mark.parametrize("lines, message", [
    ([GOOD, '{"problem": "2+2?", "ans'], r"d\.jsonl:2: not valid JSON"),       # truncated last line
    ([GOOD, json.dumps({"problem": "x"})], r"d\.jsonl:2: record has no field 'answer'"),
    ([json.dumps({"problem": "x", "answer": "12"})], r"none of the 1 records .* data\.answer_pattern='\[0-9\]'"),
    ([], r"d\.jsonl' is empty"),                                               # the one reader: empty file
    (["", "  "], r"d\.jsonl' holds no record"),                                # blank lines only
])
def test_train_data_errors_before_the_model_is_built(tmp_path, capsys, lines, message):
    """Review items 4 and 5: bad data is a one-line DataError (file:line), found before the tiny model is built, and
    nothing is left in --out (the preset keeps single-digit answers only, so "12" matches nothing)."""
    import re

    data = _data(tmp_path, lines)
    out = tmp_path / "run"
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()


def test_train_lengths_beyond_the_tiny_model_fail_before_building(tmp_path, capsys):
    """Review item 6: the tiny model has 1024 positions (cli.TINY_MAX_POSITIONS): 1000 + 100 tokens cannot fit."""
    data = _data(tmp_path, [GOOD])
    out = tmp_path / "run"
    assert cli_main(["train", "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(out),
                     "data.max_prompt_length=1000", "rollout.max_response_length=100"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stare-lab train: error: data.max_prompt_length=1000 + rollout.max_response_length=100 = 1100 "
                   f"exceeds the model's max_position_embeddings=1024 ({out / 'model'}); lower one of them"]
    assert not out.exists()


def test_train_help_has_a_description(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    assert "final_model" in " ".join(capsys.readouterr().out.split())


# -- preflight functions -----------------------------------------------------------------------------------------


def _model_dir(tmp_path: Path, max_pos: int) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": max_pos}))
    return d


def test_check_lengths_training_and_periodic_eval(tmp_path):
    """The engine's max_model_len is data.max_prompt_length + rollout.max_response_length (rollout.make_engine);
    the periodic evaluation runs on that engine, so an eval with prompt 1024 + 8 tokens cannot fit 192 + 32 = 224
    (the crash of review item 6, now a ConfigError before training)."""
    from trainer.evaluation.evaluate import EvalConfig

    model = _model_dir(tmp_path, 1024)
    ev = tmp_path / "eval.yaml"
    ev.write_text("benchmarks: [math500]\n")
    cfg = load_trainer_config(None, [f"model.path={model}", "data.max_prompt_length=192",
                                     "rollout.max_response_length=32", "schedule.eval_freq=1",
                                     f"schedule.eval_config={ev}"])
    assert paths.model_max_positions(model) == 1024
    preflight.check_lengths(cfg, 1024, EvalConfig(benchmarks=["math500"], max_prompt_length=192, max_tokens=32))
    with pytest.raises(ConfigError, match=r"max_prompt_length=1024 \+ max_tokens=8 = 1032 exceeds the model's "
                                          r"max_position_embeddings=1024"):
        preflight.check_lengths(cfg, 1024, EvalConfig(benchmarks=["math500"], max_prompt_length=1024, max_tokens=8))
    with pytest.raises(ConfigError, match=r"= 264 exceeds the rollout engine's max_model_len=224"):
        preflight.check_lengths(cfg, 1024, EvalConfig(benchmarks=["math500"], max_prompt_length=256, max_tokens=8))
    with pytest.raises(ConfigError, match="has no config.json"):
        paths.model_max_positions(tmp_path)


def test_resume_with_other_data_is_refused(tmp_path):
    """Review item 15: resuming a run directory with another data.train_files (or seed, loss, ...) is a ConfigError
    naming the key and both values; a longer schedule.total_steps (extending the run) is allowed; paths compare
    resolved."""
    a, b = _data(tmp_path, [GOOD]), tmp_path / "other.jsonl"
    b.write_text(GOOD + "\n")
    out = tmp_path / "run"
    out.mkdir()
    old = load_trainer_config(None, [f"data.train_files=[{a}]", "schedule.total_steps=3"])
    (out / "config.yaml").write_text(yaml.safe_dump(old.to_dict()))
    preflight.check_resume_compatible(out, load_trainer_config(None, [f"data.train_files=[{a}]",
                                                                     "schedule.total_steps=6"]))
    with pytest.raises(ConfigError, match=rf"data\.train_files=\['{a}'\], this config has data\.train_files="
                                          rf"\['{b}'\]; resuming would mix two experiments"):
        preflight.check_resume_compatible(out, load_trainer_config(None, [f"data.train_files=[{b}]"]))
    with pytest.raises(ConfigError, match=r"loss\.stare\.top_p_ratio=0\.1, this config has loss\.stare\.top_p_ratio"
                                          r"=0\.3"):
        preflight.check_resume_compatible(out, load_trainer_config(None, [f"data.train_files=[{a}]",
                                                                         "loss.stare.top_p_ratio=0.3"]))


def test_make_out_dir(tmp_path):
    assert paths.make_out_dir(tmp_path / "a" / "b").is_dir()
    with pytest.raises(RunError, match="cannot be created"):
        paths.make_out_dir("/proc/stare_lab_x")


def test_answer_pattern_keeps_single_digit_answers(tmp_path):
    """data.answer_pattern: only fully matching (stripped) answers are kept; max_samples counts kept records. The
    GSM8K count is checked against a plain loop over the file."""
    f = _data(tmp_path, [json.dumps({"problem": f"p{i}", "answer": a}) for i, a in enumerate(["3", "12", " 7", "x"])])
    recs = load_records([str(f)], "problem", "answer", answer_pattern="[0-9]")
    assert [r["answer"] for r in recs] == ["3", " 7"]
    assert len(load_records([str(f)], "problem", "answer", max_samples=1, answer_pattern="[0-9]")) == 1
    with pytest.raises(ConfigError, match=r"data\.answer_pattern='\[0-9' is not a valid regular expression"):
        load_trainer_config(None, ["data.answer_pattern=[0-9"])
    expected = sum(json.loads(line)["answer"].strip() in list("0123456789") for line in open(GSM8K))
    assert len(load_records([str(GSM8K)], "problem", "answer", answer_pattern="[0-9]")) == expected > 64


# -- run log: summary from all rows, amend, final_model ---------------------------------------------------------


ROW = dict(entropy=1.0, reward=0.5, gate_on=1, stare_w=1.1, stare_m=0.9, pred_entropy_change=None,
           entropy_change=None)


def test_summary_is_recomputed_from_all_rows():
    """Review item 8: the summary of a re-run / resumed command is computed from all rows, with the core's
    definitions (stare_lab.platform.summary): final entropy = the last finite one (no measured change here); final reward /
    accuracy = mean over the last max(1, ⌊0.1·2⌋) = 1 row; gate on in 1 of 1 finite rows; the target from the
    config: |1.0 − 0.98| ≤ 0.05 → in band."""
    rows = [dict(ROW, step=1, accuracy=0.25), dict(ROW, step=2, entropy=None, reward=0.75, accuracy=0.5)]
    s = summary_from_rows(rows, 2, 2, config={"loss": {"stare": {"target_entropy": 0.98}}})
    assert {k: s[k] for k in ("steps", "resumed_from", "final_reward", "final_entropy", "final_accuracy",
                              "initial_entropy", "gate_on_frac", "time_in_band", "pred_r2")} == {
        "steps": 2, "resumed_from": 2, "final_reward": 0.75, "final_entropy": 1.0, "final_accuracy": 0.5,
        "initial_entropy": 1.0, "gate_on_frac": 1.0, "time_in_band": 1.0, "pred_r2": None}
    assert summary_from_rows([], 3, 3)["final_reward"] is None


def test_amend_adds_eval_metrics_to_the_written_row(tmp_path):
    """Review item 6: the row is on disk before the evaluation; amend adds eval/… to it (the other rows unchanged)
    and later rows still append."""
    cfg = load_trainer_config(None, ["schedule.progress_bar=false"])
    log = RunLogger(cfg, tmp_path, 0, True)
    log.log(dict(ROW, step=1))
    log.log(dict(ROW, step=2))
    assert [r["step"] for r in read_rows(tmp_path)] == [1, 2]
    log.amend(2, {"eval/accuracy": 0.5, "eval/failed": 0, "eval/bad": float("nan")})
    log.log(dict(ROW, step=3))
    rows = read_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["eval/accuracy"] == 0.5 and rows[1]["eval/bad"] is None and "eval/accuracy" not in rows[0]
    log.close({"steps": 3})


def test_export_final_model(tmp_path):
    """OUT/final_model is the last checkpoint's HF export, hard-linked (same inode) and replaced on a later export."""
    for step in (1, 2):
        hf = tmp_path / "checkpoint" / f"step_{step}" / "hf"
        hf.mkdir(parents=True)
        (hf / "config.json").write_text(json.dumps({"step": step}))
        (hf / "tokenizer.json").write_text("{}")
    dst = export_final_model(tmp_path / "checkpoint" / "step_1", tmp_path)
    assert dst == tmp_path / "final_model" and json.loads((dst / "config.json").read_text()) == {"step": 1}
    export_final_model(tmp_path / "checkpoint" / "step_2", tmp_path)
    assert json.loads((dst / "config.json").read_text()) == {"step": 2}
    assert (dst / "config.json").stat().st_ino == (tmp_path / "checkpoint/step_2/hf/config.json").stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "final_model"]
    with pytest.raises(RunError, match="no HF export"):
        export_final_model(tmp_path, tmp_path)


# -- evaluate CLI -------------------------------------------------------------------------------------------------


def test_evaluate_bad_out_and_model_fail_first(tmp_path, capsys):
    """Review item 7: --out an existing file and --model without config.json are one-line errors, before any
    model is loaded or generation runs."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    base = ["evaluate", "--benchmarks", "math500", "--limit", "1", "--n", "1"]
    assert cli_main(base + ["--model", str(empty), "--out", str(afile)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stare-lab evaluate: error: --out={str(afile)!r} exists and is not a directory"]
    assert cli_main(base + ["--model", str(empty), "--out", str(tmp_path / "ev")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stare-lab evaluate: error: --model={str(empty)!r} has no config.json (not a Hugging Face model "
        "directory)"]
    assert not (tmp_path / "ev").exists()  # the output directory made for the run is removed again
    # an --out that only creating it can refuse (/proc takes no new entries) fails after the cheap checks of the
    # other options, before anything is built: here the model's
    assert cli_main(base + ["--model", str(empty), "--out", "/proc/x"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stare-lab evaluate: error: --model={str(empty)!r} has no config.json (not a Hugging Face model "
        "directory)"]


def test_a_runs_written_config_loads_back_as_its_config(tmp_path):
    """A run's config.yaml (written by RunLogger, with the ``versions`` provenance block) loads back as the same
    config, and the resume check against it still compares the settings; ``versions`` is no override key."""
    from trainer.cli import tiny_cpu_config

    data = _data(tmp_path, [GOOD])
    out = tmp_path / "run"
    cfg = load_trainer_config(tiny_cpu_config(str(data), str(out)), ["method=o1", "schedule.progress_bar=false",
                                                                      "schedule.tensorboard=false", "seed=7"])
    RunLogger(cfg, out, 0, True).close({"steps": 0})
    written = out / "config.yaml"
    assert "versions" in yaml.safe_load(written.read_text())  # the case a user meets
    loaded = load_trainer_config(written)
    assert loaded == cfg and loaded.to_dict() == cfg.to_dict()
    other = load_trainer_config(written, [f"out_dir={tmp_path / 'run2'}"])
    assert other.out_dir == str(tmp_path / "run2") and other.seed == 7
    preflight.check_resume_compatible(out, loaded)
    with pytest.raises(ConfigError, match=r"holds a run with seed=7, this config has seed=8"):
        preflight.check_resume_compatible(out, load_trainer_config(written, ["seed=8"]))
    with pytest.raises(ConfigError, match="unknown config key versions"):
        load_trainer_config(written, ["versions.torch=1"])
