"""The ONE definition of a run's summary statistics (docs/design.md §4: ``summary.json`` is recomputable from
``metrics.jsonl``), used by the simulators, the trainer and ``stare-lab analyze`` alike.

:func:`run_summary` reads only the run-format keys of the metrics rows (``step``, ``entropy``, ``entropy_change``,
``pred_entropy_change``, ``reward``, ``accuracy``, ``gate_on``, ``time/step_s``) and three settings: the target
entropy H_tgt, the band half-width and the collapse fraction (:func:`summary_settings` reads them from a run's
resolved ``config.yaml``). A value that is missing, null, non-finite or not a number is skipped; a statistic with
nothing to compute from is None. Entropies in nats, times in seconds.

The definitions, chosen once (where the three earlier copies differed, the choice and the reason):

* ``initial_entropy``: the first finite ``entropy``.
* ``final_entropy``: the entropy of the final policy as far as the rows tell: the last row with a finite
  ``entropy``, plus its measured ``entropy_change`` when that is finite (the change of that row's update), else
  that entropy alone. (The simulators reported this; the report took the last entropy, measured *before* the last
  update, so the two disagreed for the same runs.)
* ``min_entropy``: the least of the finite entropies and ``final_entropy``.
* ``steps_to_collapse``: the ``step`` of the first row whose entropy is below ``collapse_frac × initial_entropy``
  (strictly), None if none is.
* ``final_reward`` / ``final_accuracy``: the mean of the finite values among the last max(1, ⌊0.1·n⌋) of the n
  rows (:data:`FINAL_FRACTION`). A mean, not the last value: one sampled batch's reward is noisy. (The trainer
  reported the last value under the same key.)
* ``time_in_band``: the fraction of the rows with a finite entropy whose |H − H_tgt| ≤ band — a closed band, so
  H_tgt ± band both count. (The report used < band.)
* ``mean_abs_dev_second_half``: the mean |H − H_tgt| over the finite entropies of the rows from ⌊n/2⌋ on.
* ``held``: whether the run **held the band** (:func:`band_held`, docs/theory.md §7): its mean |H − H_tgt| over the
  second half is below the held band min(band, :data:`BAND_REL` · H_tgt) *and* its final entropy is at least
  :data:`HELD_FINAL_FRAC` · H_tgt. The band shrinks with a small target so that a run whose entropy collapsed never
  counts as held (with the fixed 0.05-nat band, a GRPO run that fell to 0 counted as held once H_tgt ≲ 0.1); the
  final-entropy clause catches a run that held most of the second half and then collapsed. None without a target.
* ``gate_on_frac``: the mean of the finite ``gate_on`` values (booleans count 0/1).
* ``w_mean_second_half`` / ``w_cap_share`` (adaptive W schedule only, ``w_max`` given): the mean of the finite
  ``stare_w`` over the rows from ⌊n/2⌋ on, and the share of the rows whose W is at the cap (W ≥ w_max − 1e-9):
  a band held with W at its cap has no headroom left. The share counts the rows from ⌊n/2⌋ on for the paper's
  schedule; for the auto schedule (``schedule="auto"``) the rows from the first row with H < H_tgt on (where its W
  starts to move; None without such a row): a cap that binds while the schedule acquires its W is reported too. Both
  None for a run without the adaptive schedule.
* ``balance_w`` / ``balance_m``: the push that held, 1 + mean gate·(W − 1) and 1 − mean gate·(1 − M) over the rows
  from ⌊n/2⌋ with finite ``gate_on`` and ``stare_w`` (``stare_m``) (docs/theory.md §9): for a run that held the
  band, the strength this model needed at this target and learning rate (the W of a fixed-W run that would just
  hold it). ``balance_m`` only for variant C2 (``variant="C2"``): O1 never applies M, whatever M its rows log, so
  it is None for O1, a baseline or an unknown variant. None without those keys.
* ``balance_w_max``: the largest balance W over windows of max(5, ⌊n/10⌋) consecutive rows of the second half:
  the push the strongest stretch of the hold needed. The fixed W an auto run recommends (docs/theory.md §9): a
  fixed W must cover the strongest drift, not the mean one. None without the keys.
* ``crossing_step``: the ``step`` of the first row whose entropy is below H_tgt (strictly); None if none, or if the
  first finite entropy is already below it (no drift carried the run there).
* ``steps_to_band``: steps from ``crossing_step`` to the first step s ≥ it from which the mean |H − H_tgt| over the
  next :data:`BAND_WINDOW` rows is within the held band (:func:`held_band`); None when there is no crossing or it
  never is. The time a controller takes to bring the entropy into the band after the crossing.
* ``pred_*``: :func:`fit_prediction` of the measured ``entropy_change`` on ``pred_entropy_change``: the line needs
  at least :data:`MIN_FIT_PAIRS` = 3 pairs (a line through 2 points fits them exactly: R² = 1 says nothing) and a
  non-constant prediction; R² as ``scipy.stats.linregress`` gives it (r², 0 for a constant measurement). (The
  simulators fitted from 2 points.)
* ``wall_s``: the sum of the finite ``time/step_s``; None if no row has one.
* ``steps``: the number of rows; ``target_entropy``, ``band``, ``collapse_frac``: the settings used.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from stare_lab.errors import ConfigError

__all__ = [
    "SUMMARY_KEYS",
    "ROW_KEYS",
    "FINAL_FRACTION",
    "MIN_FIT_PAIRS",
    "DEFAULT_BAND",
    "DEFAULT_COLLAPSE_FRAC",
    "BAND_REL",
    "HELD_FINAL_FRAC",
    "held_band",
    "band_held",
    "run_summary",
    "summary_settings",
    "fit_prediction",
    "tail_mean",
    "final_entropy",
    "first_step_below",
    "fraction_in_band",
    "number",
    "w_cap",
]

#: The keys of :func:`run_summary`, in order.
SUMMARY_KEYS = (
    "steps",
    "initial_entropy",
    "final_entropy",
    "min_entropy",
    "target_entropy",
    "band",
    "collapse_frac",
    "steps_to_collapse",
    "final_reward",
    "final_accuracy",
    "time_in_band",
    "mean_abs_dev_second_half",
    "held",
    "gate_on_frac",
    "w_mean_second_half",
    "w_cap_share",
    "balance_w",
    "balance_m",
    "balance_w_max",
    "crossing_step",
    "steps_to_band",
    "pred_n",
    "pred_slope",
    "pred_intercept",
    "pred_r2",
    "pred_rel_err",
    "wall_s",
)
#: The metrics-row keys :func:`run_summary` reads (besides ``step``).
ROW_KEYS = ("entropy", "entropy_change", "pred_entropy_change", "reward", "accuracy", "gate_on", "time/step_s",
            "stare_w", "stare_m")
#: ``final_reward`` / ``final_accuracy`` average the last max(1, ⌊FINAL_FRACTION · n⌋) rows.
FINAL_FRACTION = 0.1
#: A fitted line needs at least this many (predicted, measured) pairs.
MIN_FIT_PAIRS = 3
#: Default half-width (nats) of the band around H_tgt.
DEFAULT_BAND = 0.05
#: Default collapse fraction: collapsed below 10 % of the initial entropy.
DEFAULT_COLLAPSE_FRAC = 0.1
#: The band a run must hold is at most this fraction of H_tgt wide (half-width): a run held in it has a mean entropy
#: over the second half of at least (1 − BAND_REL)·H_tgt, so a collapsed run (H → 0: deviation ≈ H_tgt) never holds.
BAND_REL = 0.25
#: A run whose final entropy is below this fraction of H_tgt did not hold the band, whatever its mean deviation.
HELD_FINAL_FRAC = 0.5
#: W within this of w_max counts as at the cap (the adaptive schedule clips W to exactly w_max)
CAP_TOL = 1e-9
#: rows over which ``steps_to_band`` averages |H − H_tgt|
BAND_WINDOW = 10


def number(value: Any) -> float | None:
    """``value`` as a float if it is a finite real number (booleans count 0/1), else None."""
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    return None


def tail_mean(values: Sequence[Any], frac: float = FINAL_FRACTION) -> float | None:
    """Mean of the finite entries among the last max(1, ⌊frac·n⌋) of the n ``values``; None if none is finite.

    (⌊frac·n⌋ with a 1e-9 allowance: 0.1·30 is 3, although 0.1 is not exact in binary.)
    """
    n = len(values)
    if n == 0:
        return None
    tail = [x for x in (number(v) for v in values[n - max(1, int(n * frac + 1e-9)):]) if x is not None]
    return sum(tail) / len(tail) if tail else None


def final_entropy(entropies: Sequence[Any], changes: Sequence[Any]) -> float | None:
    """The last finite entropy plus its row's finite ``entropy_change`` (else the entropy alone); None if no
    entropy is finite. ``entropies`` and ``changes`` are aligned per row."""
    for h, dh in zip(reversed(entropies), reversed(changes)):
        h = number(h)
        if h is not None:
            d = number(dh)
            return h + d if d is not None else h
    return None


def first_step_below(steps: Sequence[Any], entropies: Sequence[Any], threshold: float | None) -> Any:
    """The step of the first row whose finite entropy is strictly below ``threshold``; None if none (or no
    threshold)."""
    if threshold is None:
        return None
    for s, h in zip(steps, entropies):
        h = number(h)
        if h is not None and h < threshold:
            return s
    return None


def fraction_in_band(entropies: Iterable[Any], target: float | None, band: float = DEFAULT_BAND) -> float | None:
    """Fraction of the finite entropies with |H − target| ≤ band (closed band); None without a target or a finite
    entropy."""
    if number(target) is None:
        return None
    h = [x for x in (number(v) for v in entropies) if x is not None]
    return sum(abs(x - target) <= band for x in h) / len(h) if h else None


def fit_prediction(predicted: Iterable[Any], measured: Iterable[Any]) -> dict[str, Any]:
    """Agreement of measured one-step ΔH with its first-order prediction (nats), over the pairs with both finite.

    Returns a dict: ``n`` (pairs); the least-squares line measured ≈ slope·predicted + intercept — ``slope``,
    ``intercept``, ``r2`` (r² as ``scipy.stats.linregress``; 0 for a constant measurement) — None with fewer than
    :data:`MIN_FIT_PAIRS` pairs or a constant prediction; the identity line's ``r2_identity`` =
    1 − Σ(m − p)²/Σ(m − m̄)² (None for a constant measurement), ``rmse`` = √mean((m − p)²) and ``rel_err`` =
    ‖m − p‖/‖m‖ (None for ‖m‖ = 0), from 1 pair on; ``reason``: why the line is None, else None.

    Source: ordinary least squares from centred moments (equal to ``scipy.stats.linregress``).
    """
    pairs = [(p, m) for p, m in ((number(a), number(b)) for a, b in zip(predicted, measured))
             if p is not None and m is not None]
    out: dict[str, Any] = {"n": len(pairs), "slope": None, "intercept": None, "r2": None, "r2_identity": None,
                           "rmse": None, "rel_err": None, "reason": None}
    if not pairs:
        out["reason"] = "no pairs with both values finite"
        return out
    p = np.array([a for a, _ in pairs], dtype=np.float64)
    m = np.array([b for _, b in pairs], dtype=np.float64)
    res = m - p
    ss_res = float(res @ res)
    dm = m - m.mean()
    ss_tot = float(dm @ dm)
    norm_m = float(np.sqrt(m @ m))
    out["rmse"] = math.sqrt(ss_res / len(pairs))
    out["r2_identity"] = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    out["rel_err"] = math.sqrt(ss_res) / norm_m if norm_m > 0 else None
    if len(pairs) < MIN_FIT_PAIRS:
        out["reason"] = f"only {len(pairs)} finite pair(s); a fit needs {MIN_FIT_PAIRS}"
        return out
    dp = p - p.mean()
    sxx, sxy = float(dp @ dp), float(dp @ dm)
    if sxx == 0:
        out["reason"] = "predicted values are constant"
        return out
    slope = sxy / sxx
    out["slope"] = slope
    out["intercept"] = float(m.mean() - slope * p.mean())
    out["r2"] = min(sxy * sxy / (sxx * ss_tot), 1.0) if ss_tot > 0 else 0.0
    return out


def held_band(band: float, target_entropy: float) -> float:
    """The half-width (nats) of the band a run must hold: min(``band``, :data:`BAND_REL` · H_tgt) (docs/theory.md §7).
    Equals ``band`` for H_tgt ≥ 4·band (0.2 nats at the default 0.05)."""
    return min(float(band), BAND_REL * float(target_entropy))


def band_held(summary: Mapping[str, Any]) -> bool | None:
    """Whether a run held the band, from its summary statistics (``mean_abs_dev_second_half``, ``target_entropy``,
    ``band``, ``final_entropy``; the module docstring's ``held``): mean |H − H_tgt| over the second half <
    :func:`held_band` and final entropy ≥ :data:`HELD_FINAL_FRAC` · H_tgt. None when the deviation or the target is
    missing (no band criterion: not held either). Works on any ``summary.json`` written before ``held`` existed."""
    dev, target = number(summary.get("mean_abs_dev_second_half")), number(summary.get("target_entropy"))
    if dev is None or target is None:
        return None
    band = number(summary.get("band"))
    final = number(summary.get("final_entropy"))
    return dev < held_band(DEFAULT_BAND if band is None else band, target) and (
        final is None or final >= HELD_FINAL_FRAC * target)


def _w_stats(rows: Sequence[Mapping[str, Any]], w_max: Any, target: float | None, auto: bool
             ) -> tuple[float | None, float | None]:
    """``(w_mean_second_half, w_cap_share)`` of the module docstring; (None, None) without ``w_max`` or W."""
    cap = number(w_max)
    if cap is None:
        return None, None
    ws = [x for x in (number(r.get("stare_w")) for r in rows[len(rows) // 2:]) if x is not None]
    if not ws:
        return None, None
    mean = sum(ws) / len(ws)
    if auto:  # from the first row below the target on: the auto schedule's W moves from there
        below = [i for i, r in enumerate(rows) if target is not None and (h := number(r.get("entropy"))) is not None
                 and h < target]
        ws = [x for x in (number(r.get("stare_w")) for r in rows[below[0]:]) if x is not None] if below else []
        if not ws:
            return mean, None
    return mean, sum(w >= cap - CAP_TOL for w in ws) / len(ws)


def _balance(rows: Sequence[Mapping[str, Any]], c2: bool) -> tuple[float | None, float | None, float | None]:
    """``(balance_w, balance_m, balance_w_max)`` of the module docstring (``balance_m`` None unless ``c2``)."""
    pw, pm = [], []
    for r in rows[len(rows) // 2:]:
        gate, w, m = number(r.get("gate_on")), number(r.get("stare_w")), number(r.get("stare_m"))
        if gate is not None and w is not None:
            pw.append(gate * (w - 1.0))
        if c2 and gate is not None and m is not None:
            pm.append(gate * (1.0 - m))
    if not pw:
        return None, (1.0 - sum(pm) / len(pm) if pm else None), None
    width = min(len(pw), max(5, len(rows) // 10))
    windows = [sum(pw[i:i + width]) / width for i in range(len(pw) - width + 1)]
    return 1.0 + sum(pw) / len(pw), (1.0 - sum(pm) / len(pm) if pm else None), 1.0 + max(windows)


def _steps_to_band(steps: Sequence[Any], entropies: Sequence[Any], target: float, band: float) -> tuple[Any, Any]:
    """``(crossing_step, steps_to_band)`` of the module docstring."""
    h = [number(v) for v in entropies]
    cross = next((i for i, x in enumerate(h) if x is not None and x < target), None)
    first = next((i for i, x in enumerate(h) if x is not None), None)
    if cross is None or cross == first:
        return None, None
    width = held_band(band, target)
    for i in range(cross, len(h)):
        window = [x for x in h[i:i + BAND_WINDOW] if x is not None]
        if len(window) == min(BAND_WINDOW, len(h) - i) and window and \
                sum(abs(x - target) for x in window) / len(window) < width:
            start, at = number(steps[cross]), number(steps[i])
            return steps[cross], (at - start if start is not None and at is not None else i - cross)
    return steps[cross], None


def _check_settings(target_entropy: Any, band: Any, collapse_frac: Any) -> float | None:
    if number(band) is None or band < 0:
        raise ConfigError(f"band={band!r} must be a finite number >= 0 (nats)")
    if number(collapse_frac) is None or not 0 <= collapse_frac <= 1:
        raise ConfigError(f"collapse_frac={collapse_frac!r} is outside [0, 1]")
    target = number(target_entropy)
    return target if target is not None and target >= 0 else None


def run_summary(
    rows: Sequence[Mapping[str, Any]],
    *,
    target_entropy: float | None = None,
    band: float = DEFAULT_BAND,
    collapse_frac: float = DEFAULT_COLLAPSE_FRAC,
    w_max: float | None = None,
    variant: str | None = None,
    schedule: str | None = None,
) -> dict[str, Any]:
    """A run's summary statistics from its metrics rows (definitions in the module docstring).

    Args:
        rows: the metrics rows in step order (``metrics.jsonl``; docs/design.md §4 keys).
        target_entropy: H_tgt (nats); None, or a non-finite / negative value, → no band statistics (None).
        band: half-width (nats) of the band around H_tgt, ≥ 0.
        collapse_frac: the collapse threshold as a fraction of the initial entropy, in [0, 1].
        w_max: the adaptive schedule's cap on W (``loss.stare.w_max``) for a run with ``loss.stare.adaptive``;
            None otherwise (then ``w_mean_second_half`` / ``w_cap_share`` are None).
        variant: the STARE variant the run applies (``loss.stare.variant``: ``"O1"`` / ``"C2"``); ``balance_m`` only
            for ``"C2"``. None: a baseline, or not known.
        schedule: the adaptive schedule (``loss.stare.schedule``: ``"paper"`` / ``"auto"``) of a run with ``w_max``;
            ``"auto"`` counts ``w_cap_share`` from the first row below H_tgt on.

    Returns:
        A dict with exactly :data:`SUMMARY_KEYS`; plain Python numbers or None (JSON-ready).

    Raises:
        ConfigError: ``band`` or ``collapse_frac`` out of range.
    """
    target = _check_settings(target_entropy, band, collapse_frac)
    out: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS)
    out.update(steps=len(rows), target_entropy=target, band=float(band), collapse_frac=float(collapse_frac))
    col = lambda key: [r.get(key) for r in rows]  # noqa: E731
    ent_raw = col("entropy")
    h = [x for x in (number(v) for v in ent_raw) if x is not None]
    out["final_reward"] = tail_mean(col("reward"))
    out["final_accuracy"] = tail_mean(col("accuracy"))
    gates = [x for x in (number(v) for v in col("gate_on")) if x is not None]
    out["gate_on_frac"] = sum(gates) / len(gates) if gates else None
    walls = [x for x in (number(v) for v in col("time/step_s")) if x is not None]
    out["wall_s"] = sum(walls) if walls else None
    out["w_mean_second_half"], out["w_cap_share"] = _w_stats(rows, w_max, target, schedule == "auto")
    out["balance_w"], out["balance_m"], out["balance_w_max"] = _balance(rows, str(variant).upper() == "C2")
    fit = fit_prediction(col("pred_entropy_change"), col("entropy_change"))
    out.update(pred_n=fit["n"], pred_slope=fit["slope"], pred_intercept=fit["intercept"], pred_r2=fit["r2"],
               pred_rel_err=fit["rel_err"])
    if not h:
        return out
    final = final_entropy(ent_raw, col("entropy_change"))
    out.update(initial_entropy=h[0], final_entropy=final, min_entropy=min(h + [final]))
    out["steps_to_collapse"] = first_step_below(col("step"), ent_raw, collapse_frac * h[0])
    if target is not None:
        out["time_in_band"] = fraction_in_band(h, target, band)
        half = [x for x in (number(v) for v in ent_raw[len(rows) // 2:]) if x is not None]
        out["mean_abs_dev_second_half"] = sum(abs(x - target) for x in half) / len(half) if half else None
        out["held"] = band_held(out)
        out["crossing_step"], out["steps_to_band"] = _steps_to_band(col("step"), ent_raw, target, float(band))
    return out


def w_cap(stare: Mapping[str, Any] | None) -> float | None:
    """The adaptive schedule's cap on W from a run's ``loss.stare`` settings (a dict of ``config.yaml``):
    ``auto_w_max`` for ``schedule: auto``, ``w_max`` for the paper's schedule; None when ``adaptive`` is not true
    (W fixed) or the cap is not a number. The dict form of :attr:`stare_lab.config.STAREConfig.w_cap`."""
    if not isinstance(stare, Mapping) or stare.get("adaptive") is not True:
        return None
    return number(stare.get("auto_w_max" if stare.get("schedule") == "auto" else "w_max"))


def summary_settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The summary settings of a run from its resolved config (``config.yaml`` as a dict, docs/design.md §4):
    ``target_entropy`` = ``loss.stare.target_entropy``; ``band`` and ``collapse_frac`` = the top-level keys of
    those names when the source has them (the tabular simulator), else :data:`DEFAULT_BAND` /
    :data:`DEFAULT_COLLAPSE_FRAC`; ``w_max`` = the adaptive schedule's cap on W when ``loss.stare.adaptive`` is true
    (``loss.stare.auto_w_max`` for ``schedule: auto``, else ``loss.stare.w_max``), else None; ``variant`` =
    ``loss.stare.variant`` (``"O1"`` when not set; None without ``loss.stare``); ``schedule`` =
    ``loss.stare.schedule`` (default ``"paper"``) when ``w_max`` is set, else None.
    Pass the result to :func:`run_summary` as keywords."""
    config = config if isinstance(config, Mapping) else {}
    stare = (config.get("loss") or {}).get("stare") if isinstance(config.get("loss"), Mapping) else None
    target = stare.get("target_entropy") if isinstance(stare, Mapping) else None
    band, frac = config.get("band"), config.get("collapse_frac")
    cap = w_cap(stare)
    return {"target_entropy": number(target),
            "band": float(band) if number(band) is not None else DEFAULT_BAND,
            "collapse_frac": float(frac) if number(frac) is not None else DEFAULT_COLLAPSE_FRAC,
            "w_max": cap,
            "variant": str(stare.get("variant") or "O1").upper() if isinstance(stare, Mapping) else None,
            "schedule": str(stare.get("schedule") or "paper") if cap is not None else None}
