"""Figures of the analysis report (matplotlib, imported lazily; no pyplot, so no GUI backend is ever needed).

Each ``plot_*`` function takes a :class:`analysis.compare.Comparison` and returns a ``matplotlib.figure.Figure``
(or None when the runs lack the data), so it works the same from the CLI and from a notebook. One style for all:
a fixed colour, line style and marker per method (:func:`method_style`: O1 and C2, say, differ in all three), the
next line styles and darker-to-lighter shades of its colour for further groups of a method, seed mean as the line and the 95% band (mean ± t·s/√n) shaded,
cut to the values the statistic can take (:func:`analysis.stats.known_range`: entropies ≥ 0, fractions in [0, 1]),
entropies in nats. Legends sit outside the data: one legend per figure below its panels (the target bands labelled
in it), the fit numbers of the prediction scatters below each column.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import multiprocessing as mp
import os
import zlib
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import stats
from .compare import QUADRANTS, Comparison
from .verdict import uses_m, uses_stare

logger = logging.getLogger(__name__)

__all__ = [
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
]

#: Fixed (colour, line style, marker) per method, the same in every figure and report; no two share a colour, and
#: the STARE variants also differ in line style and marker (readable in grey print too).
METHOD_STYLES = {
    "grpo": ("#1f77b4", "-", None),
    "grpo-ds": ("#17becf", "-", "v"),
    "o1": ("#d62728", "--", "o"),
    "c2": ("#2ca02c", "-.", "s"),
    "o1-adaptive": ("#9467bd", ":", "^"),
    "clip_cov": ("#8c564b", "--", "D"),
    "kl_cov": ("#e377c2", "-.", "P"),
    "entropy_bonus": ("#bcbd22", ":", "X"),
    "forking_tokens": ("#7f7f7f", "--", "*"),
}
#: Fixed colour per method (:data:`METHOD_STYLES`).
METHOD_COLORS = {m: s[0] for m, s in METHOD_STYLES.items()}
_EXTRA_COLORS = ("#ff7f0e", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")
_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))
_MARKS = 10  # markers per line
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


def method_style(method: str) -> tuple[str, Any, str | None]:
    """``(colour, line style, marker)`` of ``method``: fixed for the known methods (:data:`METHOD_STYLES`), else a
    stable pick (crc32 of the name) of colour and marker with a solid line."""
    if method in METHOD_STYLES:
        return METHOD_STYLES[method]
    h = zlib.crc32(method.encode())
    return _EXTRA_COLORS[h % len(_EXTRA_COLORS)], "-", "ophd<>"[h % 6]


def method_color(method: str) -> str:
    """The colour of ``method`` (:func:`method_style`)."""
    return method_style(method)[0]


def _shade(colour: str, t: float) -> str:
    """``colour`` mixed towards black (t < 0) or white (t > 0) by |t| ∈ [0, 1]."""
    from matplotlib.colors import to_hex, to_rgb

    target = 0.0 if t < 0 else 1.0
    return to_hex(tuple(c + abs(t) * (target - c) for c in to_rgb(colour)))


def _styles(cmp: Comparison) -> dict[str, tuple[str, Any, str | None]]:
    """label → (colour, linestyle, marker): the method's style for its first group; further groups of the method
    (e.g. the W values of a sweep) keep its marker and get the next line styles and a shade of its colour, from
    darker to lighter in group order."""
    count: dict[str, int] = {}
    for g in cmp.groups:
        count[g.method] = count.get(g.method, 0) + 1
    seen: dict[str, int] = {}
    out = {}
    for g in cmp.groups:
        i = seen.get(g.method, 0)
        seen[g.method] = i + 1
        colour, ls, marker = method_style(g.method)
        n = count[g.method]
        if n > 1:
            k = next((j for j, x in enumerate(_LINESTYLES) if x == ls), 0)
            ls = _LINESTYLES[(k + i) % len(_LINESTYLES)]
            colour = _shade(colour, -0.5 + i / (n - 1))  # -0.5 (darker) … +0.5 (lighter)
        out[g.label] = (colour, ls, marker)
    return out


@contextlib.contextmanager
def _style() -> Iterator[Any]:
    import matplotlib

    with matplotlib.rc_context(_STYLE):
        yield matplotlib


def _figure(
    nrows: int, ncols: int, w: float = 4.0, h: float = 2.7, sharex: bool | str = False,
    margins: dict[str, float] | None = None,
):
    """A figure of ``nrows × ncols`` panels of ``w × h`` inches. Laid out by matplotlib's constrained layout, or —
    ``margins`` given (``subplots_adjust`` fractions; ``bottom`` leaves room for the figure legend) — by fixed
    margins: the same picture for a fixed grid at a third of the drawing time (the largest figure's)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows), layout=None if margins else "constrained")
    if margins:
        fig.subplots_adjust(**margins)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, axes


def _draw(
    ax, agg: stats.SeedAggregate, style: tuple[str, Any, str | None], label: str | None, band: bool = True,
    stride: int = 1, lw: float | None = None,
):
    """Seed mean as a line in ``style`` (colour, line style, marker: :data:`_MARKS` markers along it), its band
    shaded (where ≥ 2 seeds are finite). ``stride`` > 1 draws every stride-th point (only for curves already
    moving-averaged over ≥ 2·stride steps, where it loses nothing visible)."""
    a = agg.finite()
    if a.x.size == 0:
        return
    color, ls, marker = style
    sl = slice(None, None, max(1, stride))
    x = a.x[sl]
    ax.plot(x, a.mean[sl], color=color, ls=ls, label=label, lw=lw, marker=marker, ms=4,
            markevery=max(1, x.size // _MARKS))
    if band and np.isfinite(a.lo).any():
        ax.fill_between(a.x[sl], a.lo[sl], a.hi[sl], color=color, alpha=0.18, lw=0)


def _smooth_window(cmp: Comparison, key: str, points: int = 100) -> int:
    """A moving-average window giving about ``points`` independent points along the longest run (≥ 1)."""
    n = max((r.n_steps for r in cmp.runs if r.has(key)), default=0)
    return max(1, n // points)


def _legend_shape(fig, labels: Sequence[str], ncols: int) -> tuple[int, int]:
    """(columns, rows) of a figure legend with these labels: at most ``ncols`` columns, fewer when the longest
    label would not fit the figure's width (about 15 characters of legend text per inch at its font size)."""
    longest = max((len(x) for x in labels), default=1) + 6  # + the handle
    cols = max(1, min(ncols, len(labels), int(fig.get_figwidth() * 15) // longest))
    return cols, math.ceil(len(labels) / cols) if labels else 0


def _figure_legend(fig, ax, ncols: int = 4, panel_height: float | None = None, top: float = 0.3,
                   bottom: float = 0.55) -> None:
    """One legend for the whole figure, below its panels (outside the data), from what ``ax`` labels. With
    fixed margins (``panel_height``: inches of the panels' rows) the figure is made tall enough for the legend's rows
    and the margins set: ``top`` inches above the panels, ``bottom`` inches for the x labels below them."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    cols, rows = _legend_shape(fig, labels, ncols)
    if fig.get_layout_engine():
        fig.legend(handles, labels, ncols=cols, frameon=False, loc="outside lower center")
        return
    if panel_height is not None:
        height = panel_height + top + bottom + 0.2 * rows
        fig.set_size_inches(fig.get_figwidth(), height)
        fig.subplots_adjust(top=1 - top / height, bottom=(bottom + 0.2 * rows) / height)
    fig.legend(handles, labels, ncols=cols, frameon=False, loc="lower center", bbox_to_anchor=(0.5, 0.0))


#: the target bands: a colour no method uses, hatched (unlike the seed bands), one hatch per distinct target
_BAND_COLOR = "#e8b400"
_BAND_HATCHES = ("///", "\\\\\\", "xxx", "...", "+++", "|||")


def _shade_targets(ax, cmp: Comparison) -> None:
    """Shade H_tgt ± band_half_width once per distinct target of the groups whose loss uses STARE (of all groups when
    none does) — gold and hatched (the seed bands are unhatched in the methods' colours), a different hatch per
    target — each labelled in the legend with its value and, when the groups do not all share it, its groups."""
    hw = cmp.band_half_width
    stare = [g for g in cmp.groups if uses_stare(g.runs[0])]
    by_target: dict[float, list[str]] = {}
    for g in stare or cmp.groups:  # the targets STARE steers to (a baseline's configured target means nothing)
        if g.target_entropy is not None:
            by_target.setdefault(g.target_entropy, []).append(g.label)
    for i, (t, labels) in enumerate(sorted(by_target.items())):
        who = "" if len(by_target) == 1 else f" ({', '.join(labels)})"
        ax.axhspan(t - hw, t + hw, facecolor=_BAND_COLOR + "40", lw=0.6, hatch=_BAND_HATCHES[i % len(_BAND_HATCHES)],
                   edgecolor=_BAND_COLOR, label=f"target band H_tgt = {t:.3g} ± {hw:g} nats{who}")


def plot_dynamics(cmp: Comparison) -> Any:
    """Entropy (nats, with the target band shaded), reward, gate state and STARE W/M over steps, one line per
    group (seed mean) with its 95% band. Gate: fraction of seeds with the gate on — lines, or, when a method has
    more than :data:`MAX_GATE_LINES` groups (a sweep's grid), one image row per STARE group. W is drawn for the
    groups whose loss uses STARE, M only for those that apply it (variant C2, :func:`analysis.verdict.uses_m`)."""
    styles = _styles(cmp)
    with _style():
        fig, axes = _figure(2, 2, sharex=True, margins={"left": 0.08, "right": 0.99, "wspace": 0.22,
                                                         "hspace": 0.22})
        ax_h, ax_r, ax_g, ax_w = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
        _shade_targets(ax_h, cmp)
        k_r = _smooth_window(cmp, "reward", 200)
        widths = _overlap_widths(len(cmp.groups))
        per_method: dict[str, int] = {}
        for g in cmp.groups:
            per_method[g.method] = per_method.get(g.method, 0) + 1
        gate_rows = max(per_method.values(), default=0) > MAX_GATE_LINES
        for g, lw in zip(cmp.groups, widths):
            st = styles[g.label]
            _draw(ax_h, cmp.series(g, "entropy").clipped(stats.known_range("entropy")), st, g.label)
            _draw(ax_r, cmp.series(g, "reward", smooth=k_r), st, g.label, stride=k_r // 2)
            # gate and W/M are often identical across methods (e.g. o1 and c2 share W, M and the gate): wider
            # lines first, so a line drawn later on top leaves the earlier one visible around it
            if not gate_rows:
                _draw(ax_g, cmp.series(g, "gate_on"), st, g.label, band=False, lw=lw)
            # W only where the loss uses it (STARE), M only where it does (C2): O1 and GRPO log a stare_m (O1's
            # adaptive controller even moves it) that their loss never applies
            if any(uses_stare(r) for r in g.runs):
                _draw(ax_w, cmp.series(g, "stare_w"), st, g.label, band=False, lw=lw)
            if any(uses_m(r) for r in g.runs):
                m = cmp.series(g, "stare_m").finite()
                if m.x.size:
                    ax_w.plot(m.x, m.mean, color=st[0], ls=st[1], alpha=0.55, lw=lw)
        ax_h.set(title="entropy (batch token-mean)", ylabel="entropy (nats)")
        ax_h.set_ylim(bottom=0)
        ax_r.set(title="mean reward" + (f" (moving average, {k_r} steps)" if k_r > 1 else ""), ylabel="reward")
        if gate_rows:
            _gate_rows(ax_g, cmp)
        else:
            ax_g.set(title="STARE gate (fraction of seeds on; equal lines nested)", ylabel="gate on", xlabel="step")
            ax_g.set_ylim(-0.05, 1.05)
        ax_w.axhline(1.0, color="0.5", lw=0.6)  # 1 = no reweighting (the baselines)
        ax_w.set(title="STARE weights: W (> 1); M (< 1, faint; C2 only)", ylabel="weight", xlabel="step")
        _figure_legend(fig, ax_h, panel_height=2 * 2.3)
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
    title = "STARE gate" + (f" of {method}" if method else "") + ": black on in every seed, grey some, white off"
    ax.set(title=title, xlabel="step")


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
        # each column's legend (one line per group) below it: the figure grows with the groups
        fig, axes = _figure(3, len(keys), w=4.4, h=2.6 + 0.06 * (len(cmp.groups) + 1))
        for j, key in enumerate(keys):
            ax_s, ax_r2, ax_sl = axes[0, j], axes[1, j], axes[2, j]
            lo, hi = math.inf, -math.inf
            for g in cmp.groups:
                s, p, m = cmp.prediction_pairs(g, key)
                if p.size == 0:
                    continue
                c, ls, marker = styles[g.label]
                fit = stats.fit_prediction(p, m)
                idx = np.unique(np.linspace(0, p.size - 1, min(p.size, max_points)).astype(np.int64))
                ax_s.scatter(
                    p[idx], m[idx], s=7 if marker else 5, color=c, alpha=0.45, lw=0, marker=marker or "o",
                    label=f"{g.label}: R²={fit.r2:.3f}, slope={fit.slope:.3f}",
                )
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
                                  fontsize=7, markerscale=2.5)
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
        fig, axes = _figure(2, 4, w=3.2, h=2.5, sharex=True,
                            margins={"left": 0.055, "right": 0.99, "wspace": 0.3, "hspace": 0.3})
        for j, (q, desc, sign) in enumerate(QUADRANTS):
            arrow = "H↑" if sign > 0 else "H↓"
            for g in cmp.groups:
                st = styles[g.label]
                share = cmp.quadrant_share(g, q, smooth=k).clipped((0.0, 1.0))
                _draw(axes[0, j], share, st, g.label, stride=k // 2)
                _draw(axes[1, j], cmp.series(g, f"quadrant/{q}/dH", smooth=k), st, g.label, stride=k // 2)
            axes[0, j].set(title=f"{desc} ({arrow}){suffix}", ylabel="share of tokens" if j == 0 else None)
            axes[1, j].axhline(0.0, color="k", lw=0.6)
            axes[1, j].set(title=f"ΔH contribution{suffix}", xlabel="step", ylabel="ΔH (nats)" if j == 0 else None)
        _figure_legend(fig, axes[0, 0], ncols=6, panel_height=2 * 2.1, bottom=0.6)
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
            agg = cmp.normalised_series(g, key)  # a ratio of values ≥ 0 is ≥ 0
            agg = agg.clipped((0.0, math.inf)) if stats.known_range(key)[0] >= 0 else agg
            drawn += int(agg.finite().x.size > 0)
            _draw(ax, agg, styles[g.label], g.label)
        if drawn == 0:
            return None
        ax.axhline(1.0, color="0.5", lw=0.6)
        ax.set(
            title=f"{key} relative to its initial value, by fraction of training",
            xlabel="fraction of training",
            ylabel=f"{key} / initial {key}",
        )
        ax.set_ylim(bottom=0)
        _figure_legend(fig, ax)
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
                _draw(ax, cmp.series(g, key).clipped(stats.known_range(key)), styles[g.label], g.label)
            ax.set(title=key, xlabel="step")
        for i in range(len(keys), nrows * ncols):
            axes[i // ncols, i % ncols].set_visible(False)
        _figure_legend(fig, axes[0, 0])
    return fig


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 90) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: png, svg or pdf) and return the path."""
    path = Path(path)
    with _style():
        fig.savefig(path, dpi=dpi, metadata=_METADATA.get(path.suffix.lstrip(".").lower()))
    logger.debug("wrote %s", path)
    return path


#: the figures a forked pool of :func:`save_figures` writes (set just before the fork, read by the children)
_PENDING: list[tuple[Any, Path, int, bool]] = []


def _save_pending(i: int) -> bytes | None:
    fig, path, dpi, png = _PENDING[i]
    save_figure(fig, path, dpi)
    if not png:
        return None
    buf = io.BytesIO()
    with _style():
        fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def save_figures(
    jobs: Sequence[tuple[Any, str | os.PathLike]], dpi: int = 90, png_copies: bool = False, workers: int | None = None,
) -> list[bytes | None]:
    """Write several figures (``jobs``: ``(figure, path)``) — rendering them at once on the machine's cores: the
    figures are built in this process, and forked worker processes (each inherits them) only draw and write them,
    largest first. With ``png_copies`` also return each figure as PNG bytes (the HTML report embeds PNG renders of
    PDF figures), else Nones. ``workers``: processes (default: the cores this process may use); 1, a single
    figure, or no ``fork`` start method → one after the other here. The files are the same either way."""
    global _PENDING
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    n = min(len(jobs), cores if workers is None else max(1, int(workers)))
    _PENDING = [(fig, Path(path), dpi, png_copies) for fig, path in jobs]
    try:
        if n <= 1 or "fork" not in mp.get_all_start_methods():
            return [_save_pending(i) for i in range(len(jobs))]
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0].axes))  # most panels first
        with mp.get_context("fork").Pool(n) as pool:
            done = pool.map(_save_pending, order, chunksize=1)
        out: list[bytes | None] = [None] * len(jobs)
        for i, res in zip(order, done):
            out[i] = res
        return out
    finally:
        _PENDING = []
