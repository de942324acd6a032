"""Per-run statistics from metrics rows (any simulator kind): what ``summary.json`` and the end table report.

Works on the run-directory format of design.md §4 only (``entropy``, ``reward``, ``gate_on``,
``pred_entropy_change``, ``entropy_change``, ``time/step_s``), so the sweep can summarise tabular and transformer
runs alike.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

__all__ = ["fit_line", "run_stats", "STAT_KEYS", "REGIME_RATIO"]

#: the keys :func:`run_stats` returns
STAT_KEYS = (
    "steps",
    "initial_entropy",
    "final_entropy",
    "min_entropy",
    "target_entropy",
    "steps_to_collapse",
    "final_reward",
    "time_in_band",
    "mean_abs_dev_second_half",
    "gate_on_frac",
    "pred_r2",
    "pred_slope",
    "pred_rel_err",
    "push_ratio",
    "critical_w",
    "critical_w_measured_drift",
    "crossing_step",
    "w_star_at_crossing",
    "wall_s",
)

#: a push acting at less than this share of its first-order size means the step size is outside the theory's regime
REGIME_RATIO = 0.8


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def fit_line(pred: list[float], meas: list[float]) -> dict[str, float | None]:
    """Least-squares fit ``meas ≈ intercept + slope·pred`` → ``{"slope", "intercept", "r2", "rel_err"}``.

    ``r2`` is the coefficient of determination of the fit; ``rel_err`` = ‖meas − pred‖ / ‖meas‖ (agreement with
    the identity line). Values are ``None`` where undefined (fewer than 2 points, or no variance).
    """
    pts = [(p, m) for p, m in zip(pred, meas) if p is not None and m is not None]
    if len(pts) < 2:
        return {"slope": None, "intercept": None, "r2": None, "rel_err": None}
    x = torch.tensor([p for p, _ in pts], dtype=torch.float64)
    y = torch.tensor([m for _, m in pts], dtype=torch.float64)
    xc, yc = x - x.mean(), y - y.mean()
    sxx, syy = float((xc * xc).sum()), float((yc * yc).sum())
    norm_y = float(y.norm())
    rel = float((y - x).norm()) / norm_y if norm_y > 0 else None
    if sxx == 0 or syy == 0:
        return {"slope": None, "intercept": None, "r2": None, "rel_err": rel}
    slope = float((xc * yc).sum()) / sxx
    intercept = float(y.mean()) - slope * float(x.mean())
    r2 = 1.0 - float(((yc - slope * xc) ** 2).sum()) / syy
    return {"slope": slope, "intercept": intercept, "r2": r2, "rel_err": rel}


def run_stats(
    rows: list[dict[str, Any]],
    target_entropy: float | None,
    collapse_frac: float = 0.1,
    band: float = 0.05,
    final_entropy: float | None = None,
    reweight_m: float = 1.0,
    window: int = 1,
) -> dict[str, Any]:
    """Statistics of one run's metrics rows (entropies in nats).

    Returns a dict with :data:`STAT_KEYS`: ``initial_entropy`` (first row), ``final_entropy`` (``final_entropy`` if
    given, else the last row's entropy plus its measured change when known), ``min_entropy``, ``target_entropy``,
    ``steps_to_collapse`` (first step whose entropy is below collapse_frac × initial, else None),
    ``final_reward`` (mean reward over the last 10 % of the rows), ``time_in_band`` (fraction of rows with
    |H − H_tgt| ≤ band), ``mean_abs_dev_second_half`` (mean |H − H_tgt| over the second half of the rows),
    ``gate_on_frac``, the fit of measured on predicted one-step ΔH (``pred_r2``, ``pred_slope``, ``pred_rel_err``;
    :func:`fit_line`) and ``wall_s`` (sum of ``time/step_s``). Undefined values are None (no rows, no target).

    From the decomposition keys (science.md §7, :mod:`stare_lab.critical`; None where the run does not log them):
    ``push_ratio`` = median of ``stare/push_ratio`` over the steps whose push acted (gate on), or over every step
    when it never did (then the push is the simulator's probe, which is not applied); below :data:`REGIME_RATIO`
    the step size is outside the first-order regime. ``critical_w`` = :func:`stare_lab.critical.critical_w` over
    the second half (D terms summed over ``window`` steps; ``reweight_m`` the run's M for C2, 1 for O1), meaningful
    for a run that holds the band; ``critical_w_measured_drift`` the same with the measured one-step change of the
    ω ≡ 1 update (``stare/grpo_measured``: second order included) in place of D_GRPO; ``crossing_step`` / ``w_star_at_crossing`` =
    :func:`stare_lab.critical.w_star_at_crossing` at H_tgt (the conservative estimate of a GRPO run).
    """
    out: dict[str, Any] = {k: None for k in STAT_KEYS}
    out["steps"] = len(rows)
    out["target_entropy"] = _num(target_entropy)
    h = [_num(r.get("entropy")) for r in rows]
    h = [x for x in h if x is not None]
    if not rows or not h:
        return out
    last = rows[-1]
    if final_entropy is None:
        dh = _num(last.get("entropy_change"))
        e = _num(last.get("entropy"))
        final_entropy = e + dh if (e is not None and dh is not None) else e
    out["initial_entropy"] = h[0]
    out["final_entropy"] = final_entropy
    out["min_entropy"] = min(h + ([final_entropy] if final_entropy is not None else []))
    out["steps_to_collapse"] = next(
        (r.get("step") for r in rows if _num(r.get("entropy")) is not None and r["entropy"] < collapse_frac * h[0]),
        None,
    )
    tail = [_num(r.get("reward")) for r in rows[-max(1, len(rows) // 10) :]]
    tail = [x for x in tail if x is not None]
    out["final_reward"] = sum(tail) / len(tail) if tail else None
    target = out["target_entropy"]
    if target is not None:
        out["time_in_band"] = sum(abs(x - target) <= band for x in h) / len(h)
        half = [x for x in (_num(r.get("entropy")) for r in rows[len(rows) // 2 :]) if x is not None]
        out["mean_abs_dev_second_half"] = sum(abs(x - target) for x in half) / len(half) if half else None
    gates = [_num(r.get("gate_on")) for r in rows]
    gates = [g for g in gates if g is not None]
    out["gate_on_frac"] = sum(gates) / len(gates) if gates else None
    fit = fit_line([_num(r.get("pred_entropy_change")) for r in rows], [_num(r.get("entropy_change")) for r in rows])
    out["pred_r2"], out["pred_slope"], out["pred_rel_err"] = fit["r2"], fit["slope"], fit["rel_err"]
    out["wall_s"] = sum(_num(r.get("time/step_s")) or 0.0 for r in rows)
    out.update(_decomposition_stats(rows, target, reweight_m, window))
    return out


def _decomposition_stats(rows: list[dict[str, Any]], target: float | None, m: float, window: int) -> dict[str, Any]:
    """``push_ratio``, ``critical_w``, ``crossing_step``, ``w_star_at_crossing`` of :func:`run_stats`."""
    from stare_lab import critical

    out: dict[str, Any] = {"push_ratio": None, "critical_w": None, "critical_w_measured_drift": None,
                           "crossing_step": None, "w_star_at_crossing": None}
    acted = [_num(r.get("stare/push_ratio")) for r in rows if r.get("gate_on")]
    acted = [x for x in acted if x is not None]
    if not acted:
        acted = [x for x in (_num(r.get("stare/push_ratio")) for r in rows) if x is not None]
    if acted:
        out["push_ratio"] = float(statistics.median(acted))
    if not rows or critical.KEY_D_GRPO not in rows[0] or critical.KEY_D_LPLUS not in rows[0]:
        return out
    dg = [_num(r.get(critical.KEY_D_GRPO)) for r in rows]
    dl = [_num(r.get(critical.KEY_D_LPLUS)) for r in rows]
    dm = [_num(r.get(critical.KEY_D_LMINUS)) for r in rows] if m != 1.0 else None
    window = max(1, min(window, len(rows) // 4 or 1))
    out["critical_w"] = _num(critical.critical_w(dg, dl, dm, m, window))
    if "stare/grpo_measured" in rows[0]:
        measured = [_num(r.get("stare/grpo_measured")) for r in rows]
        out["critical_w_measured_drift"] = _num(critical.critical_w(measured, dl, dm, m, window))
    if target is not None:
        step, w = critical.w_star_at_crossing([_num(r.get("entropy")) for r in rows], target, dg, dl, dm, m, window)
        out["crossing_step"] = rows[step].get("step") if step is not None else None
        out["w_star_at_crossing"] = _num(w)
    return out
