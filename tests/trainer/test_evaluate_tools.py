"""Tool-integrated evaluation: an EvalConfig with a ``tool`` section evaluates with multi-turn tool rollouts in the
sandbox — the engine of tool-use training (:class:`trainer.tools.tool_rollout.ToolUseEngine`) — and grades the model's
own text.

(a) A scripted "policy" that writes code and then boxes whatever the interpreter printed: right only if the code
really ran (gold = sum(range(1000)) = 499500, computed by hand: 999·1000/2); a second problem where the code prints
the boxed answer itself is graded on the model's text, so wrong. (b) The tiny random-init model through
``stare-lab evaluate --config`` with code delimiters it emits often, so its random text triggers real sandbox runs.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from trainer.evaluation.evaluate import EvalConfig, evaluate_engine
from trainer.engines.rollout import RolloutOutput

GOLD = "499500"
INTERP = re.compile(r"<interpreter>\n(.*?)\n</interpreter>", re.S)


def _need_sandbox():
    from trainer.tools import sandbox

    ok, reason = sandbox.sandbox_available()
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"sandbox unavailable in CI: {reason}")
        pytest.skip(f"sandbox unavailable: {reason}")


class ToolUsingEngine:
    """Writes ``<code>…</code>`` first; once an interpreter turn is in its context, boxes what it printed. Without
    tools (no stop string) it cannot see a result and boxes 0. Problem "cheat": the code prints the boxed answer."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def _out(self, pi, ctx, text):
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return RolloutOutput(pi, list(ctx), ids, [0.0] * len(ids), text, "stop")

    def generate(self, contexts, sampling):
        out = []
        for pi, ctx in enumerate(contexts):
            seen = self.tok.decode(ctx, skip_special_tokens=True)
            group = []
            for _ in range(sampling.n):
                results = INTERP.findall(seen)
                if results:  # a continuation after the interpreter turn
                    text = "Done." if "cheat" in seen else f" So the answer is \\boxed{{{results[-1].strip()}}}."
                    o = self._out(pi, ctx, text)
                elif "</code>" in sampling.stop:
                    code = 'print(chr(92) + "boxed{" + str(sum(range(1000))) + "}")' if "cheat" in seen \
                        else "print(sum(range(1000)))"
                    text = f"Let me compute.<code>{code}</code>"
                    o = self._out(pi, ctx, text)
                    o.token_ids = o.token_ids[:-1]  # stopped at the stop string: no eos
                    o.logprobs = o.logprobs[:-1]
                else:
                    o = self._out(pi, ctx, "<code>print(sum(range(1000)))</code> I cannot run it: \\boxed{0}.")
                group.append(o)
            out.append(group)
        return out


def _problems(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"id": "honest", "problem": "Add 0..999.", "answer": GOLD}) + "\n"
                 + json.dumps({"id": "cheat", "problem": "Add 0..999 (cheat).", "answer": GOLD}) + "\n")
    return str(f)


TOOL = {"code_open": "<code>", "code_close": "</code>", "max_tool_calls": 2, "max_rounds": 4,
        "interpreter_template": "<interpreter>\n{output}\n</interpreter>\n", "sandbox": {"timeout_s": 10.0}}


def test_tool_section_runs_code_in_the_sandbox_and_grades_model_text(require, tiny_model, tmp_path):
    require("transformers", "math_verify")
    _need_sandbox()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    src = _problems(tmp_path)
    base = dict(benchmarks=["tir"], files={"tir": src}, n=2, use_chat_template=False, max_tokens=200)
    res = evaluate_engine(ToolUsingEngine(tok), tok, EvalConfig(**base, tool=TOOL), out_dir=tmp_path / "tools")
    m = res["benchmarks"]["tir"]
    assert m["avg@k"] == 0.5  # honest: 2/2 right with the sandbox's 499500; cheat: 0/2 (model text has no box)
    assert m["tool_calls_per_response"] == 1.0 and m["tool_error_frac"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "tools" / "samples.jsonl").read_text().splitlines()]
    honest = [r for r in rows if r["id"] == "honest"]
    cheat = [r for r in rows if r["id"] == "cheat"]
    assert all(r["correct"] and r["tool_calls"] == 1 and r["num_turns"] == 2 for r in honest)
    assert all(f"<interpreter>\n{GOLD}\n</interpreter>" in r["response"] for r in honest)
    assert all(not r["correct"] and r["status"] == "no_answer" and "\\boxed{499500}" in r["response"] for r in cheat)
    assert res["settings"]["tool"]["code_close"] == "</code>"
    # the same engine without a tool section: nothing runs, nothing is right
    plain = evaluate_engine(ToolUsingEngine(tok), tok, EvalConfig(**base))
    assert plain["benchmarks"]["tir"]["avg@k"] == 0.0 and "tool_calls_per_response" not in plain["benchmarks"]["tir"]


def test_cli_evaluates_the_tiny_model_with_tools(require, tiny_model, tmp_path, capsys):
    """``stare-lab evaluate --config`` with a tool section on the tiny model (HF engine): code blocks delimited by
    strings its random text contains ("o" … " ") are executed in the sandbox; their errors come back as
    interpreter turns (so the rollouts are multi-turn) and are counted."""
    require("transformers", "math_verify")
    _need_sandbox()
    from stare_lab.cli import main

    cfg = tmp_path / "eval_tools.yaml"
    cfg.write_text(yaml.safe_dump({"benchmarks": ["math500"], "limit": 2, "n": 2, "max_tokens": 48,
                                   "tool": {"code_open": "o", "code_close": " ", "max_tool_calls": 2,
                                            "max_rounds": 8, "sandbox": {"timeout_s": 10.0}}}))
    out = tmp_path / "out"
    rc = main(["evaluate", "--model", str(tiny_model), "--engine", "hf", "--config", str(cfg), "--seed", "1",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert "tool calls" in capsys.readouterr().out
    m = json.loads((out / "eval.json").read_text())["benchmarks"]["math500"]
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all({"tool_calls", "tool_errors", "num_turns"} <= set(r) for r in rows)
    calls = sum(r["tool_calls"] for r in rows)
    assert calls >= 1 and m["tool_calls_per_response"] == calls / 4
    # random "code" is not valid Python: the sandbox really ran it, its error output came back as an interpreter
    # turn (cut by the 48-token budget, which counts interpreter tokens too) and the call counts as an error
    with_call = [r for r in rows if r["tool_calls"]]
    assert all(r["num_turns"] >= 2 and "\n<interpreter>\n" in r["response"] for r in with_call)
    assert sum(r["tool_errors"] for r in rows) == calls and m["tool_error_frac"] == 1.0
