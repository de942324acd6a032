"""Sweeps and the critical STARE strength in the analysis report (docs/theory.md §7).

Two sources, both read-only:

* a sweep's ``summary.json`` (written by ``stare-lab simulate``; :func:`read_sweep_summary`): its one-line
  ``headline`` (put at the top of the report), the grid and per-group band deviations (the phase diagram,
  :func:`phase_figure`), and ``critical.<method>`` (measured vs predicted critical W, :func:`critical_rows`);
* any runs that log the decomposition keys of :mod:`stare_lab.critical` (``pred/d_grpo``, ``pred/d_lplus``, and
  ``pred/d_lminus`` for C2) — simulator or trainer alike: per group the critical W along its trajectory (largest
  W*(t) over the second half) and the GRPO-only estimate where the entropy first crosses H_tgt
  (:func:`run_critical_rows`), computed by the same core functions the simulators use.

The phase diagram shows, for each STARE method, the band deviation (mean over seeds of the mean |H − H_tgt| over
the second half of each run, nats) over W × the sweep's other key (lr, H_tgt, …) with the band boundary (deviation
= the band half-width) drawn as a contour; a sweep over W alone is a curve per method with the band as a horizontal
line. Measured and predicted critical W are marked.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from stare_lab import critical

from .plots import _figure, _style, method_style

logger = logging.getLogger(__name__)

__all__ = ["read_sweep_summary", "phase_figure", "critical_rows", "critical_line", "run_critical_rows", "W_KEY"]

W_KEY = "loss.stare.reweight_w"


def read_sweep_summary(path: str | os.PathLike, warnings: list[str] | None = None) -> dict[str, Any] | None:
    """The sweep summary at ``path`` (a ``summary.json`` or a directory holding one), or None if there is none or
    it is not a sweep summary (a run's own ``summary.json`` has no ``methods``). An unreadable file adds a warning.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        if warnings is not None:
            warnings.append(f"{p}: unreadable sweep summary ({err}); ignored")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("methods"), dict):
        return None
    return data


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _deviation(entry: dict[str, Any]) -> float | None:
    devs = [_num((r or {}).get("mean_abs_dev_second_half")) for r in (entry.get("runs") or {}).values()]
    devs = [d for d in devs if d is not None]
    return sum(devs) / len(devs) if devs else None


def phase_figure(summary: dict[str, Any]) -> Any:
    """The phase diagram of a sweep over ``loss.stare.reweight_w`` (module docstring), or None without such a grid.
    One panel per STARE method; a second grid key gives a heatmap with the boundary contour, none a curve."""
    grid = dict((k, v) for k, v in (summary.get("sweep") or {}).get("grid") or [])
    if W_KEY not in grid:
        return None
    others = [k for k in grid if k != W_KEY]
    other = others[0] if others else None
    band = _num(summary.get("band")) or 0.05
    by_method: dict[str, dict[tuple[float, Any], float]] = {}
    for entry in summary["methods"].values():
        point = entry.get("point") or {}
        if W_KEY not in point:
            continue
        dev = _deviation(entry)
        if dev is not None:
            by_method.setdefault(entry.get("method", "?"), {})[(float(point[W_KEY]), point.get(other))] = dev
    if not by_method:
        return None
    crit = summary.get("critical") or {}
    with _style():
        fig, axes = _figure(1, len(by_method), w=4.4, h=3.2)
        for ax, (method, cells) in zip(axes[0], sorted(by_method.items())):
            ws = sorted({w for w, _ in cells})
            c = crit.get(method) or {}
            if other is None:
                _deviation_curve(ax, method, ws, [cells[(w, None)] for w in ws], band)
                _mark(ax, c)
            else:
                ys = sorted({y for _, y in cells}, key=lambda v: (isinstance(v, str), v))
                z = np.array([[cells.get((w, y), np.nan) for w in ws] for y in ys], dtype=float)
                im = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis_r", vmin=0,
                               vmax=max(3 * band, float(np.nanmax(z)) if np.isfinite(z).any() else band),
                               extent=(-0.5, len(ws) - 0.5, -0.5, len(ys) - 0.5))
                if np.isfinite(z).sum() >= 4 and len(ws) > 1 and len(ys) > 1:
                    ax.contour(np.arange(len(ws)), np.arange(len(ys)), np.nan_to_num(z, nan=10.0), levels=[band],
                               colors="w", linewidths=2)
                ax.set_xticks(range(len(ws)), [f"{w:g}" for w in ws])
                ax.set_yticks(range(len(ys)), [f"{y:g}" if isinstance(y, float) else str(y) for y in ys])
                short = other.rsplit(".", 1)[-1]
                ax.set(xlabel="W (stare.reweight_w)", ylabel=short,
                       title=f"{method}: band deviation (white: |H − H_tgt| = {band:g})")
                fig.colorbar(im, ax=ax, label="nats")
        return fig


#: the log axis of the band deviation reaches down to the power of ten at least this many decades below the band;
#: smaller values sit on its floor
FLOOR_DECADES = 2


def _deviation_curve(ax, method: str, ws: list[float], devs: list[float], band: float) -> None:
    """The band deviation over W on a log axis (nats) from a floor up — the power of ten at or below
    ``band``·10^−:data:`FLOOR_DECADES` (1e-4 for the 0.05-nats band): a deviation
    below that floor (the band held far inside) is drawn on the floor with a hollow marker and the floor's tick
    reads ``≤ floor``; the band boundary is a solid line over the shaded 'band held' region. Review finding: the
    previous symlog axis had a '0' tick, so 1e-3 nats looked like 0."""
    from matplotlib.ticker import NullLocator

    colour, ls, marker = method_style(method)
    floor = 10.0 ** math.floor(math.log10(band) - FLOOR_DECADES + 1e-9)
    ys = np.maximum(np.asarray(devs, dtype=float), floor)
    under = np.asarray(devs, dtype=float) < floor
    ax.plot(ws, ys, color=colour, ls=ls, marker=marker or "o", label=method)
    if under.any():
        ax.plot(np.asarray(ws)[under], ys[under], ls="none", marker=marker or "o", mfc="white", mec=colour,
                label=f"{method}: ≤ {floor:g} nats (drawn at the floor)")
    top = max(float(np.nanmax(ys)), band) * 3
    ax.axhspan(floor / 2, band, color="#2ca02c", alpha=0.08, lw=0, label=f"band held (< {band:g} nats)")
    ax.axhline(band, color="k", ls="-", lw=1.2, label=f"band boundary {band:g} nats")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top)
    ticks = [10.0**k for k in range(math.ceil(math.log10(floor) + 1e-9), math.floor(math.log10(top)) + 1)]
    ticks = [t for t in ticks if t > floor * 1.5] + [floor]
    ax.set_yticks(sorted(ticks), [f"≤ {t:g}" if t == floor else f"{t:g}" for t in sorted(ticks)])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="W (stare.reweight_w)", ylabel="mean |H − H_tgt|, 2nd half (nats)",
           title=f"{method}: band deviation over W")


def _mark(ax, c: dict[str, Any]) -> None:
    for key, style, name in (("measured_w", "-", "measured critical W"), ("predicted_w", "--", "first-order W*"),
                             ("predicted_w_grpo", "-.", "W* at GRPO's crossing")):
        v = _num(c.get(key))
        if v is not None and math.isfinite(v):
            ax.axvline(v, color="k", ls=style, lw=1, label=f"{name} {v:.3g}")
    if ax.get_legend_handles_labels()[0]:  # below the panel, outside the data
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)


def critical_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """Table rows of a sweep's ``critical`` block: method, slice of the other grid keys, measured W, first-order
    prediction, with the measured one-step drift, GRPO-only estimate, tolerance, within tolerance."""
    rows = []
    for method, c in sorted((summary.get("critical") or {}).items()):
        for label, s in (c.get("by_slice") or {"": c}).items():
            ok = s.get("predicted_w_within_tolerance")
            rows.append([method, label or "—", s.get("measured_w"), s.get("predicted_w"),
                         s.get("predicted_w_measured_drift"), s.get("predicted_w_grpo"), s.get("tolerance"),
                         "" if ok is None else ("yes" if ok else "no")])
    return rows


def critical_line(summary: dict[str, Any]) -> str | None:
    """One line with each STARE method's measured and predicted critical W of a sweep (its top-level slice), or None
    without a W grid: ``o1: measured 1.3, first-order prediction 1.28 (within the tolerance 0.105); GRPO-only
    estimate 1.35``."""
    parts = []
    for method, c in sorted((summary.get("critical") or {}).items()):
        def f(x: Any) -> str:
            v = _num(x)
            return "-" if v is None else f"{v:.3g}"

        ok = c.get("predicted_w_within_tolerance")
        within = "" if ok is None else f" ({'within' if ok else 'outside'} the tolerance {f(c.get('tolerance'))})"
        meas = "none of the grid" if c.get("measured_w") is None else f(c.get("measured_w"))
        parts.append(f"{method}: measured {meas}, first-order prediction {f(c.get('predicted_w'))}{within}; "
                     f"GRPO-only estimate {f(c.get('predicted_w_grpo'))}")
    return "; ".join(parts) or None


def run_critical_rows(cmp: Any) -> list[list[Any]]:
    """Per group of runs logging the decomposition keys: the STARE M (C2) or 1, the median over seeds of the
    critical W along the trajectory (largest W*(t) over the second half, D terms summed over 5 % of the run per
    window; per step for the simulators' mean-field ``mode: expected`` runs) and of W* where the entropy first falls below H_tgt, and the seeds that contributed."""
    rows = []
    for g in cmp.groups:
        runs = [r for r in g.runs if r.has(critical.KEY_D_GRPO) and r.has(critical.KEY_D_LPLUS)]
        if not runs:
            continue
        stare = runs[0].config_value("loss.stare") or {}
        c2 = runs[0].config_value("loss.loss_mode") == "stare" and stare.get("variant") == "C2"
        m = float(stare.get("reweight_m", 1.0)) if c2 else 1.0
        crit, cross = [], []
        for r in runs:
            col = lambda k: [None if not math.isfinite(x) else float(x) for x in r.column(k)]  # noqa: E731
            dg, dl = col(critical.KEY_D_GRPO), col(critical.KEY_D_LPLUS)
            dm = col(critical.KEY_D_LMINUS) if c2 else None
            window = 1 if r.config_value("mode") == "expected" else max(1, r.n_steps // 20)  # mean field: exact
            crit.append(critical.critical_w(dg, dl, dm, m, window))
            if r.target_entropy is not None:
                cross.append(critical.w_star_at_crossing(col("entropy"), r.target_entropy, dg, dl, dm, m, window)[1])
        med = lambda xs: float(np.median([x for x in xs if x is not None])) if any(x is not None for x in xs) else None  # noqa: E731
        rows.append([g.label, m, med(crit), med(cross), len(runs)])
    return rows
