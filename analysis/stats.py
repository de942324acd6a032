"""The numbers behind the report: seed aggregation, prediction fits, thresholds and bands (pure numpy/scipy).

Every function takes plain arrays, treats NaN as "missing" and returns a documented defined value (NaN or None)
instead of raising when there is not enough data. Entropies are in nats.

A run's summary statistics have ONE definition, in the core (:mod:`stare_lab.platform.summary`, also used by the simulators
and the trainer for ``summary.json``): :func:`run_summary` applies it to a loaded run, and the per-array helpers
here (:func:`tail_mean`, :func:`steps_to_threshold`, :func:`fraction_in_band`, :func:`fit_prediction`) delegate
to it, so the report's numbers and each run's ``summary.json`` agree.
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import reduce
from typing import Iterable, Sequence

import numpy as np

from stare_lab.platform import summary as core
__all__ = [
    "run_summary",
    "run_rows",
    "SeedAggregate",
    "aggregate_seeds",
    "t_halfwidth",
    "mean_ci",
    "known_range",
    "clipped_interval",
    "PredictionFit",
    "fit_prediction",
    "binned_fit",
    "first_finite",
    "tail_mean",
    "last_finite",
    "steps_to_threshold",
    "fraction_in_band",
    "normalised_curve",
    "moving_average",
]


def t_halfwidth(std: np.ndarray | float, n: np.ndarray | int, confidence: float = 0.95) -> np.ndarray:
    """Half-width of the two-sided Student-t confidence interval of a mean: t_{(1+c)/2, n−1} · s / √n.

    Args:
        std: sample standard deviation(s) s (ddof = 1).
        n: sample size(s).
        confidence: c ∈ (0, 1), e.g. 0.95.

    Returns:
        float64 array broadcast from ``std`` and ``n``; NaN where n < 2 (a single seed has no band).
    """
    from scipy.special import stdtrit  # Student-t quantile; scipy.special imports 5x faster than scipy.stats

    std = np.asarray(std, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    ok = n >= 2
    df = np.where(ok, n - 1, 1.0)
    t = stdtrit(df, 0.5 + confidence / 2)
    return np.where(ok, t * std / np.sqrt(np.where(ok, n, 1.0)), np.nan)


def mean_ci(values: Iterable[float | None], confidence: float = 0.95) -> tuple[float, float, int]:
    """Mean, t-interval half-width (NaN for fewer than 2 values) and count of the finite entries of ``values``.

    Returns ``(nan, nan, 0)`` if no value is finite.
    """
    arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return math.nan, math.nan, 0
    hw = float(t_halfwidth(arr.std(ddof=1), arr.size, confidence)) if arr.size >= 2 else math.nan
    return float(arr.mean()), hw, int(arr.size)


_FRACTION_RE = re.compile(r"^(final/)?((eval/)?(accuracy|pass@\d+)|frac_in_band|time_in_band|gate_on|"
                          r"quadrant/[a-z_]+/share(/\d+)?)$")
_NONNEG_RE = re.compile(r"^(final/)?(entropy|initial_entropy|final_entropy|n_steps|steps_to_threshold|"
                        r"quadrant/[a-z_]+/count|wall_time_s|time/.*|.*_s)$")


def known_range(key: str) -> tuple[float, float]:
    """The values a statistic can take, from its key: ``(0, 1)`` for fractions and shares (``accuracy``,
    ``pass@k``, ``frac_in_band``, ``gate_on``, ``quadrant/<q>/share``; also as ``final/<key>``), ``(0, inf)`` for
    entropies (nats), counts, step numbers and times (``entropy``, ``quadrant/<q>/count``, ``wall_time_s``,
    ``time/…``, keys ending in ``_s``), else ``(-inf, inf)`` (rewards, ΔH, predictions: no known range)."""
    if _FRACTION_RE.match(key):
        return 0.0, 1.0
    if _NONNEG_RE.match(key):
        return 0.0, math.inf
    return -math.inf, math.inf


def clipped_interval(mean: float, halfwidth: float, bounds: tuple[float, float] = (-math.inf, math.inf)
                     ) -> tuple[float, float, bool]:
    """The interval mean ∓ ``halfwidth`` intersected with ``bounds`` (:func:`known_range`), and whether the
    intersection cut it: ``(low, high, clipped)``. The report's one rule for every seed band it shows, in tables
    and figures: with 3 seeds the 95% t-interval is mean ± 4.30·s/√3, which for a noisy fraction can reach
    outside [0, 1] (review finding: an in-band fraction shown as 0.577 ± 1.1, a wall time as 6.89 ± 34 s).
    NaN ``halfwidth`` (one seed) gives ``(nan, nan, False)``."""
    if not (math.isfinite(mean) and math.isfinite(halfwidth)):
        return math.nan, math.nan, False
    lo, hi = mean - halfwidth, mean + halfwidth
    return max(lo, bounds[0]), min(hi, bounds[1]), lo < bounds[0] or hi > bounds[1]


@dataclasses.dataclass
class SeedAggregate:
    """A metric aggregated over the seeds of a group, on the x values common to all of them.

    Attributes:
        x: ``[S]`` the common x values (steps, or fractions of training), sorted.
        mean: ``[S]`` mean over the seeds with a finite value at that x (NaN if none).
        lo, hi: ``[S]`` mean ∓ t_{(1+c)/2, n−1}·s/√n (NaN where fewer than 2 seeds are finite: no band).
        n: ``[S]`` int, number of finite seeds at each x.
        n_runs: number of series aggregated.
        note: set when the series had different x values (different lengths) and only the common ones were used.
    """

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray
    n_runs: int
    note: str | None = None

    def finite(self) -> "SeedAggregate":
        """The same aggregate restricted to the x values where at least one seed is finite."""
        m = self.n > 0
        return dataclasses.replace(self, x=self.x[m], mean=self.mean[m], lo=self.lo[m], hi=self.hi[m], n=self.n[m])

    def clipped(self, bounds: tuple[float, float]) -> "SeedAggregate":
        """The same aggregate with the band ``lo``/``hi`` clipped to ``bounds`` (:func:`known_range`; the mean is
        inside them already, being a mean of values inside them)."""
        with np.errstate(invalid="ignore"):
            return dataclasses.replace(self, lo=np.clip(self.lo, *bounds), hi=np.clip(self.hi, *bounds))


def aggregate_seeds(
    series: Sequence[tuple[np.ndarray, np.ndarray]], confidence: float = 0.95
) -> SeedAggregate:
    """Mean and confidence band over seeds: mean ± t_{(1+c)/2, n−1} · s/√n per x (s with ddof = 1; scipy's t).

    Args:
        series: ``(x [S_i], values [S_i])`` per run; each x sorted and unique (e.g. :attr:`RunData.steps`).
            NaN values are missing and excluded from that x's mean and count.
        confidence: c of the band (0.95 → the 95% band).

    Returns:
        A :class:`SeedAggregate` on the x values common to every series (intersection); ``note`` says so when
        the series differed. An empty ``series`` gives an empty aggregate.
    """
    if not series:
        e = np.zeros(0)
        return SeedAggregate(e, e, e, e, np.zeros(0, dtype=np.int64), 0)
    xs = [np.asarray(x) for x, _ in series]
    common = reduce(np.intersect1d, xs) if len(xs) > 1 else xs[0]
    note = None
    if any(x.size != common.size for x in xs):
        sizes = sorted({int(x.size) for x in xs})
        note = (
            f"series differ in length ({', '.join(map(str, sizes))} points); "
            f"aggregated on the {common.size} points common to all {len(xs)}"
        )
    mat = np.empty((len(series), common.size), dtype=np.float64)
    for i, (x, v) in enumerate(series):
        mat[i] = np.asarray(v, dtype=np.float64)[np.searchsorted(x, common)]
    fin = np.isfinite(mat)
    n = fin.sum(axis=0)
    z = np.where(fin, mat, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, z.sum(axis=0) / np.maximum(n, 1), np.nan)
        dev = np.where(fin, mat - mean, 0.0)
        std = np.sqrt((dev**2).sum(axis=0) / np.maximum(n - 1, 1))
    hw = t_halfwidth(std, n, confidence)
    return SeedAggregate(common, mean, mean - hw, mean + hw, n.astype(np.int64), len(series), note)


@dataclasses.dataclass
class PredictionFit:
    """Agreement of the first-order prediction with the measured one-step ΔH (both in nats).

    Attributes:
        n: number of (predicted, measured) pairs with both values finite.
        slope, intercept, r2: least-squares fit measured ≈ slope·predicted + intercept and its R² = r² (the
            numbers ``scipy.stats.linregress`` gives; r = 0 for a constant measurement, as there); a perfect
            first-order prediction has slope 1, intercept 0.
        r2_identity: 1 − Σ(measured − predicted)² / Σ(measured − mean measured)², the R² of the identity line
            (can be negative).
        rmse: √mean((measured − predicted)²).
        reason: why the fit is NaN (fewer than 3 pairs, constant prediction), else None.
    """

    n: int
    slope: float
    intercept: float
    r2: float
    r2_identity: float
    rmse: float
    reason: str | None = None


def fit_prediction(predicted: np.ndarray, measured: np.ndarray) -> PredictionFit:
    """Least-squares fit of measured ΔH on predicted ΔH plus the identity-line R² (see :class:`PredictionFit`):
    :func:`stare_lab.platform.summary.fit_prediction` with NaN for its undefined (None) values.

    Pairs with a non-finite value are dropped. With fewer than 3 pairs, or a constant prediction, the fit fields
    are NaN and ``reason`` says why (never raises).

    Source: R² = 1 − SS_res/SS_tot; slope/intercept/r by ordinary least squares from centred moments (equal to
    ``scipy.stats.linregress``, which the tests check).
    """
    f = core.fit_prediction(np.asarray(predicted, dtype=np.float64).ravel().tolist(),
                            np.asarray(measured, dtype=np.float64).ravel().tolist())
    nan = lambda v: math.nan if v is None else float(v)  # noqa: E731
    return PredictionFit(f["n"], nan(f["slope"]), nan(f["intercept"]), nan(f["r2"]), nan(f["r2_identity"]),
                         nan(f["rmse"]), f["reason"])


def binned_fit(
    x: np.ndarray, predicted: np.ndarray, measured: np.ndarray, n_bins: int = 20
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The least-squares slope and R² of measured on predicted within equal-width bins of ``x`` (over time).

    Args:
        x: ``[N]`` steps (or any ordering variable); pairs from several seeds may be concatenated.
        predicted, measured: ``[N]`` ΔH values (nats); non-finite pairs are dropped.
        n_bins: number of equal-width bins over [min x, max x] (the last bin includes max x).

    Returns:
        ``(centers, slope, r2, count)``, each ``[n_bins]``; slope/R² are NaN in bins with fewer than 3 pairs or a
        constant prediction. Computed from per-bin sums (vectorised), equal to ``scipy.stats.linregress`` per bin.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    p = np.asarray(predicted, dtype=np.float64).ravel()
    m = np.asarray(measured, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(p) & np.isfinite(m)
    x, p, m = x[ok], p[ok], m[ok]
    if x.size == 0 or n_bins < 1:
        e = np.full(max(n_bins, 0), np.nan)
        return e, e.copy(), e.copy(), np.zeros(max(n_bins, 0), dtype=np.int64)
    lo, hi = float(x.min()), float(x.max())
    edges = np.linspace(lo, hi, n_bins + 1)
    b = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, n_bins - 1)
    cnt = np.bincount(b, minlength=n_bins).astype(np.float64)
    # center the data per bin before forming second moments (numerically stable)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.bincount(b, p, n_bins) / cnt
        mm = np.bincount(b, m, n_bins) / cnt
        dp, dm = p - mp[b], m - mm[b]
        sxx = np.bincount(b, dp * dp, n_bins)
        syy = np.bincount(b, dm * dm, n_bins)
        sxy = np.bincount(b, dp * dm, n_bins)
        good = (cnt >= 3) & (sxx > 0)
        slope = np.where(good, sxy / sxx, np.nan)
        # a constant measurement gives r = 0, as scipy.stats.linregress defines it
        r2 = np.where(good & (syy > 0), np.minimum(sxy**2 / (sxx * syy), 1.0), np.where(good, 0.0, np.nan))
    centers = 0.5 * (edges[:-1] + edges[1:])
    return centers, slope, r2, cnt.astype(np.int64)


def first_finite(values: np.ndarray) -> float | None:
    """The first finite entry of ``values`` (None if none)."""
    v = np.asarray(values, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(v))
    return float(v[idx[0]]) if idx.size else None


def last_finite(values: np.ndarray) -> float | None:
    """The last finite entry of ``values`` (None if none)."""
    v = np.asarray(values, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(v))
    return float(v[idx[-1]]) if idx.size else None


def tail_mean(values: np.ndarray, frac: float = core.FINAL_FRACTION) -> float | None:
    """Mean of the finite entries among the last ``max(1, floor(frac · n))`` of ``n`` values (None if none is
    finite): :func:`stare_lab.platform.summary.tail_mean`, the definition of ``final_reward`` in every ``summary.json``."""
    return core.tail_mean(np.asarray(values, dtype=np.float64).ravel().tolist(), frac)


def steps_to_threshold(steps: np.ndarray, entropy: np.ndarray, threshold: float) -> int | None:
    """The first step whose entropy (nats) is strictly below ``threshold``; None if it never is (NaN ignored):
    :func:`stare_lab.platform.summary.first_step_below` (``steps_to_collapse`` with threshold = collapse_frac × initial)."""
    step = core.first_step_below(np.asarray(steps).tolist(), np.asarray(entropy, dtype=np.float64).tolist(),
                                 threshold)
    return None if step is None else int(step)


def fraction_in_band(
    entropy: np.ndarray, target: float | None, half_width: float = core.DEFAULT_BAND
) -> float | None:
    """Fraction of the steps with a finite entropy whose entropy is in the closed target band
    |H − H_tgt| ≤ half_width: :func:`stare_lab.platform.summary.fraction_in_band` (``time_in_band`` of ``summary.json``).

    Returns None if there is no target or no finite entropy.
    """
    return core.fraction_in_band(np.asarray(entropy, dtype=np.float64).ravel().tolist(), target, half_width)


def run_rows(run) -> list[dict]:
    """The metrics rows of a loaded run (:class:`analysis.load.RunData`) as the core summary reads them: one dict
    per step (sorted, one row per step) with ``step`` and every key the summary uses; NaN → None."""
    cols = {k: run.columns[k].tolist() for k in core.ROW_KEYS if k in run.columns}
    rows = []
    for i, step in enumerate(run.steps.tolist()):
        row = {"step": int(step)}
        for k, col in cols.items():
            row[k] = col[i] if math.isfinite(col[i]) else None
        rows.append(row)
    return rows


def run_summary(run, band: float | None = None, collapse_frac: float | None = None) -> dict:
    """The run's summary statistics, :func:`stare_lab.platform.summary.run_summary` of its rows, with the run's own settings
    (:func:`stare_lab.platform.summary.summary_settings` of its config: H_tgt, band, collapse fraction) unless ``band`` /
    ``collapse_frac`` are given. For a run written by any source this equals the statistics of its
    ``summary.json``.

    Args:
        run: an :class:`analysis.load.RunData`.
        band, collapse_frac: override the run's settings (None: the run's own).

    Raises:
        ConfigError: ``band`` / ``collapse_frac`` out of range.
    """
    settings = core.summary_settings(run.config)
    if run.target_entropy is not None and settings["target_entropy"] is None:
        settings["target_entropy"] = run.target_entropy
    if band is not None:
        settings["band"] = band
    if collapse_frac is not None:
        settings["collapse_frac"] = collapse_frac
    return core.run_summary(run_rows(run), **settings)


def normalised_curve(
    steps: np.ndarray, values: np.ndarray, grid: np.ndarray
) -> tuple[np.ndarray, str | None]:
    """A run's curve on normalised axes for comparing sources: x = fraction of training, y = value / initial value.

    Args:
        steps: ``[S]`` sorted steps; x = (step − first step) / (last step − first step), over the finite values.
        values: ``[S]`` e.g. entropy (nats); divided by its first finite value.
        grid: ``[G]`` fractions in [0, 1] to interpolate onto (linear interpolation).

    Returns:
        ``(y [G], reason)``: y all-NaN and a reason string when the curve cannot be normalised (fewer than 2 finite
        points, or a zero/non-finite initial value).
    """
    s = np.asarray(steps, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(v)
    s, v = s[ok], v[ok]
    nan = np.full(np.shape(grid), np.nan)
    if s.size < 2 or s[-1] == s[0]:
        return nan, "fewer than 2 steps with a finite value"
    if v[0] == 0:
        return nan, "initial value is 0"
    x = (s - s[0]) / (s[-1] - s[0])
    return np.interp(grid, x, v / v[0]), None


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """NaN-aware centred moving average over ``window`` points (NaN entries are skipped; a point whose whole
    window is NaN stays NaN; ``window`` ≤ 1 returns the values unchanged). Near the ends the window is truncated."""
    y = np.asarray(values, dtype=np.float64)
    if window <= 1 or y.size == 0:
        return y
    fin = np.isfinite(y)
    ker = np.ones(int(window))
    num = np.convolve(np.where(fin, y, 0.0), ker, mode="same")
    den = np.convolve(fin.astype(np.float64), ker, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
