"""Tests of trainer.grading.rewards: boxed extraction, number parsing, grading (hand-written tricky cases), timeouts and the
batch rewards. Expected values are by hand: each case's comment says why the answer is right or wrong.
The all-records test on the real benchmark files is in test_rewards_benchmarks.py."""

from __future__ import annotations

import os
import threading
import time
from fractions import Fraction

import pytest

try:
    import math_verify  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the trainer extra
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("math-verify is not installed (trainer extra)", allow_module_level=True)

from stare_lab.errors import DataError
from trainer.grading import rewards
from trainer.grading.rewards import (
    extract_boxed,
    format_reward,
    grade,
    grade_response,
    gsm8k_lenient_reward,
    last_number,
    math_reward,
    parse_number,
)

# ---------------------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\left\\{1, 2\\right\\}}", "\\left\\{1, 2\\right\\}"),  # escaped braces do not close the box
        ("first \\boxed{3}, finally \\boxed{4}", "4"),  # the LAST box wins
        ("\\fbox{12}", "12"),
        ("\\boxed 5$.", "5"),  # brace-less form: one token
        ("\\boxed {7}", "7"),  # space before the brace
        ("\\boxed{\\boxed{8}}", "8"),  # the inner box starts last
        ("answer \\boxed{5} then a truncated \\boxed{6", "5"),  # an unclosed box is skipped
        ("\\boxed{}", None),  # empty box = no answer
        ("no box: the answer is 5", None),
        ("\\boxedx{3}", None),  # a different command
        ("$\\boxed{ 10 }$", "10"),  # stripped
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_non_string():
    assert extract_boxed(None) is None  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value, kind",
    [
        ("025", Fraction(25), "int"),  # AIME leading zeros
        ("27.0", Fraction(27), "decimal"),  # AMC floats
        ("1,000,000", Fraction(10**6), "int"),  # thousands separators
        ("10,\\!080", Fraction(10080), "int"),  # MATH-500 style separator
        (".0000672", Fraction(672, 10**7), "decimal"),
        ("4.5e33", Fraction(45 * 10**32), "sci"),  # Minerva scientific notation
        ("4.5 \\times 10^{33}", Fraction(45 * 10**32), "sci"),
        ("10^{-5}", Fraction(1, 10**5), "sci"),
        ("\\frac{3}{4}", Fraction(3, 4), "frac"),
        ("\\dfrac34", Fraction(3, 4), "frac"),
        ("-1./3", Fraction(-1, 3), "decimal"),  # a Minerva gold (a fraction with a decimal part)
        ("5 \\text{ cm}", Fraction(5), "int"),  # unit tail
        ("\\text{5 cm}", Fraction(5), "int"),  # text-wrapped answer
        ("55^\\circ", Fraction(55), "int"),
        ("\\$18.90", Fraction(189, 10), "decimal"),
        ("50\\%", Fraction(50), "int"),
    ],
)
def test_parse_number(text, value, kind):
    assert parse_number(text) == (value, kind)


@pytest.mark.parametrize("text", ["1,3,5", "2500,7500", "52_8", "x", "2\\sqrt{5}", "(1,2)", "\\frac{1}{0}", "1e999"])
def test_parse_number_rejects_non_numbers(text):
    # lists, base-8 numerals, expressions, a zero denominator and an absurd exponent are not plain numbers
    assert parse_number(text) is None


# ---------------------------------------------------------------------------------------------------------------
# grading: hand-written tricky cases
# ---------------------------------------------------------------------------------------------------------------

TRICKY = [
    # (response, gold, benchmark, expected)  -- why
    ("\\boxed{\\frac{1}{2}}", "\\frac12", None, True),  # same fraction, different brace style
    ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", "math500", True),  # equivalent fractions
    ("\\boxed{0.5}", "\\frac{1}{2}", "math500", True),  # decimal = fraction exactly
    ("\\boxed{0.333333}", "\\frac{1}{3}", None, True),  # equal at math-verify's 6 decimal places
    ("\\boxed{0.33}", "\\frac{1}{3}", None, False),  # 1% off
    ("first \\boxed{3} then \\boxed{4}", "4", None, True),  # several boxes: the last counts
    ("first \\boxed{3} then \\boxed{4}", "3", None, False),
    ("\\fbox{12}", "12", None, True),
    ("\\boxed{5\\text{ cm}}", "5", None, True),  # units
    ("\\boxed{\\text{5 cm}}", "5", None, True),
    ("\\boxed{1,000,000}", "1000000", None, True),  # thousands separators
    ("\\boxed{1000001}", "1000000", None, False),  # huge-number near miss: integers compare exactly
    ("\\boxed{1000000.5}", "1000000", None, False),  # an integer gold is never matched within a float tolerance
    ("\\boxed{123456.8}", "123456.7", None, False),  # decimals differ at 6 decimal places
    ("\\boxed{10^{6}}", "1000000", None, True),
    ("\\boxed{25}", "025", "aime24", True),  # AIME leading zeros
    ("\\boxed{24}", "025", "aime24", False),
    ("\\boxed{27}", "27.0", "amc23", True),  # AMC float gold
    ("\\boxed{4.5\\times 10^{33}}", "4.5e33", "minerva_math", True),  # scientific notation
    ("\\boxed{4.50 \\times 10^{33} \\mathrm{~erg}}", "4.5e33", "minerva_math", True),  # same value, a unit
    ("\\boxed{4.52 \\times 10^{33} \\mathrm{~erg}}", "4.5e33", "minerva_math", False),  # 0.4% off: wrong
    ("\\boxed{5.0\\times 10^{33}}", "4.5e33", "minerva_math", False),  # 11% off
    ("\\boxed{-1/3}", "-1./3", "minerva_math", True),
    ("\\boxed{\\frac{-1}{3}}", "-1./3", "minerva_math", True),  # sign inside the numerator
    ("\\boxed{69, 84}", "$69$,$84$", "olympiadbench", True),  # $-wrapped multi-answer list
    ("\\boxed{84, 69}", "$69$,$84$", "olympiadbench", True),  # as a set: order does not matter
    ("\\boxed{69}", "$69$,$84$", "olympiadbench", False),  # one of two answers
    ("\\boxed{\\frac{1}{2(n+1)}}", "$\\frac{1}{2 n+2}$", "olympiadbench", True),  # symbolic equivalence
    ("\\boxed{(3,\\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", "math500", True),  # tuple
    ("\\boxed{(\\frac{\\pi}{2},3)}", "\\left( 3, \\frac{\\pi}{2} \\right)", "math500", False),  # order matters
    ("\\boxed{[-2,7]}", "x \\in [-2,7]", "math500", True),  # interval
    ("\\boxed{(-2,7)}", "x \\in [-2,7]", "math500", False),  # open vs closed
    ("\\boxed{55}", "55^\\circ", "math500", True),  # degrees
    ("\\boxed{10080}", "10,\\!080", "math500", True),
    ("\\boxed{C}", "\\text{(C)}", "math500", True),  # multiple-choice letter
    ("\\boxed{\\text{(D)}}", "\\text{(C)}", "math500", False),
    ("\\boxed{\\begin{pmatrix} -2 \\\\ -14 \\\\ 7 \\end{pmatrix}}",
     "\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}", "math500", False),  # one sign differs
    ("\\boxed{2\\sqrt{5}}", "\\sqrt{20}", None, True),  # simplification
    ("\\boxed{x^{2}+2x+1}", "(x+1)^2", None, True),  # expansion
    ("\\boxed{275/2}", "137 \\frac{1}{2}", "math500", True),  # mixed number
    ("\\boxed{42}", "52_8", "math500", False),  # base-8 numeral is not the decimal 52 nor 42
    ("\\boxed{N=n+1}", "$N=n$", "olympiadbench", False),  # latex2sympy lower-cases N: no tautology match
    # math-verify's regex fallback would reduce both to the fragment 2/3 and call them equal
    ("\\boxed{\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}+1}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", "minerva_math",
     False),
    ("\\boxed{d=\\frac{2+\\sqrt{1+8 n}}{2}}", "$d=\\frac{1+\\sqrt{1+8 n}}{2}$", "olympiadbench", False),
    ("\\boxed{d=\\frac{1}{2}+\\frac{\\sqrt{1+8n}}{2}}", "$d=\\frac{1+\\sqrt{1+8 n}}{2}$", "olympiadbench", True),
    ("\\boxed{2y = 4x + 6}", "y = 2x + 3", "math500", True),  # equivalent equations (residuals proportional)
    ("\\boxed{y = 2x + 4}", "y = 2x + 3", "math500", False),
    ("\\boxed{x^{\\prime}+\\frac{r}{V} x-r c=1}", "x^{\\prime}+\\frac{r}{V} x-r c=0", "minerva_math", False),
    ("no boxed answer, 5", "5", None, False),
]


@pytest.mark.parametrize("response, gold, benchmark, expected", TRICKY)
def test_grade_tricky_cases(response, gold, benchmark, expected):
    assert grade(response, gold, benchmark) is expected


def test_grade_response_statuses():
    r = grade_response("nothing boxed", "5")
    assert (r.correct, r.extracted, r.status) == (False, None, "no_answer")
    r = grade_response("\\boxed{5}", "5")
    assert (r.correct, r.extracted, r.status) == (True, "5", "ok")


@pytest.mark.parametrize("answer", ["10^{10^{10}}", "2^{999999999}", "99999!"])
def test_huge_answers_are_rejected_fast(answer):
    # sympy would evaluate these in C (no signal can stop it); they are rejected before it sees them
    t = time.perf_counter()
    r = grade_response(f"\\boxed{{{answer}}}", "5")
    assert (r.correct, r.status) == (False, "rejected")
    assert time.perf_counter() - t < 1.0


def test_bad_gold_raises_data_error():
    with pytest.raises(DataError, match="empty"):
        grade("\\boxed{1}", "  ")
    with pytest.raises(DataError, match="must be a string"):
        grade("\\boxed{1}", 5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# timeouts and failures
# ---------------------------------------------------------------------------------------------------------------


def _hang(*args, **kwargs):
    time.sleep(30)


@pytest.fixture
def fresh_cache():
    rewards._answers_equal.cache_clear()
    yield
    rewards._answers_equal.cache_clear()


def test_timeout_scores_zero_and_is_counted(monkeypatch, fresh_cache):
    monkeypatch.setattr(rewards, "_symbolic_equal", _hang)
    t = time.perf_counter()
    stats: dict = {}
    out = math_reward(["\\boxed{x+1}", "\\boxed{7}"], ["x+2", "7"], timeout_s=0.2, stats=stats)
    elapsed = time.perf_counter() - t
    assert out == [0.0, 1.0]  # the hanging item times out; the numeric one never reaches math-verify
    assert stats == {"timeout": 1, "ok": 1}
    assert elapsed < 5.0


def test_grader_exception_scores_zero(monkeypatch, fresh_cache):
    def boom(*args, **kwargs):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(rewards, "_symbolic_equal", boom)
    stats: dict = {}
    assert math_reward(["\\boxed{x+1}"], ["x+1+0"], stats=stats) == [0.0]
    assert stats == {"error": 1}
    with pytest.raises(DataError, match="grading failed"):
        math_reward(["\\boxed{x+1}"], ["x+1+0"], on_error="raise")


def test_previous_alarm_is_restored():
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert grade("\\boxed{x^2+2x+1}", "(x+1)^2")
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 0.5  # the caller's timer is re-armed with what was left
        time.sleep(remaining + 0.1)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_grading_in_a_worker_thread():
    # outside the main thread there is no signal-based limit, but grading must still work
    out = []
    t = threading.Thread(target=lambda: out.append(math_reward(["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "4"])))
    t.start()
    t.join(60)
    assert out == [[1.0, 0.0]]


def test_math_reward_length_mismatch():
    with pytest.raises(DataError, match="2 responses but 1 gold"):
        math_reward(["a", "b"], ["1"])
    with pytest.raises(DataError, match="on_error"):
        math_reward(["a"], ["1"], on_error="ignore")


# ---------------------------------------------------------------------------------------------------------------
# optional rewards
# ---------------------------------------------------------------------------------------------------------------


def test_last_number():
    assert last_number("she pays 1,080 dollars, then 3.5 more") == "3.5"
    assert last_number("total: -12") == "-12"
    assert last_number("no digits") is None


def test_gsm8k_lenient_reward():
    responses = [
        "so she makes 18 dollars",  # no box, last number right
        "18 ... wait, 20",  # no box, last number wrong
        "\\boxed{18}",  # boxed right
        "\\boxed{20} although 18",  # boxed wrong: the box decides, the last number is not used
        "1,080 in total",  # thousands separator
    ]
    golds = ["18", "18", "18", "18", "1,080"]
    assert gsm8k_lenient_reward(responses, golds) == [1.0, 0.0, 1.0, 0.0, 1.0]
    # the default math reward does not accept unboxed numbers
    assert math_reward(responses, golds, "gsm8k") == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_format_reward():
    assert format_reward(["\\boxed{1}", "no box", "\\boxed{}", "\\boxed{2"]) == [1.0, 0.0, 0.0, 0.0]


def test_pathological_responses_are_fast():
    # 20,000 unclosed boxes: extraction is one linear pass (a per-box brace scan would be quadratic)
    t = time.perf_counter()
    assert extract_boxed("\\boxed{" * 20000) is None
    assert extract_boxed("\\boxed{1}" + "\\boxed{" * 20000) == "1"
    # a 1 MB response
    assert grade("x " * 500_000 + "\\boxed{12}", "12")
    assert time.perf_counter() - t < 5.0


@pytest.mark.parametrize(
    "response, gold, benchmark, expected",
    [
        ("\\boxed{5^2}", "5", None, False),  # an exponent is not a unit tail: 25 != 5
        ("\\boxed{5^2}", "25", None, True),
        ("\\boxed{10^2}", "100", None, True),
        ("\\boxed{1.6 cm}", "1.6", "minerva_math", True),  # plain-word units after a space
        ("\\boxed{4.5 \\times 10^{33} erg s^{-1}}", "4.5e33", "minerva_math", True),
        ("\\boxed{3 m/s}", "3", None, True),
        ("\\boxed{2 n}", "2", None, False),  # a one-letter word is a variable, not a unit
        ("\\boxed{\\frac{9}{2}\\times 10^{33}}", "4.5e33", "minerva_math", True),  # symbolic path, exact gold
        ("\\boxed{\\sqrt{16}}", "4", None, True),
        ("\\boxed{1, 100}", "1100", None, False),  # a spaced list is not a thousands-separated number
        ("\\boxed{11,111,111,100}", "11,\\! 111,\\! 111,\\! 100", "math500", True),
        ("\\boxed{864}", "864 \\mbox{ inches}^2", "math500", True),
    ],
)
def test_units_exponents_and_numeric_golds(response, gold, benchmark, expected):
    assert grade(response, gold, benchmark) is expected


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("\\boxed{9 i + 6}", "6+9i", True),  # complex numbers in either order / spacing
        ("\\boxed{9i+6}", "6 + 9i", True),
        ("\\boxed{6-9i}", "6+9i", False),
        # limitation (math-verify/latex2sympy): i is a complex-valued symbol, not the imaginary unit, so
        # (1+i)^2 is not simplified to 2i
        ("\\boxed{(1+i)^2}", "2i", False),
    ],
)
def test_complex_answers(response, gold, expected):
    assert grade(response, gold, "math500") is expected


# ---------------------------------------------------------------------------------------------------------------
# protocol parity with the STARE reference's grader (math-verify at its defaults)
# ---------------------------------------------------------------------------------------------------------------

#: (gold, prediction) pairs whose expected grade is math-verify's own verdict, computed below with
#: ``math_verify.verify(parse("\\boxed{gold}"), parse("\\boxed{pred}"))`` — the oracle is the library itself.
PARITY_PAIRS = [
    ("27", "27.0"), ("27.0", "27"), ("27", "27.0000004"), ("2.0000004", "2"), ("400000", "400000.0"),
    ("400000", "400001"), ("400000", "400000.0000004"), ("1538", "1539"), ("100", "101"), ("1,000", "1000"),
    ("025", "25"), ("0.25", "0.2500004"), ("0.25", "0.2500006"), ("\\frac{1}{3}", "0.333333"),
    ("\\frac{1}{3}", "0.33333"), ("\\frac{2}{3}", "0.666667"), ("\\frac{2}{3}", "0.666666"),
    ("0.0000001", "0.0000002"), ("1.5", "1.5000015"), ("1.5\\times10^{3}", "1500"),
    ("1.5\\times10^{3}", "1500.0000004"), ("1.5\\times10^{-7}", "0.0000002"), ("10^{-5}", "0.00001"),
    ("\\frac{1}{8}", "0.125"), ("-0.5", "-\\frac{1}{2}"), ("3", "\\frac{6}{2}"),
    ("\\frac{\\sqrt{2}}{4}", "0.353553"), ("\\frac{\\sqrt{2}}{4}", "0.353554"), ("\\pi", "3.141593"),
    ("\\pi", "3.1416"), ("\\sqrt{8}", "2\\sqrt{2}"), ("\\frac{1}{100!}", "\\frac{101}{101!}"),
]


@pytest.mark.parametrize("gold, pred", PARITY_PAIRS)
def test_grades_agree_with_math_verify(gold, pred):
    from math_verify import parse, verify

    expected = bool(verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{pred}}}")))
    assert grade(f"so \\boxed{{{pred}}}", gold) is expected


@pytest.mark.parametrize("benchmark", [None, "aime24", "math500", "minerva_math", "olympiadbench", "gsm8k"])
@pytest.mark.parametrize("pred, gold", [("400001", "400000"), ("1539", "1538"), ("101", "100"),
                                        ("1,000,001", "1000000")])
def test_integers_are_exact_on_every_benchmark(pred, gold, benchmark):
    """Integers compare exactly everywhere (math-verify); Minerva no longer accepts 1 % (1539 for 1538)."""
    assert grade(f"\\boxed{{{pred}}}", gold, benchmark) is False
    assert grade(f"\\boxed{{{gold}}}", gold, benchmark) is True


@pytest.mark.parametrize("pred, gold, expected", [
    ("0.2500004", "0.25", True),  # 0.250000 = 0.250000 at 6 decimal places
    ("0.2500006", "0.25", False),  # 0.250001 ≠ 0.250000
    ("1.5000005", "1.5", True),  # a tie rounds to even: 1.500000
    ("1.5000015", "1.5", False),  # 1.500002 ≠ 1.500000
    ("0.333333", "\\frac{1}{3}", True),
    ("0.3333", "\\frac{1}{3}", False),
    ("1.4142136", "\\sqrt{2}", True),  # decimal vs an exact irrational: math-verify's rounding, through sympy
])
def test_decimals_compare_at_six_places(pred, gold, expected):
    assert grade(f"\\boxed{{{pred}}}", gold, "minerva_math") is expected


def test_numbers_equal_rules_by_hand():
    """The rules of numbers_equal on exact values (expected by hand)."""
    from trainer.grading.rewards import numbers_equal

    assert numbers_equal((Fraction(27), "decimal"), (Fraction(27), "int"))  # equal values
    assert not numbers_equal((Fraction(270000001, 10**7), "decimal"), (Fraction(27), "int"))  # an integer: exact
    assert numbers_equal((Fraction(1, 3), "frac"), (Fraction(333333, 10**6), "decimal"))  # 6 places
    assert not numbers_equal((Fraction(1, 3), "frac"), (Fraction(3333333, 10**7), "frac"))  # fractions: exact
    assert not numbers_equal((Fraction(45 * 10**32), "sci"), (Fraction(452 * 10**31), "sci"))  # sci: exact


def test_relative_tolerance_is_an_explicit_option():
    assert grade_response("\\boxed{1539}", "1538", "minerva_math").correct is False
    assert grade_response("\\boxed{1539}", "1538", "minerva_math", rel_tol=1e-2).correct is True
    assert grade_response("\\boxed{1560}", "1538", "minerva_math", rel_tol=1e-2).correct is False  # 1.4 % off
    assert grade_response("\\boxed{4.52\\times10^{33}}", "4.5e33", rel_tol=1e-2).correct is True
    assert grade_response("\\boxed{4.52\\times10^{33}}", "4.5e33").correct is False
    for bad in (0, 1, -0.1, 2.0, True, "0.01"):
        with pytest.raises(DataError, match="rel_tol"):
            grade_response("\\boxed{1}", "1", rel_tol=bad)


@pytest.mark.parametrize("pred, gold, expected", [
    # two different exact answers, both below 1e-15 in size: math-verify's evalf(chop=True) calls them equal
    ("\\frac{1}{100!}", "\\frac{1}{101!}", False),
    ("\\frac{1}{101!}", "\\frac{1}{100!}", False),
    ("\\frac{1}{1000!}", "\\frac{1}{999!}", False),
    ("\\frac{1}{2^{2000}}", "\\frac{1}{2^{2001}}", False),
    ("e^{-1000}", "e^{-1001}", False),
    ("\\frac{1}{100!}", "1.0\\times10^{-158}", False),  # 1/100! = 9.33e-159
    # ... while equal exact answers stay equal
    ("\\frac{101}{101!}", "\\frac{1}{100!}", True),
    ("\\frac{1}{e^{1000}}", "e^{-1000}", True),
    ("\\frac{1}{2^{2000}}", "\\frac{1}{4^{1000}}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\cos(\\pi/6)", True),
    ("\\sqrt{8}", "2\\sqrt{2}", True),
])
def test_exact_answers_never_compare_through_an_underflowing_float(pred, gold, expected):
    assert grade(f"\\boxed{{{pred}}}", gold) is expected
