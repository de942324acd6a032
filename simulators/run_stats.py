"""Per-run statistics for the simulators: the core's one run summary (:func:`stare_lab.platform.summary.run_summary`; the
definitions are documented there) plus the first-order decomposition statistics of
:func:`stare_lab.theory.critical.decomposition_summary` (push ratio, critical W, W* at the H_tgt crossing).

:func:`run_stats` and :func:`fit_line` keep their signatures; :data:`STAT_KEYS` =
:data:`stare_lab.platform.summary.SUMMARY_KEYS` + :data:`stare_lab.theory.critical.DECOMPOSITION_KEYS`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from stare_lab.theory.critical import DECOMPOSITION_KEYS, KEY_D_RATIO, KEY_W_STAR, REGIME_RATIO, decomposition_summary, w_star
from stare_lab.platform.summary import SUMMARY_KEYS, fit_prediction, run_summary

logger = logging.getLogger(__name__)

__all__ = ["fit_line", "run_stats", "step_observables", "STAT_KEYS", "REGIME_RATIO"]

#: the keys :func:`run_stats` returns
STAT_KEYS = SUMMARY_KEYS + DECOMPOSITION_KEYS


def fit_line(pred: list[float], meas: list[float]) -> dict[str, float | None]:
    """``{"slope", "intercept", "r2", "rel_err"}`` of :func:`stare_lab.platform.summary.fit_prediction` (measured on
    predicted; the line needs 3 pairs, ``rel_err`` = ‖meas − pred‖ / ‖meas‖ from 1 pair; None where undefined)."""
    fit = fit_prediction(pred, meas)
    return {k: fit[k] for k in ("slope", "intercept", "r2", "rel_err")}


def step_observables(d_grpo: float | None, d_lplus: float | None, d_lminus: float | None = None,
                     m: float = 1.0) -> dict[str, float | None]:
    """Two per-step calibration observables of docs/theory.md §8 from a step's D terms (nats), as every simulator
    logs them: ``pred/d_ratio`` = D_L+/|D_GRPO| (None when D_GRPO is 0 or a term is missing) and ``pred/w_star``
    = W*(t) (:func:`stare_lab.theory.critical.w_star` with the run's M, ``m`` = 1 for O1; ``inf`` — written as null —
    when no W cancels the drift). The third, ``pred/lplus_above_sstar``, needs the tokens
    (:func:`stare_lab.theory.first_order.share_above_critical`)."""
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (d_grpo, d_lplus))
    return {KEY_D_RATIO: d_lplus / abs(d_grpo) if ok and d_grpo != 0 else None,
            KEY_W_STAR: w_star(d_grpo, d_lplus, d_lminus, m)}


def run_stats(
    rows: list[dict[str, Any]],
    target_entropy: float | None,
    collapse_frac: float = 0.1,
    band: float = 0.05,
    final_entropy: float | None = None,
    reweight_m: float = 1.0,
    window: int = 1,
    w_max: float | None = None,
    push_efficiency: float = 1.0,
    variant: str | None = None,
    schedule: str | None = None,
) -> dict[str, Any]:
    """:func:`stare_lab.platform.summary.run_summary` of ``rows`` with these settings (``w_max``: the adaptive schedule's
    cap on W, None for a run without it; ``variant`` / ``schedule``: the run's STARE variant and adaptive schedule,
    None for a baseline) plus
    :func:`stare_lab.theory.critical.decomposition_summary` (``reweight_m``: the run's M for C2, 1 for O1; ``window``: D
    terms summed over that many steps; ``push_efficiency``: the share of the push a tabular toy applies) — a dict
    with :data:`STAT_KEYS`.

    ``final_entropy`` is only checked: the summary must be recomputable from the rows, so ``final_entropy`` is
    the last entropy plus its measured change there; a given value that differs from it by more than rounding is
    logged as a warning (it means the rows lack the last ``entropy_change``).
    """
    out = run_summary(rows, target_entropy=target_entropy, band=band, collapse_frac=collapse_frac, w_max=w_max,
                      variant=variant, schedule=schedule)
    derived = out["final_entropy"]
    if final_entropy is not None and not (derived is not None and math.isclose(final_entropy, derived,
                                                                               rel_tol=1e-12, abs_tol=1e-15)):
        logger.warning("final_entropy=%r given, the rows give %r (last entropy + entropy_change); the summary "
                       "keeps the rows' value", final_entropy, derived)
    out.update(decomposition_summary(rows, target_entropy, reweight_m=reweight_m, window=window,
                                     push_efficiency=push_efficiency))
    return out
