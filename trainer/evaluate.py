"""Benchmark evaluation: sample k responses per problem, grade them, report avg@k / pass@k / maj@k (STARE Table 2).

``stare-lab evaluate --model PATH --benchmarks aime24,aime25,amc23,math500,minerva_math,olympiadbench
[--n 32] [--temperature 1.0] [--top-p 0.7] [--max-tokens N] [--out DIR] [--config EVAL.yaml] [--limit N]
[--data-dir DIR] [--file NAME=SOURCE] [--engine vllm|hf]`` (wired by ``trainer/cli.py`` through
:func:`add_arguments` and :func:`main`). Settings: :class:`EvalConfig` defaults < ``--config`` < options. The
trainer's periodic evaluation can call :func:`evaluate_engine` with its own engine and log :func:`flat_metrics`.

Outputs in ``DIR``:

* ``eval.json`` — ``{"model", "settings", "benchmarks": {name: {"n_problems", "k", "avg@k", "pass@k", "maj@k",
  "mean_response_tokens", "frac_no_boxed", "pass_at": {"1": …, "2": …, …}, "status": {…}}}, "average"}``.
  Accuracies are fractions in [0, 1] (Table 2 shows percent). ``average`` is the unweighted mean of the
  benchmarks' avg@k, as Table 2's "avg" column.
* ``samples.jsonl`` — one row per sample: ``benchmark, id, sample, response, extracted, correct, status,
  response_tokens, finish_reason`` (``response_tokens`` counts the engine's response tokens, including a final eos;
  ``mean_response_tokens`` averages it).

Prompts: the paper's template (problem + "Please reason step by step, and put your final answer within
\\boxed{}.", :data:`trainer.config.DEFAULT_PROMPT_TEMPLATE`) through the tokenizer's chat template when it has one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from stare_lab.config import check_positive, check_range, config_prefix, from_dict, load_yaml, to_dict
from stare_lab.errors import ConfigError, DataError

from .benchmarks import DEFAULT_SAMPLES, Problem, load_benchmark, resolve_benchmarks
from .config import DEFAULT_PROMPT_TEMPLATE
from .rewards import grade_batch, normalize_answer, parse_number

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
    "add_arguments",
    "config_from_args",
    "main",
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
    their normalised string (:func:`trainer.rewards.normalize_answer`); samples without an answer do not vote. Ties
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
        benchmarks: names (see :func:`trainer.benchmarks.resolve_benchmarks`); default the six of Table 2.
        n: samples per problem for every benchmark; ``None`` = the paper's (32 for AIME24/25 and AMC23, 4 else).
        temperature, top_p, top_k: sampling (paper validation: T = 1.0, top-p 0.7).
        max_tokens: max new tokens per response (paper: 3072 for Short CoT).
        max_prompt_length: prompt tokens; longer prompts are truncated on the left (logged).
        seed: sampling seed (same seed, engine and model ⇒ same samples).
        data_dir: benchmark directory with ``<name>/<name>.jsonl`` or ``<name>.jsonl`` files (``None`` =
            ``$STARE_LAB_BENCHMARK_DIR`` if set, else the copies bundled with the package,
            :data:`trainer.benchmarks.BUNDLED_DIR`).
        limit: evaluate only the first ``limit`` problems of each benchmark (``None`` = all).
        files: benchmark → data source read instead of ``data_dir``: a JSONL or Parquet file, or ``hf:NAME:SPLIT``
            (a ``datasets`` dataset: local cache, or the hub when online).
        problem_key, answer_key: record fields of the statement and the gold answer.
        prompt_template: user-message template with ``{problem}``.
        use_chat_template: wrap the message with the tokenizer's chat template when it has one.
        timeout_s: grading time limit per response, seconds.
        batch_prompts: prompts per ``generate`` call.
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
    batch_prompts: int = 256

    def __post_init__(self) -> None:
        p = config_prefix("eval")
        p = p + "." if p else ""
        self.benchmarks = resolve_benchmarks(self.benchmarks)
        if self.n is not None:
            check_positive(f"{p}n", self.n, integer=True)
        check_range(f"{p}temperature", self.temperature, 0, None, lo_open=True)
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
                raise ConfigError(f"{p}files has {name!r}, which is not one of the benchmarks {self.benchmarks}")
        if "{problem}" not in self.prompt_template:
            raise ConfigError(f"{p}prompt_template={self.prompt_template!r} must contain {{problem}}")
        check_range(f"{p}timeout_s", self.timeout_s, 0, None, lo_open=True)
        check_positive(f"{p}batch_prompts", self.batch_prompts, integer=True)
        if not isinstance(self.use_chat_template, bool):
            raise ConfigError(f"{p}use_chat_template={self.use_chat_template!r} must be true or false")

    def samples_for(self, benchmark: str) -> int:
        """k for ``benchmark``: ``n`` if set, else the paper's default (4 for benchmarks not in Table 2)."""
        return self.n if self.n is not None else DEFAULT_SAMPLES.get(benchmark, 4)


def load_problems(cfg: EvalConfig, name: str) -> list[Problem]:
    """The problems of benchmark ``name`` per ``cfg`` (``files`` entry, else ``data_dir``; ``limit``).

    Raises:
        DataError: missing or malformed data (see :func:`trainer.benchmarks.load_benchmark`).
    """
    return load_benchmark(name, cfg.data_dir, path=cfg.files.get(name), limit=cfg.limit,
                          problem_key=cfg.problem_key, answer_key=cfg.answer_key)


def _chunk_seed(seed: int, benchmark: str, chunk_index: int) -> int:
    """Sampling seed of one generate call: a function of the run seed, the benchmark NAME (so a benchmark's samples
    do not depend on which other benchmarks run) and the chunk index; 31 bits."""
    import zlib

    import numpy as np

    ss = np.random.SeedSequence([seed, zlib.crc32(benchmark.encode()), chunk_index])
    return int(ss.generate_state(1)[0] & 0x7FFFFFFF)


def evaluate_engine(
    engine: Any,
    tokenizer: Any,
    cfg: EvalConfig,
    out_dir: str | Path | None = None,
    model_name: str = "",
    problems: dict[str, list[Problem]] | None = None,
) -> dict[str, Any]:
    """Evaluate with an existing rollout engine (:class:`trainer.rollout.RolloutEngine`).

    Args:
        engine: has ``generate(prompt_token_ids, SamplingConfig) -> [prompt][n] RolloutOutput``.
        tokenizer: the model's tokenizer (prompt encoding, chat template).
        cfg: the settings.
        out_dir: write ``eval.json`` and ``samples.jsonl`` there (created); ``None`` = return only.
        model_name: recorded as ``model`` in the result.
        problems: preloaded problems per benchmark (else loaded from ``cfg.data_dir``).

    Returns:
        the ``eval.json`` content (see the module docstring).

    Raises:
        DataError: missing benchmark data or an engine that returns the wrong number of responses.
    """
    from .data import PromptEncoder
    from .rollout import SamplingConfig

    encoder = PromptEncoder(tokenizer, cfg.prompt_template, cfg.use_chat_template, cfg.max_prompt_length, "left")
    out = Path(out_dir) if out_dir is not None else None
    sample_fh = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        sample_fh = open(out / "samples.jsonl", "w", encoding="utf-8")
    result: dict[str, Any] = {"model": model_name, "settings": _settings(cfg), "benchmarks": {}, "average": None}
    t0 = time.perf_counter()
    try:
        for name in cfg.benchmarks:
            probs = problems[name] if problems is not None and name in problems else load_problems(cfg, name)
            k = cfg.samples_for(name)
            rows: list[dict[str, Any]] = []
            for c_idx, start in enumerate(range(0, len(probs), cfg.batch_prompts)):
                chunk = probs[start : start + cfg.batch_prompts]
                ids = [
                    encoder.encode({"prompt": p.problem, "answer": p.answer, "id": p.id}, start + i).token_ids
                    for i, p in enumerate(chunk)
                ]
                sampling = SamplingConfig(
                    n=k, max_tokens=cfg.max_tokens, seed=_chunk_seed(cfg.seed, name, c_idx),
                    temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                )
                outputs = engine.generate(ids, sampling)
                if len(outputs) != len(chunk) or any(len(o) != k for o in outputs):
                    raise DataError(f"engine returned {[len(o) for o in outputs]} responses for {len(chunk)} prompts"
                                    f" × n={k}")
                texts = [o.text for group in outputs for o in group]
                golds = [p.answer for p in chunk for _ in range(k)]
                grades = grade_batch(texts, golds, name, cfg.timeout_s)
                for i, (p, group) in enumerate(zip(chunk, outputs)):
                    for j, o in enumerate(group):
                        g = grades[i * k + j]
                        row = {"benchmark": name, "id": p.id, "sample": j, "response": o.text,
                               "extracted": g.extracted, "correct": g.correct, "status": g.status,
                               "response_tokens": len(o.token_ids), "finish_reason": o.finish_reason}
                        rows.append(row)
                        if sample_fh is not None:
                            sample_fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                if sample_fh is not None:
                    sample_fh.flush()
            metrics = benchmark_metrics(rows, k)
            result["benchmarks"][name] = metrics
            logger.info("%s: avg@%d %.4f  pass@%d %.4f  maj@%d %.4f  (%d problems, %.0f s)", name, k,
                        metrics["avg@k"], k, metrics["pass@k"], k, metrics["maj@k"], metrics["n_problems"],
                        time.perf_counter() - t0)
    finally:
        if sample_fh is not None:
            sample_fh.close()
    avgs = [m["avg@k"] for m in result["benchmarks"].values()]
    result["average"] = sum(avgs) / len(avgs) if avgs else None
    result["settings"]["wall_s"] = round(time.perf_counter() - t0, 3)
    if out is not None:
        (out / "eval.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def _settings(cfg: EvalConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["k"] = {b: cfg.samples_for(b) for b in cfg.benchmarks}
    return d


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------


#: CLI option → EvalConfig field, for options that default to the config's value.
_CLI_FIELDS = {
    "n": "n", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_tokens",
    "max_prompt_length": "max_prompt_length", "seed": "seed", "limit": "limit", "data_dir": "data_dir",
    "timeout_s": "timeout_s", "problem_key": "problem_key", "answer_key": "answer_key",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``stare-lab evaluate`` options to ``parser``.

    Settings come from the :class:`EvalConfig` defaults, then ``--config FILE.yaml`` (an EvalConfig mapping, e.g.
    ``papers/stare_2606.19236/eval_short_cot.yaml``), then the options given on the command line.
    """
    d = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    parser.add_argument("--model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model)")
    parser.add_argument("--config", default=None, help="EvalConfig YAML (options below override it)")
    parser.add_argument("--benchmarks", default=None,
                        help="comma-separated: aime24,aime25,amc23,math500,minerva_math,olympiadbench (or all; "
                             "default all)")
    parser.add_argument("--n", type=int, default=None,
                        help="samples per problem for every benchmark (default: 32 for AIME24/25, AMC23; 4 else)")
    parser.add_argument("--temperature", type=float, default=None, help=f"default {d['temperature']}")
    parser.add_argument("--top-p", type=float, default=None, help=f"default {d['top_p']}")
    parser.add_argument("--top-k", type=int, default=None, help=f"default {d['top_k']} (off)")
    parser.add_argument("--max-tokens", type=int, default=None, help=f"max new tokens (default {d['max_tokens']})")
    parser.add_argument("--max-prompt-length", type=int, default=None, help=f"default {d['max_prompt_length']}")
    parser.add_argument("--seed", type=int, default=None, help=f"default {d['seed']}")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    parser.add_argument("--data-dir", default=None,
                        help="directory with NAME/NAME.jsonl or NAME.jsonl files (default: $STARE_LAB_BENCHMARK_DIR if "
                             "set, else the copies bundled with the package, trainer/assets/benchmarks)")
    parser.add_argument("--file", action="append", default=[], metavar="NAME=SOURCE",
                        help="read benchmark NAME from SOURCE (JSONL, Parquet or hf:DATASET:SPLIT); repeatable")
    parser.add_argument("--problem-key", default=None, help="record field of the problem (default problem)")
    parser.add_argument("--answer-key", default=None, help="record field of the gold answer (default answer)")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="rollout engine (default vllm)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="engine dtype (default: bfloat16 on GPU, float32 on CPU)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallelism")
    parser.add_argument("--timeout-s", type=float, default=None, help=f"grading limit per item (default "
                                                                        f"{d['timeout_s']} s)")
    parser.add_argument("--no-chat-template", action="store_true", help="plain prompts even if a template exists")
    parser.add_argument("--out", default="runs/eval", help="output directory (eval.json, samples.jsonl)")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The :class:`EvalConfig` of a parsed command line (defaults < ``--config`` < explicit options).

    Raises:
        ConfigError: a bad config file or option value (naming the key).
    """
    data: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    for opt, field in _CLI_FIELDS.items():
        value = getattr(args, opt, None)
        if value is not None:
            data[field] = value
    if getattr(args, "benchmarks", None):
        data["benchmarks"] = resolve_benchmarks(args.benchmarks)
    for item in getattr(args, "file", None) or []:
        name, sep, source = item.partition("=")
        if not sep or not source:
            raise ConfigError(f"--file {item!r} must look like NAME=SOURCE (e.g. aime24=data/aime24.parquet)")
        data.setdefault("files", {})[resolve_benchmarks(name)[0]] = source
    if getattr(args, "no_chat_template", False):
        data["use_chat_template"] = False
    return from_dict(EvalConfig, to_dict(data), prefix="eval")


def _make_engine(args: argparse.Namespace, cfg: EvalConfig) -> tuple[Any, Any]:
    import torch

    from .preflight import model_max_positions
    from .rollout import HFEngine, VLLMEngine

    if not Path(args.model).is_dir():
        raise ConfigError(f"--model {args.model!r} is not a directory")
    model_max = model_max_positions(args.model, option="--model")
    tok = args.tokenizer or args.model
    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    if args.engine == "hf":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        engine = HFEngine(args.model, tok, device=device, dtype=dtype)
    else:
        max_len = cfg.max_prompt_length + cfg.max_tokens
        if model_max is not None and max_len > model_max:
            raise ConfigError(
                f"--max-prompt-length {cfg.max_prompt_length} + --max-tokens {cfg.max_tokens} = {max_len} exceeds the "
                f"model's max_position_embeddings={model_max}; lower one of them"
            )
        engine = VLLMEngine(args.model, tok, dtype=dtype, seed=cfg.seed, tensor_parallel_size=args.tensor_parallel_size,
                            max_model_len=max_len)
    return engine, engine.tokenizer


def main(args: argparse.Namespace) -> int:
    """Run ``stare-lab evaluate``; prints one line per benchmark and the average. Returns 0.

    Raises:
        ConfigError: bad options (naming the option and the allowed values), ``--model`` not a Hugging Face model
            directory (no ``config.json``), lengths beyond the model's positions.
        DataError: missing benchmark data.
        RunError: ``--out`` exists as a file or cannot be created (checked before the model is loaded).
    """
    from .preflight import check_out_dir, make_out_dir

    cfg = config_from_args(args)
    check_out_dir(args.out, option="--out")  # a bad --out fails now, not after all the generation
    problems = {b: load_problems(cfg, b) for b in cfg.benchmarks}  # fail on bad data before loading the model
    created = not Path(args.out).exists()
    make_out_dir(args.out, option="--out")  # before the model loads; removed again if the engine cannot be built
    try:
        engine, tokenizer = _make_engine(args, cfg)
    except BaseException:
        if created:
            Path(args.out).rmdir()
        raise
    result = evaluate_engine(engine, tokenizer, cfg, out_dir=args.out, model_name=str(args.model), problems=problems)
    for name, m in result["benchmarks"].items():
        k = m["k"]
        print(f"{name:14s} avg@{k} {100 * m['avg@k']:5.1f}  pass@{k} {100 * m['pass@k']:5.1f}  "
              f"maj@{k} {100 * m['maj@k']:5.1f}  tokens {m['mean_response_tokens']:7.1f}  "
              f"no-boxed {100 * m['frac_no_boxed']:5.1f}%  ({m['n_problems']} problems)")
    if result["average"] is not None:
        print(f"{'average':14s} {100 * result['average']:5.1f}")
    print(f"wrote {Path(args.out) / 'eval.json'} and {Path(args.out) / 'samples.jsonl'}")
    return 0
