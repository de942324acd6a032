"""Answer text for grading (trainer.grading.rewards): the last complete ``\\boxed{…}`` of a response, string
normalisation, and exact numbers — parsing plain numeric answers (leading zeros, thousands separators, decimals,
scientific notation, fractions, unit tails) and comparing them with math-verify's rules on exact values. No
math-verify call here. The grading pipeline that uses these is described in :mod:`trainer.grading.rewards`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from stare_lab.errors import DataError

__all__ = ["FLOAT_ROUNDING", "extract_boxed", "normalize_answer", "normalize_gold", "parse_number", "numbers_equal",
           "check_rel_tol"]

#: Decimal places to which two numbers are rounded before comparison when one of them is a plain decimal:
#: math-verify's default ``float_rounding`` (``math_verify.verify(..., float_rounding=6)``).
FLOAT_ROUNDING = 6

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
