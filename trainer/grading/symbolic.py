"""The symbolic side of grading (trainer.grading.rewards, step 4): math-verify's LaTeX normalisation + latex2sympy
(cached), a random-point numeric check, exact comparison of constants, and the guards around sympy — wall-clock
limits (``SIGALRM``, main thread only) and the rejection of answers too large to evaluate safely.
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

logger = logging.getLogger("trainer.grading.rewards")

__all__ = ["GradingTimeout", "MAX_ANSWER_CHARS"]

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
