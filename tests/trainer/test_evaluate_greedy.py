"""`stare-lab evaluate --temperature 0` decodes greedily: each engine's tokens equal the argmax continuation computed
here by hand (one forward per position of the tiny random-init model, the most likely next token, until eos or the
token budget); the seed does not matter, one response per problem (k=1), more is a one-line error. Its console is
the trainer's: the engines' logs are hidden unless --verbose."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from stare_lab.cli import main as cli_main
from stare_lab.errors import ConfigError

pytestmark = [pytest.mark.trainer]
_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 8, 200, 31, 64, 12]]
MAX_TOKENS = 8


def _argmax_continuation(model_dir, prompt, eos):
    """The greedy continuation by hand: repeatedly append argmax of the last position's logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(nxt)
            ids.append(nxt)
            if nxt in eos:
                break
    return out


def _eos(model_dir):
    from transformers import AutoTokenizer

    return {AutoTokenizer.from_pretrained(str(model_dir)).eos_token_id}


def test_hf_engine_greedy_equals_argmax(require, tiny_model):
    require("transformers")
    from trainer.engines.rollout import HFEngine, SamplingConfig

    eng = HFEngine(str(tiny_model), str(tiny_model), device="cpu", dtype="float32")
    a = eng.generate(PROMPTS, SamplingConfig(n=1, max_tokens=MAX_TOKENS, seed=1, temperature=0.0))
    b = eng.generate(PROMPTS, SamplingConfig(n=1, max_tokens=MAX_TOKENS, seed=2, temperature=0.0))
    eos = eng._eos
    for p, ga, gb in zip(PROMPTS, a, b):
        want = _argmax_continuation(tiny_model, p, eos)
        assert ga[0].token_ids == gb[0].token_ids == want
    with pytest.raises(ConfigError, match="greedy decoding gives one response per prompt; use n=1"):
        SamplingConfig(n=2, max_tokens=4, seed=0, temperature=0.0)


def test_vllm_engine_greedy_equals_argmax(require, tiny_model):
    """vLLM (in a subprocess with the CPU environment): the same argmax tokens, whatever the seed."""
    require("vllm")
    code = f"""
import json
from trainer.engines.rollout import VLLMEngine, SamplingConfig
eng = VLLMEngine({str(tiny_model)!r}, {str(tiny_model)!r}, dtype="float32", seed=0, max_model_len=64)
out = [eng.generate({PROMPTS!r}, SamplingConfig(n=1, max_tokens={MAX_TOKENS}, seed=s, temperature=0.0))
       for s in (1, 2)]
print("TOKENS", json.dumps([[g[0].token_ids for g in o] for o in out]))
"""
    proc = runs.run([sys.executable, "-c", code])
    line = [x for x in proc.stdout.splitlines() if x.startswith("TOKENS ")][-1]
    by_seed = json.loads(line[len("TOKENS "):])
    eos = _eos(tiny_model)
    want = [_argmax_continuation(tiny_model, p, eos) for p in PROMPTS]
    assert by_seed[0] == by_seed[1] == want


def test_evaluate_cli_greedy_is_quiet_and_k_is_one(require, tiny_model, tmp_path, capsys):
    """`evaluate --engine hf --temperature 0`: k = 1 sample per problem, identical responses for two seeds; --n 4
    with temperature 0 is a one-line error. Through vLLM (subprocess): no engine INFO lines on the console unless
    --verbose, as in `stare-lab train`."""
    require("transformers", "vllm")
    bench = tmp_path / "mine.jsonl"
    bench.write_text("".join(json.dumps({"id": str(i), "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                             for i in range(2)))
    common = ["evaluate", "--model", str(tiny_model), "--benchmarks", "mine", "--file", f"mine={bench}",
              "--temperature", "0", "--max-tokens", "6", "--max-prompt-length", "200"]
    responses = []
    for seed in (1, 2):
        out = tmp_path / f"e{seed}"
        assert cli_main([*common, "--engine", "hf", "--seed", str(seed), "--out", str(out)]) == 0
        rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        assert [r["sample"] for r in rows] == [0, 0]
        assert json.loads((out / "eval.json").read_text())["benchmarks"]["mine"]["k"] == 1
        responses.append([r["response"] for r in rows])
    assert responses[0] == responses[1]
    capsys.readouterr()
    assert cli_main([*common, "--engine", "hf", "--n", "4", "--out", str(tmp_path / "e3")]) == 1
    assert capsys.readouterr().err.strip() == (
        "stare-lab evaluate: error: eval.n=4 with eval.temperature=0: greedy decoding gives one response per "
        "problem; use n=1 (or leave n unset) or a temperature > 0")
    quiet = runs.run([sys.executable, "-m", "stare_lab.cli", *common, "--out", str(tmp_path / "v1")])
    loud = runs.run([sys.executable, "-m", "stare_lab.cli", *common, "--out", str(tmp_path / "v2"), "--verbose"])
    assert not [x for x in quiet.stderr.splitlines() if x.startswith("INFO") and "vllm" in x.lower()], quiet.stderr
    assert [x for x in loud.stderr.splitlines() if "INFO" in x and "vllm" in x.lower()], loud.stderr[-2000:]
    assert json.loads((tmp_path / "v1" / "samples.jsonl").read_text().splitlines()[0])["response"] == responses[0][0]
