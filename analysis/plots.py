"""Figures of the analysis report (matplotlib, imported lazily; no pyplot, so no GUI backend is ever needed).

Each ``plot_*`` function takes a :class:`analysis.compare.Comparison` and returns a ``matplotlib.figure.Figure``
(or None when the runs lack the data), so it works the same from the CLI and from a notebook. One look for all
(:mod:`analysis.figstyle`): a fixed colour, line style and marker per method; a sweep's grid as a colour scale with a
colour bar; the seed mean as the line and its 95% band (mean ± t·s/√n, cut to the values the statistic can take:
entropies ≥ 0, fractions in [0, 1]) as two thin lines in the same colour — never a translucent fill, so overlapping
bands make no colour the legend does not name; entropies in nats. The entropy is drawn twice: zoomed on the
target band and the second half of the runs, and over the whole run. Legends sit outside the data.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from . import stats
from .compare import QUADRANTS, Comparison
from .figstyle import (
    DPI,
    METHOD_COLORS,
    METHOD_STYLES,
    shade,
    colour_bar,
    draw,
    figure,
    figure_legend,
    group_styles,
    legend_entries,
    method_color,
    method_style,
    save_figure,
    save_figures,
    style,
)
from .verdict import uses_m, uses_stare

logger = logging.getLogger(__name__)

__all__ = [
    "DPI",
    "METHOD_COLORS",
    "METHOD_STYLES",
    "method_color",
    "method_style",
    "plot_dynamics",
    "plot_prediction",
    "plot_quadrants",
    "plot_cross_source",
    "plot_metrics",
    "save_figure",
    "save_figures",
    "zoom_range",
]

_SLOPE_LIM = (-1.0, 3.0)


def _smooth_window(cmp: Comparison, key: str, points: int = 100) -> int:
    """A moving-average window giving about ``points`` independent points along the longest run (≥ 1)."""
    n = max((r.n_steps for r in cmp.runs if r.has(key)), default=0)
    return max(1, n // points)


#: the target bands: a colour no method uses, opaque (two bands overlapping show the one on top, never a mix) and
#: hatched, one hatch per distinct target
_BAND_COLOR = "#e8b400"
_BAND_HATCHES = ("///", "\\\\\\", "xxx", "...", "+++", "|||")


def _targets(cmp: Comparison) -> dict[float, list[str]]:
    """Target entropy → the labels of its groups, for the groups whose loss uses STARE (of all groups when none
    does: a baseline's configured target means nothing when STARE groups are there)."""
    stare = [g for g in cmp.groups if uses_stare(g.runs[0])]
    by_target: dict[float, list[str]] = {}
    for g in stare or cmp.groups:
        if g.target_entropy is not None:
            by_target.setdefault(g.target_entropy, []).append(g.label)
    return dict(sorted(by_target.items()))


def _shade_targets(ax, cmp: Comparison, label: bool = True) -> None:
    """Shade H_tgt ± band_half_width once per distinct target (:func:`_targets`) — light gold, opaque and hatched,
    a different hatch per target — each labelled in the legend (``label``) with its value and, when the groups do
    not all share it, its groups."""
    hw = cmp.band_half_width
    by_target = _targets(cmp)
    for i, (t, labels) in enumerate(by_target.items()):
        who = "" if len(by_target) == 1 else f" ({', '.join(labels)})"
        ax.axhspan(t - hw, t + hw, facecolor=shade(_BAND_COLOR, 0.75), lw=0.6, zorder=0.5,
                   hatch=_BAND_HATCHES[i % len(_BAND_HATCHES)], edgecolor=_BAND_COLOR,
                   label=f"target band H_tgt = {t:.3g} ± {hw:g} nats{who}" if label else None)


def zoom_range(cmp: Comparison, pad: float = 0.1) -> tuple[float, float] | None:
    """The entropy range (nats) of the zoomed entropy panel: every target band (:func:`_targets`) and the seed means
    of every group over the second half of the steps, widened by ``pad`` × its span on each side and cut at 0;
    None without finite entropies."""
    aggs = [cmp.series(g, "entropy").finite() for g in cmp.groups]
    xs = [a.x for a in aggs if a.x.size]
    if not xs:
        return None
    mid = (min(float(x[0]) for x in xs) + max(float(x[-1]) for x in xs)) / 2
    hw = cmp.band_half_width
    vals = [v for a in aggs for v in a.mean[a.x >= mid]] + [v for t in _targets(cmp) for v in (t - hw, t + hw)]
    vals = [float(v) for v in vals if math.isfinite(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    span = max(hi - lo, 0.02 * max(abs(hi), 1e-3))
    return max(0.0, lo - pad * span), hi + pad * span


def _legend_panel(ax, fig, styles: Any) -> None:
    """The legend of the dynamics figure in its own (empty) panel ``ax``, from what the first panel labels, and
    the colour bar of the sweep's grid under it."""
    ax.axis("off")
    handles, labels = legend_entries(fig, fig.axes[0])
    if handles:
        ncols = 1 if len(labels) <= 10 else 2
        ax.legend(handles, labels, loc="upper left", frameon=False, ncols=ncols,
                  fontsize=8 if math.ceil(len(labels) / ncols) <= 10 else 6.5, borderaxespad=0.0)
    if styles.scale is not None:
        box = ax.get_position()  # a figure-level axes (in fig.axes), in the lower part of the panel
        colour_bar(fig, styles.scale, cax=fig.add_axes((box.x0 + 0.04 * box.width, box.y0 + 0.14 * box.height,
                                                        0.92 * box.width, 0.08 * box.height)))


def plot_dynamics(cmp: Comparison) -> Any:
    """Entropy (nats, with the target band shaded; zoomed on the band and the second half, :func:`zoom_range`, and
    over the whole run), reward, gate state and STARE W/M over steps, one line per group (seed mean) with its 95%
    band; the legend (and a sweep's colour bar) in the sixth panel. Gate: fraction of seeds with the gate on —
    lines, or, when a method has more than :data:`MAX_GATE_LINES` groups (a sweep's grid), one image row per STARE
    group. W is drawn for the groups whose loss uses STARE, M only for those that apply it (variant C2,
    :func:`analysis.verdict.uses_m`). ``fig.axes``: zoomed entropy, reward, gate, W/M, whole-run entropy, legend."""
    from matplotlib.figure import Figure

    styles = group_styles(cmp)
    with style():
        fig = Figure(figsize=(8.0, 7.6))
        fig.subplots_adjust(left=0.08, right=0.99, top=0.96, bottom=0.07, wspace=0.22, hspace=0.38)
        gs = fig.add_gridspec(3, 2)
        ax_h = fig.add_subplot(gs[0, 0])
        ax_r, ax_g, ax_w = (fig.add_subplot(gs[i, j], sharex=ax_h) for i, j in ((1, 0), (1, 1), (2, 0)))
        ax_full = fig.add_subplot(gs[0, 1], sharex=ax_h)
        ax_leg = fig.add_subplot(gs[2, 1])
        _shade_targets(ax_h, cmp)
        _shade_targets(ax_full, cmp, label=False)
        k_r = _smooth_window(cmp, "reward", 200)
        widths = _overlap_widths(len(cmp.groups))
        per_method: dict[str, int] = {}
        for g in cmp.groups:
            per_method[g.method] = per_method.get(g.method, 0) + 1
        gate_rows = max(per_method.values(), default=0) > MAX_GATE_LINES
        for g, lw in zip(cmp.groups, widths):
            st, label = styles[g.label], styles.label(g.label)
            band = styles.band(g.label)
            lw = lw if band else None  # nested widths are for equal lines, not for a grid's levels
            entropy = cmp.series(g, "entropy").clipped(stats.known_range("entropy"))
            draw(ax_h, entropy, st, label, band)
            draw(ax_full, entropy, st, None, band)
            draw(ax_r, cmp.series(g, "reward", smooth=k_r), st, label, band, stride=k_r // 2)
            # gate and W/M are often identical across methods (e.g. o1 and c2 share W, M and the gate): wider
            # lines first, so a line drawn later on top leaves the earlier one visible around it
            if not gate_rows:
                draw(ax_g, cmp.series(g, "gate_on"), st, label, band=False, lw=lw)
            # W only where the loss uses it (STARE), M only where it does (C2): O1 and GRPO log a stare_m (O1's
            # adaptive controller even moves it) that their loss never applies
            if any(uses_stare(r) for r in g.runs):
                draw(ax_w, cmp.series(g, "stare_w"), st, label, band=False, lw=lw)
            if any(uses_m(r) for r in g.runs):
                m = cmp.series(g, "stare_m").finite()
                if m.x.size:  # lighter, opaque: no translucent line over another colour
                    ax_w.plot(m.x, m.mean, color=shade(st[0], 0.45), ls=st[1], lw=lw)
        styles.add_proxies(ax_h)
        zoom = zoom_range(cmp)
        if zoom is not None:
            ax_h.set_ylim(*zoom)
            ax_full.axhspan(*zoom, fill=False, ls="--", lw=0.9, edgecolor="0.2", zorder=3)
        ax_h.set(title="entropy (token-mean), zoomed: target band, 2nd half", ylabel="entropy (nats)")
        ax_full.set(title="entropy, whole run (dashed box: the left panel)", ylabel="entropy (nats)")
        ax_full.set_ylim(bottom=0)
        ax_r.set(title="mean reward" + (f" (moving average, {k_r} steps)" if k_r > 1 else ""), ylabel="reward")
        if gate_rows:
            _gate_rows(ax_g, cmp)
        else:
            ax_g.set(title="STARE gate (fraction of seeds on; equal lines nested)", ylabel="gate on", xlabel="step")
            ax_g.set_ylim(-0.05, 1.05)
        ax_w.axhline(1.0, color="0.5", lw=0.6)  # 1 = no reweighting (the baselines)
        ax_w.set(title="STARE weights: W (> 1); M (< 1, lighter; C2 only)", ylabel="weight", xlabel="step")
        _legend_panel(ax_leg, fig, styles)
    return fig


#: more groups of one method than this (a sweep's grid points): the gate panel is one row per STARE group
MAX_GATE_LINES = 4


def _gate_rows(ax, cmp: Comparison) -> None:
    """The gate panel as an image: one row per group whose loss uses STARE (the baselines never open it), the
    grey of each step the fraction of the group's seeds with the gate on (white 0 … black 1). Rows are named by
    their labels, without the method when all rows share it (``W=1.1``). Review finding: 8 grid points of one
    method as 8 shades of one colour made the line panel unreadable."""
    rows = [g for g in cmp.groups if any(uses_stare(r) for r in g.runs)]
    names = [g.label for g in rows]
    method = rows[0].method if rows and all(g.method == rows[0].method for g in rows) else None
    if method is not None:
        names = [n[len(method):].strip().removeprefix("(").removesuffix(")") or method for n in names]
    for i, g in enumerate(rows):
        a = cmp.series(g, "gate_on").finite()
        if a.x.size == 0:
            continue
        x = a.x.astype(np.float64)
        mid = (x[1:] + x[:-1]) / 2 if x.size > 1 else np.zeros(0)
        edges = np.concatenate([[x[0] - 0.5], mid, [x[-1] + 0.5]])
        mesh = ax.pcolormesh(edges, [i - 0.5, i + 0.5], a.mean[None, :], cmap="Greys", vmin=0.0, vmax=1.0,
                             shading="flat", rasterized=True)
        mesh.sticky_edges.x.clear()  # keep the steps' margins of the line panels it shares x with
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    fig = ax.figure  # room on the left for the row names (about 18 characters per inch at 7 pt)
    fig.subplots_adjust(left=max(fig.subplotpars.left, (max(map(len, names), default=0) / 18 + 0.15)
                                 / fig.get_figwidth()))
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first group on top, as in the legend
    ax.grid(False)
    title = "STARE gate" + (f" of {method}" if method else "") + " (black: on in all seeds, white: off)"
    ax.set(title=title, xlabel="step")


def _overlap_widths(n: int, thin: float = 1.0, thick: float = 4.0) -> list[float]:
    """Line widths from ``thick`` (first of ``n`` lines) down to ``thin`` (last): identical curves drawn in this
    order stay visible as nested stripes."""
    if n <= 1:
        return [1.4] * n
    return [thick - (thick - thin) * i / (n - 1) for i in range(n)]


#: scatter markers of the methods whose lines have none (GRPO): every method's points have their own shape
_SCATTER_FALLBACK = "x"


def _scatter(ax, x, y, colour: str, marker: str | None, label: str) -> None:
    """Points as hollow markers of the method's shape (``x`` for a method without a marker): overlapping points
    of different methods stay readable as shapes, and no translucent fill mixes their colours."""
    from matplotlib.markers import MarkerStyle

    m = marker or _SCATTER_FALLBACK
    if MarkerStyle(m).is_filled():
        ax.scatter(x, y, s=16, marker=m, facecolors="none", edgecolors=colour, linewidths=0.8, label=label)
    else:
        ax.scatter(x, y, s=16, marker=m, color=colour, linewidths=0.8, label=label)


def _shown_pairs(n: int, max_points: int, i: int, n_groups: int) -> np.ndarray:
    """Indices of the pairs the scatter of group ``i`` (of ``n_groups``) shows: every stride-th of its ``n`` pairs,
    at most ``max_points``, from an offset of its own — so groups with equal pairs (runs that agree until the gate
    opens) show side by side instead of one on top of the other (for ≥ 20 pairs per group and shown group)."""
    stride = max(math.ceil(n / max_points), n_groups if n >= 20 * n_groups else 1)
    return np.arange(i % stride, n, stride)


def plot_prediction(cmp: Comparison, max_predictors: int = 4, max_points: int = 400, n_bins: int = 20) -> Any:
    """Predicted vs measured one-step ΔH (nats): per predictor key (``pred_entropy_change``, each ``pred/<name>``)
    a column with the scatter (hollow markers, one shape and colour per method, :func:`_scatter`; identity line
    dashed; R² and slope of the least-squares fit in the legend), then the R² and slope of the fit in at most
    ``n_bins`` windows of ≥ 10 steps each (over time). Fits use every pair; the scatter shows at most ``max_points``
    evenly spaced pairs per group (:func:`_shown_pairs`). A sweep's grid is coloured by its colour bar. None if no
    run has both a prediction and a measurement."""
    if not cmp.has_measured_change():
        return None
    keys = cmp.predictor_keys()[:max_predictors]
    if not keys:
        return None
    styles = group_styles(cmp)
    with style():
        # each column's legend (one line per group) below it: the figure grows with the groups
        fig, axes = figure(3, len(keys), w=4.4, h=2.6 + 0.06 * (len(cmp.groups) + 1))
        for j, key in enumerate(keys):
            ax_s, ax_r2, ax_sl = axes[0, j], axes[1, j], axes[2, j]
            lo, hi = math.inf, -math.inf
            for i, g in enumerate(cmp.groups):
                s, p, m = cmp.prediction_pairs(g, key)
                if p.size == 0:
                    continue
                c, ls, marker = styles[g.label]
                fit = stats.fit_prediction(p, m)
                idx = _shown_pairs(p.size, max_points, i, len(cmp.groups))
                _scatter(ax_s, p[idx], m[idx], c, marker, f"{g.label}: R²={fit.r2:.3f}, slope={fit.slope:.3f}")
                lo, hi = min(lo, p.min(), m.min()), max(hi, p.max(), m.max())
                # windows of ≥ 10 steps each, at most n_bins of them
                nb = max(1, min(n_bins, np.unique(s).size // 10))
                centers, slope, r2, _ = stats.binned_fit(s, p, m, nb)
                ax_r2.plot(centers, r2, color=c, ls=ls, marker=marker or ".", ms=3, label=g.label)
                ax_sl.plot(centers, slope, color=c, ls=ls, marker=marker or ".", ms=3, label=g.label)
            if math.isfinite(lo):
                ax_s.plot([lo, hi], [lo, hi], color="k", ls="--", lw=0.8, label="identity")
            ax_s.set(title=key, xlabel="predicted ΔH (nats)", ylabel="measured ΔH (nats)")
            handles, labels = ax_s.get_legend_handles_labels()
            if handles:  # below the column, outside the data: each group's fit (R², slope) of this predictor
                axes[2, j].legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.32), frameon=False,
                                  fontsize=7, markerscale=1.5)
            ax_r2.set(title=f"R² over time (≤ {n_bins} windows of ≥ 10 steps)", ylabel="R²", xlabel="step")
            ax_r2.set_ylim(-0.05, 1.05)
            ax_sl.axhline(1.0, color="k", ls="--", lw=0.8)
            title = "slope over time (1 = exact)"
            ylo, yhi = ax_sl.get_ylim()
            if ylo < _SLOPE_LIM[0] or yhi > _SLOPE_LIM[1]:  # windows with a near-constant prediction explode
                ax_sl.set_ylim(max(ylo, _SLOPE_LIM[0]), min(yhi, _SLOPE_LIM[1]))
                title += f", axis clipped to [{_SLOPE_LIM[0]:g}, {_SLOPE_LIM[1]:g}]"
            ax_sl.set(title=title, ylabel="slope", xlabel="step")
        if styles.scale is not None:
            colour_bar(fig, styles.scale, ax=axes.ravel().tolist(), orientation="vertical")
    return fig


def plot_quadrants(cmp: Comparison) -> Any:
    """The four quadrants (advantage sign × surprisal above/below the critical value, docs/theory.md §2) over steps:
    share of the tokens (top row) and summed first-order ΔH contribution in nats (bottom row), one column per
    quadrant, moving-averaged for readability (window in the titles). None if no run logs quadrants."""
    if not cmp.has_quadrants():
        return None
    styles = group_styles(cmp)
    k = _smooth_window(cmp, f"quadrant/{QUADRANTS[0][0]}/count")
    suffix = f" (moving avg {k})" if k > 1 else ""
    with style():
        fig, axes = figure(2, 4, w=3.2, h=2.5, sharex=True,
                            margins={"left": 0.055, "right": 0.99, "wspace": 0.3, "hspace": 0.3})
        for j, (q, desc, sign) in enumerate(QUADRANTS):
            arrow = "H↑" if sign > 0 else "H↓"
            for g in cmp.groups:
                st, label = styles[g.label], styles.label(g.label)
                share = cmp.quadrant_share(g, q, smooth=k).clipped((0.0, 1.0))
                band = styles.band(g.label)
                draw(axes[0, j], share, st, label, band, stride=k // 2)
                draw(axes[1, j], cmp.series(g, f"quadrant/{q}/dH", smooth=k), st, label, band, stride=k // 2)
            axes[0, j].set(title=f"{desc} ({arrow}){suffix}", ylabel="share of tokens" if j == 0 else None)
            axes[1, j].axhline(0.0, color="k", lw=0.6)
            axes[1, j].set(title=f"ΔH contribution{suffix}", xlabel="step", ylabel="ΔH (nats)" if j == 0 else None)
        styles.add_proxies(axes[0, 0])
        figure_legend(fig, axes[0, 0], ncols=6, panel_height=2 * 2.1, bottom=0.6, scale=styles.scale)
    return fig


def plot_cross_source(cmp: Comparison, key: str = "entropy") -> Any:
    """Runs of different sources (simulator vs trainer) on normalised axes: fraction of training on x, ``key`` /
    its initial value on y (absolute entropies differ by scale). None unless ≥ 2 sources are present and some run
    can be normalised."""
    if len(cmp.sources) < 2:
        return None
    styles = group_styles(cmp)
    with style():
        fig, axes = figure(1, 1, w=6.0, h=3.6)
        ax = axes[0, 0]
        drawn = 0
        for g in cmp.groups:
            agg = cmp.normalised_series(g, key)  # a ratio of values ≥ 0 is ≥ 0
            agg = agg.clipped((0.0, math.inf)) if stats.known_range(key)[0] >= 0 else agg
            drawn += int(agg.finite().x.size > 0)
            draw(ax, agg, styles[g.label], styles.label(g.label), styles.band(g.label))
        if drawn == 0:
            return None
        ax.axhline(1.0, color="0.5", lw=0.6)
        ax.set(
            title=f"{key} relative to its initial value, by fraction of training",
            xlabel="fraction of training",
            ylabel=f"{key} / initial {key}",
        )
        ax.set_ylim(bottom=0)
        styles.add_proxies(ax)
        figure_legend(fig, ax, scale=styles.scale)
    return fig


def plot_metrics(cmp: Comparison, keys: Sequence[str]) -> Any:
    """Any metric keys over steps (seed mean and 95% band), one panel each, three per row. None if no key has data
    in any run."""
    keys = [k for k in keys if any(r.has(k) for r in cmp.runs)]
    if not keys:
        return None
    styles = group_styles(cmp)
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    with style():
        fig, axes = figure(nrows, ncols, sharex=True)
        for i, key in enumerate(keys):
            ax = axes[i // ncols, i % ncols]
            for g in cmp.groups:
                draw(ax, cmp.series(g, key).clipped(stats.known_range(key)), styles[g.label], styles.label(g.label),
                     styles.band(g.label))
            ax.set(title=key, xlabel="step")
        for i in range(len(keys), nrows * ncols):
            axes[i // ncols, i % ncols].set_visible(False)
        styles.add_proxies(axes[0, 0])
        figure_legend(fig, axes[0, 0], scale=styles.scale)
    return fig
