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
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

__all__ = [
    "KEY_D_GRPO", "KEY_D_LPLUS", "KEY_D_LMINUS", "KEY_D_RATIO", "KEY_LPLUS_ABOVE", "KEY_W_STAR", "w_star", "w_star_series", "critical_w", "w_star_at_crossing",
    "measured_critical_w", "tolerance", "decomposition_summary", "DECOMPOSITION_KEYS", "REGIME_RATIO",
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
        ``(step index of the crossing, W*)``; ``(None, None)`` if the entropy never falls below ``target``.
    """
    cross = next((i for i, h in enumerate(entropy) if _finite(h) and h < target), None)
    if cross is None:
        return None, None
    n = len(entropy)
    a = max(0, min(cross - window // 2, n - window))
    b = min(n, a + window)
    lm = _sums(d_lminus, a, b) if d_lminus is not None else 0.0
    return cross, w_star(_sums(d_grpo, a, b), _sums(d_lplus, a, b), lm, m)


def measured_critical_w(deviations: Mapping[float, Sequence[float | None]], band: float) -> float | None:
    """The critical W measured on a grid: the smallest grid W whose runs hold the band on every seed, i.e. every
    seed's mean |H − H_tgt| over the second half is below ``band`` (nats). ``deviations`` maps each grid W to the
    per-seed deviations (``None`` = not measured: that W does not hold). ``None`` if no grid W holds."""
    held = [w for w, devs in deviations.items() if devs and all(_finite(d) and d < band for d in devs)]
    return min(held) if held else None


def tolerance(measured_w: float, grid_step: float) -> float:
    """The agreement a prediction of the critical W must reach (issue 13): max(35 % of W − 1, one grid step)."""
    return max(0.35 * (measured_w - 1.0), grid_step)


#: a push acting at less than this share of its first-order size means the step size is outside the theory's regime
REGIME_RATIO = 0.8

#: the keys of :func:`decomposition_summary`, in order
DECOMPOSITION_KEYS = ("push_ratio", "critical_w", "critical_w_measured_drift", "crossing_step", "w_star_at_crossing")


def decomposition_summary(
    rows: Sequence[Mapping[str, Any]], target_entropy: float | None, *, reweight_m: float = 1.0, window: int = 1
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
    * ``crossing_step`` / ``w_star_at_crossing``: :func:`w_star_at_crossing` at ``target_entropy`` (the
      conservative estimate from a GRPO run).
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
    dl = [num(r.get(KEY_D_LPLUS)) for r in rows]
    dm = [num(r.get(KEY_D_LMINUS)) for r in rows] if m != 1.0 else None
    window = max(1, min(int(window), len(rows) // 4 or 1))
    out["critical_w"] = num(critical_w(dg, dl, dm, m, window))
    if "stare/grpo_measured" in rows[0]:
        measured = [num(r.get("stare/grpo_measured")) for r in rows]
        out["critical_w_measured_drift"] = num(critical_w(measured, dl, dm, m, window))
    if target_entropy is not None:
        step, w = w_star_at_crossing([num(r.get("entropy")) for r in rows], target_entropy, dg, dl, dm, m, window)
        out["crossing_step"] = rows[step].get("step") if step is not None else None
        out["w_star_at_crossing"] = num(w)
    return out
