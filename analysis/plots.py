"""Figures of the analysis report (matplotlib, imported lazily; no pyplot, so no GUI backend is ever needed).

Each ``plot_*`` function takes a :class:`analysis.compare.Comparison` and returns a ``matplotlib.figure.Figure``
(or None when the runs lack the data), so it works the same from the CLI and from a notebook. One style for all:
a fixed colour per method (:func:`method_color`), a line style per group within a method, seed mean as the line
and the 95% band (mean ± t·s/√n) shaded, entropies in nats.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import zlib
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import stats
from .compare import QUADRANTS, Comparison

logger = logging.getLogger(__name__)

__all__ = [
    "METHOD_COLORS",
    "method_color",
    "plot_dynamics",
    "plot_prediction",
    "plot_quadrants",
    "plot_cross_source",
    "plot_metrics",
    "save_figure",
]

#: Fixed colour per method (the same in every figure and report).
METHOD_COLORS = {
    "grpo": "#1f77b4",
    "grpo-ds": "#17becf",
    "o1": "#d62728",
    "c2": "#ff7f0e",
    "o1-adaptive": "#9467bd",
    "clip_cov": "#2ca02c",
    "kl_cov": "#8c564b",
    "entropy_bonus": "#e377c2",
    "forking_tokens": "#7f7f7f",
}
_EXTRA_COLORS = ("#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")
_LINESTYLES = ("-", "--", ":", "-.")
_SLOPE_LIM = (-1.0, 3.0)

_STYLE = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "svg.hashsalt": "stare_lab",  # deterministic SVG ids
}
#: no creation dates in vector files: the same runs give byte-identical figures
_METADATA = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}


def method_color(method: str) -> str:
    """The colour of ``method``: fixed for the known methods, else a stable pick (crc32 of the name)."""
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    return _EXTRA_COLORS[zlib.crc32(method.encode()) % len(_EXTRA_COLORS)]


def _styles(cmp: Comparison) -> dict[str, tuple[str, str]]:
    """label → (colour, linestyle); groups sharing a method get successive line styles."""
    seen: dict[str, int] = {}
    out = {}
    for g in cmp.groups:
        i = seen.get(g.method, 0)
        seen[g.method] = i + 1
        out[g.label] = (method_color(g.method), _LINESTYLES[i % len(_LINESTYLES)])
    return out


@contextlib.contextmanager
def _style() -> Iterator[Any]:
    import matplotlib

    with matplotlib.rc_context(_STYLE):
        yield matplotlib


def _figure(nrows: int, ncols: int, w: float = 4.0, h: float = 2.7, sharex: bool | str = False):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, axes


def _draw(
    ax, agg: stats.SeedAggregate, color: str, ls: str, label: str | None, band: bool = True, stride: int = 1,
    lw: float | None = None,
):
    """Seed mean as a line, its band shaded (where ≥ 2 seeds are finite). ``stride`` > 1 draws every stride-th
    point (only for curves already moving-averaged over ≥ 2·stride steps, where it loses nothing visible)."""
    a = agg.finite()
    if a.x.size == 0:
        return
    sl = slice(None, None, max(1, stride))
    ax.plot(a.x[sl], a.mean[sl], color=color, ls=ls, label=label, lw=lw)
    if band and np.isfinite(a.lo).any():
        ax.fill_between(a.x[sl], a.lo[sl], a.hi[sl], color=color, alpha=0.18, lw=0)


def _smooth_window(cmp: Comparison, key: str, points: int = 100) -> int:
    """A moving-average window giving about ``points`` independent points along the longest run (≥ 1)."""
    n = max((r.n_steps for r in cmp.runs if r.has(key)), default=0)
    return max(1, n // points)


def _legend(ax, **kwargs) -> None:
    """A legend if anything on ``ax`` is labelled (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _shade_targets(ax, cmp: Comparison, styles: dict[str, tuple[str, str]]) -> None:
    """Shade H_tgt ± band_half_width: once in grey if all groups share a target, else per group in its colour."""
    hw = cmp.band_half_width
    targets = {g.target_entropy for g in cmp.groups if g.target_entropy is not None}
    if len(targets) == 1:
        t = targets.pop()
        ax.axhspan(t - hw, t + hw, color="0.5", alpha=0.18, lw=0, label=f"target {t:.3g} ± {hw:g} nats")
        ax.axhline(t, color="0.4", lw=0.8, ls="--")
    else:
        for g in cmp.groups:
            if g.target_entropy is not None:
                t = g.target_entropy
                ax.axhspan(t - hw, t + hw, color=styles[g.label][0], alpha=0.08, lw=0)


def plot_dynamics(cmp: Comparison) -> Any:
    """Entropy (nats, with the target band shaded), reward, gate state and STARE W/M over steps, one line per
    group (seed mean) with its 95% band. Gate: fraction of seeds with the gate on."""
    styles = _styles(cmp)
    with _style():
        fig, axes = _figure(2, 2, sharex=True)
        ax_h, ax_r, ax_g, ax_w = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
        _shade_targets(ax_h, cmp, styles)
        k_r = _smooth_window(cmp, "reward", 200)
        widths = _overlap_widths(len(cmp.groups))
        for g, lw in zip(cmp.groups, widths):
            c, ls = styles[g.label]
            _draw(ax_h, cmp.series(g, "entropy"), c, ls, g.label)
            _draw(ax_r, cmp.series(g, "reward", smooth=k_r), c, ls, g.label, stride=k_r // 2)
            # gate and W/M are often identical across methods (e.g. o1 and c2 share W, M and the gate): wider
            # lines first, so a line drawn later on top leaves the earlier one visible around it
            _draw(ax_g, cmp.series(g, "gate_on"), c, ls, g.label, band=False, lw=lw)
            _draw(ax_w, cmp.series(g, "stare_w"), c, ls, g.label, band=False, lw=lw)
            m = cmp.series(g, "stare_m").finite()
            if m.x.size:
                ax_w.plot(m.x, m.mean, color=c, ls=ls, alpha=0.55, lw=lw)
        ax_h.set(title="entropy (batch token-mean)", ylabel="entropy (nats)")
        ax_h.set_ylim(bottom=0)
        ax_r.set(title="mean reward" + (f" (moving average, {k_r} steps)" if k_r > 1 else ""), ylabel="reward")
        ax_g.set(title="STARE gate (fraction of seeds on; equal lines nested)", ylabel="gate on", xlabel="step")
        ax_g.set_ylim(-0.05, 1.05)
        ax_w.set(title="STARE weights: W (above 1), M (below 1, faint)", ylabel="weight", xlabel="step")
        _legend(ax_h, loc="best", frameon=False)
        _legend(ax_g, loc="best", frameon=False, fontsize=7)
    return fig


def _overlap_widths(n: int, thin: float = 1.0, thick: float = 4.0) -> list[float]:
    """Line widths from ``thick`` (first of ``n`` lines) down to ``thin`` (last): identical curves drawn in this
    order stay visible as nested stripes."""
    if n <= 1:
        return [1.4] * n
    return [thick - (thick - thin) * i / (n - 1) for i in range(n)]


def plot_prediction(cmp: Comparison, max_predictors: int = 4, max_points: int = 4000, n_bins: int = 20) -> Any:
    """Predicted vs measured one-step ΔH (nats): per predictor key (``pred_entropy_change``, each ``pred/<name>``)
    a column with the scatter (identity line dashed; R² and slope of the least-squares fit in the legend), then the
    R² and slope of the fit in at most ``n_bins`` windows of ≥ 10 steps each (over time). Fits use every pair; the scatter shows at
    most ``max_points`` evenly spaced pairs per group. None if no run has both a prediction and a measurement."""
    if not cmp.has_measured_change():
        return None
    keys = cmp.predictor_keys()[:max_predictors]
    if not keys:
        return None
    styles = _styles(cmp)
    with _style():
        fig, axes = _figure(3, len(keys), w=4.0, h=2.6)
        for j, key in enumerate(keys):
            ax_s, ax_r2, ax_sl = axes[0, j], axes[1, j], axes[2, j]
            lo, hi = math.inf, -math.inf
            for g in cmp.groups:
                s, p, m = cmp.prediction_pairs(g, key)
                if p.size == 0:
                    continue
                c, ls = styles[g.label]
                fit = stats.fit_prediction(p, m)
                idx = np.unique(np.linspace(0, p.size - 1, min(p.size, max_points)).astype(np.int64))
                ax_s.scatter(
                    p[idx], m[idx], s=5, color=c, alpha=0.35, lw=0,
                    label=f"{g.label}: R²={fit.r2:.3f}, slope={fit.slope:.3f}",
                )
                lo, hi = min(lo, p.min(), m.min()), max(hi, p.max(), m.max())
                # windows of ≥ 10 steps each, at most n_bins of them
                nb = max(1, min(n_bins, np.unique(s).size // 10))
                centers, slope, r2, _ = stats.binned_fit(s, p, m, nb)
                ax_r2.plot(centers, r2, color=c, ls=ls, marker=".", ms=3, label=g.label)
                ax_sl.plot(centers, slope, color=c, ls=ls, marker=".", ms=3, label=g.label)
            if math.isfinite(lo):
                ax_s.plot([lo, hi], [lo, hi], color="k", ls="--", lw=0.8, label="identity")
            ax_s.set(title=key, xlabel="predicted ΔH (nats)", ylabel="measured ΔH (nats)")
            _legend(ax_s, loc="upper left", frameon=False, fontsize=7)
            ax_r2.set(title=f"R² over time (≤ {n_bins} windows of ≥ 10 steps)", ylabel="R²", xlabel="step")
            ax_r2.set_ylim(-0.05, 1.05)
            ax_sl.axhline(1.0, color="k", ls="--", lw=0.8)
            title = "slope over time (1 = exact)"
            ylo, yhi = ax_sl.get_ylim()
            if ylo < _SLOPE_LIM[0] or yhi > _SLOPE_LIM[1]:  # windows with a near-constant prediction explode
                ax_sl.set_ylim(max(ylo, _SLOPE_LIM[0]), min(yhi, _SLOPE_LIM[1]))
                title += f", axis clipped to [{_SLOPE_LIM[0]:g}, {_SLOPE_LIM[1]:g}]"
            ax_sl.set(title=title, ylabel="slope", xlabel="step")
    return fig


def plot_quadrants(cmp: Comparison) -> Any:
    """The four quadrants (advantage sign × surprisal above/below the critical value, docs/theory.md §2) over steps:
    share of the tokens (top row) and summed first-order ΔH contribution in nats (bottom row), one column per
    quadrant, moving-averaged for readability (window in the titles). None if no run logs quadrants."""
    if not cmp.has_quadrants():
        return None
    styles = _styles(cmp)
    k = _smooth_window(cmp, f"quadrant/{QUADRANTS[0][0]}/count")
    suffix = f" (moving avg {k})" if k > 1 else ""
    with _style():
        fig, axes = _figure(2, 4, w=3.2, h=2.5, sharex=True)
        for j, (q, desc, sign) in enumerate(QUADRANTS):
            arrow = "H↑" if sign > 0 else "H↓"
            for g in cmp.groups:
                c, ls = styles[g.label]
                _draw(axes[0, j], cmp.quadrant_share(g, q, smooth=k), c, ls, g.label, stride=k // 2)
                _draw(axes[1, j], cmp.series(g, f"quadrant/{q}/dH", smooth=k), c, ls, g.label, stride=k // 2)
            axes[0, j].set(title=f"{desc} ({arrow}){suffix}", ylabel="share of tokens" if j == 0 else None)
            axes[1, j].axhline(0.0, color="k", lw=0.6)
            axes[1, j].set(title=f"ΔH contribution{suffix}", xlabel="step", ylabel="ΔH (nats)" if j == 0 else None)
        _legend(axes[0, 0], loc="best", frameon=False)
    return fig


def plot_cross_source(cmp: Comparison, key: str = "entropy") -> Any:
    """Runs of different sources (simulator vs trainer) on normalised axes: fraction of training on x, ``key`` /
    its initial value on y (absolute entropies differ by scale). None unless ≥ 2 sources are present and some run
    can be normalised."""
    if len(cmp.sources) < 2:
        return None
    styles = _styles(cmp)
    with _style():
        fig, axes = _figure(1, 1, w=6.0, h=3.6)
        ax = axes[0, 0]
        drawn = 0
        for g in cmp.groups:
            c, ls = styles[g.label]
            agg = cmp.normalised_series(g, key)
            drawn += int(agg.finite().x.size > 0)
            _draw(ax, agg, c, ls, g.label)
        if drawn == 0:
            return None
        ax.axhline(1.0, color="0.5", lw=0.6)
        ax.set(
            title=f"{key} relative to its initial value, by fraction of training",
            xlabel="fraction of training",
            ylabel=f"{key} / initial {key}",
        )
        ax.set_ylim(bottom=0)
        _legend(ax, loc="best", frameon=False)
    return fig


def plot_metrics(cmp: Comparison, keys: Sequence[str]) -> Any:
    """Any metric keys over steps (seed mean and 95% band), one panel each, three per row. None if no key has data
    in any run."""
    keys = [k for k in keys if any(r.has(k) for r in cmp.runs)]
    if not keys:
        return None
    styles = _styles(cmp)
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    with _style():
        fig, axes = _figure(nrows, ncols, sharex=True)
        for i, key in enumerate(keys):
            ax = axes[i // ncols, i % ncols]
            for g in cmp.groups:
                c, ls = styles[g.label]
                _draw(ax, cmp.series(g, key), c, ls, g.label)
            ax.set(title=key, xlabel="step")
        for i in range(len(keys), nrows * ncols):
            axes[i // ncols, i % ncols].set_visible(False)
        _legend(axes[0, 0], loc="best", frameon=False)
    return fig


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 90) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: png, svg or pdf) and return the path."""
    path = Path(path)
    with _style():
        fig.savefig(path, dpi=dpi, metadata=_METADATA.get(path.suffix.lstrip(".").lower()))
    logger.debug("wrote %s", path)
    return path
