"""Grader check on EVERY record of the six bundled benchmarks (trainer/assets/benchmarks, 1,547 records):

* a response boxing the gold answer (as stored, and re-written in a canonical numeric form where the gold is a
  number: ``025`` → ``25``, ``27.0`` → ``27``, ``4.5e33`` → ``4.5 \\times 10^{33}``) is graded correct — 100%;
* a response boxing a wrong answer is graded wrong — 100%: numbers get gold + 1 and, where |gold| ≥ 1, also
  gold × 1.001 (0.1 % off: integers and decimals are exact at 6 decimal places, on every benchmark — Minerva
  included); other answers get their first digit bumped (``(2,\\infty)`` → ``(3,\\infty)``) and, separately,
  ``+1`` appended.

Record counts are from trainer/assets/README.md (30 / 30 / 40 / 500 / 272 / 675)."""

from __future__ import annotations

import os
import re
from fractions import Fraction

import pytest

try:
    import math_verify  # noqa: F401
except ImportError:  # pragma: no cover
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("math-verify is not installed (trainer extra)", allow_module_level=True)

from trainer.evaluation.benchmarks import BENCHMARKS, BUNDLED_DIR, load_benchmark
from trainer.grading.rewards import grade_response, normalize_gold, parse_number

EXPECTED_COUNTS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva_math": 272, "olympiadbench": 675}

DATA_DIR = BUNDLED_DIR

REASONING = (
    "We set up the problem carefully. First we collect the given quantities and write the relations between them; "
    "then we simplify, check the edge cases, and verify the result by substituting it back. "
)


def _response(answer: str) -> str:
    return REASONING * 3 + f"Therefore, the final answer is $\\boxed{{{answer}}}$."


def _fmt(value: Fraction) -> str:
    """A canonical LaTeX rendering of a rational number: integer, finite decimal, or m \\times 10^{e}."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.15g}"
    if "e" in text:
        mant, exp = text.split("e")
        return f"{mant} \\times 10^{{{int(exp)}}}"
    if Fraction(text) == value:
        return text
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}" if value > 0 else \
        f"-\\frac{{{-value.numerator}}}{{{value.denominator}}}"


def _wrong_numbers(value: Fraction) -> list[Fraction]:
    return [value + 1] + ([value * Fraction(1001, 1000)] if abs(value) >= 1 else [])


def _bump_first_digit(text: str) -> str | None:
    m = re.search(r"\d", text)
    if not m:
        return None
    d = int(m.group(0))
    return text[: m.start()] + str((d + 1) % 10) + text[m.end():]


@pytest.fixture(scope="module")
def records():
    return {b: load_benchmark(b, DATA_DIR) for b in BENCHMARKS}


def test_record_counts(records):
    assert {b: len(v) for b, v in records.items()} == EXPECTED_COUNTS
    assert sum(len(v) for v in records.values()) == 1547


@pytest.mark.slow
def test_every_gold_answer_is_graded_correct(records):
    failures = []
    n_checked = 0
    for bench, problems in records.items():
        for p in problems:
            variants = [p.answer, normalize_gold(p.answer, bench)]
            num = parse_number(normalize_gold(p.answer, bench))
            if num is not None:
                variants.append(_fmt(num[0]))
            for v in variants:
                n_checked += 1
                r = grade_response(_response(v), p.answer, bench)
                if not r.correct:
                    failures.append((bench, p.id, p.answer, v, r.status))
    assert n_checked >= 2 * 1547
    assert failures == [], f"{len(failures)} gold answers graded wrong, e.g. {failures[:5]}"


@pytest.mark.slow
def test_every_wrong_answer_is_graded_wrong(records):
    failures = []
    n_numeric = n_other = 0
    for bench, problems in records.items():
        for p in problems:
            gold = normalize_gold(p.answer, bench)
            num = parse_number(gold)
            if num is not None:
                n_numeric += 1
                wrongs = [_fmt(w) for w in _wrong_numbers(num[0])]
            else:
                n_other += 1
                wrongs = [w for w in (_bump_first_digit(gold), gold + "+1") if w is not None]
            for w in wrongs:
                r = grade_response(_response(w), p.answer, bench)
                if r.correct:
                    failures.append((bench, p.id, p.answer, w, r.status))
    assert n_numeric + n_other == 1547
    assert failures == [], f"{len(failures)} wrong answers graded correct, e.g. {failures[:5]}"
