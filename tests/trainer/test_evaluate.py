"""Tests of trainer.evaluation.evaluate and trainer.evaluation.benchmarks: metric estimators against closed forms / brute force / hand
counts, the harness with a scripted engine (hand-computed eval.json), and end-to-end CLI runs with a tiny random-init
model on a 10-problem subset (HF engine; vLLM-CPU engine, slow)."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stare_lab.errors import ConfigError, DataError
from trainer.evaluation.benchmarks import BUNDLED_DIR, Problem, load_benchmark, resolve_benchmarks
from trainer.evaluation.evaluate import (
    EvalConfig,
    avg_at_k,
    benchmark_metrics,
    evaluate_engine,
    flat_metrics,
    maj_at_k,
    majority_vote,
    pass_at_k,
)

DATA_DIR = BUNDLED_DIR  # the benchmark copies bundled with the package

# ---------------------------------------------------------------------------------------------------------------
# pass@k / avg@k / maj@k
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_closed_form_and_brute_force(n):
    """Closed form 1 − C(n−c,k)/C(n,k) (Chen et al. 2021, Eq. 1) and, independently, the fraction of all k-subsets
    of the n samples that contain at least one correct sample."""
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            closed = 1.0 - math.comb(n - c, k) / math.comb(n, k)
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_hand_values_and_large_n():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one of four
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0
    # n = 1000 would overflow a float ratio of binomials; the product form stays exact to rounding
    assert pass_at_k(1000, 10, 100) == pytest.approx(1.0 - math.comb(990, 100) / math.comb(1000, 100), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5), (4.0, 1, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(DataError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_avg_at_k_synthetic():
    # 3 problems × 4 samples: 2/4, 0/4, 4/4 correct → mean (0.5 + 0 + 1) / 3
    correct = [[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert avg_at_k(correct) == pytest.approx(0.5)
    with pytest.raises(DataError):
        avg_at_k([])
    with pytest.raises(DataError, match="problem 1 has no samples"):
        avg_at_k([[1], []])


def test_majority_vote_grouping_and_ties():
    # "0.5" and "\frac{1}{2}" are the same number: 2 votes beat 1 for "3"
    assert majority_vote(["3", "0.5", "\\frac{1}{2}"]) == 1
    # tie 2–2: the group whose first member comes first wins
    assert majority_vote(["7", "8", "8", "7"]) == 0
    assert majority_vote(["8", "7", "7", "8"]) == 0
    # unanswered samples do not vote
    assert majority_vote([None, None, "4"]) == 2
    assert majority_vote([None, None]) is None
    # normalised strings vote together: "\left(1,2\right)" and "(1, 2)"
    assert majority_vote(["x", "\\left(1,2\\right)", "(1, 2)"]) == 1


def test_maj_at_k_by_hand():
    answers = [["5", "5", "6"], ["1", "2", "2"], [None, None, None]]
    correct = [[True, True, False], [True, False, False], [False, False, False]]
    # problem 0: majority "5" correct; problem 1: majority "2" wrong; problem 2: no answer → wrong
    assert maj_at_k(answers, correct) == pytest.approx(1 / 3)
    with pytest.raises(DataError):
        maj_at_k(answers, correct[:2])


def test_benchmark_metrics_by_hand():
    rows = []
    table = {"a": [(True, "1"), (False, "2"), (False, "2"), (False, None)],
             "b": [(False, "9"), (False, None), (False, None), (False, None)]}
    for pid, samples in table.items():
        for j, (ok, ans) in enumerate(samples):
            rows.append({"id": pid, "sample": j, "correct": ok, "extracted": ans,
                         "status": "no_answer" if ans is None else "ok", "response_tokens": 10 * (j + 1)})
    m = benchmark_metrics(rows, 4)
    assert m["n_problems"] == 2 and m["k"] == 4
    assert m["avg@k"] == pytest.approx((1 / 4 + 0) / 2)
    assert m["pass@k"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["pass_at"]["1"] == pytest.approx(m["avg@k"])  # pass@1 = avg accuracy
    assert m["pass_at"]["2"] == pytest.approx((1 - math.comb(3, 2) / math.comb(4, 2)) / 2)
    assert m["maj@k"] == 0.0  # "a": "2" (two votes) is wrong; "b": "9" wrong
    assert m["mean_response_tokens"] == pytest.approx(25.0)  # (10+20+30+40)/4 for both problems
    assert m["frac_no_boxed"] == pytest.approx(4 / 8)
    with pytest.raises(DataError, match="expected k=3"):
        benchmark_metrics(rows, 3)


# ---------------------------------------------------------------------------------------------------------------
# config and loaders
# ---------------------------------------------------------------------------------------------------------------


def test_resolve_benchmarks():
    assert resolve_benchmarks("aime24, minerva,olympiad") == ["aime24", "minerva_math", "olympiadbench"]
    assert resolve_benchmarks("all") == ["aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"]
    with pytest.raises(ConfigError, match="unknown benchmark 'aime23'"):
        resolve_benchmarks("aime23")
    with pytest.raises(ConfigError, match="listed twice"):
        resolve_benchmarks("aime24,aime2024")
    with pytest.raises(ConfigError, match="empty"):
        resolve_benchmarks(" , ")


def test_eval_config_defaults_and_errors():
    cfg = EvalConfig()
    # Table 2: avg@32 for AIME24/25 and AMC23, avg@4 for the other three; --n overrides all
    assert [cfg.samples_for(b) for b in cfg.benchmarks] == [32, 32, 32, 4, 4, 4]
    assert EvalConfig(n=8).samples_for("aime24") == 8
    with pytest.raises(ConfigError, match="eval.top_p=1.5 is outside"):
        EvalConfig(top_p=1.5)
    with pytest.raises(ConfigError, match="eval.n=0"):
        EvalConfig(n=0)


def test_load_benchmark_errors(tmp_path):
    with pytest.raises(DataError, match="no data file"):
        load_benchmark("aime24", tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "problem": "x"}\n')
    with pytest.raises(DataError, match="no field 'answer'"):
        load_benchmark("aime24", path=str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "1", "problem": "x", "answer": " "}\n')
    with pytest.raises(DataError, match="empty answer"):
        load_benchmark("aime24", path=str(empty))


def test_load_benchmark_subset():
    probs = load_benchmark("aime24", DATA_DIR, limit=10)
    assert len(probs) == 10
    assert probs[0].id == "60" and probs[0].answer == "204"  # first record of aime24.jsonl


# ---------------------------------------------------------------------------------------------------------------
# the harness with a scripted engine
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Out:
    text: str
    token_ids: list
    finish_reason: str = "stop"


class _Tok:
    """Minimal tokenizer: one token per character, no chat template."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 256 for c in text]}


class _ScriptedEngine:
    """Returns, for prompt i, the responses script[i % len(script)] (must have n entries)."""

    def __init__(self, script):
        self.script = script
        self.calls = []

    def generate(self, prompt_token_ids, sampling):
        self.calls.append((len(prompt_token_ids), sampling.n, sampling.seed, sampling.temperature, sampling.top_p))
        out = []
        for i in range(len(prompt_token_ids)):
            texts = self.script[i % len(self.script)]
            assert len(texts) == sampling.n
            out.append([_Out(t, list(range(len(t.split())))) for t in texts])
        return out


def test_evaluate_engine_scripted(tmp_path):
    problems = {
        "aime24": [Problem("aime24", "p1", "Find x.", "025"), Problem("aime24", "p2", "Find y.", "7")],
        "math500": [Problem("math500", "q1", "Compute.", "\\frac{1}{2}")],
    }
    # aime24 p1: samples "25" (right), "24", none, "25" → 2/4; p2: "7","7","7","1" → 3/4
    # math500 q1 is prompt 0 of its own generate call, so it gets script row 0 (nothing equals 1/2)
    script = [
        ["so \\boxed{25}", "\\boxed{24}", "no answer", "thus \\boxed{025}"],
        ["\\boxed{7}", "\\boxed{7}", "\\boxed{7}", "\\boxed{1}"],
    ]
    engine = _ScriptedEngine(script)
    cfg = EvalConfig(benchmarks=["aime24", "math500"], n=4, temperature=0.6, top_p=0.9, max_tokens=8,
                     use_chat_template=False)
    res = evaluate_engine(engine, _Tok(), cfg, out_dir=tmp_path, model_name="scripted", problems=problems)
    a = res["benchmarks"]["aime24"]
    assert a["avg@k"] == pytest.approx((2 / 4 + 3 / 4) / 2)
    assert a["pass@k"] == 1.0
    assert a["maj@k"] == 1.0  # p1: "25"/"025" (2 votes, same number) right; p2: "7" right
    assert a["frac_no_boxed"] == pytest.approx(1 / 8)
    # the scripted engine gives one token per whitespace-separated word
    assert a["mean_response_tokens"] == pytest.approx((2 + 1 + 2 + 2 + 1 + 1 + 1 + 1) / 8)
    m = res["benchmarks"]["math500"]  # q1 gets script row 0: nothing equals 1/2
    assert (m["avg@k"], m["pass@k"], m["maj@k"]) == (0.0, 0.0, 0.0)
    assert res["average"] == pytest.approx((a["avg@k"] + 0.0) / 2)
    # sampling settings reach the engine; seeds differ between benchmarks
    assert [c[1:2] + c[3:] for c in engine.calls] == [(4, 0.6, 0.9), (4, 0.6, 0.9)]
    assert engine.calls[0][2] != engine.calls[1][2]
    on_disk = json.loads((tmp_path / "eval.json").read_text())
    assert on_disk["benchmarks"]["aime24"]["avg@k"] == pytest.approx(a["avg@k"])
    assert on_disk["model"] == "scripted" and on_disk["settings"]["k"] == {"aime24": 4, "math500": 4}
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    assert rows[0] == {"benchmark": "aime24", "id": "p1", "sample": 0, "response": "so \\boxed{25}",
                       "extracted": "25", "correct": True, "status": "ok", "response_tokens": 2,
                       "finish_reason": "stop"}
    assert rows[2]["extracted"] is None and rows[2]["status"] == "no_answer"
    assert flat_metrics(res)["eval/aime24/avg@4"] == pytest.approx(a["avg@k"])
    assert flat_metrics(res)["eval/accuracy"] == pytest.approx(res["average"])


def test_evaluate_engine_checks_engine_output():
    class Short(_ScriptedEngine):
        def generate(self, prompt_token_ids, sampling):
            return super().generate(prompt_token_ids, sampling)[:-1]

    problems = {"aime24": [Problem("aime24", "p1", "x", "1"), Problem("aime24", "p2", "y", "2")]}
    cfg = EvalConfig(benchmarks=["aime24"], n=1, use_chat_template=False)
    with pytest.raises(DataError, match="engine returned"):
        evaluate_engine(Short([["\\boxed{1}"]]), _Tok(), cfg, problems=problems)


# ---------------------------------------------------------------------------------------------------------------
# end to end with a tiny random-init model (10-problem subset)
# ---------------------------------------------------------------------------------------------------------------


def _check_outputs(out: Path, n_problems: int, k: int) -> dict:
    res = json.loads((out / "eval.json").read_text())
    m = res["benchmarks"]["math500"]
    assert m["n_problems"] == n_problems and m["k"] == k
    for key in ("avg@k", "pass@k", "maj@k", "frac_no_boxed"):
        assert 0.0 <= m[key] <= 1.0
    assert m["mean_response_tokens"] > 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == n_problems * k
    assert {r["benchmark"] for r in rows} == {"math500"}
    assert set(rows[0]) == {"benchmark", "id", "sample", "response", "extracted", "correct", "status",
                            "response_tokens", "finish_reason"}
    assert all(r["response_tokens"] <= 12 for r in rows)
    # accuracy from samples.jsonl equals eval.json's avg@k
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(m["avg@k"])
    return res


def test_cli_end_to_end_hf_engine(require, tiny_model, tmp_path):
    require("transformers", "math_verify")
    from stare_lab.cli import main

    args = ["evaluate", "--model", str(tiny_model), "--engine", "hf", "--benchmarks", "math500", "--limit", "10",
            "--n", "2", "--max-tokens", "12", "--seed", "3", "--out"]
    assert main(args + [str(tmp_path / "a")]) == 0
    res = _check_outputs(tmp_path / "a", 10, 2)
    assert res["settings"]["seed"] == 3 and res["settings"]["top_p"] == 0.7
    # same seed ⇒ same samples
    assert main(args + [str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "samples.jsonl").read_text() == (tmp_path / "b" / "samples.jsonl").read_text()


@pytest.mark.slow
def test_cli_end_to_end_vllm_engine(require, tiny_model, tmp_path):
    require("vllm", "transformers", "math_verify")
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "stare_lab.cli", "evaluate", "--model", str(tiny_model), "--engine", "vllm",
           "--benchmarks", "math500", "--limit", "10", "--n", "2", "--max-tokens", "12", "--max-prompt-length",
           "512", "--out", str(tmp_path / "v")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "average" in proc.stdout
    _check_outputs(tmp_path / "v", 10, 2)


def test_cli_rejects_length_beyond_model_positions(require, tiny_model, tmp_path, capsys):
    """The tiny model has max_position_embeddings=1024 (trainer.tiny default): 1024 + 12 tokens cannot fit."""
    require("transformers")
    from stare_lab.cli import main

    rc = main(["evaluate", "--model", str(tiny_model), "--engine", "vllm", "--benchmarks", "math500", "--limit", "1",
               "--max-prompt-length", "1024", "--max-tokens", "12", "--out", str(tmp_path)])
    assert rc == 1
    assert "exceeds the model's max_position_embeddings=1024" in capsys.readouterr().err


def test_config_from_args_precedence(tmp_path):
    """EvalConfig defaults < --config YAML < explicit options."""
    import argparse

    from trainer.evaluation.cli import add_arguments, config_from_args

    yml = tmp_path / "e.yaml"
    yml.write_text("benchmarks: [aime24, amc23]\nn: 16\ntop_p: 0.8\nmax_tokens: 100\n")
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--model", "m", "--config", str(yml), "--top-p", "0.5"]))
    assert (cfg.benchmarks, cfg.n, cfg.top_p, cfg.max_tokens, cfg.temperature) == (["aime24", "amc23"], 16, 0.5,
                                                                                   100, 1.0)
    cfg = config_from_args(p.parse_args(["--model", "m", "--benchmarks", "math500", "--no-chat-template"]))
    assert cfg.benchmarks == ["math500"] and cfg.n is None and cfg.top_p == 0.7 and not cfg.use_chat_template
    yml.write_text("top_p: 2.0\n")
    with pytest.raises(ConfigError, match=r"eval.top_p=2(\.0)? is outside \(0, 1\]"):
        config_from_args(p.parse_args(["--model", "m", "--config", str(yml)]))


def test_parquet_source_with_other_field_names(require, tmp_path):
    """A Parquet benchmark file with fields Problem/Answer, selected by --file NAME=SOURCE and --*-key."""
    require("pyarrow")
    import argparse

    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.evaluation.evaluate import load_problems
    from trainer.evaluation.cli import add_arguments, config_from_args

    path = tmp_path / "aime.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "Problem": ["1+1?", "2+2?", "3+3?"], "Answer": ["2", "4", "6"]}),
                   path)
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--model", "m", "--benchmarks", "aime24", "--file", f"aime2024={path}",
                                         "--problem-key", "Problem", "--answer-key", "Answer", "--limit", "2"]))
    assert cfg.files == {"aime24": str(path)}
    probs = load_problems(cfg, "aime24")
    assert [(q.id, q.problem, q.answer) for q in probs] == [("a", "1+1?", "2"), ("b", "2+2?", "4")]
    with pytest.raises(ConfigError, match="NAME=SOURCE"):
        config_from_args(p.parse_args(["--model", "m", "--file", "aime24"]))
    with pytest.raises(ConfigError, match="not one of the benchmarks"):
        EvalConfig(benchmarks=["math500"], files={"aime24": str(path)})


def test_duplicate_ids_are_a_data_error(tmp_path):
    f = tmp_path / "dup.jsonl"
    f.write_text('{"id": "1", "problem": "a", "answer": "1"}\n{"id": "1", "problem": "b", "answer": "2"}\n')
    with pytest.raises(DataError, match="id '1' occurs more than once"):
        load_benchmark("aime24", path=str(f))


def test_sampling_seed_depends_on_benchmark_name_not_position():
    from trainer.evaluation.evaluate import _chunk_seed

    assert _chunk_seed(0, "aime24", 0) == _chunk_seed(0, "aime24", 0)
    assert len({_chunk_seed(0, "aime24", 0), _chunk_seed(0, "aime25", 0), _chunk_seed(1, "aime24", 0),
                _chunk_seed(0, "aime24", 1)}) == 4
    assert 0 <= _chunk_seed(123, "math500", 7) < 2**31
