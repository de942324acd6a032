"""The look shared by every figure of the report (matplotlib, imported lazily; no pyplot, so no GUI backend is ever
needed).

- A fixed colour, line style and marker per method (:func:`method_style`: O1 and C2, say, differ in all three).
- A sweep's grid as a colour scale (:class:`Scale`): when a method has several groups that differ in one numeric
  setting (the W values of a W sweep), each group's colour is its value's, read off a colour bar, and the legend
  names the method once; other repeated groups of a method get darker-to-lighter shades of its colour and the next
  line styles (:func:`group_styles`).
- The seed mean as the line and its 95% band (mean ± t·s/√n, cut to the values the statistic can take,
  :func:`analysis.stats.known_range`) as two thin solid lines in the line's own colour (:func:`draw`). No band is
  filled: translucent fills of different hues stacked into colours that no legend names (review finding: a dark
  grey blob where four methods' bands overlapped).
- Legends and colour bars outside the data; PNGs at :data:`DPI` dots per inch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import os
import zlib
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from . import stats
from .grouping import fmt_value, short_name

logger = logging.getLogger(__name__)

__all__ = ["DPI", "METHOD_STYLES", "METHOD_COLORS", "SEED_BAND", "COLOUR_BAR", "Scale", "Styles", "method_style",
           "method_color", "shade", "group_styles", "draw", "figure", "figure_legend", "legend_entries", "colour_bar",
           "style", "save_figure", "save_figures"]

#: resolution (dots per inch) of the report's PNG figures
DPI = 150

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
#: the colour map of a sweep's grid (:class:`Scale`) and the part of it used: its bright yellow end is left out (it
#: vanishes on white and is near the gold of the target band)
SCALE_CMAP, _SCALE_SPAN = "plasma", (0.0, 0.78)
#: ``gid`` of the two edge lines of a seed band, and the label of a colour bar's axes (tests find them by these)
SEED_BAND, COLOUR_BAR = "seed band", "colour bar"
_BAND_LW = 0.6
_BAND_NOTE = "thin lines: 95% seed band, same colour"

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


def shade(colour: str, t: float) -> str:
    """``colour`` mixed towards black (t < 0) or white (t > 0) by |t| ∈ [0, 1]."""
    from matplotlib.colors import to_hex, to_rgb

    target = 0.0 if t < 0 else 1.0
    return to_hex(tuple(c + abs(t) * (target - c) for c in to_rgb(colour)))


@dataclasses.dataclass(frozen=True)
class Scale:
    """The colour scale of a sweep's grid: the groups of ``methods`` are coloured by their value of the setting
    ``key`` — one colour per distinct value (``values``, ascending), evenly spaced along :data:`SCALE_CMAP`."""

    key: str
    values: tuple[float, ...]
    colours: tuple[str, ...]
    methods: tuple[str, ...]

    @property
    def title(self) -> str:
        """The colour bar's label: ``W (loss.stare.reweight_w) of o1``."""
        name = short_name(self.key)
        return (f"{name} ({self.key})" if name != self.key else name) + f" of {', '.join(self.methods)}"

    def colour(self, value: float) -> str:
        """The colour of ``value`` (one of ``values``)."""
        return self.colours[self.values.index(value)]


@dataclasses.dataclass
class Styles:
    """label → ``(colour, line style, marker)`` of every group of a comparison (:func:`group_styles`), the colour
    scale of its sweep grid (None without one) and the labels it colours."""

    by_label: dict[str, tuple[str, Any, str | None]]
    scale: Scale | None = None
    scaled: frozenset[str] = frozenset()

    def __getitem__(self, label: str) -> tuple[str, Any, str | None]:
        return self.by_label[label]

    def label(self, label: str) -> str | None:
        """The legend label of a group's line: None for a group the colour scale names (its method gets one entry,
        :meth:`add_proxies`)."""
        return None if label in self.scaled else label

    def band(self, label: str) -> bool:
        """Whether a group's seed band is drawn: not for a grid point of the colour scale (the bands of a grid's
        many groups would cover its lines; the tables give every group's interval)."""
        return label not in self.scaled

    def add_proxies(self, ax: Any) -> None:
        """One legend entry per method on the colour scale, in its line style and marker, in dark grey."""
        if self.scale is None:
            return
        for m in self.scale.methods:
            _, ls, marker = method_style(m)
            ax.plot([], [], color="0.25", ls=ls, marker=marker, ms=4,
                    label=f"{m}: colour = {short_name(self.scale.key)} (colour bar); no seed bands")


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _settings(g: Any) -> dict[str, Any]:
    return {**dict(g.settings), **dict(g.key_values)}


def _scale(by_method: dict[str, list[Any]], min_groups: int = 3) -> Scale | None:
    """The colour scale of the comparison: the numeric setting that tells apart the groups of the method with the most
    groups (at least ``min_groups``; ``loss.stare.reweight_w`` first, then the setting with the most values), applied
    to every method whose groups differ in it; None when no method has such groups."""
    best: tuple[tuple[bool, int, int], str] | None = None  # (rank, key)
    for groups in by_method.values():
        if len(groups) < min_groups:
            continue
        settings = [_settings(g) for g in groups]
        for k in sorted({k for s in settings for k in s}):
            vals = [s.get(k) for s in settings]
            if all(_numeric(v) for v in vals) and len(set(vals)) > 1:
                rank = (k == "loss.stare.reweight_w", len(set(vals)), len(groups))
                if best is None or rank > best[0]:
                    best = (rank, k)
    if best is None:
        return None
    key = best[1]
    methods, values = [], set()
    for m, groups in by_method.items():
        vals = [_settings(g).get(key) for g in groups]
        if len(groups) > 1 and all(_numeric(v) for v in vals) and len(set(vals)) > 1:
            methods.append(m)
            values.update(vals)
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    ordered = tuple(sorted(values))
    cmap = colormaps[SCALE_CMAP]
    colours = tuple(to_hex(cmap(float(t))) for t in np.linspace(*_SCALE_SPAN, len(ordered)))
    return Scale(key, ordered, colours, tuple(methods))


def group_styles(cmp: Any) -> Styles:
    """The style of every group of ``cmp``: a method's own style for its single group; for the groups of a method on
    the colour scale (:class:`Scale`) the colour of their value with the method's marker and line style (the next
    line styles for groups that also differ in other settings); for other repeated groups of a method the next line
    styles and shades of its colour from darker to lighter in group order."""
    by_method: dict[str, list[Any]] = {}
    for g in cmp.groups:
        by_method.setdefault(g.method, []).append(g)
    scale = _scale(by_method)
    out: dict[str, tuple[str, Any, str | None]] = {}
    scaled = set()
    for method, groups in by_method.items():
        colour, ls, marker = method_style(method)
        k = next((j for j, x in enumerate(_LINESTYLES) if x == ls), 0)
        if scale is not None and method in scale.methods:
            rest: dict[str, int] = {}  # the other settings → a line style each
            for g in groups:
                s = _settings(g)
                i = rest.setdefault(repr(sorted((a, repr(b)) for a, b in s.items() if a != scale.key)), len(rest))
                out[g.label] = (scale.colour(s[scale.key]), _LINESTYLES[(k + i) % len(_LINESTYLES)] if i else ls,
                                marker)
                scaled.add(g.label)
        elif len(groups) > 1:
            for i, g in enumerate(groups):
                out[g.label] = (shade(colour, -0.5 + i / (len(groups) - 1)), _LINESTYLES[(k + i) % len(_LINESTYLES)],
                                marker)  # shades from -0.5 (darker) to +0.5 (lighter)
        else:
            out[groups[0].label] = (colour, ls, marker)
    return Styles(out, scale, frozenset(scaled))


@contextlib.contextmanager
def style() -> Iterator[Any]:
    """The report's matplotlib settings (fonts, grid, spines), as a context."""
    import matplotlib

    with matplotlib.rc_context(_STYLE):
        yield matplotlib


def figure(
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


def draw(
    ax, agg: stats.SeedAggregate, style: tuple[str, Any, str | None], label: str | None, band: bool = True,
    stride: int = 1, lw: float | None = None,
) -> None:
    """Seed mean as a line in ``style`` (colour, line style, marker: :data:`_MARKS` markers along it), its band
    (where ≥ 2 seeds are finite) as two thin solid lines in the same colour (``gid`` :data:`SEED_BAND`), never a
    fill. ``stride`` > 1 draws every stride-th point (only for curves already moving-averaged over ≥ 2·stride
    steps, where it loses nothing visible)."""
    a = agg.finite()
    if a.x.size == 0:
        return
    color, ls, marker = style
    sl = slice(None, None, max(1, stride))
    x = a.x[sl]
    line = ax.plot(x, a.mean[sl], color=color, ls=ls, label=label, lw=lw, marker=marker, ms=4,
                   markevery=max(1, x.size // _MARKS))[0]
    if band and np.isfinite(a.lo).any():
        for edge in (a.lo[sl], a.hi[sl]):
            ax.plot(x, edge, color=color, ls="-", lw=_BAND_LW, gid=SEED_BAND, zorder=line.get_zorder() - 0.1)


def _has_bands(fig) -> bool:
    return any(line.get_gid() == SEED_BAND for ax in fig.axes for line in ax.get_lines())


def legend_entries(fig, ax) -> tuple[list[Any], list[str]]:
    """The handles and labels of ``ax`` and, when the figure draws seed bands, one entry saying how they look."""
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    if handles and _has_bands(fig):
        handles.append(Line2D([], [], color="0.25", lw=_BAND_LW))
        labels.append(_BAND_NOTE)
    return handles, labels


def _legend_shape(fig, labels: Sequence[str], ncols: int) -> tuple[int, int]:
    """(columns, rows) of a figure legend with these labels: at most ``ncols`` columns, fewer when the longest
    label would not fit the figure's width (about 15 characters of legend text per inch at its font size)."""
    longest = max((len(x) for x in labels), default=1) + 6  # + the handle
    cols = max(1, min(ncols, len(labels), int(fig.get_figwidth() * 15) // longest))
    return cols, math.ceil(len(labels) / cols) if labels else 0


def colour_bar(fig, scale: Scale, cax: Any = None, ax: Any = None, orientation: str = "horizontal") -> Any:
    """A discrete colour bar of ``scale`` — one cell per value, ticked with the values — in ``cax``, or below
    (horizontal) or right of (vertical) the axes ``ax`` (constrained layout). Its axes is labelled
    :data:`COLOUR_BAR`."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    n = len(scale.values)
    mappable = ScalarMappable(BoundaryNorm(np.arange(n + 1) - 0.5, n), ListedColormap(list(scale.colours)))
    side = "bottom" if orientation == "horizontal" else "right"
    kw = {"cax": cax} if cax is not None else {"ax": ax, "shrink": 0.6, "aspect": 30, "location": side}
    cb = fig.colorbar(mappable, orientation=orientation, ticks=range(n), **kw)
    labels = [fmt_value(v) for v in scale.values]
    (cb.ax.set_xticklabels if orientation == "horizontal" else cb.ax.set_yticklabels)(labels)
    cb.set_label(scale.title)
    cb.ax.set_label(COLOUR_BAR)
    cb.ax.minorticks_off()
    return cb


def figure_legend(fig, ax, ncols: int = 4, panel_height: float | None = None, top: float = 0.3,
                  bottom: float = 0.55, scale: Scale | None = None) -> None:
    """One legend for the whole figure, below its panels (outside the data), from what ``ax`` labels (and the seed
    band entry, :func:`legend_entries`), and the colour bar of ``scale`` under it. With fixed margins
    (``panel_height``: inches of the panels' rows) the figure is made tall enough for the legend's rows and the
    colour bar and the margins set: ``top`` inches above the panels, ``bottom`` inches for the x labels below
    them. With constrained layout the colour bar goes between the panels and the legend."""
    handles, labels = legend_entries(fig, ax)
    if not handles:
        return
    cols, rows = _legend_shape(fig, labels, ncols)
    if fig.get_layout_engine():
        fig.legend(handles, labels, ncols=cols, frameon=False, loc="outside lower center")
        if scale is not None:
            colour_bar(fig, scale, ax=[a for a in fig.axes if a.get_visible()], orientation="horizontal")
        return
    bar = 0.75 if scale is not None else 0.0  # inches: the colour bar, its ticks and its label
    height = fig.get_figheight()
    if panel_height is not None:
        height = panel_height + top + bottom + 0.2 * rows + bar
        fig.set_size_inches(fig.get_figwidth(), height)
        fig.subplots_adjust(top=1 - top / height, bottom=(bottom + 0.2 * rows + bar) / height)
    fig.legend(handles, labels, ncols=cols, frameon=False, loc="lower center", bbox_to_anchor=(0.5, bar / height))
    if scale is not None:
        colour_bar(fig, scale, cax=fig.add_axes((0.3, 0.42 / height, 0.4, 0.12 / height)))


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = DPI) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix: png, svg or pdf) and return the path."""
    path = Path(path)
    with style():
        fig.savefig(path, dpi=dpi, metadata=_METADATA.get(path.suffix.lstrip(".").lower()))
    logger.debug("wrote %s", path)
    return path


def save_figures(
    jobs: Sequence[tuple[Any, str | os.PathLike]], dpi: int = DPI, png_copies: bool = False,
) -> list[bytes | None]:
    """Write several figures (``jobs``: ``(figure, path)``), one after the other in this process, and return, with
    ``png_copies``, each figure as PNG bytes too (the HTML report embeds PNG renders of PDF figures), else Nones.

    No worker processes: a pool forked from the command (issue 29) could hang the command after its last figure —
    its workers inherited the command's Python-level SIGTERM handler, and ``Pool.terminate()`` signalled one while
    it was about to block on the pool's queue lock, so the handler never ran and the command waited for the worker
    for ever. Drawing here costs about 0.3–0.5 s more than the pool on an idle 2-core machine and nothing under load
    (docs/benchmarks.md, "bench_simulate_exit.py")."""
    out: list[bytes | None] = []
    for fig, path in jobs:
        save_figure(fig, path, dpi)
        if png_copies:
            buf = io.BytesIO()
            with style():
                fig.savefig(buf, format="png", dpi=dpi)
            out.append(buf.getvalue())
        else:
            out.append(None)
    return out
