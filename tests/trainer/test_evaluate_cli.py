"""``stare-lab evaluate`` errors and options a new user hits (fast: the errors come before any model is loaded).

Each error is tried through the front door, with its one-line message and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from stare_lab.cli import main as cli_main
from stare_lab.errors import ConfigError
from trainer.evaluation.benchmarks import BENCHMARKS
from trainer.evaluation.evaluate import EvalConfig, evaluate_engine, load_problems
from trainer.evaluation.cli import add_arguments, config_from_args


class _CharTokenizer:
    """Characters as token ids (the scripted evaluations' tokenizer)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_existing_results_are_refused_without_overwrite_and_left_untouched(tmp_path, capsys):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "eval.json").write_text('{"old": true}\n')
    (out / "samples.jsonl").write_text("old\n")
    before = {f: ((out / f).read_bytes(), os.stat(out / f).st_mtime_ns) for f in ("eval.json", "samples.jsonl")}
    rc = cli_main(["evaluate", "--model", str(tmp_path / "no_model"), "--benchmarks", "aime24", "--out", str(out)])
    assert rc == 1
    assert _one_line_error(capsys) == (
        f"stare-lab evaluate: error: --out {str(out)!r} already holds a run (eval.json, samples.jsonl); pass --resume "
        "to continue it or --overwrite to replace it, or choose another --out")
    after = {f: ((out / f).read_bytes(), os.stat(out / f).st_mtime_ns) for f in ("eval.json", "samples.jsonl")}
    assert after == before and sorted(p.name for p in out.iterdir()) == ["eval.json", "samples.jsonl"]
    # with --overwrite the check passes: the next error is the (missing) model, and the old results are still there
    rc = cli_main(["evaluate", "--model", str(tmp_path / "no_model"), "--benchmarks", "aime24", "--out", str(out),
                   "--overwrite"])
    assert rc == 1
    assert "is not a directory" in _one_line_error(capsys)
    assert (out / "eval.json").read_text() == '{"old": true}\n'


def test_an_empty_existing_out_is_fine(tmp_path, capsys):
    rc = cli_main(["evaluate", "--model", str(tmp_path / "no_model"), "--benchmarks", "aime24", "--out", str(tmp_path)])
    assert rc == 1 and "is not a directory" in _one_line_error(capsys)


def test_file_works_for_any_name(tmp_path):
    """--file NAME=SOURCE with a name that is not built in adds a custom benchmark (listed in --benchmarks)."""
    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "problem": f"{i}+{i}?", "answer": str(2 * i)}) + "\n"
                           for i in range(3)))
    cfg = config_from_args(_parser().parse_args(["--model", "m", "--benchmarks", "my-set,aime24",
                                                 "--file", f"my-set={src}"]))
    assert cfg.benchmarks == ["my-set", "aime24"] and cfg.files == {"my-set": str(src)}
    assert [(p.id, p.answer) for p in load_problems(cfg, "my-set")] == [("0", "0"), ("1", "2"), ("2", "4")]
    assert cfg.samples_for("my-set") == 4  # not a Table-2 benchmark: avg@4 unless --n
    # a custom name must be listed in --benchmarks (the default is the six of Table 2)
    with pytest.raises(ConfigError, match=r"eval.files has 'my-set', which is not one of the benchmarks .*add it"):
        config_from_args(_parser().parse_args(["--model", "m", "--file", f"my-set={src}"]))
    # an unknown name without a source is still an error
    with pytest.raises(ConfigError, match=r"unknown benchmark 'my-set'; known: aime24, .*gsm8k, all, or a NAME"):
        config_from_args(_parser().parse_args(["--model", "m", "--benchmarks", "my-set"]))
    with pytest.raises(ConfigError, match="must be letters, digits"):
        config_from_args(_parser().parse_args(["--model", "m", "--benchmarks", "a b", "--file", f"a b={src}"]))


def test_custom_benchmark_evaluates_end_to_end(tmp_path):
    """A custom --file benchmark through evaluate_engine (a scripted engine answers i+i right for even i)."""
    from trainer.engines.rollout import RolloutOutput

    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "problem": f"{i}+{i}?", "answer": str(2 * i)}) + "\n"
                           for i in range(4)))

    class Engine:
        def generate(self, prompts, sampling):
            outs = []
            for pi, ids in enumerate(prompts):
                i = int("".join(map(chr, ids)).split("+")[0])
                text = f"\\boxed{{{2 * i if i % 2 == 0 else 2 * i + 1}}}"
                outs.append([RolloutOutput(pi, ids, [1] * 3, [0.0] * 3, text, "stop") for _ in range(sampling.n)])
            return outs

    cfg = EvalConfig(benchmarks=["mine"], files={"mine": str(src)}, n=2, use_chat_template=False,
                     prompt_template="{problem}")
    res = evaluate_engine(Engine(), _CharTokenizer(), cfg, out_dir=tmp_path / "o")
    assert res["benchmarks"]["mine"]["avg@k"] == 0.5 and res["average"] == 0.5  # i = 0, 2 right; 1, 3 wrong
    assert json.loads((tmp_path / "o" / "eval.json").read_text())["benchmarks"]["mine"]["n_problems"] == 4
    assert not list((tmp_path / "o").glob("*.partial"))


def test_benchmarks_help_lists_every_builtin_name(capsys):
    with pytest.raises(SystemExit):
        cli_main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in (*BENCHMARKS, "gsm8k"):
        assert name in text
    assert "--file NAME=SOURCE" in text and "--overwrite" in text and "--rel-tol" in text


def test_gsm8k_and_all_resolve_to_bundled_data():
    cfg = config_from_args(_parser().parse_args(["--model", "m", "--benchmarks", "gsm8k,all"]))
    assert cfg.benchmarks == ["gsm8k", *BENCHMARKS]
    assert len(load_problems(cfg, "gsm8k")) == 1319  # the bundled GSM8K test split (trainer/assets/README.md)


@pytest.mark.parametrize("value", ["0", "1", "-0.5"])
def test_rel_tol_is_validated(value, capsys):
    rc = cli_main(["evaluate", "--model", "m", "--benchmarks", "aime24", "--rel-tol", value])
    assert rc == 1 and "eval.rel_tol=" in _one_line_error(capsys)


def test_resume_refuses_a_model_whose_files_changed(tmp_path, capsys):
    """eval.json records the model's fingerprint; ``--resume`` reports a finished evaluation again only while the
    model's files are unchanged (e.g. not after ``train --overwrite``); an eval.json without one is accepted."""
    from trainer.engines.rollout import RolloutOutput
    from trainer.evaluation.cli import model_fingerprint

    model, out, src = tmp_path / "model", tmp_path / "eval", tmp_path / "mine.jsonl"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}\n')
    (model / "model.safetensors").write_bytes(b"old weights")
    src.write_text(json.dumps({"id": "0", "problem": "1+1?", "answer": "2"}) + "\n")
    argv = ["--model", str(model), "--benchmarks", "mine", "--file", f"mine={src}", "--n", "2", "--engine", "hf",
            "--out", str(out)]

    class Engine:
        def generate(self, prompts, sampling):
            return [[RolloutOutput(pi, ids, [1], [0.0], "\\boxed{2}", "stop") for _ in range(sampling.n)]
                    for pi, ids in enumerate(prompts)]

    fp = model_fingerprint(model)
    evaluate_engine(Engine(), _CharTokenizer(), config_from_args(_parser().parse_args(argv)), out_dir=out,
                    model_name=str(model), model_fingerprint=fp)
    assert json.loads((out / "eval.json").read_text())["model_fingerprint"] == fp
    assert cli_main(["evaluate", *argv, "--resume"]) == 0
    assert "already holds this evaluation (same model and settings): not recomputed" in capsys.readouterr().out
    before = (out / "eval.json").read_bytes()

    (model / "model.safetensors").write_bytes(b"new weights, another checkpoint")
    assert model_fingerprint(model) != fp
    assert cli_main(["evaluate", *argv, "--resume"]) == 1
    assert _one_line_error(capsys) == (
        f"stare-lab evaluate: error: --resume: the model at {str(model)!r} changed since the evaluation in "
        f"{str(out)!r} (its files differ): pass --overwrite to re-evaluate")
    assert (out / "eval.json").read_bytes() == before

    old = json.loads(before)  # written before fingerprints were recorded: accepted on path and settings
    del old["model_fingerprint"]
    (out / "eval.json").write_text(json.dumps(old))
    assert cli_main(["evaluate", *argv, "--resume"]) == 0
    assert "not recomputed" in capsys.readouterr().out
