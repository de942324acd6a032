"""Sweeps and the critical STARE strength in the analysis report (docs/theory.md §7).

Two sources, both read-only:

* a sweep's ``summary.json`` (written by ``stare-lab simulate``; :func:`read_sweep_summary`): its one-line
  ``headline`` (put at the top of the report), the grid and per-group band deviations (the phase diagram,
  :func:`phase_figure`), ``critical.<method>`` (measured vs predicted critical W, :func:`critical_rows`) and
  ``critical_strength`` (the labelled critical strengths and the recommended one, :func:`sweep_strength_block`);
* any runs that log the decomposition keys of :mod:`stare_lab.theory.critical` (``pred/d_grpo``, ``pred/d_lplus``, and
  ``pred/d_lminus`` for C2) — simulator or trainer alike: per group the *predicted* critical W along its held runs
  (largest W*(t) over the second half) and the *conservative* W* where the entropy first crosses H_tgt
  (:func:`run_critical_rows`), and the labelled strengths with the recommended one (:func:`run_strength_block`),
  computed by the same core functions the simulators use.

Every critical W is named by its kind (measured / auto / calibrated / predicted / conservative,
:class:`stare_lab.theory.critical.CriticalStrength`), and one recommended W per push comes first
(:func:`strength_lines`); an auto-schedule group's line says the W it found (:func:`auto_lines`).

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

from stare_lab.theory import critical
from stare_lab.theory.regime import calibrated_strengths
from stare_lab.platform.summary import band_held, w_cap

from .figstyle import figure as _figure, method_style, style as _style

logger = logging.getLogger(__name__)

__all__ = ["read_sweep_summary", "phase_figure", "critical_rows", "critical_line", "run_critical_rows", "W_KEY",
           "sweep_strength_block", "run_strength_block", "strength_lines", "strength_rows", "add_calibration",
           "auto_lines"]

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
    for key, style, name in (("measured_w", "-", "measured W"), ("predicted_w", "--", "predicted W (first order)"),
                             ("predicted_w_grpo", "-.", "conservative W (GRPO's crossing)")):
        v = _num(c.get(key))
        if v is not None and math.isfinite(v):
            ax.axvline(v, color="k", ls=style, lw=1, label=f"{name} {v:.3g}")
    if ax.get_legend_handles_labels()[0]:  # below the panel, outside the data
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)


def critical_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """Table rows of a sweep's ``critical`` block, one per method and slice: method, slice of the other grid keys,
    measured W, predicted W (first order along the held runs), the same with the measured one-step drift,
    conservative W (at GRPO's crossing), tolerance, whether the prediction is within it."""
    rows = []
    for method, c in sorted((summary.get("critical") or {}).items()):
        for label, s in (c.get("by_slice") or {"": c}).items():
            ok = s.get("predicted_w_within_tolerance")
            rows.append([method, label or "—", s.get("measured_w"), s.get("predicted_w"),
                         s.get("predicted_w_measured_drift"), s.get("predicted_w_grpo"), s.get("tolerance"),
                         "" if ok is None else ("yes" if ok else "no")])
    return rows


def _run_values(r: Any) -> dict[str, Any]:
    """One run's ``m`` (C2's M, else None), ``critical_w`` (largest W*(t) over the second half; D terms summed over 5 %
    of the run per window, per step for the simulators' mean-field ``mode: expected`` runs) and
    ``w_star_at_crossing`` (W* where the entropy first falls below H_tgt), by the core functions; {} when the run
    does not log the D terms."""
    if not (r.has(critical.KEY_D_GRPO) and r.has(critical.KEY_D_LPLUS)):
        return {}
    stare = r.config_value("loss.stare") or {}
    c2 = r.config_value("loss.loss_mode") == "stare" and stare.get("variant") == "C2"
    m = float(stare.get("reweight_m", 1.0)) if c2 else 1.0
    col = lambda k: [None if not math.isfinite(x) else float(x) for x in r.column(k)]  # noqa: E731
    e = r.config_value("push_efficiency")  # a tabular toy's share of the push applied
    dg, dl = col(critical.KEY_D_GRPO), critical.applied_push(col(critical.KEY_D_LPLUS), e)
    dm = critical.applied_push(col(critical.KEY_D_LMINUS), e) if c2 else None
    window = 1 if r.config_value("mode") == "expected" else max(1, r.n_steps // 20)  # mean field: exact
    cross = (critical.w_star_at_crossing(col("entropy"), r.target_entropy, dg, dl, dm, m, window)[1]
             if r.target_entropy is not None else None)
    return {"m": None if m == 1.0 else m, "critical_w": critical.critical_w(dg, dl, dm, m, window),
            "w_star_at_crossing": cross}


def _median(xs: list[Any]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def run_critical_rows(cmp: Any, summaries: dict[int, dict[str, Any]] | None = None) -> list[list[Any]]:
    """Per group of runs logging the decomposition keys: the STARE M (C2) or 1, how many runs held the band
    (:func:`stare_lab.platform.summary.band_held`; ``summaries``: ``id(run)`` → the run's summary, default computed), the
    *predicted* critical W — median over the held runs of the largest W*(t) over the second half, empty when no run
    held (along a run that did not hold the band it is not a critical W) — the *conservative* W* where the entropy
    first falls below H_tgt (median over all runs: the gate is off until then), and the runs that contributed."""
    rows = []
    for g in cmp.groups:
        runs = [(r, _run_values(r)) for r in g.runs]
        runs = [(r, v) for r, v in runs if v]
        if not runs:
            continue
        held = [v for r, v in runs if band_held(_summary(r, summaries))]
        m = runs[0][1]["m"]
        rows.append([g.label, 1.0 if m is None else m, f"{len(held)}/{len(runs)}",
                     _median([v["critical_w"] for v in held]),
                     _median([v["w_star_at_crossing"] for _, v in runs]), len(runs)])
    return rows


def _summary(run: Any, summaries: dict[int, dict[str, Any]] | None) -> dict[str, Any]:
    if summaries is not None and id(run) in summaries:
        return summaries[id(run)]
    from .stats import run_summary

    return run_summary(run)


def sweep_strength_block(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``critical_strength`` block of a sweep's ``summary.json`` (:func:`simulators.notes.strength_block`
    wrote it), or None when there is none (no sweep, or a summary written before it existed)."""
    block = (summary or {}).get("critical_strength")
    return block if isinstance(block, dict) and isinstance(block.get("slices"), dict) else None


def run_strength_block(cmp: Any, summaries: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report's labelled critical strengths from its own runs (no W sweep summary): per experiment slice
    (:func:`analysis.verdict.reference_slices`: source, sweep, kind, target, ``group_by`` values) the *predicted*
    and *conservative* strengths of :func:`stare_lab.theory.critical.run_strengths` and the recommended one per push; the
    same shape as ``summary.json``'s ``critical_strength``. Slices are labelled by the values that differ between
    them (``lr=1``); one slice is labelled ``""``."""
    from .verdict import reference_slices, uses_stare

    slices = reference_slices(cmp)
    keys = sorted({k for sl in slices for k in sl})
    differ = [k for k in keys if len({repr(sl.get(k)) for sl in slices}) > 1]
    by_slice: dict[str, list[dict[str, Any]]] = {}
    points: dict[str, dict[str, Any]] = {}
    for g, sl in zip(cmp.groups, slices):
        point = {("H_tgt" if k == "target" else k): Path(str(sl[k])).name if k == "sweep" else sl.get(k)
                 for k in differ}
        label = ",".join(f"{k}={_val(v)}" for k, v in point.items())
        points[label] = point
        stare = uses_stare(g.runs[0])
        st = g.runs[0].config_value("loss.stare") or {}
        auto = stare and bool(st.get("adaptive")) and st.get("schedule") == "auto"
        runs = []
        for r in g.runs:
            v = _run_values(r)
            if v or auto:  # an auto run's balance W needs no D terms
                runs.append({**_summary(r, summaries), **v})
        m = next((v["m"] for v in (_run_values(r) for r in g.runs[:1]) if v), None)
        w = st.get("reweight_w") if stare and not st.get("adaptive") else None
        by_slice.setdefault(label, []).append({
            "label": g.label, "stare": stare, "m": m, "runs": runs, "grpo": g.method in ("grpo", "grpo-ds"),
            "w": w if isinstance(w, (int, float)) and not isinstance(w, bool) else None,
            "sampled": g.runs[0].config_value("mode") != "expected",
            "auto": auto, "variant": st.get("variant"), "w_cap": w_cap(st)})
    out: dict[str, Any] = {"rule": " > ".join(critical.STRENGTH_KINDS) + " (docs/theory.md §7)", "slice": {},
                           "recommended": None, "slices": {}}
    for label, groups in by_slice.items():
        strengths = critical.run_strengths(groups)
        ms = list(dict.fromkeys(x.m for x in strengths))
        rec = {critical.variant_label(m): critical.recommend(strengths, m) for m in ms}
        out["slices"][label] = {"point": points[label], "strengths": [x.to_dict() for x in strengths],
                                "recommended": {k: v.to_dict() for k, v in rec.items() if v is not None},
                                "auto": critical.auto_entries(groups), "ran": critical.pushes_ran(groups, strengths)}
    first = next(iter(out["slices"].values()), None)
    if first:
        order = list(first["ran"]) + ["O1"]  # a push that ran, O1 first
        out["slice"] = first["point"]
        out["recommended"] = next((first["recommended"][v] for v in order if v in first["recommended"]), None)
    return out


def add_calibration(block: dict[str, Any], calibration: dict[str, Any]) -> dict[str, Any]:
    """``block`` with one more slice, ``target model (<probe run>)``: the *calibrated* strengths of a
    ``calibration.json`` (:func:`stare_lab.theory.regime.calibrated_strengths`) and the recommended one per push. They are
    about the probed model, not about the runs of the report, so they never join the other slices'
    recommendations (docs/theory.md §7)."""
    strengths = calibrated_strengths(calibration)
    probe = calibration.get("probe") or {}
    label = f"target model ({probe.get('model') or probe.get('run') or 'probe'})"
    rec = {critical.variant_label(x.m): x for x in strengths}
    slices = dict(block.get("slices") or {})
    slices[label] = {"point": {"calibration": calibration.get("path")}, "strengths": [x.to_dict() for x in strengths],
                     "recommended": {k: v.to_dict() for k, v in rec.items()}}
    return {**block, "slices": slices}


def _val(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):  # ("target_entropy", 0.4)
        v = v[1]
    return f"{v:g}" if isinstance(v, float) else str(v)


def strength_lines(block: dict[str, Any] | None) -> list[str]:
    """The critical-W lines of a ``critical_strength`` block, in the words of ``stare-lab simulate``'s screen: the
    recommendation of the block's own ``slice`` (the headline's) once, one number per push
    (:func:`stare_lab.theory.critical.recommended_clause`), the other kinds' numbers there (``other estimates for
    O1: …``), then every other slice's recommendation (``at lr=1: recommended W for O1: 1.3 (measured: …); also:
    …``, :func:`stare_lab.theory.critical.recommendation_text`)."""
    block = block or {}
    clause = critical.recommended_clause(block) if block.get("slices") else None
    lines = [clause] if clause else []
    for label, entry in (block.get("slices") or {}).items():
        strengths = [critical.CriticalStrength.from_dict(d) for d in entry.get("strengths") or []]
        base = clause is not None and entry.get("point") == block.get("slice")
        for m in dict.fromkeys(x.m for x in strengths):
            if base:
                also = critical.also_text(strengths, m)
                if also:
                    lines.append(f"other estimates for {critical.variant_label(m)}: {also}")
                continue
            text = critical.recommendation_text(strengths, m)
            if text:
                lines.append((f"at {label}: " if label else "") + text)
    return lines


def auto_lines(block: dict[str, Any] | None) -> list[str]:
    """One line per auto-schedule group of a ``critical_strength`` block (its slices' ``auto`` entries,
    :func:`stare_lab.theory.critical.auto_line`: the W it found, next to the measured W of the same slice): the
    lines ``stare-lab simulate`` prints."""
    slices = (block or {}).get("slices") or {}
    lines = []
    for label, entry in slices.items():
        strengths = [critical.CriticalStrength.from_dict(d) for d in entry.get("strengths") or []]
        for e in entry.get("auto") or []:
            lines.append((f"at {label}: " if len(slices) > 1 and label else "") + critical.auto_line(e, strengths))
    return lines


def critical_line(block: dict[str, Any] | None) -> str | None:
    """The report's critical-W line: every line of :func:`strength_lines` joined by "; ", or None without any."""
    return "; ".join(strength_lines(block)) or None


def strength_rows(block: dict[str, Any] | None) -> list[list[Any]]:
    """Table rows of a ``critical_strength`` block: slice, push (O1 / C2 (M=…)), kind, W, range, source, and
    "recommended" on the row the recommendation picked."""
    rows = []
    for label, entry in ((block or {}).get("slices") or {}).items():
        recs = {(d.get("kind"), d.get("w"), d.get("m")) for d in (entry.get("recommended") or {}).values()}
        for d in entry.get("strengths") or []:
            s = critical.CriticalStrength.from_dict(d)
            rows.append([label or "—", s.variant, s.kind, "" if s.w is None else s.w, s.range_text(), s.source,
                         "recommended" if (d.get("kind"), d.get("w"), d.get("m")) in recs else ""])
    return rows
