"""Answer grading and rule rewards for math RL and evaluation (STARE §4: math-verify on the last ``\\boxed{}``).

Public API (scripts, tests, the trainer's reward and ``trainer.evaluation.evaluate`` import these):

* :func:`extract_boxed` — the content of the last complete ``\\boxed{…}`` / ``\\fbox{…}`` (nested braces,
  ``\\boxed 5`` without braces) or ``None``.
* :func:`grade` — ``grade(response, gold, benchmark=None) -> bool``; :func:`grade_response` returns a
  :class:`GradeResult` with the extracted answer and a status (``ok``, ``no_answer``, ``timeout``, ``error``,
  ``rejected``).
* :func:`math_reward` — batch reward (1.0 right / 0.0 wrong); a grader exception or timeout gives 0 and is
  counted and logged, never raised (unless ``on_error="raise"``).
* :func:`gsm8k_lenient_reward` (last number in the response) and :func:`format_reward` (has a boxed answer) —
  separate, explicitly configured rewards, never the default for the math benchmarks.

Grading pipeline for one response (``grade_response``):

1. Extract the last complete boxed answer; none → wrong, status ``no_answer``.
2. Normalise both answers (:func:`normalize_answer`); equal strings → right.
3. Both plain numbers (:func:`parse_number`: leading zeros, thousands separators, ``27.0``, ``4.5e33``,
   ``4.5\\times10^{33}``, fractions, unit tails) → :func:`numbers_equal`, math-verify's rules on exact values: an
   integer on either side → exact (400001 is not 400000; 27.0 is 27); else a plain decimal on either side →
   equal after rounding both to :data:`FLOAT_ROUNDING` = 6 decimal places (math-verify's default
   ``float_rounding``: 0.333333 is 1/3); else (fractions, scientific notation) → exact. No math-verify call.
4. Otherwise parse each WHOLE answer with math-verify's LaTeX normalisation + latex2sympy (cached; a numeric side
   is handed over as its exact value, or as a plain decimal if it was written as one), reject pairs that evaluate
   differently at random points (sound), compare two exact constants exactly (:func:`_exact_constants_equal`:
   rationals by value, other constants relative to their size — never an absolute threshold, so 1/100! is not
   1/101!), and let math-verify's ``verify`` decide the rest.

Protocol parity: the STARE reference grades with math-verify (``parse``/``verify`` at their defaults,
``float_rounding=6``, ``numeric_precision=15``; see papers/stare_2606.19236/README.md, "Grading"). The rules above are
math-verify's, with two deliberate departures: scientific notation ``4.5e33`` is read as a number (math-verify reads
the ``e`` as Euler's number), and constant expressions are compared exactly (math-verify's ``evalf(chop=True)``
calls any two values below ~1e-15 apart equal, e.g. ``1/100!`` and ``1/101!``). A looser numeric comparison is an
option, never the default: ``rel_tol`` also accepts numbers within that relative distance (e.g. ``1e-4``, the
Qwen2.5-Math harness's tolerance) — integers included.

Timeouts: math-verify can hang on adversarial LaTeX. Each item runs under a wall-clock limit (``timeout_s``)
enforced with ``SIGALRM`` when called from the main thread; math-verify's own signal timeouts are disabled (they
raise outside the main thread). Called from another thread, items run without a limit (logged once).
Answers with exponent towers, huge exponents or huge factorials are rejected before sympy sees them (status
``rejected``): sympy would compute them in C, where no signal can interrupt it.

Modules: :mod:`trainer.grading.answers` (extraction, normalisation, exact numbers: steps 1–3), :mod:`trainer.grading.symbolic`
(math-verify, the numeric check, timeouts and size guards: step 4); this module grades and turns grades into
rewards.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from fractions import Fraction
from typing import Sequence

from stare_lab.errors import DataError

from trainer.grading.answers import (  # noqa: F401 - re-exported: the public grading API lives here
    FLOAT_ROUNDING,
    check_rel_tol,
    extract_boxed,
    normalize_answer,
    normalize_gold,
    numbers_equal,
    parse_number,
)
from trainer.grading.symbolic import (  # noqa: F401 - _mv_parse re-exported for the grading benchmark's cache control
    MAX_ANSWER_CHARS,
    GradingTimeout,
    _latex_number,
    _mv_parse,
    _symbolic_equal,
    _time_limit,
    _too_large,
)

logger = logging.getLogger(__name__)

__all__ = [
    "FLOAT_ROUNDING", "GradeResult", "GradingTimeout", "extract_boxed", "normalize_answer", "normalize_gold",
    "parse_number", "numbers_equal", "check_rel_tol", "grade", "grade_response", "grade_batch", "math_reward",
    "gsm8k_lenient_reward", "format_reward", "last_number",
]

@dataclasses.dataclass(frozen=True)
class GradeResult:
    """Outcome of grading one response.

    Attributes:
        correct: the extracted answer is equivalent to the gold answer.
        extracted: content of the last boxed answer (``None`` if the response has none).
        status: ``ok`` (graded), ``no_answer`` (no boxed answer), ``timeout`` (limit hit: graded wrong),
            ``error`` (the grader raised: graded wrong), ``rejected`` (answer too large to evaluate safely:
            graded wrong; the string and numeric comparisons, which come first, did not match).
    """

    correct: bool
    extracted: str | None
    status: str


# -------------------- grading ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _answers_equal(pred: str, gold: str, rel_tol: float | None = None) -> bool:
    """Compare an extracted answer with a (normalised) gold answer; see the module docstring for the steps.

    Cached per ``(pred, gold, rel_tol)`` (a timeout or rejection raises and is not cached)."""
    if normalize_answer(pred) == normalize_answer(gold):
        return True
    g_num = parse_number(gold)
    p_num = parse_number(pred)
    if g_num is not None and p_num is not None:
        return numbers_equal(p_num, g_num, rel_tol)
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    if _too_large(pred):
        raise _Rejected
    if g_num is not None:
        gold = _latex_number(*g_num)
    if p_num is not None:
        pred = _latex_number(*p_num)
    return _symbolic_equal(gold, pred)


class _Rejected(Exception):
    """The answer is too large to evaluate safely (:func:`_too_large`)."""


def grade_response(response: str, gold: str, benchmark: str | None = None,
                   timeout_s: float | None = 5.0, rel_tol: float | None = None) -> GradeResult:
    """Grade one response against a gold answer (pipeline in the module docstring).

    Args:
        response: the model's full response text; its last complete ``\\boxed{}`` is the answer.
        gold: the reference answer as stored in the benchmark (no ``\\boxed``); see :func:`normalize_gold`.
        benchmark: benchmark name (``aime24``, ``aime25``, ``amc23``, ``math500``, ``minerva_math``,
            ``olympiadbench``, ``gsm8k``) selecting the gold cleanup (:func:`normalize_gold`); ``None`` = generic.
            The comparison rules are the same for every benchmark (math-verify's, :func:`numbers_equal`).
        timeout_s: wall-clock limit for this item in seconds (main thread only); ``None`` = no limit.
        rel_tol: ``None`` (default: math-verify's rules) or a relative tolerance in (0, 1) that also accepts numbers
            that close (integers included) — an explicit, looser option.

    Returns:
        a :class:`GradeResult`. Never raises for a bad response or a grader failure (status ``error``/``timeout``).

    Raises:
        DataError: if ``gold`` is not a non-empty string (a data bug, not a model failure), or a bad ``rel_tol``.
    """
    check_rel_tol(rel_tol)
    g = normalize_gold(gold, benchmark)
    pred = extract_boxed(response) if isinstance(response, str) else None
    if pred is None:
        return GradeResult(False, None, "no_answer")
    try:
        with _time_limit(timeout_s):
            ok = _answers_equal(pred, g, rel_tol)
        return GradeResult(ok, pred, "ok")
    except GradingTimeout:
        logger.debug("grading timed out (%s s) on answer %.200r", timeout_s, pred)
        return GradeResult(False, pred, "timeout")
    except _Rejected:
        logger.debug("answer rejected as too large to evaluate: %.200r", pred)
        return GradeResult(False, pred, "rejected")
    except Exception as err:  # noqa: BLE001 - a grader bug must not crash training or evaluation
        logger.debug("grading raised %s: %s on answer %.200r", type(err).__name__, err, pred)
        return GradeResult(False, pred, "error")


def grade(response: str, gold: str, benchmark: str | None = None) -> bool:
    """True iff the last boxed answer of ``response`` is equivalent to ``gold`` (see :func:`grade_response`).

    Uses a 5 s per-item timeout (main thread). Raises :class:`~stare_lab.errors.DataError` only for an invalid
    gold answer.
    """
    return grade_response(response, gold, benchmark).correct


def grade_batch(responses: Sequence[str], golds: Sequence[str], benchmark: str | Sequence[str | None] | None = None,
                timeout_s: float | None = 5.0, rel_tol: float | None = None) -> list[GradeResult]:
    """:func:`grade_response` for each ``(response, gold)`` pair; ``benchmark`` is one name or one per item.

    Raises:
        DataError: if the lengths differ, a gold answer is invalid or ``rel_tol`` is bad.
    """
    check_rel_tol(rel_tol)
    n = len(responses)
    if len(golds) != n:
        raise DataError(f"got {n} responses but {len(golds)} gold answers; need one gold answer per response")
    if benchmark is None or isinstance(benchmark, str):
        benches: Sequence[str | None] = [benchmark] * n
    else:
        benches = list(benchmark)
        if len(benches) != n:
            raise DataError(f"got {n} responses but {len(benches)} benchmark names")
    return [grade_response(r, g, b, timeout_s, rel_tol) for r, g, b in zip(responses, golds, benches)]


def _log_failures(results: Sequence[GradeResult], what: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    bad = {k: v for k, v in counts.items() if k in ("timeout", "error", "rejected")}
    if bad:
        logger.warning("%s: %d of %d responses could not be graded (%s); they get reward 0",
                       what, sum(bad.values()), len(results), ", ".join(f"{k} {v}" for k, v in sorted(bad.items())))
    return counts


def math_reward(responses: Sequence[str], golds: Sequence[str], benchmark: str | Sequence[str | None] | None = None,
                timeout_s: float | None = 5.0, on_error: str = "zero", stats: dict | None = None) -> list[float]:
    """Binary rule reward: 1.0 if the last boxed answer is right (:func:`grade_response`), else 0.0.

    A response without a boxed answer, a grading timeout or a grader exception gives 0.0; timeouts/errors are
    counted and logged (warning) and, if ``stats`` is a dict, its keys ``ok``/``no_answer``/``timeout``/``error``/
    ``rejected`` are incremented.

    Args:
        on_error: ``"zero"`` (default) or ``"raise"`` (raise :class:`DataError` if any item timed out or errored —
            for debugging a grader).

    Raises:
        DataError: mismatched lengths, invalid gold answers, or (``on_error="raise"``) a failed item.
    """
    if on_error not in ("zero", "raise"):
        raise DataError(f"on_error={on_error!r} is not one of {{'zero', 'raise'}}")
    results = grade_batch(responses, golds, benchmark, timeout_s)
    counts = _log_failures(results, "math_reward")
    if stats is not None:
        for k, v in counts.items():
            stats[k] = stats.get(k, 0) + v
    if on_error == "raise" and any(r.status in ("timeout", "error") for r in results):
        first = next(r for r in results if r.status in ("timeout", "error"))
        raise DataError(f"grading failed ({first.status}) on answer {first.extracted!r}")
    return [1.0 if r.correct else 0.0 for r in results]


# -------------------- optional rewards (explicitly configured; never the default for the math benchmarks) ------------

_LAST_NUM_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (thousands separators removed), or ``None``."""
    found = _LAST_NUM_RE.findall(text or "")
    return found[-1].replace(",", "") if found else None


def gsm8k_lenient_reward(responses: Sequence[str], golds: Sequence[str], timeout_s: float | None = 5.0) -> list[float]:
    """Lenient GSM8K reward: 1.0 if the boxed answer is right, or — when there is no boxed answer — if the last
    number in the response equals the gold number exactly. For demos with weak models only; never the default.

    Raises:
        DataError: mismatched lengths or invalid gold answers.
    """
    results = grade_batch(responses, golds, "gsm8k", timeout_s)
    _log_failures(results, "gsm8k_lenient_reward")
    out = []
    for resp, gold, res in zip(responses, golds, results):
        num, g = last_number(resp), parse_number(normalize_gold(gold, "gsm8k"))
        lenient = res.extracted is None and num is not None and g is not None and Fraction(num) == g[0]
        out.append(1.0 if res.correct or lenient else 0.0)
    return out


def format_reward(responses: Sequence[str]) -> list[float]:
    """1.0 for a response with a complete, non-empty ``\\boxed{}`` answer (:func:`extract_boxed`), else 0.0.

    A shaping term, added with an explicit weight (``reward.format_reward``); off by default.
    """
    return [1.0 if extract_boxed(r) is not None else 0.0 for r in responses]
