"""verl's RL dataset format (Parquet or JSONL: chat-list ``prompt``, ``reward_model.ground_truth``, ``data_source``,
``extra_info``) loads with no extra option; nested keys are addressable; and the tiny-cpu preset trains on a
verl-format Parquet and JSONL file with no data flags (its output: one line per step, the final report, no engine
noise)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from stare_lab.errors import DataError
from trainer.data import PromptEncoder, load_records

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def _verl_rows(flat_file: Path) -> list[dict]:
    """verl's gsm8k preprocessing layout (examples/data_preprocess/gsm8k.py) of flat problem/answer records."""
    rows = []
    for i, line in enumerate(flat_file.read_text().splitlines()):
        rec = json.loads(line)
        rows.append({"data_source": "openai/gsm8k",
                     "prompt": [{"role": "user", "content": f"{rec['problem']} {INSTRUCTION}"}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": rec["answer"]},
                     "extra_info": {"split": "train", "index": i}})
    return rows


@pytest.fixture(scope="module")
def verl_files(gsm8k_digits, tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("verl")
    rows = _verl_rows(gsm8k_digits)
    pq.write_table(pa.Table.from_pylist(rows), d / "train.parquet")
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d / "train.parquet", d / "train.jsonl", rows


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_verl_format_is_detected_with_the_default_keys(verl_files, kind):
    path = verl_files[0] if kind == "parquet" else verl_files[1]
    rows = verl_files[2]
    recs = load_records([str(path)], "problem", "answer")
    assert len(recs) == len(rows)
    assert recs[0]["prompt"] == rows[0]["prompt"]  # the chat list, as is
    assert recs[0]["answer"] == rows[0]["reward_model"]["ground_truth"]
    assert recs[0]["data_source"] == "openai/gsm8k" and recs[0]["extra_info"]["index"] == 0


def test_nested_keys_and_flattened_columns(tmp_path):
    f = tmp_path / "n.jsonl"
    f.write_text(json.dumps({"q": "1+2?", "meta": {"gold": {"value": 3}}}) + "\n"
                 + json.dumps({"q": "2+2?", "meta": {"gold": {"value": 4}}, "meta.gold.value": "four"}) + "\n")
    recs = load_records([str(f)], "q", "meta.gold.value")
    assert [r["answer"] for r in recs] == ["3", "four"]  # a literal dotted column wins over the nested path
    with pytest.raises(DataError, match=r"n.jsonl:1: record has no field 'meta.gold.missing'"):
        load_records([str(f)], "q", "meta.gold.missing")
    with pytest.raises(DataError, match="must be a string or a chat list"):
        load_records([str(f)], "meta", "q")


def test_explicit_verl_keys_and_a_list_ground_truth(tmp_path):
    f = tmp_path / "v.jsonl"
    rec = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}],
           "reward_model": {"ground_truth": ["2"]}}
    f.write_text(json.dumps(rec) + "\n")
    (r,) = load_records([str(f)], "prompt", "reward_model.ground_truth")
    assert r["answer"] == "2" and r["prompt"] == rec["prompt"]


def test_chat_list_prompts_are_the_conversation(tiny_model):
    """A chat-list prompt goes through the chat template as is (no prompt_template on top); a string prompt is
    wrapped by the template into one user message."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    enc = PromptEncoder(tok, "{problem} Solve it.", True, 512, "left")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]
    ids = enc.encode({"prompt": msgs, "answer": "2", "id": 0}, 0).token_ids
    assert ids == list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    ids2 = enc.encode({"prompt": "1+1?", "answer": "2", "id": 1}, 1).token_ids
    assert ids2 == list(tok.apply_chat_template([{"role": "user", "content": "1+1? Solve it."}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.mark.slow
@pytest.mark.trainer
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_tiny_cpu_preset_trains_on_verl_data_without_extra_flags(require, verl_files, tmp_path, kind):
    """``stare-lab train --preset tiny-cpu --train-data FILE --out DIR`` on verl-format data. Also the output a
    person reads (issue 16): one line per step on stderr, the final report on stdout, no engine noise."""
    require("vllm", "deepspeed", "math_verify", "transformers")
    data = verl_files[0] if kind == "parquet" else verl_files[1]
    out = tmp_path / "run"
    proc = runs.run([sys.executable, "-m", "stare_lab.cli", "train", "--preset", "tiny-cpu", "--train-data",
                     str(data), "--out", str(out)], cwd=tmp_path)
    rows = runs.rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["skipped"] == 0 and r["num_tokens"] > 0 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows), [r["grad_norm"] for r in rows]
    step_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("step ")]
    assert [ln.split(" | ")[0] for ln in step_lines] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(" tok/s " in ln and "ETA " in ln and "entropy " in ln and "gate on W 1.100 M 0.900" in ln
               for ln in step_lines), step_lines
    assert "run finished: 3 steps in" in proc.stdout and "final reward" in proc.stdout
    assert str(out / "final_model") in proc.stdout
    for noise in ("FutureWarning", "RotaryEmbedding", "INFO vllm", "DeepSpeed info", "Loading safetensors",
                  "Traceback"):  # no traceback at exit either (vLLM's exit hook after our process-group teardown)
        assert noise not in proc.stderr, noise
