"""Benchmark evaluation: sample k responses per problem, grade them, report avg@k / pass@k / maj@k (STARE Table 2).

The library side of ``stare-lab evaluate`` (the command line is :mod:`trainer.evaluation.cli`): :class:`EvalConfig`,
:func:`evaluate_engine` (any rollout engine; the trainer's periodic evaluation calls it with its own engine and
logs :func:`flat_metrics`) and the metrics. By default the problems come from the benchmark copies bundled with the
package (:data:`trainer.evaluation.benchmarks.BUNDLED_DIR`); ``EvalConfig.files`` / ``data_dir`` read other sources.

Outputs in ``DIR``:

* ``eval.json`` — ``{"model", ["model_fingerprint",] "settings", "benchmarks": {name: {"n_problems", "k", "avg@k", "pass@k", "maj@k",
  "mean_response_tokens", "frac_no_boxed", "pass_at": {"1": …, "2": …, …}, "status": {…}}}, "average"}``
  (with tools also ``tool_calls_per_response``, ``tool_error_frac``). Accuracies are fractions in [0, 1] (Table 2
  shows percent). ``average`` is the unweighted mean of the benchmarks' avg@k, as Table 2's "avg" column.
* ``samples.jsonl`` — one row per sample: ``benchmark, id, sample, response, extracted, correct, status,
  response_tokens, finish_reason`` (``response_tokens`` counts the engine's response tokens, including a final eos —
  with tools, interpreter tokens too; ``mean_response_tokens`` averages it), with tools also ``tool_calls,
  tool_errors, num_turns``.

Prompts: the paper's template (problem + "Please reason step by step, and put your final answer within
\\boxed{}.", :data:`trainer.config.DEFAULT_PROMPT_TEMPLATE`) through the tokenizer's chat template when it has one.
Grading: :func:`trainer.grading.rewards.grade_batch` (math-verify's rules, as the STARE reference; ``rel_tol`` optional).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from stare_lab.config import check_positive, check_range, config_prefix, from_dict, to_dict
from stare_lab.errors import ConfigError, DataError

from trainer.evaluation.benchmarks import DEFAULT_SAMPLES, Problem, canonical_name, load_benchmark, resolve_benchmarks
from trainer.config import DEFAULT_PROMPT_TEMPLATE
from trainer.grading.rewards import grade_batch, normalize_answer, parse_number

logger = logging.getLogger(__name__)

__all__ = [
    "EvalConfig",
    "pass_at_k",
    "avg_at_k",
    "majority_vote",
    "maj_at_k",
    "benchmark_metrics",
    "evaluate_engine",
    "flat_metrics",
    "load_problems",
    "share",
]


# ----------------------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    ``1 − C(n−c, k) / C(n, k)``, computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` (numerically stable product
    form).

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code", Eq. 1 and Fig. 3.

    Raises:
        DataError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise DataError(f"pass_at_k: {name}={v!r} must be an integer")
    if not 0 <= c <= n:
        raise DataError(f"pass_at_k: c={c} is outside [0, n={n}]")
    if not 1 <= k <= n:
        raise DataError(f"pass_at_k: k={k} is outside [1, n={n}]")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k: mean over problems of the fraction of their samples that are correct (= mean per-sample accuracy
    when every problem has the same number of samples).

    Raises:
        DataError: if there are no problems or a problem has no samples.
    """
    if not correct:
        raise DataError("avg_at_k: no problems")
    total = 0.0
    for i, row in enumerate(correct):
        if len(row) == 0:
            raise DataError(f"avg_at_k: problem {i} has no samples")
        total += sum(bool(x) for x in row) / len(row)
    return total / len(correct)


def _answer_key(answer: str) -> tuple:
    num = parse_number(answer)
    if num is not None:
        return ("num", num[0])
    return ("str", normalize_answer(answer))


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the majority vote, or ``None`` if no sample has an answer.

    Answers are grouped by value when they parse as numbers (``0.5`` and ``\\frac{1}{2}`` vote together), else by
    their normalised string (:func:`trainer.grading.rewards.normalize_answer`); samples without an answer do not vote. Ties
    go to the group whose first member comes first (lowest sample index); the returned index is that first member.
    """
    keys: dict[tuple, list[int]] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        keys.setdefault(_answer_key(a), []).append(i)
    if not keys:
        return None
    best = max(keys.values(), key=lambda idx: (len(idx), -idx[0]))
    return best[0]


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """maj@k: fraction of problems whose majority-vote answer (:func:`majority_vote`) is correct; a problem with no
    answered sample counts as wrong.

    Raises:
        DataError: if the two nested sequences differ in shape or are empty.
    """
    if not answers or len(answers) != len(correct):
        raise DataError(f"maj_at_k: got {len(answers)} answer rows and {len(correct)} correctness rows")
    hits = 0
    for i, (a_row, c_row) in enumerate(zip(answers, correct)):
        if len(a_row) != len(c_row):
            raise DataError(f"maj_at_k: problem {i} has {len(a_row)} answers but {len(c_row)} grades")
        j = majority_vote(a_row)
        hits += int(j is not None and bool(c_row[j]))
    return hits / len(answers)


def benchmark_metrics(samples: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """Aggregate one benchmark's sample rows (``id``, ``sample``, ``extracted``, ``correct``, ``status``,
    ``response_tokens``) into the ``eval.json`` entry.

    ``pass_at`` holds the unbiased pass@j for j = 1, 2, 4, … ≤ k and j = k.

    Raises:
        DataError: if there are no samples or a problem has a number of samples other than ``k``.
    """
    if not samples:
        raise DataError("benchmark_metrics: no samples")
    by_id: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by_id.setdefault(str(s["id"]), []).append(s)
    for pid, rows in by_id.items():
        if len(rows) != k:
            raise DataError(f"benchmark_metrics: problem {pid!r} has {len(rows)} samples, expected k={k}")
    rows_sorted = [sorted(rows, key=lambda r: r["sample"]) for rows in by_id.values()]
    correct = [[bool(r["correct"]) for r in rows] for rows in rows_sorted]
    answers = [[r["extracted"] for r in rows] for rows in rows_sorted]
    js = sorted({2**e for e in range(int(math.log2(k)) + 1)} | {k})
    pass_at = {str(j): sum(pass_at_k(k, sum(c), j) for c in correct) / len(correct) for j in js}
    status = Counter(s["status"] for s in samples)
    tools = {}
    if any("tool_calls" in s for s in samples):  # tool-integrated evaluation (EvalConfig.tool)
        calls = sum(s.get("tool_calls", 0) for s in samples)
        tools = {"tool_calls_per_response": calls / len(samples),
                 "tool_error_frac": sum(s.get("tool_errors", 0) for s in samples) / calls if calls else 0.0}
    return {
        "n_problems": len(correct),
        "k": k,
        "avg@k": avg_at_k(correct),
        "pass@k": pass_at[str(k)],
        "maj@k": maj_at_k(answers, correct),
        "mean_response_tokens": sum(s["response_tokens"] for s in samples) / len(samples),
        "frac_no_boxed": status.get("no_answer", 0) / len(samples),
        "pass_at": pass_at,
        "status": dict(sorted(status.items())),
        **tools,
    }


def flat_metrics(result: dict[str, Any]) -> dict[str, float]:
    """``eval.json`` content → metrics-row keys (runs.py convention): ``eval/<bench>/avg@<k>``,
    ``eval/<bench>/pass@<k>``, ``eval/<bench>/maj@<k>`` and ``eval/accuracy`` (the average)."""
    out: dict[str, float] = {}
    for name, m in result.get("benchmarks", {}).items():
        k = m["k"]
        for key in ("avg", "pass", "maj"):
            out[f"eval/{name}/{key}@{k}"] = m[f"{key}@k"]
    if result.get("average") is not None:
        out["eval/accuracy"] = result["average"]
    return out


# ----------------------------------------------------------------------------------------------------------------
# config and evaluation
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class EvalConfig:
    """Evaluation settings (also readable from YAML with :func:`stare_lab.config.load_config`).

    Attributes:
        benchmarks: names (see :func:`trainer.evaluation.benchmarks.resolve_benchmarks`); default the six of Table 2. A name
            other than the built-in ones needs a data source in ``files``.
        n: samples per problem for every benchmark; ``None`` = the paper's (32 for AIME24/25 and AMC23, 4 else).
        temperature, top_p, top_k: sampling (paper validation: T = 1.0, top-p 0.7).
        max_tokens: max new tokens per response (paper: 3072 for Short CoT); with ``tool``, model and interpreter
            tokens together.
        max_prompt_length: prompt tokens; longer prompts are truncated on the left (logged).
        seed: sampling seed (same seed, engine, model and number of data-parallel groups ⇒ same samples).
        data_dir: benchmark directory with ``<name>/<name>.jsonl`` or ``<name>.jsonl`` files (``None`` =
            ``$STARE_LAB_BENCHMARK_DIR`` if set, else the copies bundled with the package,
            :data:`trainer.evaluation.benchmarks.BUNDLED_DIR`).
        limit: evaluate only the first ``limit`` problems of each benchmark (``None`` = all).
        files: benchmark → data source read instead of ``data_dir``: a JSONL or Parquet file, or ``hf:NAME:SPLIT``
            (a ``datasets`` dataset: local cache, or the hub when online). Any name: a name that is not built in
            adds a custom benchmark (list it in ``benchmarks``).
        problem_key, answer_key: record fields of the statement and the gold answer.
        prompt_template: user-message template with ``{problem}``.
        use_chat_template: wrap the message with the tokenizer's chat template when it has one.
        timeout_s: grading time limit per response, seconds.
        rel_tol: ``None`` (default): answers are judged by math-verify's rules, as the STARE reference grades
            (:func:`trainer.grading.rewards.numbers_equal`). A number in (0, 1): also accept numbers within this relative
            distance (integers included) — a looser, explicit option (e.g. 1e-4, the Qwen2.5-Math harness's).
        batch_prompts: prompts per ``generate`` call.
        tool: multi-turn tool use (a mapping of :class:`trainer.tools.tool_rollout.ToolUseConfig` fields, e.g. the
            ``tool`` section of a tool-use trainer config): responses are generated by
            :class:`~trainer.tools.tool_rollout.ToolUseEngine` — the engine of tool-use training — so code blocks run in
            the sandbox and their output comes back as interpreter turns; the model's own text is graded.
            ``None`` (default) = plain single-turn sampling.
    """

    benchmarks: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_SAMPLES))
    n: int | None = None
    temperature: float = 1.0
    top_p: float = 0.7
    top_k: int = -1
    max_tokens: int = 3072
    max_prompt_length: int = 1024
    seed: int = 0
    data_dir: str | None = None
    limit: int | None = None
    files: dict = dataclasses.field(default_factory=dict)
    problem_key: str = "problem"
    answer_key: str = "answer"
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    use_chat_template: bool = True
    timeout_s: float = 5.0
    rel_tol: float | None = None
    batch_prompts: int = 256
    # a ToolUseConfig or None; typed ``Any`` and converted in __post_init__ (as TrainerConfig.tool)
    tool: Any = None

    def __post_init__(self) -> None:
        from trainer.tools.config import ToolUseConfig

        prefix = config_prefix("eval")
        p = prefix + "." if prefix else ""
        if not isinstance(self.files, dict):
            raise ConfigError(f"{p}files={self.files!r} must be a mapping NAME: SOURCE")
        self.files = {canonical_name(k): str(v) for k, v in self.files.items()}
        self.benchmarks = resolve_benchmarks(self.benchmarks, custom=self.files)
        if self.n is not None:
            check_positive(f"{p}n", self.n, integer=True)
        check_range(f"{p}temperature", self.temperature, 0, None)
        if self.temperature == 0 and self.n not in (None, 1):
            raise ConfigError(f"{p}n={self.n} with {p}temperature=0: greedy decoding gives one response per problem; "
                              "use n=1 (or leave n unset) or a temperature > 0")
        check_range(f"{p}top_p", self.top_p, 0, 1, lo_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise ConfigError(f"{p}top_k={self.top_k} must be -1 (off) or a positive integer")
        check_positive(f"{p}max_tokens", self.max_tokens, integer=True)
        check_positive(f"{p}max_prompt_length", self.max_prompt_length, integer=True)
        check_positive(f"{p}seed", self.seed, integer=True, allow_zero=True)
        if self.limit is not None:
            check_positive(f"{p}limit", self.limit, integer=True)
        for name in self.files:
            if name not in self.benchmarks:
                raise ConfigError(f"{p}files has {name!r}, which is not one of the benchmarks {self.benchmarks}; "
                                  f"add it to the benchmarks (--benchmarks ...,{name})")
        if "{problem}" not in self.prompt_template:
            raise ConfigError(f"{p}prompt_template={self.prompt_template!r} must contain {{problem}}")
        check_range(f"{p}timeout_s", self.timeout_s, 0, None, lo_open=True)
        if self.rel_tol is not None:
            check_range(f"{p}rel_tol", self.rel_tol, 0, 1, lo_open=True, hi_open=True)
        check_positive(f"{p}batch_prompts", self.batch_prompts, integer=True)
        if not isinstance(self.use_chat_template, bool):
            raise ConfigError(f"{p}use_chat_template={self.use_chat_template!r} must be true or false")
        if isinstance(self.tool, Mapping):
            self.tool = from_dict(ToolUseConfig, self.tool, prefix=f"{p}tool")
        elif self.tool is not None and not isinstance(self.tool, ToolUseConfig):
            raise ConfigError(f"{p}tool={self.tool!r} must be a mapping of ToolUseConfig fields or null")

    def samples_for(self, benchmark: str) -> int:
        """k for ``benchmark``: ``n`` if set, else 1 for greedy decoding (``temperature=0``), else the paper's
        default (4 for benchmarks not in Table 2)."""
        if self.n is not None:
            return self.n
        return 1 if self.temperature == 0 else DEFAULT_SAMPLES.get(benchmark, 4)


def load_problems(cfg: EvalConfig, name: str) -> list[Problem]:
    """The problems of benchmark ``name`` per ``cfg`` (``files`` entry, else ``data_dir``; ``limit``).

    Raises:
        DataError: missing or malformed data (see :func:`trainer.evaluation.benchmarks.load_benchmark`).
    """
    return load_benchmark(name, cfg.data_dir, path=cfg.files.get(name), limit=cfg.limit,
                          problem_key=cfg.problem_key, answer_key=cfg.answer_key)


def _chunk_seed(seed: int, benchmark: str, chunk_index: int, shard: tuple[int, int] = (0, 1)) -> int:
    """Sampling seed of one generate call: a function of the run seed, the benchmark NAME (so a benchmark's samples
    do not depend on which other benchmarks run), the chunk index and — with several data-parallel groups — the
    share ``(dp_rank, dp_size)``; 31 bits."""
    import zlib

    import numpy as np

    key = [seed, zlib.crc32(benchmark.encode()), chunk_index] + ([*shard] if shard[1] > 1 else [])
    ss = np.random.SeedSequence(key)
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def share(n: int, dp_rank: int, dp_size: int) -> tuple[int, int]:
    """The contiguous slice ``[start, stop)`` of ``n`` problems that data-parallel group ``dp_rank`` of ``dp_size``
    evaluates: sizes differ by at most one, the shares cover ``range(n)`` in order.

    Raises:
        DataError: unless ``0 <= dp_rank < dp_size``.
    """
    if not 0 <= dp_rank < dp_size:
        raise DataError(f"dp_rank={dp_rank} is outside [0, dp_size={dp_size})")
    return n * dp_rank // dp_size, n * (dp_rank + 1) // dp_size


def _gather_rows(rows: list[dict[str, Any]], dist: Any) -> list[dict[str, Any]] | None:
    """All data-parallel groups' rows on rank 0 (in share order; one rank per tensor-parallel group contributes),
    ``None`` elsewhere. Collective over the default process group: every rank must call it."""
    import torch.distributed as tdist

    mine = rows if dist.tp_rank == 0 else []
    gathered: list[Any] | None = [None] * dist.world_size if dist.rank == 0 else None
    tdist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None
    return [r for part in gathered for r in part]


def _broadcast(obj: Any, dist: Any) -> Any:
    import torch.distributed as tdist

    box = [obj if dist.rank == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def evaluate_engine(
    engine: Any,
    tokenizer: Any,
    cfg: EvalConfig,
    out_dir: str | Path | None = None,
    model_name: str = "",
    problems: dict[str, list[Problem]] | None = None,
    dist: Any = None,
    model_fingerprint: str | None = None,
) -> dict[str, Any]:
    """Evaluate with an existing rollout engine (:class:`trainer.engines.rollout.RolloutEngine`).

    With ``cfg.tool`` set, ``engine`` is wrapped in :class:`trainer.tools.tool_rollout.ToolUseEngine` (unless it already
    is one, as in tool-use training, whose engine and tool settings are then used): multi-turn rollouts with code
    run in the sandbox, graded on the model's own text. (A wrapper made here runs the code on every rank; with
    tensor parallelism the training engine's wrapper, which broadcasts one rank's tool outputs, is the one to use.) With several data-parallel groups (``dist.dp_size > 1``) each group samples and grades its share of every
    benchmark's problems (:func:`share`); rank 0 gathers the rows, computes the metrics and writes the files, and
    every rank returns the same result.

    Args:
        engine: has ``generate(prompt_token_ids, SamplingConfig) -> [prompt][n] RolloutOutput``.
        tokenizer: the model's tokenizer (prompt encoding, chat template).
        cfg: the settings.
        out_dir: write ``eval.json`` and ``samples.jsonl`` there (created; on rank 0 only). Files are written as
            ``*.partial`` and renamed when the evaluation is complete, so an interrupted run leaves earlier results
            in place. ``None`` = return only.
        model_name: recorded as ``model`` in the result.
        problems: preloaded problems per benchmark (else loaded per ``cfg``).
        dist: the rank layout (:class:`trainer.engines.launch.DistInfo`: ``rank``, ``world_size``, ``dp_rank``,
            ``dp_size``, ``tp_rank``) of an initialised ``torch.distributed`` job; ``None`` = one process.
            Collective: every rank must call with the same ``cfg``.
        model_fingerprint: recorded as ``model_fingerprint`` when given (``stare-lab evaluate --resume`` checks it).

    Returns:
        the ``eval.json`` content (see the module docstring).

    Raises:
        DataError: missing benchmark data or an engine that returns the wrong number of responses.
    """
    from trainer.data import PromptEncoder
    from trainer.engines.rollout import SamplingConfig
    from trainer.tools.tool_rollout import ToolRolloutOutput, ToolUseEngine

    if cfg.tool is not None and not isinstance(engine, ToolUseEngine):
        engine = ToolUseEngine(engine, tokenizer, cfg.tool)
    multi = dist is not None and dist.world_size > 1
    dp_rank, dp_size = (dist.dp_rank, dist.dp_size) if multi else (0, 1)
    main_rank = not multi or dist.rank == 0
    encoder = PromptEncoder(tokenizer, cfg.prompt_template, cfg.use_chat_template, cfg.max_prompt_length, "left")
    out = Path(out_dir) if out_dir is not None and main_rank else None
    sample_fh = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        sample_fh = open(out / "samples.jsonl.partial", "w", encoding="utf-8")
    result: dict[str, Any] = {"model": model_name, "settings": _settings(cfg, dp_size), "benchmarks": {},
                              "average": None}
    if model_fingerprint is not None:
        result["model_fingerprint"] = model_fingerprint
    t0 = time.perf_counter()
    try:
        for name in cfg.benchmarks:
            probs = problems[name] if problems is not None and name in problems else load_problems(cfg, name)
            k = cfg.samples_for(name)
            start, stop = share(len(probs), dp_rank, dp_size)
            rows: list[dict[str, Any]] = []
            for c_idx, c_start in enumerate(range(start, stop, cfg.batch_prompts)):
                chunk = probs[c_start : min(c_start + cfg.batch_prompts, stop)]
                ids = [
                    encoder.encode({"prompt": p.problem, "answer": p.answer, "id": p.id}, c_start + i).token_ids
                    for i, p in enumerate(chunk)
                ]
                sampling = SamplingConfig(
                    n=k, max_tokens=cfg.max_tokens, seed=_chunk_seed(cfg.seed, name, c_idx, (dp_rank, dp_size)),
                    temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                )
                outputs = engine.generate(ids, sampling)
                if len(outputs) != len(chunk) or any(len(o) != k for o in outputs):
                    raise DataError(f"engine returned {[len(o) for o in outputs]} responses for {len(chunk)} prompts"
                                    f" × n={k}")
                # tool use: grade the model's own text (an answer printed by the interpreter does not count)
                texts = [o.model_text if isinstance(o, ToolRolloutOutput) else o.text for g in outputs for o in g]
                golds = [p.answer for p in chunk for _ in range(k)]
                grades = grade_batch(texts, golds, name, cfg.timeout_s, cfg.rel_tol)
                for i, (p, group) in enumerate(zip(chunk, outputs)):
                    for j, o in enumerate(group):
                        g = grades[i * k + j]
                        row = {"benchmark": name, "id": p.id, "sample": j, "response": o.text,
                               "extracted": g.extracted, "correct": g.correct, "status": g.status,
                               "response_tokens": len(o.token_ids), "finish_reason": o.finish_reason}
                        if isinstance(o, ToolRolloutOutput):
                            row.update(tool_calls=o.num_tool_calls, tool_errors=o.num_tool_errors,
                                       num_turns=o.num_turns)
                        rows.append(row)
            if multi:
                rows = _gather_rows(rows, dist)
            if not main_rank:
                continue
            if sample_fh is not None:
                sample_fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
                sample_fh.flush()
            metrics = benchmark_metrics(rows, k)
            result["benchmarks"][name] = metrics
            logger.info("%s: avg@%d %.4f  pass@%d %.4f  maj@%d %.4f  (%d problems, %.0f s)", name, k,
                        metrics["avg@k"], k, metrics["pass@k"], k, metrics["maj@k"], metrics["n_problems"],
                        time.perf_counter() - t0)
    finally:
        if sample_fh is not None:
            sample_fh.close()
    if main_rank:
        avgs = [m["avg@k"] for m in result["benchmarks"].values()]
        result["average"] = sum(avgs) / len(avgs) if avgs else None
        result["settings"]["wall_s"] = round(time.perf_counter() - t0, 3)
        if out is not None:
            partial = out / "eval.json.partial"
            partial.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
            os.replace(out / "samples.jsonl.partial", out / "samples.jsonl")
            os.replace(partial, out / "eval.json")
    return _broadcast(result, dist) if multi else result


def _settings(cfg: EvalConfig, dp_size: int = 1) -> dict[str, Any]:
    d = to_dict(cfg)
    d["k"] = {b: cfg.samples_for(b) for b in cfg.benchmarks}
    d["dp_size"] = dp_size
    return d
