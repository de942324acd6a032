"""The analysis report: figures + ``report.md`` + a self-contained ``report.html`` (images base64-embedded) +
``report.json`` (the numbers of the tables, machine-readable).

One document model (:class:`analysis.document.Doc`: headings, paragraphs, lists, tables, images) renders to both
Markdown and HTML, so the two always say the same thing; every table is an :class:`analysis.tables.Table` built once
from raw values, whose rows also go into ``report.json`` (unformatted: mean / 95% half-width / count for a seed
aggregate, null where a cell is empty). ``report.json`` also lists every run with its summary statistics
(:func:`analysis.stats.run_summary` with the run's own settings), which equal the statistics of the run's
``summary.json``. The report reads top to bottom: runs, entropy dynamics, predicted vs measured ΔH, the four
quadrants, the per-method summary, then (when given) cross-source and paper comparisons.
No timestamps: the same runs give the same report."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from stare_lab.theory.critical import STRENGTH_KINDS
from stare_lab.errors import ConfigError, RunError
from stare_lab.platform.runlock import LOCK_FILE, lock_dir

from . import phase, plots, stats
from .compare import Comparison
from .document import Doc
from .paper import check_paper_filters, load_paper_table, paper_comparison
from .tables import Column, Table, interval, json_value
from .verdict import comparison_verdict

logger = logging.getLogger(__name__)

__all__ = ["Doc", "ReportFiles", "write_report", "report_data", "report_outputs", "FORMATS", "FIGURES"]

FORMATS = ("png", "svg", "pdf")
#: the report's figures (file names without the format); a report folder is rewritten whole (:func:`report_outputs`)
FIGURES = ("dynamics", "prediction", "quadrants", "phase", "cross_source", "metrics")
_MIME = {"png": "image/png", "svg": "image/svg+xml"}
_MAX_WARNINGS = 60


#: the rule for every seed band of the report (tables and figures), said once in its text
BAND_RULE = (
    "Seed bands: the 95% t-interval of the mean over seeds (mean ± t·s/√n; with 3 seeds t = 4.30), cut to the "
    "values the statistic can take — fractions and shares to [0, 1]; entropies, counts and times to ≥ 0 "
    "(`analysis.stats.known_range`). In tables a cut interval is shown as [low, high] instead of ± (e.g. "
    "0.577 [0, 1]: the seeds disagree too much for the interval to say more than the range); figures draw the "
    "cut band. Rewards, ΔH and predictions have no known range and are never cut."
)


@dataclasses.dataclass
class ReportFiles:
    """What :func:`write_report` wrote: ``markdown``, ``html`` and ``json`` paths, the figure paths by name, the
    verdict line at the top of the report and its critical-W line (the recommended W with its kind per slice and
    push, :func:`analysis.phase.critical_line`; None without any)."""

    markdown: Path
    html: Path
    figures: dict[str, Path]
    json: Path | None = None
    verdict: str = ""
    critical: str | None = None


def _seeds_text(seeds: Sequence[int | None]) -> str:
    return ", ".join("?" if s is None else str(s) for s in seeds)


def _runs_section(doc: Doc, cmp: Comparison, tables: dict[str, Any]) -> None:
    doc.h(2, "Runs")
    t = Table([Column("group", "group"), Column("method", "method"), Column("source", "source"),
               Column("runs", "runs"), Column("seeds", "seeds", text=_seeds_text),
               Column("steps", "steps", in_json=False), Column("steps_min"), Column("steps_max"),
               Column("target_entropy", "target H", "nats")])
    for g in cmp.groups:
        n = [r.n_steps for r in g.runs]
        t.add(group=g.label, method=g.method, source=g.source, runs=len(g.runs), seeds=list(g.seeds),
              steps=f"{min(n)}" if min(n) == max(n) else f"{min(n)}–{max(n)}", steps_min=min(n), steps_max=max(n),
              target_entropy=g.target_entropy)
    doc.table(t)
    tables["runs"] = t.to_json()
    split = [n for n in cmp.notes if "separate groups" in n]
    if split:
        doc.p("Not averaged together: " + " ".join(s.rstrip(".") + "." for s in split))


_FIT_COLUMNS = (
    Column("group", "group"), Column("predictor", "predictor", text=lambda p: f"`{p}`"),
    Column("n", "pairs (all seeds)"), Column("slope", "slope (pooled fit)"),
    Column("intercept", "intercept (pooled fit)"), Column("r2", "R² (pooled fit)"),
    Column("r2_identity", "R² (identity, pooled)"), Column("rmse", "RMSE", "nats"), Column("reason", "note"),
)


def _prediction_section(doc: Doc, cmp: Comparison, tables: dict[str, Any]) -> None:
    doc.h(2, "2. Predicted vs measured one-step entropy change")
    fits = cmp.prediction_fits() if cmp.has_measured_change() else []
    t = Table(_FIT_COLUMNS, [{"group": f["label"], "predictor": f["predictor"],
                              **{c.key: getattr(f["fit"], c.key) for c in _FIT_COLUMNS[2:]}} for f in fits])
    tables["prediction"] = t.to_json()
    if not fits:
        doc.p("No run logs both a first-order prediction and a measured `entropy_change`; nothing to compare.")
        return
    doc.p(
        "Ordinary least-squares fit of measured ΔH on predicted ΔH (as `scipy.stats.linregress`), pooled over seeds: a perfect "
        "first-order prediction has slope 1, intercept 0 and R² 1. R² (identity) = 1 − Σ(measured − predicted)² / "
        "Σ(measured − mean)², the fit of the identity line itself (negative when worse than a constant). All "
        "(step, seed) pairs of a group go into one fit, so R² here is not the per-seed mean shown as R2(dH) by "
        "`stare-lab simulate`."
    )
    doc.table(t)


def _quadrant_section(doc: Doc, cmp: Comparison, tables: dict[str, Any]) -> None:
    doc.h(2, "3. Four quadrants: advantage sign × surprisal")
    tables["quadrants"] = []
    if not cmp.has_quadrants():
        doc.p("No run logs `quadrant/…` keys.")
        return
    doc.p(
        "Tokens split by the sign of their advantage and by surprisal above/below the critical value s* "
        "(docs/theory.md §2: sign(ΔH) = sign(Â)·sign(s − s*)). Share = count / all four counts; ΔH = the quadrant's "
        "summed first-order contribution per step (nats); mean ± 95% band over seeds (cut to the possible values: "
        "see section 4)."
    )
    t = Table([Column("group", "group"), Column("quadrant"), Column("description", "quadrant"),
               Column("expected_sign", "expected sign of ΔH", text=lambda s: "+" if s > 0 else "−"),
               interval("count", "tokens per step", stat="quadrant/q/count"),
               interval("share", "share", stat="quadrant/q/share"),
               interval("dH_per_step", "ΔH per step", "nats", stat="quadrant/q/dH_per_step"),
               interval("dH_total", "ΔH total", "nats", stat="quadrant/q/dH_total")])
    for r in cmp.quadrant_table():
        t.add(group=r["label"], **{k: r[k] for k in ("quadrant", "description", "expected_sign", "count", "share",
                                                     "dH_per_step", "dH_total")})
    doc.table(t)
    tables["quadrants"] = t.to_json()


def _threshold_text(v: tuple[float | None, int, int]) -> str:
    mean, crossed, total = v
    return "never" if mean is None else f"{mean:.0f} ({crossed}/{total})"


def _summary_section(doc: Doc, cmp: Comparison, extra: Sequence[str], tables: dict[str, Any]) -> None:
    doc.h(2, "4. Summary per method")
    srows = cmp.summary_rows(extra)
    finals = list(dict.fromkeys(k for r in srows for k in r if k.startswith("final/")))
    thr = (f"{cmp.threshold:g} nats" if cmp.threshold is not None
           else f"{cmp.threshold_frac:g} × the run's initial entropy")
    doc.p(
        f"Each cell: mean ± 95% band over the group's seeds of a per-run number, with the definitions of every "
        f"run's `summary.json` (`stare_lab.platform.summary`). Initial H: the run's first logged entropy; final H: its last "
        f"logged entropy plus that step's measured change where logged (the entropy after the last update), nats. "
        f"Steps to threshold: first step with entropy < {thr}, mean over the seeds that got there (count in "
        f"brackets). In band: fraction of steps with |H − H_tgt| ≤ {cmp.band_half_width:g} nats. Final reward: "
        "mean reward over the last 10% of the run's steps. Other final values: last logged value. Wall time: sum "
        "of `time/step_s` (else summary.json). `stare-lab simulate`'s table reports the same H0, H_end, reward and "
        "in-band numbers; its R2(dH) is a per-seed fit averaged over seeds (section 2 here pools the seeds). "
        + BAND_RULE
    )
    t = Table([
        Column("group", "group"), Column("method"), Column("source"), Column("n_runs", "runs"),
        Column("target_entropy"),
        interval("initial_entropy", "initial H (first logged)", "nats"),
        interval("final_entropy", "final H (after the last update)", "nats"),
        Column("steps_to_threshold", "steps to threshold", text=_threshold_text,
               json=lambda v: json_value({"mean": v[0], "crossed": v[1], "runs": v[2]})),
        interval("frac_in_band", "in band (fraction of steps)"),
        interval("final_reward", "final reward (mean of last 10% of steps)"),
        *[interval(k, f"`{k[6:]}` (last logged)") for k in finals],
        interval("wall_time_s", "wall time", "s"),
    ])
    for r in srows:
        t.add(group=r["label"], **{c.key: r.get(c.key) for c in t.columns[1:]})
    doc.table(t)
    tables["summary"] = t.to_json()


def run_summaries(cmp: Comparison) -> dict[int, dict[str, Any]]:
    """``id(run)`` → :func:`analysis.stats.run_summary` of every run with its own settings (the statistics of its
    ``summary.json``), computed once for the verdict and ``report.json``."""
    return {id(r): stats.run_summary(r) for r in cmp.runs}


def report_data(
    cmp: Comparison, tables: dict[str, Any], title: str, inputs: Sequence[str],
    summaries: dict[int, dict[str, Any]] | None = None, verdict: str | None = None,
) -> dict[str, Any]:
    """The content of ``report.json``: ``title``, ``verdict`` (the line at the top of the report), ``inputs``,
    ``settings`` (band, threshold, threshold fraction, confidence, group-by keys), ``runs`` — one entry per run:
    ``path``, ``source``, ``method``, ``seed``, ``group`` and ``summary`` (:func:`analysis.stats.run_summary` with the
    run's own settings: the statistics of its ``summary.json``; ``summaries`` if given, see :func:`run_summaries`) —
    ``tables`` (the numbers of the report's tables, by section) and ``notes`` / ``warnings``. Non-finite numbers are
    null."""
    summaries = run_summaries(cmp) if summaries is None else summaries
    runs = []
    for g in cmp.groups:
        for r in g.runs:
            runs.append({"path": str(r.path), "source": r.source, "method": r.method, "seed": r.seed,
                         "group": g.label, "summary": summaries[id(r)]})
    return json_value({
        "title": title,
        "verdict": verdict if verdict is not None else comparison_verdict(cmp, summaries),
        "inputs": list(inputs),
        "settings": {"band_half_width": cmp.band_half_width, "threshold": cmp.threshold,
                     "threshold_frac": cmp.threshold_frac, "confidence": cmp.confidence,
                     "group_by": list(cmp.group_by)},
        "runs": runs,
        "tables": tables,
        "notes": list(cmp.notes),
        "warnings": list(dict.fromkeys(cmp.warnings)),
    })


def _critical_section(doc: Doc, cmp: Comparison, sweep: dict[str, Any] | None, add_figure: Any,
                      block: dict[str, Any], summaries: dict[int, dict[str, Any]], tables: dict[str, Any]) -> None:
    """Critical STARE strength (docs/theory.md §7): the labelled strengths and the recommended one (``block``), the
    sweep's phase diagram and measured vs predicted W, and per group the predicted / conservative W of runs that
    log the decomposition terms (:mod:`analysis.phase`)."""
    srows = phase.strength_rows(block)
    crit_rows = phase.critical_rows(sweep) if sweep else []
    run_rows = phase.run_critical_rows(cmp, summaries)
    fig = phase.phase_figure(sweep) if sweep else None
    tables["critical_strength"] = block
    if not (srows or crit_rows or run_rows or fig is not None):
        return
    doc.h(2, "Critical STARE strength")
    doc.p(
        "With the gate on, a step's first-order entropy change splits as D_GRPO + (W − 1)·D_L+ (+ (M − 1)·D_L− for "
        "C2), so W*(t) = 1 − D_GRPO(t)/D_L+(t) cancels the drift (docs/theory.md §7; `stare_lab.theory.critical`). Every "
        "critical W below is named by its kind: **measured** (the smallest W of a W sweep held on every seed), "
        "**auto** (from an auto run: the balance W, 1 + mean gate·(W − 1), over the strongest stretch of the second "
        "half of the auto-schedule runs that held; a lower bound when not every run held), "
        "**calibrated** (measured on a toy calibrated to a target model's probe), **predicted** (first order: the "
        "largest W*(t) over the second half of runs that held the band) and **conservative** (first order: W* where "
        "GRPO first crosses H_tgt). The recommended W is the first available in the order "
        f"{' > '.join(STRENGTH_KINDS)}: a measurement beats a model of it. A run "
        "holds the band when its mean |H − H_tgt| over the second half is below min(band, H_tgt/4) and its final "
        "entropy is at least H_tgt/2, so a collapsed run never counts."
    )
    if srows:
        doc.table(Table.from_rows(["slice", "push", "kind", "W", "range", "source", ""], srows))
    if fig is not None:
        doc.p("Phase diagram: band deviation = mean over seeds of the mean |H − H_tgt| over the second half of each "
              "run; the band holds below the boundary. Over W alone the deviation is on a log axis down to a floor "
              f"(10^-{phase.FLOOR_DECADES} × the band, rounded down to a power of ten); smaller deviations are drawn "
              "on the floor with hollow markers, its tick reads '≤ floor'.")
        add_figure(doc, "phase", fig, "band deviation over the sweep grid")
    if crit_rows:
        doc.p("Measured W = the smallest grid W whose runs hold the band on every seed; predicted W = median over the "
              "held runs of their largest W*(t) over the second half; 'with measured drift' uses the measured "
              "one-step change of the ω ≡ 1 update instead of D_GRPO (second-order, noise-driven drift included); "
              "conservative W = median over GRPO's seeds of W* where they cross H_tgt; tolerance max(35 % of W − 1, "
              "one grid step).")
        doc.table(Table.from_rows(["method", "slice", "measured W", "predicted W", "predicted, measured drift",
                                   "conservative W", "tolerance", "within"], crit_rows))
    if run_rows:
        doc.p("Per group: the predicted W only along runs that held the band (along a run that did not, the largest "
              "W*(t) is not a critical W); the conservative W* over all runs (the gate is off until the crossing, so "
              "each run follows GRPO up to there).")
        doc.table(Table.from_rows(["group", "M (C2)", "held runs", "predicted W along the held runs (median)",
                                   "conservative W* at the H_tgt crossing (median)", "runs"], run_rows))


def write_report(
    cmp: Comparison,
    out_dir: str | os.PathLike,
    fmt: str = "png",
    metrics: Sequence[str] = (),
    paper: str | os.PathLike | None = None,
    paper_setting: str | None = None,
    paper_model: str | None = None,
    dpi: int = plots.DPI,
    title: str = "stare_lab analysis report",
    inputs: Sequence[str] = (),
    sweep: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
) -> ReportFiles:
    """Write the figures, ``report.md``, a self-contained ``report.html`` and ``report.json`` (:func:`report_data`)
    into ``out_dir``.

    Args:
        cmp: the grouped runs (:func:`analysis.compare`).
        out_dir: created if missing; the files a previous report wrote there (:func:`report_outputs`: every
            figure, in any format, and ``report.*``) are removed first, so it holds only this report.
        fmt: figure format: ``png``, ``svg`` or ``pdf`` (for pdf the HTML embeds PNG renders of the figures).
        metrics: extra metric keys to plot over steps and list in the summary table.
        paper: a Table-2 CSV (see :mod:`analysis.paper`) to put reported numbers next to measured ones.
        paper_setting, paper_model: restrict the paper rows.
        dpi: raster resolution (dots per inch) of PNG figures (the HTML shows a PNG at its figure's size in
            inches, 96 CSS pixels per inch, so a higher ``dpi`` is sharper, not larger).
        title: the report's title.
        inputs: the paths analysed (listed in the report).
        sweep: a sweep's ``summary.json`` (:func:`analysis.phase.read_sweep_summary`): its headline goes at the
            top, its grid and critical W into the "Critical STARE strength" section.
        calibration: a ``calibration.json`` (:func:`stare_lab.theory.regime.read_calibration`): its calibrated critical W
            for the probed model is listed as a slice of its own (:func:`analysis.phase.add_calibration`).

    Raises:
        ConfigError: unknown ``fmt``, ``dpi`` ≤ 0, or a ``paper_setting``/``paper_model`` the paper table lacks.
        RunError: if ``out_dir`` cannot be created.
        DataError: if the paper table is unreadable or lacks required columns.

    Nothing is written when the arguments are bad; if writing fails midway, an ``out_dir`` this call created is
    removed again.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} is not one of {{{', '.join(FORMATS)}}}")
    if isinstance(dpi, bool) or not isinstance(dpi, int) or dpi <= 0:
        raise ConfigError(f"dpi={dpi!r} must be a positive integer")
    paper_rows = load_paper_table(paper) if paper is not None else None  # fail early, before any output
    if paper_rows is not None:
        check_paper_filters(paper_rows, paper_setting, paper_model)
    out = Path(out_dir)
    created = not out.exists()
    with lock_dir(out, command="stare-lab analyze"):  # one writer per report folder (created here if missing)
        try:
            return _write(cmp, out, fmt, metrics, paper, paper_rows, paper_setting, paper_model, dpi, title, inputs,
                          sweep, calibration)
        except BaseException:
            if created:  # leave no half-written folder behind: everything in it but the lock is ours
                for p in out.iterdir():
                    if p.name != LOCK_FILE:
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            raise


def report_outputs() -> list[str]:
    """The names a report writes in its folder (every figure in every format, ``report.md/.html/.json``)."""
    return [f"{name}.{fmt}" for name in FIGURES for fmt in FORMATS] + ["report.md", "report.html", "report.json"]


def _remove_previous(out: Path) -> None:
    """Remove the files a previous report wrote in ``out`` (:func:`report_outputs`; nothing else)."""
    for name in report_outputs():
        p = out / name
        if p.is_file() or p.is_symlink():
            try:
                p.unlink()
            except OSError as err:
                raise RunError(f"cannot remove the previous report's {str(p)!r}: {err.strerror or err}") from None


def _css_width(png: bytes, dpi: int) -> int:
    """The CSS width (pixels, 96 per inch) of a PNG rendered at ``dpi``: its figure's width in inches (the PNG's
    width is bytes 16–19 of its header, big-endian)."""
    return round(int.from_bytes(png[16:20], "big") * 96 / dpi)


def _write(
    cmp: Comparison, out: Path, fmt: str, metrics: Sequence[str], paper: Any, paper_rows: Any,
    paper_setting: str | None, paper_model: str | None, dpi: int, title: str, inputs: Sequence[str],
    sweep: dict[str, Any] | None = None, calibration: dict[str, Any] | None = None,
) -> ReportFiles:
    figures: dict[str, Path] = {}
    built: list[tuple[Any, Path]] = []  # written together at the end (plots.save_figures)

    def add_figure(doc: Doc, name: str, fig: Any, alt: str) -> None:
        if fig is None:
            return
        assert name in FIGURES, name  # a new figure is listed there, so a later report removes it
        path = out / f"{name}.{fmt}"
        figures[name] = path
        built.append((fig, path))
        doc.img(path.name, alt)

    doc = Doc()
    doc.h(1, title)
    summaries = run_summaries(cmp)
    verdict = comparison_verdict(cmp, summaries, per_setting=not (sweep and sweep.get("critical")))
    doc.p(f"**Verdict:** {verdict}")
    block = phase.sweep_strength_block(sweep) or phase.run_strength_block(cmp, summaries)
    if calibration is not None:
        block = phase.add_calibration(block, calibration)
    crit = phase.critical_line(block)
    if crit:
        doc.p(f"**Critical W:** {crit}")
    for line in phase.auto_lines(block):  # the W each auto-schedule group found, as the screen says it
        doc.p(f"**Auto schedule:** {line}")
    n_runs = len(cmp.runs)
    doc.p(
        f"{n_runs} run{'s' * (n_runs != 1)} in {len(cmp.groups)} group{'s' * (len(cmp.groups) != 1)} "
        f"(sources: {', '.join(cmp.sources)})" + (f", read from {', '.join(f'`{i}`' for i in inputs)}." if inputs else ".")
        + (f" Grouped by method and {', '.join(f'`{k}`' for k in cmp.group_by)}." if cmp.group_by else "")
    )
    tables: dict[str, Any] = {}
    _runs_section(doc, cmp, tables)

    doc.h(2, "1. Entropy dynamics")
    doc.p(
        "Lines: mean over seeds, one colour, line style and marker per method; thin solid lines in the same colour: "
        "its 95% band (mean ± t·s/√n, none for a single seed; the entropy band cut at 0 nats, see section 4), never "
        "a translucent fill, so overlaps make no new colour. A sweep's grid points are coloured by their value "
        "(colour bar), the method named once in the legend. Entropy twice: left zoomed on the target band and the "
        "second half of the runs, right the whole run (dashed box: the left panel's range). Gold, hatched: the "
        f"target band H_tgt ± {cmp.band_half_width:g} nats (`loss.stare.target_entropy`; one hatch per target when "
        "groups differ, each labelled in the legend). Gate: fraction of seeds with the STARE gate on (when a method "
        f"has more than {plots.MAX_GATE_LINES} groups, e.g. a sweep's grid points, one row per STARE group, black = "
        "on in every seed, white = off). W (STARE weight on L+) as logged, for the groups whose loss uses STARE; M "
        "(on L−, lighter) only for variant C2 (`loss.stare.variant`): O1 never applies M, whatever M its runs log."
    )
    add_figure(doc, "dynamics", plots.plot_dynamics(cmp), "entropy, reward, gate and W/M over steps")

    _prediction_section(doc, cmp, tables)
    add_figure(doc, "prediction", plots.plot_prediction(cmp), "predicted vs measured one-step entropy change")

    _quadrant_section(doc, cmp, tables)
    add_figure(doc, "quadrants", plots.plot_quadrants(cmp), "four quadrants over steps")

    _summary_section(doc, cmp, metrics, tables)
    _critical_section(doc, cmp, sweep, add_figure, block, summaries, tables)

    if len(cmp.sources) > 1:
        doc.h(2, "5. Across sources (normalised axes)")
        doc.p(
            "Absolute entropies differ in scale between sources, so each run is shown as entropy / its initial "
            "entropy against the fraction of training done (linear interpolation onto 201 points, then the seed "
            "mean and band)."
        )
        fig = plots.plot_cross_source(cmp)
        if fig is None:
            doc.p("No run has at least 2 steps with a finite, non-zero entropy: nothing to normalise.")
        add_figure(doc, "cross_source", fig, "entropy relative to start by source")
        t = Table([Column("group", "group"), Column("source", "source"),
                   Column("final_over_initial", "final H / initial H")])
        for g in cmp.groups:
            agg = cmp.normalised_series(g).finite()
            t.add(group=g.label, source=g.source, final_over_initial=float(agg.mean[-1]) if agg.x.size else None)
        doc.table(t)
        tables["cross_source"] = t.to_json()

    if paper_rows is not None:
        doc.h(2, "6. Paper comparison")
        t = Table.from_rows(*paper_comparison(paper_rows, cmp, paper_setting, paper_model))
        tables["paper"] = t.to_json_matrix()
        doc.p(f"Reported numbers from `{paper}` (percent) next to measured evaluation results; empty cells are "
              "empty in the source.")
        if t.rows:
            doc.table(t)  # the notes, then the table
        else:
            doc.ul(t.notes)
            doc.p("No paper row matches the methods of these runs.")

    if metrics:
        doc.h(2, "Extra metrics")
        fig = plots.plot_metrics(cmp, metrics)
        if fig is None:
            doc.p(f"None of {', '.join(f'`{m}`' for m in metrics)} is logged by these runs.")
        add_figure(doc, "metrics", fig, "extra metrics over steps")

    doc.h(2, "Notes and warnings")
    items = list(cmp.notes)
    warns = list(dict.fromkeys(cmp.warnings))
    items += warns[:_MAX_WARNINGS]
    if len(warns) > _MAX_WARNINGS:
        items.append(f"… and {len(warns) - _MAX_WARNINGS} more warnings")
    if items:
        doc.ul(items)
    else:
        doc.p("None.")

    _remove_previous(out)  # the folder holds only this report: no stale figure of a previous one survives
    pngs = plots.save_figures(built, dpi, png_copies=fmt == "pdf")
    images = {}
    for (_, path), png in zip(built, pngs):
        mime, data = ("image/png", png) if fmt == "pdf" else (_MIME[fmt], path.read_bytes())
        images[path.name] = (mime, data, _css_width(data, dpi) if mime == "image/png" else None)
    md_path = out / "report.md"
    html_path = out / "report.html"
    md_path.write_text(doc.to_markdown(), encoding="utf-8")
    html_path.write_text(doc.to_html(images, title), encoding="utf-8")
    json_path = out / "report.json"
    data = report_data(cmp, tables, title, inputs, summaries, verdict)
    json_path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    logger.debug("wrote %s and %s (%d figures)", md_path, html_path, len(figures))
    return ReportFiles(md_path, html_path, figures, json_path, verdict, crit)
