"""Multi-turn tool-use rollouts (ReTool / SimpleTIR style) on top of any :class:`~trainer.engines.rollout.RolloutEngine`.

The policy writes code in a block delimited by ``code_open`` / ``code_close`` (default a Markdown fence
```` ```python … ``` ````; ``<code>…</code>`` also works). Generation stops at ``code_close`` (a stop string), the code
runs in the sandbox (:mod:`trainer.tools.sandbox`), its output is appended to the response as an *interpreter turn*
(``interpreter_template``, default ``<interpreter>…</interpreter>``), and generation resumes after it — up to
``max_tool_calls`` executed calls and the total response-token budget (``SamplingConfig.max_tokens``, model and
interpreter tokens together).

Batched: every round makes one ``engine.generate`` call over all live trajectories (two when some of them have
used up their tool calls and must finish without the stop string), so vLLM advances them together.

The result per trajectory is a :class:`ToolRolloutOutput` — a :class:`~trainer.engines.rollout.RolloutOutput` whose
``token_ids`` interleave model and interpreter tokens, plus ``loss_mask`` (1 on model-sampled tokens, 0 on
interpreter tokens). The trainer uses ``loss_mask`` as (its factor of) ``response_mask``, so interpreter tokens
are excluded from the loss, the entropy statistics and the STARE surprisal selection: they were not sampled by
the policy. ``logprobs`` holds the engine's log-probs on model tokens and 0.0 on interpreter tokens (masked).

Markdown fences are ambiguous (the opening fence contains the closing one). A stop at ``code_close`` with no
``code_open`` before it in the current model segment is a *continuation*: generation resumes without running
anything (one extra round, bounded by ``max_rounds``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterable, Sequence

from stare_lab.errors import DataError

from trainer.engines.rollout import RolloutEngine, RolloutOutput, SamplingConfig
from trainer.tools.config import ToolUseConfig
from trainer.tools.sandbox import SandboxResult, run_many

logger = logging.getLogger(__name__)

__all__ = [
    "ToolCall",
    "ToolRolloutOutput",
    "ToolUseEngine",
    "generate_with_tools",
    "extract_code",
    "format_interpreter_output",
    "tool_metrics",
    "collate_responses",
    "TOOL_METRIC_KEYS",
]


@dataclasses.dataclass
class ToolCall:
    """One executed code block: where it sits in the response and what came back.

    Attributes:
        code: the extracted source.
        ok, timed_out, error: from the :class:`~trainer.tools.sandbox.SandboxResult` (``error`` is ``None`` when ok).
        start, end: token span ``[start, end)`` of its interpreter turn in the response (mask 0 there).
        wall_s: execution seconds.
    """

    code: str
    ok: bool
    timed_out: bool
    error: str | None
    start: int
    end: int
    wall_s: float


@dataclasses.dataclass
class ToolRolloutOutput(RolloutOutput):
    """A :class:`~trainer.engines.rollout.RolloutOutput` with interleaved interpreter turns.

    Attributes (beyond the base class):
        loss_mask: ``len(token_ids)`` ints; 1 on tokens sampled by the policy, 0 on interpreter tokens.
        sample_index: which of the ``n`` samples of its prompt it is.
        tool_calls: the executed calls, in order.
        num_turns: model turns (generation rounds that produced tokens for this response, continuations included).
        model_text: the model's tokens only, decoded (interpreter turns left out): grade *this*, so an answer
            printed by the code does not count as the model's answer.

    ``logprobs`` is 0.0 at interpreter positions (``None`` if the engine returned none); ``finish_reason`` is ``"stop"`` (eos, or a final answer) or
    ``"length"`` (the token budget ran out, possibly inside an interpreter turn).
    """

    loss_mask: list[int] = dataclasses.field(default_factory=list)
    sample_index: int = 0
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    num_turns: int = 0
    model_text: str = ""

    @property
    def num_tool_calls(self) -> int:
        """Executed code blocks."""
        return len(self.tool_calls)

    @property
    def num_tool_errors(self) -> int:
        """Executed code blocks that failed (exception, non-zero exit, timeout, memory)."""
        return sum(not c.ok for c in self.tool_calls)


# ----------------------------------------------------------------------------------------------------------------
# pure helpers
# ----------------------------------------------------------------------------------------------------------------


def _strip_inner_fence(code: str) -> str:
    """``<code>```python\\nX\\n```</code>`` (ReTool) → ``X``."""
    s = code.strip("\n")
    if s.lstrip().startswith("```"):
        first_nl = s.find("\n")
        s = s[first_nl + 1 :] if first_nl >= 0 else ""
        if s.rstrip().endswith("```"):
            s = s.rstrip()[:-3]
    return s


def extract_code(segment: str, code_open: str, code_close: str) -> str | None:
    """The code of the block that ends at the last ``code_close`` of ``segment``, or ``None``.

    ``segment`` is the model's text since its last interpreter turn. The block is the text between the last
    ``code_open`` that ends before the last ``code_close`` and that ``code_close``. ``None`` when there is no such
    pair (e.g. the stop string fired on the opening fence itself) — the caller then continues generation.

    Examples: ``extract_code("a ```python\\nprint(1)\\n```", "```python", "```") == "print(1)"``;
    ``extract_code("a ```", "```python", "```") is None``.
    """
    close = segment.rfind(code_close)
    if close < 0:
        return None
    opening = segment.rfind(code_open, 0, close)
    if opening < 0 or opening + len(code_open) > close:
        return None
    code = segment[opening + len(code_open) : close]
    if code.strip().startswith("```"):
        code = _strip_inner_fence(code)
    return code.strip("\n")


def format_interpreter_output(result: SandboxResult, max_chars: int = 1024) -> str:
    """The text the model sees for one call (without the template): stdout, then on failure the traceback
    (or ``TimeoutError: …``); cut to ``max_chars`` characters with a ``[output truncated]`` marker."""
    parts = [result.stdout]
    if result.timed_out:
        parts.append(f"TimeoutError: {result.error}")
    elif not result.ok:
        parts.append(result.stderr if result.stderr.strip() else (result.error or "error"))
    text = "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts if p).rstrip("\n")
    truncated = result.truncated or len(text) > max_chars
    if len(text) > max_chars:
        text = text[:max_chars]
    if truncated:
        text += "\n... [output truncated]"
    return text if text else "(no output)"


# ----------------------------------------------------------------------------------------------------------------
# the rollout
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Traj:
    prompt_index: int
    sample_index: int
    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    segment_start: int = 0  # first token of the current model segment (after the last interpreter turn)
    calls: list[ToolCall] = dataclasses.field(default_factory=list)
    turns: int = 0
    engine_logprobs: bool = True  # False once a round came back without log-probs
    done: bool = False
    finish: str = "stop"


def _round_seed(seed: int, round_index: int, group: int) -> int:
    return (int(seed) * 1_000_003 + round_index * 7919 + group) % (2**31 - 1)


def generate_with_tools(
    engine: RolloutEngine,
    tokenizer: Any,
    prompt_token_ids: list[list[int]],
    sampling: SamplingConfig,
    config: ToolUseConfig | None = None,
    runner: Callable[[list[str]], list[SandboxResult]] | None = None,
) -> list[list[ToolRolloutOutput]]:
    """Sample ``sampling.n`` tool-using responses per prompt; returns ``[prompt][n]`` :class:`ToolRolloutOutput`.

    Args:
        engine: any :class:`~trainer.engines.rollout.RolloutEngine` (vLLM, HF, or a scripted test engine).
        tokenizer: the policy's tokenizer (``encode`` / ``decode`` / ``eos_token_id``): decodes model segments to
            find code and encodes interpreter turns.
        prompt_token_ids: the prompts.
        sampling: ``n``, temperature etc.; ``max_tokens`` is the **total** response budget (model + interpreter
            tokens); ``seed`` seeds round r with a seed derived from (seed, r), so the call is deterministic.
        config: tool-use settings (default :class:`ToolUseConfig`).
        runner: executes a batch of code strings (default: :func:`trainer.tools.sandbox.run_many` with
            ``config.sandbox``); must return one :class:`~trainer.tools.sandbox.SandboxResult` per code, in order.

    Raises:
        SandboxError: the sandbox cannot start (bwrap missing).
        DataError: the engine returned a malformed batch (wrong count, logprobs of the wrong length).
    """
    config = config or ToolUseConfig()
    if runner is None:
        sandbox_cfg = config.sandbox

        def runner(codes: list[str]) -> list[SandboxResult]:
            return run_many(codes, sandbox_cfg)

    stop_ids = set(sampling.stop_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        stop_ids.add(int(tokenizer.eos_token_id))
    budget = sampling.max_tokens
    trajs = [
        _Traj(pi, j, list(p)) for pi, p in enumerate(prompt_token_ids) for j in range(sampling.n)
    ]

    def sampling_for(round_index: int, group: int, n: int, max_tokens: int, tools: bool) -> SamplingConfig:
        stop = list(sampling.stop) + ([config.code_close] if tools else [])
        return dataclasses.replace(
            sampling, n=n, max_tokens=max_tokens, seed=_round_seed(sampling.seed, round_index, group), stop=stop
        )

    def absorb(t: _Traj, out: RolloutOutput, tools: bool) -> str | None:
        """Append a model turn; return the code to run, or None. Marks the trajectory done when it ends."""
        room = budget - len(t.tokens)
        ids = list(out.token_ids)[:room]
        lps = out.logprobs
        if lps is not None and len(lps) != len(out.token_ids):
            raise DataError(
                f"engine returned {len(lps)} logprobs for {len(out.token_ids)} tokens (prompt {t.prompt_index})"
            )
        t.engine_logprobs &= lps is not None
        lps = [float(x) for x in lps[: len(ids)]] if lps is not None else [0.0] * len(ids)
        t.tokens += ids
        t.mask += [1] * len(ids)
        t.logprobs += lps
        t.turns += 1
        if len(ids) < len(out.token_ids) or out.finish_reason == "length":
            t.done, t.finish = True, "length"  # cut by this trajectory's budget or by the engine's max_tokens
            return None
        if not ids or not tools or ids[-1] in stop_ids:
            t.done, t.finish = True, "stop"  # eos / stop token, or a round without tools
            return None
        segment = tokenizer.decode(t.tokens[t.segment_start :], skip_special_tokens=True)
        if config.code_close not in segment:
            t.done, t.finish = True, "stop"  # stopped by one of the caller's own stop strings
            return None
        if len(t.tokens) >= budget:
            t.done, t.finish = True, "length"  # no room left for an interpreter turn
            return None
        return extract_code(segment, config.code_open, config.code_close) or ""  # "" = continuation

    # round 0: n samples per prompt in one call
    tools0 = config.max_tool_calls > 0 and config.max_rounds > 1
    first = engine.generate(prompt_token_ids, sampling_for(0, 0, sampling.n, budget, tools0))
    if len(first) != len(prompt_token_ids) or any(len(g) != sampling.n for g in first):
        raise DataError(f"engine returned {[len(g) for g in first]} outputs for {len(prompt_token_ids)} prompts "
                        f"x n={sampling.n}")
    pending = {}
    for t in trajs:
        code = absorb(t, first[t.prompt_index][t.sample_index], tools0)
        if code is not None:
            pending[id(t)] = code
    round_index = 1
    while True:
        _run_pending(trajs, pending, runner, tokenizer, config, budget)
        live = [t for t in trajs if not t.done]
        if not live:
            break
        last_round = round_index >= config.max_rounds - 1
        pending = {}
        groups = (
            [t for t in live if not last_round and len(t.calls) < config.max_tool_calls],
            [t for t in live if last_round or len(t.calls) >= config.max_tool_calls],
        )
        for group_index, (group, tools) in enumerate(zip(groups, (True, False))):
            if not group:
                continue
            max_new = max(budget - len(t.tokens) for t in group)
            outs = engine.generate(
                [t.prompt + t.tokens for t in group], sampling_for(round_index, group_index, 1, max_new, tools)
            )
            if len(outs) != len(group) or any(len(o) != 1 for o in outs):
                raise DataError(f"engine returned {len(outs)} groups for {len(group)} contexts with n=1")
            for t, o in zip(group, outs):
                code = absorb(t, o[0], tools)
                if code is not None:
                    pending[id(t)] = code
        round_index += 1

    results: list[list[ToolRolloutOutput]] = [[] for _ in prompt_token_ids]
    for t in trajs:
        results[t.prompt_index].append(
            ToolRolloutOutput(
                prompt_index=t.prompt_index,
                prompt_token_ids=t.prompt,
                token_ids=t.tokens,
                logprobs=t.logprobs if t.engine_logprobs else None,
                text=tokenizer.decode(t.tokens, skip_special_tokens=True),
                finish_reason=t.finish,
                loss_mask=t.mask,
                sample_index=t.sample_index,
                tool_calls=t.calls,
                num_turns=t.turns,
                model_text=tokenizer.decode([x for x, m in zip(t.tokens, t.mask) if m], skip_special_tokens=True),
            )
        )
    return results


def _run_pending(
    trajs: list[_Traj],
    pending: dict[int, str],
    runner: Callable[[list[str]], list[SandboxResult]],
    tokenizer: Any,
    config: ToolUseConfig,
    budget: int,
) -> None:
    """Execute this round's code blocks (one batch) and append their interpreter turns."""
    todo = [(t, pending[id(t)]) for t in trajs if id(t) in pending and pending[id(t)]]
    results = runner([code for _, code in todo]) if todo else []
    if len(results) != len(todo):
        raise DataError(f"tool runner returned {len(results)} results for {len(todo)} code blocks")
    for (t, code), res in zip(todo, results):
        text = config.interpreter_template.format(output=format_interpreter_output(res, config.max_output_chars))
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        room = budget - len(t.tokens)
        start = len(t.tokens)
        ids = ids[:room]
        t.tokens += ids
        t.mask += [0] * len(ids)
        t.logprobs += [0.0] * len(ids)
        t.segment_start = len(t.tokens)
        t.calls.append(ToolCall(code, res.ok, res.timed_out, res.error, start, len(t.tokens), res.wall_s))
        if len(t.tokens) >= budget:
            t.done, t.finish = True, "length"
        if not res.ok:
            logger.debug("tool call failed (prompt %d): %s", t.prompt_index, res.error)
    # continuations ("" = the stop fired on an opening fence): nothing to run, the trajectory simply goes on


class ToolUseEngine:
    """A :class:`~trainer.engines.rollout.RolloutEngine` that wraps another one with :func:`generate_with_tools`.

    ``generate`` returns :class:`ToolRolloutOutput` (a ``RolloutOutput`` with ``loss_mask``); ``sync_weights``,
    ``sleep`` and ``wake_up`` go to the wrapped engine. The trainer's loop uses it unchanged, provided it
    multiplies ``response_mask`` by ``loss_mask`` where present.
    """

    def __init__(self, engine: RolloutEngine, tokenizer: Any, config: ToolUseConfig | None = None,
                 runner: Callable[[list[str]], list[SandboxResult]] | None = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or ToolUseConfig()
        self.runner = runner

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[list[ToolRolloutOutput]]:
        """See :func:`generate_with_tools`."""
        return generate_with_tools(self.engine, self.tokenizer, prompt_token_ids, sampling, self.config, self.runner)

    def sync_weights(self, named_tensors: Iterable[Any]) -> None:
        """Delegate to the wrapped engine."""
        self.engine.sync_weights(named_tensors)

    def sleep(self) -> None:
        """Delegate to the wrapped engine."""
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Delegate to the wrapped engine."""
        self.engine.wake_up(tags)


# ----------------------------------------------------------------------------------------------------------------
# metrics and collation
# ----------------------------------------------------------------------------------------------------------------


#: The keys of :func:`tool_metrics`, in its order.
TOOL_METRIC_KEYS = ("tool/calls_per_response", "tool/error_frac", "tool/timeout_frac", "tool/turns",
                    "tool/response_length", "tool/model_tokens", "tool/interpreter_tokens", "tool/length_frac")


def tool_metrics(outputs: Sequence[ToolRolloutOutput] | Sequence[Sequence[ToolRolloutOutput]]) -> dict[str, float]:
    """Namespaced metrics of a batch (flat or ``[prompt][n]``), for the trainer's metrics row.

    Keys: ``tool/calls_per_response`` (mean executed calls), ``tool/error_frac`` (failed / executed calls; 0.0
    when no call was made), ``tool/timeout_frac`` (timed-out / executed calls; 0.0 when none), ``tool/turns``
    (mean model turns), ``tool/response_length`` (mean tokens, model + interpreter), ``tool/model_tokens`` and
    ``tool/interpreter_tokens`` (means), ``tool/length_frac`` (fraction cut by the token budget).

    Raises:
        DataError: empty batch.
    """
    flat: list[ToolRolloutOutput] = []
    for o in outputs:
        flat.extend(o if isinstance(o, (list, tuple)) else [o])
    if not flat:
        raise DataError("tool_metrics needs at least one response")
    n = len(flat)
    calls = sum(o.num_tool_calls for o in flat)
    errors = sum(o.num_tool_errors for o in flat)
    timeouts = sum(c.timed_out for o in flat for c in o.tool_calls)
    model_tokens = sum(sum(o.loss_mask) for o in flat)
    total_tokens = sum(len(o.token_ids) for o in flat)
    return {
        "tool/calls_per_response": calls / n,
        "tool/error_frac": errors / calls if calls else 0.0,
        "tool/timeout_frac": timeouts / calls if calls else 0.0,
        "tool/turns": sum(o.num_turns for o in flat) / n,
        "tool/response_length": total_tokens / n,
        "tool/model_tokens": model_tokens / n,
        "tool/interpreter_tokens": (total_tokens - model_tokens) / n,
        "tool/length_frac": sum(o.finish_reason == "length" for o in flat) / n,
    }


def collate_responses(outputs: Sequence[RolloutOutput], pad_token_id: int, pad_to: int | None = None) -> dict:
    """Right-pad responses into tensors.

    Returns a dict of ``responses`` ``[B, T]`` int64, ``response_mask`` ``[B, T]`` float32 (1 on model tokens,
    0 on interpreter tokens and padding; plain ``RolloutOutput`` rows count every token as a model token) and
    ``rollout_logprobs`` ``[B, T]`` float32 (0 where masked). ``T = pad_to`` or the longest response.

    Raises:
        DataError: a response is longer than ``pad_to``.
    """
    import torch

    longest = max((len(o.token_ids) for o in outputs), default=0)
    T = longest if pad_to is None else pad_to
    if longest > T:
        raise DataError(f"a response has {longest} tokens, more than pad_to={pad_to}")
    B = len(outputs)
    responses = torch.full((B, T), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    for i, o in enumerate(outputs):
        L = len(o.token_ids)
        responses[i, :L] = torch.tensor(o.token_ids, dtype=torch.long)
        m = getattr(o, "loss_mask", None) or [1] * L
        mask[i, :L] = torch.tensor(m, dtype=torch.float32)
        if o.logprobs is not None:
            logprobs[i, :L] = torch.tensor(o.logprobs, dtype=torch.float32) * mask[i, :L]
    return {"responses": responses, "response_mask": mask, "rollout_logprobs": logprobs}
