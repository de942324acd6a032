"""Answer grading and rule rewards for math RL and evaluation (STARE §4: math-verify on the last ``\\boxed{}``).

Public API (scripts, tests, the trainer's reward and ``trainer.evaluate`` import these):

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
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import re
import signal
import threading
from fractions import Fraction
from typing import Any, Iterator, Sequence

from stare_lab.errors import DataError

logger = logging.getLogger(__name__)

__all__ = [
    "FLOAT_ROUNDING", "GradeResult", "GradingTimeout", "extract_boxed", "normalize_answer", "normalize_gold",
    "parse_number", "numbers_equal", "check_rel_tol", "grade", "grade_response", "grade_batch", "math_reward",
    "gsm8k_lenient_reward", "format_reward", "last_number",
]

#: Decimal places to which two numbers are rounded before comparison when one of them is a plain decimal:
#: math-verify's default ``float_rounding`` (``math_verify.verify(..., float_rounding=6)``).
FLOAT_ROUNDING = 6

#: Relative agreement of two exact constants (both evaluated to :data:`_EVAL_DIGITS` significant digits) that counts
#: as equality when sympy cannot decide it by exact arithmetic (e.g. nested radicals); relative, never absolute.
_CONST_REL_EQ = 1e-30
_EVAL_DIGITS = 50

#: Longest answer (characters) handed to math-verify; longer boxed contents are graded by string match only.
MAX_ANSWER_CHARS = 1000


class GradingTimeout(BaseException):
    """Raised inside a grading call when its wall-clock limit expires.

    A ``BaseException`` (like math-verify's own ``TimeoutException``) so that the broad ``except Exception`` blocks
    inside math-verify and sympy cannot swallow it.
    """


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


# -------------------- extraction -------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _brace_pairs(text: str) -> dict[int, int]:
    """``{index of "{": index just past its matching "}"}`` for every balanced brace pair, in one O(n) pass.

    Escaped braces ``\\{`` / ``\\}`` do not count; unmatched braces are left out.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i + 1
        i += 1
    return pairs


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``.

    Handles nested braces, whitespace before the brace (``\\boxed {x}``) and the brace-less form ``\\boxed 5``
    (content up to the next whitespace or ``$``). A trailing ``\\boxed{`` left open by a truncated response is
    skipped in favour of the previous complete one. An empty box counts as no answer.

    Returns:
        the stripped content, or ``None`` if there is no complete, non-empty boxed answer.
    """
    if not isinstance(text, str):
        return None
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    pairs: dict[int, int] | None = None
    for pos in reversed(starts):
        j = pos
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            if pairs is None:
                pairs = _brace_pairs(text)
            end = pairs.get(j)
            if end is None:
                continue
            content = text[j + 1 : end - 1].strip()
        elif j > pos:  # "\boxed 5": one whitespace-delimited token
            m = re.match(r"[^\s$]+", text[j:])
            content = m.group(0) if m else ""
        else:
            continue
        if content:
            return content
    return None


# -------------------- normalisation ----------------------------------------------------------------------------------

_SPACING_RE = re.compile(r"\\[,;:! ]|\\q?quad\b|~")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree\b")


def normalize_answer(answer: str) -> str:
    """Conservative string normalisation of an answer (meaning-preserving edits only).

    Removes ``$`` wrappers, ``\\left``/``\\right``/``\\displaystyle``, spacing commands (``\\!``, ``\\,``, ``~``,
    ``\\quad``), degree marks, ``\\$`` and ``\\%``, a trailing period, and all whitespace; maps ``\\dfrac``/
    ``\\tfrac`` to ``\\frac``. Two answers with equal normalised strings are graded equal.
    """
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = s.replace("\\displaystyle", "")
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = _SPACING_RE.sub(" ", s)
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s


def normalize_gold(gold: str, benchmark: str | None = None) -> str:
    """Benchmark-specific cleanup of a gold answer before comparison.

    * OlympiadBench: ``$…$``-wrapped answers and multi-answer lists (``$69$,$84$`` → ``69,84``), trailing period.
    * AIME / AMC: numeric strings (``025``, ``27.0``) are kept; :func:`parse_number` compares them numerically.
    * Everything: surrounding whitespace and a final newline are removed.

    Raises:
        DataError: if ``gold`` is not a string or is empty.
    """
    if not isinstance(gold, str):
        raise DataError(f"gold answer must be a string, got {type(gold).__name__} {gold!r}")
    g = gold.strip()
    if not g:
        raise DataError("gold answer is empty")
    if "$" in g.replace("\\$", ""):
        g = re.sub(r"(?<!\\)\$", "", g).strip()
        g = g.rstrip(".").strip()
    return g


# number forms: 1,234 · 025 · 27.0 · .5 · 4.5e33 · 4.5\times10^{33} · 10^{-5} · \frac{3}{4} · 3/4 · -1./3
_INT = r"\d{1,3}(?:,\d{3})+(?![\d,])|\d+"
_DEC = rf"(?:{_INT})(?:\.\d*)?|\.\d+"
_NUM_RE = re.compile(
    rf"(?P<sign>[+-]?)(?P<mant>{_DEC})"
    r"(?:(?:[eE](?P<e>[+-]?\d+))|(?:\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*(?P<p>[+-]?\d+)\s*\}?))?"
)
_POW10_RE = re.compile(r"(?P<sign>[+-]?)10\s*\^\s*\{?\s*(?P<p>[+-]?\d+)\s*\}?")
_FRAC_RE = re.compile(r"(?P<sign>[+-]?)\\frac\s*\{\s*(?P<isign>[+-]?)\s*(?P<a>\d+)\s*\}\s*\{\s*(?P<b>\d+)\s*\}")
_FRAC_SHORT_RE = re.compile(r"(?P<sign>[+-]?)\\frac\s*(?P<a>\d)\s*(?P<b>\d)")
_EXP = r"\^\s*\{?\s*-?\d\s*\}?"  # a small unit exponent: ^2, ^{-1}
#: unit tail in LaTeX: \text{ cm}, \mathrm{~m}^2, \mbox{ inches}^2, \%, \$ (an exponent only after a unit)
_UNIT_TAIL_RE = re.compile(
    rf"(?:\s*(?:\\(?:text|mathrm|mbox|rm|textrm)\s*\{{[^{{}}]*\}}(?:\s*{_EXP})?|\\%|%|\\\$))+\s*$"
)
#: unit tail in plain words after whitespace: " cm", " miles", " erg s^{-1}", " m/s" (a first word of one letter
#: only before / or ^, so "2 n" or "5 x" are not numbers)
_PLAIN_UNIT_RE = re.compile(
    rf"(?<=[\d.}}])\s+(?:[A-Za-z]{{2,}}|[A-Za-z](?=\s*[/^]))(?:\s*{_EXP})?"
    rf"(?:\s*(?:/|\\cdot)?\s*[A-Za-z]+(?:\s*{_EXP})?)*\s*$"
)


def _signed(m: re.Match, val: Fraction) -> Fraction:
    return -val if m.group("sign") == "-" else val


def _decimal(text: str) -> Fraction:
    text = text.replace(",", "")
    return Fraction(text[:-1] if text.endswith(".") else text)


def parse_number(answer: str) -> tuple[Fraction, str] | None:
    """Parse ``answer`` as one plain real number, exactly.

    Accepted: integers (leading zeros, thousands separators ``1,234``/``10,\\!080``), decimals (``27.0``, ``.5``,
    ``5.``), scientific notation (``4.5e33``, ``4.5\\times10^{33}``, ``10^{-5}``), fractions of such numbers
    (``\\frac{3}{4}``, ``\\frac34``, ``3/4``, ``-1./3``), with an optional trailing unit (``\\text{ cm}``,
    ``\\mathrm{~m}^2``, plain words ``cm``, ``erg s^{-1}``, ``m/s`` after a space), ``\\%``, ``\\$`` or degree
    mark; a whole answer wrapped in ``\\text{…}`` is unwrapped.

    Returns:
        ``(value, kind)`` — the exact rational value and how it was written: ``"int"`` (integer literal),
        ``"decimal"`` (plain decimal literal with a point, or a fraction with a decimal part such as ``-1./3``),
        ``"sci"`` (scientific notation or a power of ten) or ``"frac"`` (a fraction of integers) — or ``None`` if
        ``answer`` is not such a number. The kind selects the comparison rule (:func:`numbers_equal`).
    """
    s = answer.strip().replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r",\s*\\!\s*", ",", s)  # LaTeX thousands separator "11,\! 111"
    s = _SPACING_RE.sub(" ", s.replace("\\!", "")).strip()
    wrapped = re.fullmatch(r"\\(?:text|textbf|mathrm|mbox|textrm)\s*\{([^{}]*)\}", s)
    if wrapped:
        s = wrapped.group(1).strip()
    s = _DEGREE_RE.sub("", s)
    s = _UNIT_TAIL_RE.sub("", s).strip()
    s = _PLAIN_UNIT_RE.sub("", s).strip().rstrip(".")
    if not s or len(s) > 200:
        return None
    m = _NUM_RE.fullmatch(s)
    if m:
        exp = m.group("e") or m.group("p")
        if exp is not None and abs(int(exp)) > 400:
            return None
        val = _decimal(m.group("mant")) * (Fraction(10) ** int(exp) if exp is not None else 1)
        kind = "sci" if exp is not None else ("decimal" if "." in m.group("mant") else "int")
        return _signed(m, val), kind
    m = _POW10_RE.fullmatch(s)
    if m:
        e = int(m.group("p"))
        return (_signed(m, Fraction(10) ** e), "sci") if abs(e) <= 400 else None
    m = (
        _FRAC_RE.fullmatch(s)
        or _FRAC_SHORT_RE.fullmatch(s)
        or re.fullmatch(r"(?P<sign>[+-]?)(?P<a>\d+\.?\d*)\s*/\s*(?P<b>\d+\.?\d*)", s)
    )
    if m:
        num, den = _decimal(m.group("a")), _decimal(m.group("b"))
        if "isign" in m.groupdict() and m.group("isign") == "-":
            num = -num
        kind = "decimal" if "." in m.group("a") + m.group("b") else "frac"
        return (_signed(m, num / den), kind) if den != 0 else None
    return None


def _round_half_even(x: Fraction, places: int) -> Fraction:
    """``x`` rounded to ``places`` decimal places, ties to even, exactly (no binary float)."""
    scale = 10**places
    return Fraction(round(x * scale), scale)  # Fraction.__round__ rounds half to even


def check_rel_tol(rel_tol: float | None, name: str = "rel_tol") -> None:
    """Raise :class:`DataError` unless ``rel_tol`` is ``None`` or a number in (0, 1)."""
    if rel_tol is None:
        return
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not 0 < rel_tol < 1:
        raise DataError(f"{name}={rel_tol!r} must be null (math-verify's rules) or a number in (0, 1)")


def numbers_equal(pred: tuple[Fraction, str], gold: tuple[Fraction, str], rel_tol: float | None = None) -> bool:
    """Compare two numbers from :func:`parse_number` by math-verify's rules, on their exact values.

    * Equal values are equal (``27.0`` = ``27``, ``0.5`` = ``\\frac{1}{2}``, ``10^{-5}`` = ``0.00001``).
    * An integer on either side: nothing else is equal (``400001`` ≠ ``400000``, ``27.0000004`` ≠ ``27``) —
      math-verify compares integers exactly.
    * Else a plain decimal on either side: equal iff both round to the same value at :data:`FLOAT_ROUNDING` = 6
      decimal places (ties to even) — math-verify's ``float_rounding``, so ``0.333333`` = ``\\frac{1}{3}`` but
      ``0.33333`` ≠ it. (Like math-verify, this is an absolute rounding: decimals below 5e-7 all round to 0.)
    * Else (fractions, scientific notation): exact.
    * ``rel_tol`` (an option, default off): also equal when ``|x − y| ≤ rel_tol · max(|x|, |y|)``, for every kind.

    Source: math-verify 0.9 ``math_verify.grader.sympy_numeric_eq`` (defaults ``float_rounding=6``); the STARE
    reference grades with it (papers/stare_2606.19236/README.md, "Grading").

    Raises:
        DataError: ``rel_tol`` not ``None`` and not in (0, 1).
    """
    check_rel_tol(rel_tol)
    (x, kx), (y, ky) = pred, gold
    if x == y:
        return True
    if rel_tol is not None and abs(x - y) <= Fraction(str(rel_tol)) * max(abs(x), abs(y)):
        return True
    if "int" in (kx, ky):
        return False
    if "decimal" in (kx, ky):
        return _round_half_even(x, FLOAT_ROUNDING) == _round_half_even(y, FLOAT_ROUNDING)
    return False


# -------------------- safety and timeouts ----------------------------------------------------------------------------

_TOWER_RE = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\d+\s*\^|\^\s*\{?\s*\(?\s*\d{7,}")
_BIG_FACT_RE = re.compile(r"\d{5,}\s*!")
_BIG_INT_RE = re.compile(r"\d{400,}")


def _too_large(answer: str) -> bool:
    """True for answers sympy may evaluate in C for a very long time (towers, 1e6+ exponents, 10^5+ factorials)."""
    return bool(_TOWER_RE.search(answer) or _BIG_FACT_RE.search(answer) or _BIG_INT_RE.search(answer))


_warned_thread = False


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`GradingTimeout` in the body after ``seconds`` of wall time (main thread only; else no limit).

    A previously armed ``ITIMER_REAL`` and ``SIGALRM`` handler are restored afterwards.
    """
    global _warned_thread
    if not seconds or seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        if not _warned_thread:
            logger.warning("grading outside the main thread runs without a per-item timeout")
            _warned_thread = True
        yield
        return

    def _handler(signum, frame):  # noqa: ARG001
        raise GradingTimeout(f"grading took longer than {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, _handler)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            signal.setitimer(signal.ITIMER_REAL, old_delay, old_interval)


# -------------------- math-verify ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _mv():
    """Import math-verify lazily (the ``trainer`` extra) and quiet its 'timeout disabled' warnings.

    Returns ``(to_sympy, verify)``: ``to_sympy(latex)`` normalises a LaTeX answer the way math-verify's LaTeX
    extraction does and converts the WHOLE string with latex2sympy (raising on a syntax error). We do not use
    ``math_verify.parse`` on the boxed content: when the full answer fails to parse, its regex extraction falls back
    to a sub-expression (``\\frac{1}{3}E_1+\\frac{2}{3}E_2+1`` → ``2/3``), so two different answers that share a
    fragment would verify as equal.
    """
    try:
        from math_verify import LatexExtractionConfig, verify
        from math_verify.parser import normalize_latex, parse_latex_cached
    except ImportError as err:  # pragma: no cover - math-verify is a trainer dependency
        raise DataError("grading needs math-verify>=0.7: pip install 'math-verify[antlr4_13_2]'") from err
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils"):
        logging.getLogger(name).setLevel(logging.ERROR)
    norm_config = dataclasses.replace(LatexExtractionConfig().normalization_config, boxed="last")

    def to_sympy(latex: str):
        # math-verify parses i as the imaginary unit only when it stands alone ("9 i"), not in "9i": write a
        # digit-attached i apart so that "6+9i" and "9 i + 6" parse alike (both complex)
        latex = re.sub(r"(?<=\d)i\b", " i", latex)
        return parse_latex_cached(normalize_latex(latex, config=norm_config))

    return to_sympy, verify


@functools.lru_cache(maxsize=65536)
def _mv_parse(answer: str) -> tuple:
    """``(sympy_object, answer)``, or ``(answer,)`` if the whole answer does not parse (string compare only).

    Cached: the same gold is graded for every sample of its problem, and samples often repeat an answer."""
    to_sympy, _ = _mv()
    try:
        expr = to_sympy(answer)
    except GradingTimeout:
        raise
    except Exception:  # noqa: BLE001 - unparseable LaTeX is an ordinary outcome
        return (answer,)
    # latex2sympy lower-cases symbol names, so "N=n" becomes the tautology Eq(n, n): such a degenerate relation
    # would verify against any other relation; compare the strings only.
    if getattr(expr, "is_Relational", False) and getattr(expr, "lhs", None) == getattr(expr, "rhs", None):
        return (answer,)
    if expr is None or isinstance(expr, bool) or getattr(expr, "is_Boolean", False) and expr in (True, False):
        return (answer,)
    return (expr, answer)


def _values(exprs: Sequence[Any], symbols: Sequence[Any], rng: Any) -> list[complex] | None:
    """Evaluate ``exprs`` at one random point (30 digits); ``None`` if a value is not a finite number."""
    import sympy

    subs = {s: sympy.Float(rng.uniform(0.5, 2.5), 30) for s in symbols}
    out = []
    for e in exprs:
        v = complex(e.evalf(30, subs=subs))
        if not (math.isfinite(v.real) and math.isfinite(v.imag)):
            return None
        out.append(v)
    return out


def _numerically_different(g: Any, p: Any, points: int = 3) -> bool:
    """True if two parsed answers are provably different by evaluation at random positive points.

    A sound fast rejection before math-verify's (slow) simplification. Plain expressions equal as functions agree
    at every point, so a difference beyond rounding (relative 1e-6, 30-digit evaluation) at one point proves them
    different. Equations: assignments to the same symbol (``d = A`` vs ``d = B``) compare their right-hand sides;
    other equations ``a = b`` vs ``c = d`` are equivalent only if the residuals ``a − b`` and ``c − d`` are
    proportional, so a ratio that changes between points proves them different. Anything else (sets, tuples,
    inequalities, matrices), values that are not finite numbers, or errors give False (no conclusion:
    math-verify decides). Points come from a fixed-seed RNG in [0.5, 2.5] (deterministic).
    """
    import random

    import sympy

    rng = random.Random(20260519)
    try:
        if isinstance(g, sympy.Equality) and isinstance(p, sympy.Equality):
            if isinstance(g.lhs, sympy.Symbol) and g.lhs == p.lhs:
                return _numerically_different(g.rhs, p.rhs, points)
            ra, rb = g.lhs - g.rhs, p.lhs - p.rhs
            symbols = sorted(ra.free_symbols | rb.free_symbols, key=str)
            ratios = []
            for _ in range(points):
                vals = _values([ra, rb], symbols, rng)
                if vals is None or abs(vals[0]) < 1e-9 or abs(vals[1]) < 1e-9:
                    return False
                ratios.append(vals[0] / vals[1])
            return any(abs(q - ratios[0]) > 1e-6 * max(1.0, abs(ratios[0])) for q in ratios[1:])
        if not (isinstance(g, sympy.Expr) and isinstance(p, sympy.Expr)):
            return False
        symbols = sorted(g.free_symbols | p.free_symbols, key=str)
        if len(symbols) > 10:
            return False
        for _ in range(points):
            vals = _values([g, p], symbols, rng)
            if vals is None:
                return False
            if abs(vals[0] - vals[1]) > 1e-6 * max(1.0, abs(vals[0]), abs(vals[1])):
                return True
        return False
    except GradingTimeout:
        raise
    except Exception:  # noqa: BLE001 - no conclusion
        return False


def _exact_constant(expr: Any) -> bool:
    """True for a sympy expression with no free symbols and no floating-point number in it (an exact constant)."""
    import sympy

    return (isinstance(expr, sympy.Expr) and not expr.free_symbols and not expr.atoms(sympy.Float)
            and not expr.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan))


def _exact_constants_equal(g: Any, p: Any) -> bool | None:
    """Compare two exact constants exactly; ``None`` if one of them is not one (:func:`_exact_constant`).

    Rationals (after ``doit``: ``1/100!`` is the rational 1/93326…) compare by value. Other constants (radicals,
    π, logarithms) are evaluated to :data:`_EVAL_DIGITS` significant digits (mpmath has no underflow) and are
    equal iff they agree to a relative :data:`_CONST_REL_EQ`; the test is relative, so two tiny values are never
    equal merely for being tiny (math-verify's ``(a − b).evalf(chop=True) == 0`` calls ``1/100!`` and ``1/101!``
    equal). Both zero: equal; one zero: equal only if the other evaluates to exactly zero.
    """
    import sympy

    if not (_exact_constant(g) and _exact_constant(p)):
        return None
    try:
        gd, pd = g.doit(), p.doit()
    except GradingTimeout:
        raise
    except Exception:  # noqa: BLE001 - leave it to the numeric comparison
        gd, pd = g, p
    if isinstance(gd, sympy.Rational) and isinstance(pd, sympy.Rational):
        return bool(gd == pd)
    va, vb = sympy.N(gd, _EVAL_DIGITS), sympy.N(pd, _EVAL_DIGITS)
    if not (va.is_number and vb.is_number and va.is_finite and vb.is_finite):
        return None
    diff, scale = abs(va - vb), max(abs(va), abs(vb))
    if scale == 0:
        return True
    return bool(diff <= _CONST_REL_EQ * scale)


def _symbolic_equal(gold: str, pred: str) -> bool:
    """math-verify ``verify`` of the parsed answers (its defaults ``float_rounding=6``, ``numeric_precision=15``),
    after the sound numeric rejection :func:`_numerically_different`; two exact constants are decided by
    :func:`_exact_constants_equal` instead (the strings are already known to differ)."""
    _, verify = _mv()
    g, p = list(_mv_parse(gold)), list(_mv_parse(pred))
    if len(g) == 2 and len(p) == 2:
        if _numerically_different(g[0], p[0]):
            return False
        exact = _exact_constants_equal(g[0], p[0])
        if exact is not None:
            return exact
    return bool(verify(g, p, timeout_seconds=None))


def _latex_number(value: Fraction, kind: str) -> str:
    """A number from :func:`parse_number` as LaTeX math-verify reads the way it was meant: a plain decimal stays
    a decimal (math-verify's float rules apply to it), everything else becomes its exact integer or fraction (so
    ``4.5e33``, which latex2sympy would read as 4.5·e·33, arrives as the integer 45·10^32)."""
    sign = "-" if value < 0 else ""
    v = abs(value)
    den = v.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if kind == "decimal" and den == 1 and v.denominator > 1:
        places = max(twos, fives)
        digits = str(v.numerator * 10**places // v.denominator).rjust(places + 1, "0")
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    if v.denominator == 1:
        return f"{sign}{v.numerator}"
    return f"{sign}\\frac{{{v.numerator}}}{{{v.denominator}}}"


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
