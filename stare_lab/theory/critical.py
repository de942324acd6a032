"""The critical STARE strength: how large W (and M) must be for the gated controller to hold the band (docs/theory.md §7).

With the gate on, the first-order entropy change of one step splits into the GRPO change of the same rollouts and
the parts the reweighted tokens carry (docs/theory.md §7):

    D(W, M) = D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L−

D_GRPO is the step's first-order change with ω ≡ 1, D_L+ (normally > 0) the part of it carried by the selected
positive-advantage high-surprisal tokens L+, D_L− (normally < 0) that of the selected negative-advantage ones L−.
The band at H_tgt can hold only if D(W, M) ≥ 0 there, so at step t

    W*(t) = 1 − (D_GRPO(t) + (M − 1)·D_L−(t)) / D_L+(t)      (O1: M = 1, W*(t) = 1 − D_GRPO(t)/D_L+(t))

is the W that cancels the drift. W*(t) falls as the reward saturates, so the critical W for a band criterion over
the second half of a run is the largest W*(t) over that half along a trajectory held at H_tgt
(:func:`critical_w`); the W* at the step where a GRPO run first crosses H_tgt (:func:`w_star_at_crossing`) is the
conservative estimate available from a W = 1 run alone. :func:`measured_critical_w` reads the critical W off a grid
of runs. These are pure functions of logged numbers (nats), shared by the simulators, analysis and the trainer.

Metric-row keys (``metrics.jsonl``, one value per step, nats, the first-order change of that step's update averaged
like ``entropy``): :data:`KEY_D_GRPO`, :data:`KEY_D_LPLUS`, :data:`KEY_D_LMINUS`.

In a sampled run (finite G) each step's D terms carry sampling noise; ``window`` > 1 sums them over consecutive
steps before the ratio is taken (a ratio of sums, not a mean of ratios), which is what a band criterion averaged
over many steps responds to.

**One critical strength, five kinds** (docs/theory.md §7). Every output (the terminal, ``summary.json``, the
report, ``report.json``, ``stare-lab promote``) names a critical W as a :class:`CriticalStrength` of one of the
kinds of :data:`STRENGTH_KINDS` — *measured* (the smallest W of a W sweep held on every seed,
:func:`measured_strength`), *auto* (the balance W an auto-schedule run found, :func:`auto_strength`),
*calibrated* (measured on a toy calibrated to the target model's probe, ``calibration.json``:
:mod:`stare_lab.theory.regime`), *predicted* (first order along held runs) and *conservative* (W* where GRPO
crosses H_tgt) — and :func:`recommend` picks the one W to act on by that order of precedence.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

from stare_lab.errors import ConfigError, DataError
from stare_lab.platform.summary import band_held, held_band

__all__ = [
    "KEY_D_GRPO", "KEY_D_LPLUS", "KEY_D_LMINUS", "KEY_D_RATIO", "KEY_LPLUS_ABOVE", "KEY_W_STAR", "w_star", "w_star_series", "critical_w", "w_star_at_crossing",
    "measured_critical_w", "tolerance", "applied_push", "decomposition_summary", "DECOMPOSITION_KEYS", "REGIME_RATIO",
    "STRENGTH_KINDS", "KIND_MEANING", "CriticalStrength", "recommend", "measured_strength", "strength_from_values",
    "recommendation_text", "variant_label", "run_strengths", "lower_bound_reason", "FULL_PUSH",
    "at_grpo_floor", "auto_strength", "auto_entries", "auto_line", "also_text", "recommended_clause", "pushes_ran",
]

KEY_D_GRPO = "pred/d_grpo"
KEY_D_LPLUS = "pred/d_lplus"
KEY_D_LMINUS = "pred/d_lminus"
#: D_L+/|D_GRPO| of one step (the first calibration target, docs/theory.md §8)
KEY_D_RATIO = "pred/d_ratio"
#: share of the L+ probability mass whose surprisal is above its position's s* (the second calibration target, §8)
KEY_LPLUS_ABOVE = "pred/lplus_above_sstar"
#: W*(t) of one step (:func:`w_star` of that step's D terms)
KEY_W_STAR = "pred/w_star"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def w_star(d_grpo: float | None, d_lplus: float | None, d_lminus: float | None = 0.0, m: float = 1.0) -> float | None:
    """The W that cancels the first-order drift of one step (or one window of steps), docs/theory.md §7:
    W* = 1 − (D_GRPO + (M − 1)·D_L−)/D_L+, at least 1 (W ≥ 1; a value below 1 means W = 1 already holds).

    Args:
        d_grpo, d_lplus, d_lminus: the D terms (nats); ``d_lminus`` only matters when ``m != 1`` (C2).
        m: the M the run uses (1 for O1).

    Returns:
        W* ≥ 1; ``math.inf`` when D_L+ ≤ 0 and the drift D_GRPO + (M − 1)·D_L− is negative (no W cancels it);
        1.0 when D_L+ ≤ 0 and the drift is ≥ 0; ``None`` when an input is missing or not finite.
    """
    if not (_finite(d_grpo) and _finite(d_lplus) and _finite(m)):
        return None
    if m != 1.0 and not _finite(d_lminus):
        return None
    drift = d_grpo + ((m - 1.0) * d_lminus if m != 1.0 else 0.0)
    if d_lplus <= 0:
        return math.inf if drift < 0 else 1.0
    return max(1.0, 1.0 - drift / d_lplus)


def _sums(values: Sequence[float | None], start: int, stop: int) -> float | None:
    chunk = values[start:stop]
    if not chunk or any(not _finite(v) for v in chunk):
        return None
    return float(sum(chunk))


def w_star_series(
    d_grpo: Sequence[float | None],
    d_lplus: Sequence[float | None],
    d_lminus: Sequence[float | None] | None = None,
    m: float = 1.0,
    window: int = 1,
    start: int = 0,
) -> list[float | None]:
    """W* (:func:`w_star`) over consecutive non-overlapping windows of ``window`` steps from step index ``start``
    (the D terms of a window summed first; a last partial window is dropped). ``window = 1`` gives W*(t) per step.

    Raises:
        ValueError: ``window`` < 1, ``start`` < 0, or series of different lengths.
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r} must be an integer >= 1")
    if start < 0:
        raise ValueError(f"start={start!r} must be >= 0")
    n = len(d_grpo)
    if len(d_lplus) != n or (d_lminus is not None and len(d_lminus) != n):
        raise ValueError(f"D series have different lengths ({n}, {len(d_lplus)}, "
                         f"{None if d_lminus is None else len(d_lminus)})")
    out = []
    for a in range(start, n - window + 1, window):
        lm = _sums(d_lminus, a, a + window) if d_lminus is not None else 0.0
        out.append(w_star(_sums(d_grpo, a, a + window), _sums(d_lplus, a, a + window), lm, m))
    return out


def critical_w(
    d_grpo: Sequence[float | None],
    d_lplus: Sequence[float | None],
    d_lminus: Sequence[float | None] | None = None,
    m: float = 1.0,
    window: int = 1,
    from_frac: float = 0.5,
) -> float | None:
    """Critical W along one trajectory (docs/theory.md §7): the largest W* over the windows of the part of the run from
    step ``from_frac``·n on (default: the second half, the span of the band criterion), D terms per step.

    Meaningful along a trajectory held at H_tgt (a STARE run that holds the band); on a collapsing run it is the W*
    of whatever entropies the run passed. Returns ``None`` if no window has a defined W*.

    Raises:
        ValueError: ``from_frac`` outside [0, 1), or as :func:`w_star_series`.
    """
    if not 0 <= from_frac < 1:
        raise ValueError(f"from_frac={from_frac!r} is outside [0, 1)")
    series = w_star_series(d_grpo, d_lplus, d_lminus, m, window, start=int(from_frac * len(d_grpo)))
    vals = [v for v in series if v is not None]
    return max(vals) if vals else None


def w_star_at_crossing(
    entropy: Sequence[float | None],
    target: float,
    d_grpo: Sequence[float | None],
    d_lplus: Sequence[float | None],
    d_lminus: Sequence[float | None] | None = None,
    m: float = 1.0,
    window: int = 1,
) -> tuple[int | None, float | None]:
    """The GRPO-only (conservative) estimate: W* where a run's entropy first falls below ``target`` (nats), with the
    D terms summed over the ``window`` steps centred on that step (clipped to the run).

    Returns:
        ``(step index of the crossing, W*)``; ``(None, None)`` if the entropy never falls below ``target``, or
        starts below it (no drift carried it there: a W* of the first step says nothing about holding the band).
    """
    cross = next((i for i, h in enumerate(entropy) if _finite(h) and h < target), None)
    first = next((i for i, h in enumerate(entropy) if _finite(h)), None)
    if cross is None or cross == first:
        return None, None
    n = len(entropy)
    a = max(0, min(cross - window // 2, n - window))
    b = min(n, a + window)
    lm = _sums(d_lminus, a, b) if d_lminus is not None else 0.0
    return cross, w_star(_sums(d_grpo, a, b), _sums(d_lplus, a, b), lm, m)


def measured_critical_w(
    deviations: Mapping[float, Sequence[float | None]], band: float, target_entropy: float | None = None,
) -> float | None:
    """The critical W measured on a grid from the band deviations alone: the smallest grid W whose every seed's
    mean |H − H_tgt| over the second half is below ``band`` (nats) — below the held band min(band, H_tgt/4)
    (:func:`stare_lab.platform.summary.held_band`) when ``target_entropy`` is given. ``deviations`` maps each grid W to the
    per-seed deviations (``None`` = not measured: that W does not hold). ``None`` if no grid W holds. The full
    held test (final entropy too) needs the runs' summaries: :func:`measured_strength`."""
    if target_entropy is not None:
        band = held_band(band, target_entropy)
    held = [w for w, devs in deviations.items() if devs and all(_finite(d) and d < band for d in devs)]
    return min(held) if held else None


def tolerance(measured_w: float, grid_step: float) -> float:
    """The agreement a prediction of the critical W must reach (issue 13): max(35 % of W − 1, one grid step)."""
    return max(0.35 * (measured_w - 1.0), grid_step)


#: a push acting at less than this share of its first-order size means the step size is outside the theory's regime
REGIME_RATIO = 0.8

#: the keys of :func:`decomposition_summary`, in order
DECOMPOSITION_KEYS = ("push_ratio", "critical_w", "critical_w_measured_drift", "w_star_at_crossing")


def applied_push(d: Sequence[float | None], push_efficiency: float | None) -> list[float | None]:
    """D_L+ or D_L− per step (nats) of the push a step applies when only a share e (``push_efficiency``, a tabular
    toy's knob; None = 1, a model) of it is applied: e·D (docs/calibration.md, the push-efficiency knob)."""
    e = 1.0 if push_efficiency is None else float(push_efficiency)
    return [None if x is None else e * x for x in d]


def decomposition_summary(
    rows: Sequence[Mapping[str, Any]], target_entropy: float | None, *, reweight_m: float = 1.0, window: int = 1,
    push_efficiency: float = 1.0,
) -> dict[str, Any]:
    """Run-level statistics of the first-order decomposition (docs/theory.md §7) from a run's metrics rows; every
    value is None where the run does not log what it needs.

    * ``push_ratio``: median of ``stare/push_ratio`` (STARE's measured one-step effect over its first-order size)
      over the steps whose push acted (gate on), or over every step when it never did (then the push is a probe that
      was not applied); below :data:`REGIME_RATIO` the step size is outside the first-order regime.
    * ``critical_w``: :func:`critical_w` over the second half (D terms summed over ``window`` steps; ``reweight_m``
      the run's M for C2, 1 for O1), meaningful for a run that holds the band.
    * ``critical_w_measured_drift``: the same with the measured one-step change of the ω ≡ 1 update
      (``stare/grpo_measured``: second order included) in place of D_GRPO.
    * ``w_star_at_crossing``: :func:`w_star_at_crossing` at ``target_entropy`` (the conservative estimate from a
      GRPO run; the crossing's step is the run summary's ``crossing_step``).

    ``push_efficiency`` e: the share of the push the step applies (a tabular toy's knob, docs/calibration.md; 1 for
    a model): the W* of the critical W keys then cancel the drift with the applied push e·((W − 1)·D_L+ +
    (M − 1)·D_L−), i.e. D_L+ and D_L− enter scaled by e.
    """
    num = lambda x: float(x) if _finite(x) else None  # noqa: E731
    out: dict[str, Any] = {k: None for k in DECOMPOSITION_KEYS}
    acted = [num(r.get("stare/push_ratio")) for r in rows if r.get("gate_on")]
    acted = [x for x in acted if x is not None]
    if not acted:
        acted = [x for x in (num(r.get("stare/push_ratio")) for r in rows) if x is not None]
    if acted:
        out["push_ratio"] = float(statistics.median(acted))
    if not rows or KEY_D_GRPO not in rows[0] or KEY_D_LPLUS not in rows[0]:
        return out
    m = float(reweight_m)
    dg = [num(r.get(KEY_D_GRPO)) for r in rows]
    dl = applied_push([num(r.get(KEY_D_LPLUS)) for r in rows], push_efficiency)
    dm = applied_push([num(r.get(KEY_D_LMINUS)) for r in rows], push_efficiency) if m != 1.0 else None
    window = max(1, min(int(window), len(rows) // 4 or 1))
    out["critical_w"] = num(critical_w(dg, dl, dm, m, window))
    if "stare/grpo_measured" in rows[0]:
        measured = [num(r.get("stare/grpo_measured")) for r in rows]
        out["critical_w_measured_drift"] = num(critical_w(measured, dl, dm, m, window))
    if target_entropy is not None:
        _, w = w_star_at_crossing([num(r.get("entropy")) for r in rows], target_entropy, dg, dl, dm, m, window)
        out["w_star_at_crossing"] = num(w)
    return out


# ----------------------------------------------------------------------------------------------------------------
# one critical strength, five kinds (docs/theory.md §7)
# ----------------------------------------------------------------------------------------------------------------

#: the kinds of critical strength, in the order of precedence of :func:`recommend` (docs/theory.md §7)
STRENGTH_KINDS = ("measured", "auto", "calibrated", "predicted", "conservative")
#: what each kind is, as every output says it
KIND_MEANING = {
    "measured": "smallest fixed W held on every seed (a W sweep, or runs at one W)",
    "auto": ("from an auto run: balance W, 1 + mean gate·(W − 1), over the strongest stretch of the second half of "
             "runs that held (the fixed W that covers it)"),
    "calibrated": "measured on a toy calibrated to the target model's probe",
    "predicted": "first order: largest W*(t) over the second half of held runs",
    "conservative": "first order: W* where GRPO crosses H_tgt",
}


def _opt_number(name: str, value: Any, allow_inf: bool) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if not ok or (math.isinf(value) and not allow_inf):
        raise ConfigError(f"critical strength {name}={value!r} must be a {'number' if allow_inf else 'finite number'}"
                          " or None")
    return float(value)


@dataclasses.dataclass(frozen=True)
class CriticalStrength:
    """One critical STARE strength, labelled with its kind and source (docs/theory.md §7).

    Attributes:
        kind: one of :data:`STRENGTH_KINDS`.
        w: the critical W (≥ 1; ``math.inf`` when no W cancels the drift); None when a W sweep found no grid W that
            held (then ``low`` is the largest grid W tried: the critical W is above it).
        m: the M (C2) this W goes with; None for O1 (M = 1 is stored as None).
        low, high: the range of the estimate — *measured*: the largest grid W below ``w`` that did not hold (None
            if ``w`` is the smallest grid W) and ``w`` itself, the critical W lies in (low, high]; *auto*,
            *predicted*, *conservative*: the least and largest value over the runs (seeds); *calibrated*: the
            calibration's uncertainty range.
        source: where the number comes from, in words (method, slice, runs, file).
        lower_bound: why the value is only a lower bound of the critical W ("" when it is not): a first-order
            number (*predicted*, *conservative*) from sampled rollouts (the sampling noise adds a drift the first
            order leaves out) or from runs whose push acted below its first-order size (:func:`lower_bound_reason`);
            an *auto* number from runs that did not all hold the band (:func:`auto_strength`); every output then
            says "at least".

    Raises:
        ConfigError: an unknown kind, or a value that is not a number.
    """

    kind: str
    w: float | None
    m: float | None = None
    low: float | None = None
    high: float | None = None
    source: str = ""
    lower_bound: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRENGTH_KINDS:
            raise ConfigError(f"critical strength kind={self.kind!r} is not one of {{{', '.join(STRENGTH_KINDS)}}}")
        object.__setattr__(self, "w", _opt_number("w", self.w, True))
        m = _opt_number("m", self.m, False)
        object.__setattr__(self, "m", None if m == 1.0 else m)
        object.__setattr__(self, "low", _opt_number("low", self.low, True))
        object.__setattr__(self, "high", _opt_number("high", self.high, True))
        object.__setattr__(self, "source", str(self.source))
        object.__setattr__(self, "lower_bound", str(self.lower_bound or ""))

    @property
    def variant(self) -> str:
        """``O1`` or ``C2 (M=0.9)``: the push this W is for (:func:`variant_label`)."""
        return variant_label(self.m)

    def range_text(self) -> str:
        """The range in words: ``(1.1, 1.3]`` (measured), ``> 1.5`` (measured, no grid W held), ``1.25–1.4``."""
        f = lambda x: f"{x:.3g}"  # noqa: E731
        if self.kind == "measured":
            if self.w is None:
                return f"> {f(self.low)} (no grid W held)" if self.low is not None else "no grid W held"
            return f"({f(self.low)}, {f(self.w)}]" if self.low is not None else f"≤ {f(self.w)}"
        if self.low is None or self.high is None or self.low == self.high:
            return ""
        return f"{f(self.low)}–{f(self.high)}"

    def value_text(self, with_m: bool = True) -> str:
        """``1.3``, ``1.3 at M=0.9``, ``at least 1.3`` (a lower bound), ``above 1.5`` (measured, no grid W held) or
        ``inf`` (no W cancels the drift)."""
        if self.w is None:
            w = f"above {self.low:.3g}" if self.low is not None else "none"
        else:
            w = ("at least " if self.lower_bound and math.isfinite(self.w) else "") + f"{self.w:.3g}"
        return w + (f" at M={self.m:.3g}" if with_m and self.m is not None else "")

    def describe(self, with_m: bool = True, meaning: bool = True) -> str:
        """``1.3 (measured: smallest W held on every seed of a W sweep; range (1.1, 1.3]; o1 W sweep …)`` — the
        number (with its M unless ``with_m`` is False), its kind and meaning (``meaning`` False: the kind alone,
        ``auto`` still as "from an auto run"), the range and the source: how every output names it."""
        parts = [KIND_MEANING[self.kind] if meaning else "from an auto run" if self.kind == "auto" else ""]
        parts = [p for p in parts if p]
        rng = self.range_text()
        if rng:
            parts.append(f"range {rng}")
        if self.source:
            parts.append(self.source)
        if self.lower_bound:
            parts.append(f"a lower bound: {self.lower_bound}")
        return f"{self.value_text(with_m)} ({self.kind}{': ' if parts else ''}{'; '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "w", "m", "low", "high", "source", "lower_bound", "meaning"}`` (the form of ``summary.json`` /
        ``report.json`` / the promote provenance; ``meaning`` = :data:`KIND_MEANING` of the kind)."""
        return {**dataclasses.asdict(self), "meaning": KIND_MEANING[self.kind]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CriticalStrength":
        """The record :meth:`to_dict` wrote (``meaning`` and unknown keys ignored).

        Raises:
            DataError: ``data`` is not a mapping, lacks ``kind``, or holds a bad kind or value.
        """
        if not isinstance(data, Mapping) or "kind" not in data:
            raise DataError(f"critical strength {data!r} must be a mapping with a 'kind' (one of "
                            f"{', '.join(STRENGTH_KINDS)})")
        try:
            return cls(data["kind"], data.get("w"), data.get("m"), data.get("low"), data.get("high"),
                       data.get("source") or "", data.get("lower_bound") or "")
        except ConfigError as err:
            raise DataError(str(err)) from None


def variant_label(m: float | None) -> str:
    """``O1`` for M None / 1, else ``C2 (M=0.9)`` (M to 3 significant digits: an auto run's M = 1/W is not round)."""
    return "O1" if m is None or m == 1.0 else f"C2 (M={m:.3g})"


def _same_m(a: float | None, b: float | None) -> bool:
    a = None if a == 1.0 else a
    b = None if b == 1.0 else b
    return a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))


def recommend(strengths: Iterable[CriticalStrength], m: float | None = None) -> CriticalStrength | None:
    """The one critical W to act on among ``strengths`` for the push with M = ``m`` (None: O1), all about the same
    system (task, lr, sampling): by precedence measured > auto > calibrated > predicted > conservative
    (:data:`STRENGTH_KINDS`, docs/theory.md §7), within one kind the largest W (the safe side). A measured record
    with no held grid W (``w`` None, ``low`` = the largest W tried) rules out every estimate at or below ``low``;
    so does an *auto* record that is a lower bound (its runs did not all hold: the push they applied while failing,
    at or below its ``w``). When the bounds rule every estimate out, the bound itself is returned — the measured
    record first (its W: "above ``low``"), else the largest auto one ("at least").

    Returns:
        The chosen record, or None when ``strengths`` holds none for this M.
    """
    cands = [s for s in strengths if _same_m(s.m, m)]
    failed = [s for s in cands if s.kind == "auto" and s.lower_bound and s.w is not None]
    bound = max([s.low for s in cands if s.kind == "measured" and s.w is None and s.low is not None]
                + [s.w for s in failed], default=None)
    for kind in STRENGTH_KINDS:
        ok = [s for s in cands if s.kind == kind and s.w is not None and s not in failed
              and (bound is None or s.w > bound)]
        if ok:
            return max(ok, key=lambda s: s.w)
    return next((s for s in cands if s.kind == "measured"), None) or max(failed, key=lambda s: s.w, default=None)


def measured_strength(
    held_by_w: Mapping[float, Sequence[bool | None]], m: float | None = None, source: str = "",
) -> CriticalStrength | None:
    """The *measured* critical strength of a W grid: the smallest grid W whose runs all held the band
    (:func:`stare_lab.platform.summary.band_held` of each run: ``True``; None or False is a miss), with ``low`` the largest
    grid W below it that did not hold. No grid W held: ``w`` None and ``low`` the largest grid W (the critical W is
    above it). None for an empty grid."""
    if not held_by_w:
        return None
    ws = sorted(float(w) for w in held_by_w)
    held = {float(w): bool(v) and all(x is True for x in v) for w, v in held_by_w.items()}
    found = next((w for w in ws if held[w]), None)
    if found is None:
        return CriticalStrength("measured", None, m, ws[-1], None, source)
    below = [w for w in ws if w < found and not held[w]]
    return CriticalStrength("measured", found, m, below[-1] if below else None, found, source)


def strength_from_values(
    kind: str, values: Iterable[float | None], m: float | None = None, source: str = "",
) -> CriticalStrength | None:
    """A *predicted* / *conservative* (or *calibrated*) strength from per-run values: W the median, ``low`` /
    ``high`` the least / largest (None and NaN skipped, ``inf`` kept: no W cancels the drift there). None if no
    value is left."""
    vals = sorted(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
                  and not math.isnan(v))
    if not vals:
        return None
    return CriticalStrength(kind, statistics.median(vals), m, vals[0], vals[-1], source)


def also_text(strengths: Sequence[CriticalStrength], m: float | None = None) -> str:
    """``auto 1.29, predicted at least 1.29, conservative 1.35``: the numbers of the strengths for M = ``m`` other than
    the one :func:`recommend` picks, by precedence ("" when there are none)."""
    rec = recommend(strengths, m)
    others = [s for s in strengths if s is not rec and _same_m(s.m, m) and s.w is not None]
    return ", ".join(f"{s.kind} {s.value_text(with_m=False)}" for s in sorted(
        others, key=lambda s: STRENGTH_KINDS.index(s.kind)))


def recommendation_text(strengths: Sequence[CriticalStrength], m: float | None = None) -> str | None:
    """``recommended W for O1: 1.3 (measured: …); also: predicted 1.33, conservative 1.35`` (one line: the
    recommendation of :func:`recommend` with its kind, then the other kinds' numbers, :func:`also_text`), or None
    without any."""
    rec = recommend(strengths, m)
    if rec is None:
        return None
    also = also_text(strengths, m)
    return f"recommended W for {variant_label(m)}: {rec.describe(with_m=False)}" + (f"; also: {also}" if also else "")


def _variant_order(labels: Iterable[str]) -> list[str]:
    return sorted(dict.fromkeys(labels), key=lambda v: (v != "O1", v))


def recommended_clause(block: Mapping[str, Any]) -> str | None:
    """The one recommendation of a ``critical_strength`` block (``summary.json``, ``report.json``: ``slices`` →
    ``{"point", "recommended": {variant: record}}``, ``slice`` the headline's point): ``recommended W: O1 1.3
    (measured; range (1.2, 1.3]; …), C2 (M=0.9) at least 1.18 (predicted; …)`` — one number per push with its kind,
    range and source, O1 first; ``recommended W at lr=1: …`` when the block has several slices (the others are
    listed apart). Only the pushes the slice's STARE groups ran when it says so (``ran``, :func:`pushes_ran`) and
    one of them has a recommendation. None when the slice recommends nothing."""
    slices = block.get("slices") or {}
    label, entry = next(((k, v) for k, v in slices.items() if v.get("point") == block.get("slice")),
                        next(iter(slices.items()), ("", {})))
    recs = entry.get("recommended") or {}
    ran = entry.get("ran")
    if ran is not None and any(v in recs for v in ran):  # the pushes that ran (an O1 W* of GRPO's is not one)
        recs = {k: v for k, v in recs.items() if k in ran}
    if not recs:
        return None
    texts = [f"{v} {CriticalStrength.from_dict(recs[v]).describe(with_m=False, meaning=False)}"
             for v in _variant_order(recs)]
    where = f" at {label}" if label and len(slices) > 1 else ""
    return f"recommended W{where}: " + ", ".join(texts)


def _labels(names: Sequence[str]) -> str:
    names = list(dict.fromkeys(names))
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


#: a push that acted below this share of its first-order size makes a first-order W a lower bound (2 %: the
#: median push ratio of a mean-field run is exact, a sampled run's is labelled a lower bound anyway)
FULL_PUSH = 0.98


def lower_bound_reason(runs: Sequence[Mapping[str, Any]], sampled: bool) -> str:
    """Why a first-order critical W from ``runs`` (run summaries with ``push_ratio``) is only a lower bound, or "":
    ``sampled`` rollouts (finite G: the sampling noise adds a second-order drift that the first order leaves out,
    docs/theory.md §7), and/or a median push ratio below :data:`FULL_PUSH` (the push acted below its first-order size,
    so more W than the first order says is needed)."""
    why = []
    if sampled:
        why.append("sampled rollouts add a noise-driven drift the first order leaves out")
    ratios = [float(r["push_ratio"]) for r in runs if _finite(r.get("push_ratio"))]
    if ratios and statistics.median(ratios) < FULL_PUSH:
        why.append(f"the push acted at {statistics.median(ratios):.0%} of its first-order size")
    return " and ".join(why)


def at_grpo_floor(groups: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the target sits at GRPO's floor: the groups include GRPO (``"grpo": True``) and every GRPO run held
    the band by itself (:func:`stare_lab.platform.summary.band_held`) — there is no drift below the band for STARE
    to cancel, so no critical W describes these runs."""
    runs = [r for g in groups if g.get("grpo") and not g.get("stare") for r in g.get("runs") or []]
    return bool(runs) and all(band_held(r) is True for r in runs)


def _auto_variant(g: Mapping[str, Any]) -> str:
    return "C2" if str(g.get("variant") or "O1").upper() == "C2" else "O1"


def _range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}–{hi:.3g}"


def _cap_clause(runs: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> str:
    """``W at its cap auto_w_max=1.2 on 85% of the steps from the crossing on`` (the largest ``w_cap_share`` of the
    runs), "" when W never sat at its cap."""
    shares = [float(r["w_cap_share"]) for r in runs if _finite(r.get("w_cap_share"))]
    if not shares or max(shares) <= 0:
        return ""
    caps = sorted({float(g["w_cap"]) for g in groups if _finite(g.get("w_cap"))})
    cap = f" auto_w_max={caps[0]:g}" if len(caps) == 1 else ""
    return f"W at its cap{cap} on {max(shares):.0%} of the steps from the crossing on"


def auto_strength(groups: Sequence[Mapping[str, Any]], variant: str = "O1") -> CriticalStrength | None:
    """The *auto* strength of the auto-schedule groups (``"auto": True``) of ``variant`` (``"O1"`` / ``"C2"``, a
    group's ``"variant"``) among ``groups`` (:func:`run_strengths`' form; ``"w_cap"``: the schedule's cap on W).

    W: the median over the runs that held the band (:func:`~stare_lab.platform.summary.band_held`) of their
    ``balance_w_max`` — the balance 1 + mean gate·(W − 1) over the strongest stretch of the second half
    (:func:`stare_lab.platform.summary.run_summary`): the push the hold needed where the drift was strongest, so
    the fixed W that covers it, where the mean ``balance_w`` (in the source) is the push that held on average;
    ``low`` / ``high`` their range. When no run held, over every run. Not every run held: a lower bound ("the band
    did not hold on k/n seeds", with the share of the steps from the crossing on that W sat at its cap, when it
    did). C2: ``m`` = 1/W, the auto schedule's pairing (M = 1/W), so that the record is the fixed (W, M) the run
    recommends. None without such a group or a finite ``balance_w_max``."""
    mine = [g for g in groups if g.get("auto") and _auto_variant(g) == variant]
    runs = [r for g in mine for r in g.get("runs") or []]
    held = [r for r in runs if band_held(r) is True]
    use = held or runs
    found = [float(r["balance_w_max"]) for r in use if _finite(r.get("balance_w_max"))]
    if not found:
        return None
    mean = [float(r["balance_w"]) for r in use if _finite(r.get("balance_w"))]
    label = _labels([g["label"] for g in mine])
    source = f"{len(held)}/{len(runs)} runs of {label} held the band" + (
        f"; mean balance W {statistics.median(mean):.3g} (range {_range(mean)})" if mean else "")
    cap = _cap_clause(runs, mine)
    if cap:
        source += f"; {cap}"
    why = ""
    if len(held) < len(runs):
        why = f"the band did not hold on {len(runs) - len(held)}/{len(runs)} seeds" + (f" ({cap})" if cap else "")
    w = float(statistics.median(found))
    return CriticalStrength("auto", w, 1.0 / w if variant == "C2" else None, min(found), max(found), source, why)


def pushes_ran(groups: Sequence[Mapping[str, Any]], strengths: Sequence[CriticalStrength]) -> list[str]:
    """The pushes (:func:`variant_label`) the STARE groups among ``groups`` (:func:`run_strengths`' form) ran, O1
    first: a fixed or paper-schedule group's M, an auto group's its *auto* record's (C2: M = 1/W); ``["O1"]`` when
    no STARE group ran (GRPO alone gives O1's conservative W)."""
    out = [variant_label(g.get("m")) for g in groups if g.get("stare") and not g.get("auto")]
    for g in groups:
        if g.get("auto"):
            c2 = _auto_variant(g) == "C2"
            out += [s.variant for s in strengths if s.kind == "auto" and (s.m is not None) == c2]
    return _variant_order(out) if out else ["O1"]


def auto_entries(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per auto-schedule group (``"auto": True``), what the screen and the report say of it (:func:`auto_line`):
    ``{"label", "variant", "n", "held", "strength": the group's own :func:`auto_strength` record (to_dict),
    "balance_w": median of the mean balance W over the same runs, "balance_low", "balance_high", "cap_share": the
    largest ``w_cap_share`` (None without one), "w_cap"}``; groups without a finite ``balance_w_max`` are left
    out."""
    out = []
    for g in groups:
        if not g.get("auto"):
            continue
        rec = auto_strength([g], _auto_variant(g))
        if rec is None:
            continue
        runs = list(g.get("runs") or [])
        held = [r for r in runs if band_held(r) is True]
        mean = [float(r["balance_w"]) for r in held or runs if _finite(r.get("balance_w"))]
        shares = [float(r["w_cap_share"]) for r in runs if _finite(r.get("w_cap_share"))]
        out.append({"label": g["label"], "variant": _auto_variant(g), "n": len(runs), "held": len(held),
                    "strength": rec.to_dict(), "balance_w": statistics.median(mean) if mean else None,
                    "balance_low": min(mean) if mean else None, "balance_high": max(mean) if mean else None,
                    "cap_share": max(shares) if shares else None,
                    "w_cap": float(g["w_cap"]) if _finite(g.get("w_cap")) else None})
    return out


def auto_line(entry: Mapping[str, Any], strengths: Sequence[CriticalStrength] = ()) -> str:
    """One line for an :func:`auto_entries` entry: ``o1-auto: held 3/3 seeds; the W it found: 1.29 (range
    1.27–1.29; from an auto run: …; mean balance W 1.22, range 1.2–1.24); measured critical W 1.3 (W sweep)`` — the
    cap when W sat at it, and the *measured* strength of the same variant among ``strengths`` when there is one
    (for C2 with its M)."""
    rec = CriticalStrength.from_dict(entry["strength"])
    inner = [f"range {rec.range_text()}"] if rec.range_text() else []
    inner.append("from an auto run: the balance W of the strongest stretch of its hold")
    if entry.get("balance_w") is not None:
        lo, hi = entry.get("balance_low"), entry.get("balance_high")
        inner.append(f"mean balance W {entry['balance_w']:.3g}"
                     + (f", range {_range([lo, hi])}" if lo is not None and hi is not None and lo != hi else ""))
    if rec.lower_bound:
        inner.append(f"a lower bound: {rec.lower_bound}")
    line = (f"{entry['label']}: held {entry['held']}/{entry['n']} seeds; the W it found: {rec.value_text()} "
            f"({'; '.join(inner)})")
    share, cap = entry.get("cap_share"), entry.get("w_cap")
    if _finite(share) and share > 0 and "at its cap" not in rec.lower_bound:
        line += (f"; W at its cap" + (f" auto_w_max={cap:g}" if _finite(cap) else "")
                 + f" on {share:.0%} of the steps from the crossing on")
    c2 = entry.get("variant") == "C2"
    meas = [s for s in strengths if s.kind == "measured" and (s.m is not None) == c2]
    if meas:
        s = meas[0]
        how = "W sweep" if "W sweep" in s.source else "runs at a fixed W"
        line += f"; measured critical W {s.value_text()} ({how})"
    return line


def run_strengths(groups: Sequence[Mapping[str, Any]]) -> list[CriticalStrength]:
    """The *measured* (runs at a fixed W), *predicted* and *conservative* strengths of a set of runs, per M.

    Args:
        groups: each ``{"label", "stare": bool (the loss uses the STARE gate and W/M), "m": C2's M or None (O1 and
            baselines), "runs": [run summaries]}``, optionally ``"grpo": bool`` (the group is GRPO itself — only
            GRPO's runs give the conservative estimate; another baseline, a plugin's method say, follows its own
            trajectory), ``"w"`` (a STARE group's fixed W; None or absent: adaptive, or not given) and
            ``"sampled"`` (its rollouts are sampled: finite G), ``"auto"`` (its runs use the auto schedule, with
            ``"variant"`` ``"O1"`` / ``"C2"`` and ``"w_cap"`` its cap on W). A run summary has ``critical_w``,
            ``w_star_at_crossing``, ``push_ratio``, ``balance_w``, ``balance_w_max``, ``w_cap_share`` and the band
            keys of :func:`stare_lab.platform.summary.band_held` (``summary.json`` of any source).

    Returns:
        *measured* for each M with STARE groups at a fixed W (``"w"`` given): :func:`measured_strength` over
        their W values (seeds of one W pooled) — with a single W that held, an upper bound (range ≤ W);
        *predicted* for each M: the median over the runs that held the band (:func:`~stare_lab.platform.summary.band_held`)
        of every STARE group with that M of their ``critical_w`` (largest W*(t) over the second half);
        *conservative* for O1 (also without an O1 STARE group: a GRPO run alone gives it): the median over the
        GRPO groups' runs of ``w_star_at_crossing``, else —
        without GRPO — over the O1 STARE groups' runs (the gate is off until the crossing, so their trajectory
        is GRPO's up to there); for C2 at M: over the C2 groups' own runs (W* with their M). Low / high: the range
        over those runs. A first-order strength is labelled a lower bound (:func:`lower_bound_reason`);
        *auto* for each variant with auto groups (:func:`auto_strength`; for C2 at M = 1/W). The auto groups give
        only that one: their balance is the measurement along the same trajectory, and C2's applied M moves with W.
        None at all when the target sits at GRPO's floor (:func:`at_grpo_floor`).
    """
    out: list[CriticalStrength] = []
    if at_grpo_floor(groups):
        return out
    auto = [g for g in groups if g.get("auto")]
    groups = [g for g in groups if not g.get("auto")]
    ms: list[float | None] = [None] if any(not g.get("stare") and g.get("grpo") for g in groups) else []
    for g in groups:
        if g.get("stare") and not any(_same_m(g.get("m"), x) for x in ms):
            ms.append(None if g.get("m") in (None, 1.0) else float(g["m"]))
    for m in ms:
        mine = [g for g in groups if g.get("stare") and _same_m(g.get("m"), m)]
        fixed = [g for g in mine if _finite(g.get("w")) and g.get("runs")]
        if fixed:
            held_by_w: dict[float, list[bool | None]] = {}
            for g in fixed:
                held_by_w.setdefault(float(g["w"]), []).extend(band_held(r) for r in g.get("runs") or [])
            seeds = max(len(v) for v in held_by_w.values())
            meas = measured_strength(held_by_w, m, f"runs at a fixed W: {_labels([g['label'] for g in fixed])}; "
                                                   f"W {', '.join(f'{w:g}' for w in sorted(held_by_w))}; {seeds} seeds")
            if meas is not None and meas.w is not None and meas.low is None:  # held at the smallest W it ran
                meas = dataclasses.replace(meas, source=f"{meas.source}: held on every seed at the smallest W run, "
                                                        "an upper bound of the critical W")
            if meas is not None:
                out.append(meas)
        held = [(g, r) for g in mine for r in g.get("runs") or [] if band_held(r)]
        pred = strength_from_values("predicted", [r.get("critical_w") for _, r in held], m,
                                    f"{len(held)} held runs of {_labels([g['label'] for g, _ in held])}")
        if pred is not None:
            why = lower_bound_reason([r for _, r in held], any(g.get("sampled") for g, _ in held))
            out.append(dataclasses.replace(pred, lower_bound=why))
        base = [g for g in groups if not g.get("stare") and g.get("grpo")] if m is None else []
        src = base or mine
        runs = [r for g in src for r in g.get("runs") or []]
        cons = strength_from_values(
            "conservative", [r.get("w_star_at_crossing") for r in runs], m,
            f"{len(runs)} runs of {_labels([g['label'] for g in src])}"
            + (" (GRPO's trajectory up to the crossing: the gate is off until then)" if not base else ""))
        if cons is not None:
            why = lower_bound_reason(runs, any(g.get("sampled") for g in src))
            out.append(dataclasses.replace(cons, lower_bound=why))
    out += [x for x in (auto_strength(auto, v) for v in ("O1", "C2")) if x is not None]
    return out
