"""The six math evaluation benchmarks of STARE (Table 2) and their loaders.

Records are normalised JSONL ``{"id", "problem", "answer", "source"}``. By default they come from the copies
bundled with the package (:data:`BUNDLED_DIR`, ``trainer/assets/benchmarks/<name>.jsonl``; provenance, licenses and
checksums in ``trainer/assets/README.md``), so evaluation works offline from a clone or a ``pip install``.
Alternatives: a directory with ``<name>/<name>.jsonl`` or ``<name>.jsonl`` files (``--data-dir`` or the environment
variable ``STARE_LAB_BENCHMARK_DIR``), or, per benchmark, any source :func:`trainer.data.load_records` reads
(``--file NAME=SOURCE``): a JSONL or Parquet file, or a ``datasets`` dataset ``hf:NAME:SPLIT`` (read from the local
cache, or the hub when online).

Default number of samples per problem follows the paper's Table 2: avg@32 for AIME24/25 and AMC23, avg@4 for
MATH-500, Minerva Math and OlympiadBench.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from stare_lab.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = [
    "BUNDLED_DIR",
    "GSM8K_TRAIN_SAMPLE",
    "BENCHMARKS",
    "DEFAULT_SAMPLES",
    "ALIASES",
    "ENV_DATA_DIR",
    "Problem",
    "default_data_dir",
    "canonical_name",
    "resolve_benchmarks",
    "benchmark_file",
    "load_benchmark",
]

#: The benchmark files bundled with the package (package data; see ``trainer/assets/README.md``).
BUNDLED_DIR = Path(__file__).resolve().parents[1] / "assets" / "benchmarks"

#: The first 1,000 GSM8K training records (normalised JSONL): prompts of the tests and the ``tiny-cpu`` preset.
GSM8K_TRAIN_SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "gsm8k_train_sample.jsonl"

#: Benchmark names in Table 2 order.
BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench")

#: Samples per problem (k of avg@k) used in the paper's Table 2 (docs/theory.md §5).
DEFAULT_SAMPLES = {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva_math": 4, "olympiadbench": 4}

#: Accepted alternative spellings (lower case) → canonical name.
ALIASES = {
    "aime2024": "aime24",
    "aime2025": "aime25",
    "amc": "amc23",
    "amc2023": "amc23",
    "math-500": "math500",
    "math_500": "math500",
    "minerva": "minerva_math",
    "minerva-math": "minerva_math",
    "olympiad": "olympiadbench",
    "olympiad_bench": "olympiadbench",
    "gsm8k": "gsm8k",
}

ENV_DATA_DIR = "STARE_LAB_BENCHMARK_DIR"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One evaluation problem.

    Attributes:
        benchmark: canonical benchmark name (selects the grader's normalisation, :mod:`trainer.grading.rewards`).
        id: the record's id (string).
        problem: problem statement (goes into the prompt template).
        answer: gold answer as stored (graded by :func:`trainer.grading.rewards.grade`).
    """

    benchmark: str
    id: str
    problem: str
    answer: str


def default_data_dir() -> Path:
    """``$STARE_LAB_BENCHMARK_DIR`` if set, else the bundled copies (:data:`BUNDLED_DIR`)."""
    env = os.environ.get(ENV_DATA_DIR)
    return Path(env) if env else BUNDLED_DIR


#: A benchmark name (built-in or custom): it becomes part of metric keys ``eval/<name>/avg@k``.
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def canonical_name(name: str) -> str:
    """Lower-cased ``name`` with the :data:`ALIASES` applied (``AIME2024`` → ``aime24``; custom names stay).

    Raises:
        ConfigError: a name that is empty or has characters other than letters, digits, ``_``, ``.``, ``-``.
    """
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if not _NAME_RE.fullmatch(key):
        raise ConfigError(f"benchmark name {name!r} must be letters, digits, '_', '.' or '-' (it names metric keys)")
    return key


def resolve_benchmarks(names: str | Sequence[str], custom: Iterable[str] = ()) -> list[str]:
    """Canonical benchmark names from a comma-separated string or a list (``all`` = the six of Table 2).

    Known names: the six of :data:`BENCHMARKS`, ``gsm8k`` and their :data:`ALIASES`. Names in ``custom`` (those a
    data source is given for, ``--file NAME=SOURCE`` / ``EvalConfig.files``) are accepted as well.

    Raises:
        ConfigError: on an empty list, an unknown name (listing the known ones) or a duplicate.
    """
    custom = {canonical_name(c) for c in custom}
    items = [s.strip() for s in names.split(",")] if isinstance(names, str) else [str(s).strip() for s in names]
    items = [s for s in items if s]
    if not items:
        raise ConfigError("benchmarks is empty; choose from " + ", ".join(BENCHMARKS))
    out: list[str] = []
    for item in items:
        if item.lower() == "all":
            out.extend(b for b in BENCHMARKS if b not in out)
            continue
        name = canonical_name(item)
        if name not in BENCHMARKS and name != "gsm8k" and name not in custom:
            raise ConfigError(f"benchmarks: unknown benchmark {item!r}; known: {', '.join(BENCHMARKS)}, gsm8k, all, "
                              f"or a NAME given a data source with --file NAME=SOURCE")
        if name in out:
            raise ConfigError(f"benchmarks: {name!r} is listed twice")
        out.append(name)
    return out


def benchmark_file(name: str, data_dir: str | Path | None = None) -> Path:
    """Path of ``<data_dir>/<name>/<name>.jsonl`` or ``<data_dir>/<name>.jsonl`` (``gsm8k`` also
    ``<data_dir>/gsm8k/test.jsonl`` and ``<data_dir>/../gsm8k/test.jsonl``); ``data_dir=None`` =
    :func:`default_data_dir`.

    Raises:
        DataError: if the file does not exist (naming where it looked).
    """
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    candidates = [root / name / f"{name}.jsonl", root / f"{name}.jsonl"]
    if name == "gsm8k":
        candidates += [root / "gsm8k" / "test.jsonl", root.parent / "gsm8k" / "test.jsonl"]
    for c in candidates:
        if c.is_file():
            return c
    raise DataError(f"benchmark {name!r}: no data file; looked for {', '.join(str(c) for c in candidates)}")


def load_benchmark(
    name: str,
    data_dir: str | Path | None = None,
    *,
    path: str | None = None,
    limit: int | None = None,
    problem_key: str = "problem",
    answer_key: str = "answer",
) -> list[Problem]:
    """Load one benchmark's problems in file order.

    Args:
        name: canonical benchmark name (see :func:`resolve_benchmarks`).
        data_dir: directory with ``<name>/<name>.jsonl`` or ``<name>.jsonl``; ``None`` = :func:`default_data_dir`
            (the bundled copies unless ``$STARE_LAB_BENCHMARK_DIR`` is set).
        path: read this JSONL/Parquet file or ``hf:NAME:SPLIT`` instead of the data directory.
        limit: keep only the first ``limit`` problems (a subset for quick runs; ``None`` = all).
        problem_key, answer_key: record fields holding the statement and the gold answer.

    Raises:
        DataError: missing/unreadable file, a record without the fields, an empty gold answer, a duplicate id, no
            records.
        ConfigError: ``limit`` < 1.
    """
    from trainer.data import load_records

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r} must be a positive integer or None")
    source = path if path is not None else str(benchmark_file(name, data_dir))
    records = load_records([source], problem_key, answer_key, max_samples=limit)
    problems = []
    for i, rec in enumerate(records):
        answer = rec["answer"].strip()
        if not answer:
            raise DataError(f"{source}: record {i} (id {rec['id']!r}) has an empty answer")
        problems.append(Problem(benchmark=name, id=str(rec["id"]), problem=rec["prompt"], answer=rec["answer"]))
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise DataError(f"{source}: problem id {p.id!r} occurs more than once; ids must be unique")
        seen.add(p.id)
    logger.info("loaded %d problems of %s from %s", len(problems), name, source)
    return problems
