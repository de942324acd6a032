"""The analysis report: figures + ``report.md`` + a self-contained ``report.html`` (images base64-embedded) +
``report.json`` (the numbers of the tables, machine-readable).

One document model (:class:`Doc`: headings, paragraphs, lists, tables, images) renders to both Markdown and HTML,
so the two always say the same thing; the sections put the numbers of their tables into ``report.json`` as they
build them (unformatted: mean / 95% half-width / count for a seed aggregate, null where a cell is empty).
``report.json`` also lists every run with its summary statistics (:func:`analysis.stats.run_summary` with the
run's own settings), which equal the statistics of the run's ``summary.json``. The report reads top to bottom:
runs, entropy dynamics, predicted vs measured ΔH, the four quadrants, the per-method summary, then (when given)
cross-source and paper comparisons.
No timestamps: the same runs give the same report.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

from stare_lab.errors import ConfigError
from stare_lab.runlock import LOCK_FILE, lock_dir

from . import phase, plots, stats
from .compare import Comparison
from .paper import check_paper_filters, load_paper_table, paper_comparison
from .verdict import comparison_verdict

logger = logging.getLogger(__name__)

__all__ = ["Doc", "ReportFiles", "write_report", "report_data", "FORMATS"]

FORMATS = ("png", "svg", "pdf")
_MIME = {"png": "image/png", "svg": "image/svg+xml"}
_MAX_WARNINGS = 60
_NUMERIC = re.compile(r"^-?[\d.]+(e-?\d+)?( ± [\d.]+(e-?\d+)?| \[-?[\d.]+(e-?\d+)?, (-?[\d.]+(e-?\d+)?|inf)\])?"
                      r"( \(\d+/\d+\))?$")


def _num(v: Any, digits: int = 3) -> str:
    """A table cell: '' for None/NaN, ints as is, floats with ``digits`` significant digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
    return str(v)


def _mci(t: tuple[float, float, int] | None, key: str = "", digits: int = 3) -> str:
    """``(mean, halfwidth, n)`` → '0.123 ± 0.004' (no ± for one value; '' for none); where the interval leaves the
    possible values of statistic ``key`` (:func:`analysis.stats.known_range`) the clipped interval instead:
    '0.577 [0, 1]' (:data:`BAND_RULE`)."""
    if not t or t[2] == 0:
        return ""
    mean, hw, _ = t
    lo, hi, cut = stats.clipped_interval(mean, hw, stats.known_range(key))
    if cut:
        return f"{_num(mean, digits)} [{_num(lo, 2)}, {_num(hi, 2)}]"
    return _num(mean, digits) + (f" ± {_num(hw, 2)}" if math.isfinite(hw) else "")


#: the rule for every seed band of the report (tables and figures), said once in its text
BAND_RULE = (
    "Seed bands: the 95% t-interval of the mean over seeds (mean ± t·s/√n; with 3 seeds t = 4.30), cut to the "
    "values the statistic can take — fractions and shares to [0, 1]; entropies, counts and times to ≥ 0 "
    "(`analysis.stats.known_range`). In tables a cut interval is shown as [low, high] instead of ± (e.g. "
    "0.577 [0, 1]: the seeds disagree too much for the interval to say more than the range); figures shade the "
    "cut band. Rewards, ΔH and predictions have no known range and are never cut."
)


def _jnum(v: Any) -> Any:
    """A number for report.json: None for None/NaN/±inf, ints as ints, other numbers as floats."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float) or hasattr(v, "__float__"):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


def _jmci(t: tuple[float, float, int] | None, key: str = "") -> dict[str, Any] | None:
    """``(mean, halfwidth, n)`` → ``{"mean", "ci95", "n", "low", "high"}``: ``ci95`` the t half-width, ``low`` /
    ``high`` the interval cut to the possible values of statistic ``key`` (:data:`BAND_RULE`, as the tables show
    it); None entries where undefined."""
    if t is None:
        return None
    lo, hi, _ = stats.clipped_interval(t[0], t[1], stats.known_range(key)) if t[2] else (math.nan, math.nan, False)
    return {"mean": _jnum(t[0]), "ci95": _jnum(t[1]), "n": int(t[2]), "low": _jnum(lo), "high": _jnum(hi)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return _jnum(value)


class Doc:
    """A small document: add blocks, then render with :meth:`to_markdown` or :meth:`to_html`."""

    def __init__(self) -> None:
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str) -> None:
        """A heading of ``level`` 1–6."""
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        """A paragraph; `backticks` become code, **stars** bold."""
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        """A bullet list (nothing for an empty list)."""
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table; non-string cells are formatted with 3 significant digits, None/NaN as empty cells."""
        self.blocks.append(("table", list(header), [[_num(c) if not isinstance(c, str) else c for c in r] for r in rows]))

    def img(self, name: str, alt: str) -> None:
        """An image file ``name`` relative to the report's folder (Markdown: an image, or a plain link for a PDF,
        which Markdown viewers cannot show inline)."""
        self.blocks.append(("img", name, alt))

    def to_markdown(self) -> str:
        """GitHub-flavoured Markdown; images are links relative to the report's folder."""
        out: list[str] = []
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out.append("#" * b[1] + " " + b[2])
            elif kind == "p":
                out.append(b[1])
            elif kind == "ul":
                out.append("\n".join(f"- {i}" for i in b[1]))
            elif kind == "table":
                esc = [[c.replace("|", "\\|") for c in r] for r in [b[1], *b[2]]]
                lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])]
                lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
                out.append("\n".join(lines))
            elif kind == "img":
                out.append(f"[{b[2]} ({b[1]})]({b[1]})" if b[1].lower().endswith(".pdf") else f"![{b[2]}]({b[1]})")
        return "\n\n".join(out) + "\n"

    @staticmethod
    def _inline(text: str) -> str:
        parts = re.split(r"(`[^`]*`|\*\*[^*]+\*\*)", text)
        return "".join(
            f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
            else f"<strong>{html.escape(p[2:-2])}</strong>" if p.startswith("**") and p.endswith("**") and len(p) > 4
            else html.escape(p)
            for p in parts
        )

    def to_html(self, images: dict[str, tuple[str, bytes]], title: str) -> str:
        """HTML with every image embedded: ``images`` maps an image name to ``(mime type, bytes)``."""
        body: list[str] = []
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                body.append(f"<h{b[1]}>{self._inline(b[2])}</h{b[1]}>")
            elif kind == "p":
                body.append(f"<p>{self._inline(b[1])}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{self._inline(i)}</li>" for i in b[1]) + "</ul>")
            elif kind == "table":
                head = "".join(f"<th>{self._inline(c)}</th>" for c in b[1])
                rows = "".join(
                    "<tr>" + "".join(
                        f'<td class="n">{self._inline(c)}</td>' if _NUMERIC.match(c) else f"<td>{self._inline(c)}</td>"
                        for c in r
                    ) + "</tr>"
                    for r in b[2]
                )
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif kind == "img":
                mime, data = images[b[1]]
                uri = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
                body.append(f'<figure><img src="{uri}" alt="{html.escape(b[2])}"></figure>')
        style = (
            "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
            "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
            "td.n{text-align:right}img{max-width:100%}code{background:#f3f3f3}"
        )
        return (
            f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
        )


@dataclasses.dataclass
class ReportFiles:
    """What :func:`write_report` wrote: ``markdown``, ``html`` and ``json`` paths, the figure paths by name and the
    verdict line at the top of the report."""

    markdown: Path
    html: Path
    figures: dict[str, Path]
    json: Path | None = None
    verdict: str = ""


def _runs_section(doc: Doc, cmp: Comparison, tables: dict[str, Any]) -> None:
    doc.h(2, "Runs")
    rows = []
    tables["runs"] = []
    for g in cmp.groups:
        n = [r.n_steps for r in g.runs]
        seeds = ", ".join("?" if s is None else str(s) for s in g.seeds)
        steps = f"{min(n)}" if min(n) == max(n) else f"{min(n)}–{max(n)}"
        rows.append([g.label, g.method, g.source, str(len(g.runs)), seeds, steps, g.target_entropy])
        tables["runs"].append({"group": g.label, "method": g.method, "source": g.source, "runs": len(g.runs),
                               "seeds": list(g.seeds), "steps_min": min(n), "steps_max": max(n),
                               "target_entropy": g.target_entropy})
    doc.table(["group", "method", "source", "runs", "seeds", "steps", "target H (nats)"], rows)
    split = [n for n in cmp.notes if "separate groups" in n]
    if split:
        doc.p("Not averaged together: " + " ".join(s.rstrip(".") + "." for s in split))


def _prediction_section(doc: Doc, cmp: Comparison, tables: dict[str, Any]) -> None:
    doc.h(2, "2. Predicted vs measured one-step entropy change")
    fits = cmp.prediction_fits()
    tables["prediction"] = [
        {"group": f["label"], "predictor": f["predictor"], **{k: getattr(f["fit"], k) for k in (
            "n", "slope", "intercept", "r2", "r2_identity", "rmse", "reason")}}
        for f in (fits if cmp.has_measured_change() else [])
    ]
    if not cmp.has_measured_change() or not fits:
        doc.p("No run logs both a first-order prediction and a measured `entropy_change`; nothing to compare.")
        return
    doc.p(
        "Ordinary least-squares fit of measured ΔH on predicted ΔH (as `scipy.stats.linregress`), pooled over seeds: a perfect "
        "first-order prediction has slope 1, intercept 0 and R² 1. R² (identity) = 1 − Σ(measured − predicted)² / "
        "Σ(measured − mean)², the fit of the identity line itself (negative when worse than a constant). All "
        "(step, seed) pairs of a group go into one fit, so R² here is not the per-seed mean shown as R2(dH) by "
        "`stare-lab simulate`."
    )
    rows = []
    for f in fits:
        fit = f["fit"]
        rows.append(
            [f["label"], f"`{f['predictor']}`", fit.n, fit.slope, fit.intercept, fit.r2, fit.r2_identity, fit.rmse,
             fit.reason or ""]
        )
    doc.table(["group", "predictor", "pairs (all seeds)", "slope (pooled fit)", "intercept (pooled fit)",
               "R² (pooled fit)", "R² (identity, pooled)", "RMSE (nats)", "note"], rows)


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
    rows = []
    for r in cmp.quadrant_table():
        rows.append([r["label"], r["description"], "+" if r["expected_sign"] > 0 else "−",
                     _mci(r["count"], "quadrant/q/count"), _mci(r["share"], "quadrant/q/share"),
                     _mci(r["dH_per_step"]), _mci(r["dH_total"])])
        tables["quadrants"].append({"group": r["label"], "quadrant": r["quadrant"], "description": r["description"],
                                    "expected_sign": r["expected_sign"],
                                    **{k: _jmci(r[k], f"quadrant/q/{k}") for k in ("count", "share", "dH_per_step",
                                                                                    "dH_total")}})
    doc.table(["group", "quadrant", "expected sign of ΔH", "tokens per step", "share", "ΔH per step (nats)",
               "ΔH total (nats)"], rows)


def _summary_section(doc: Doc, cmp: Comparison, extra: Sequence[str], tables: dict[str, Any]) -> None:
    doc.h(2, "4. Summary per method")
    srows = cmp.summary_rows(extra)
    finals = list(dict.fromkeys(k for r in srows for k in r if k.startswith("final/")))
    thr = (f"{cmp.threshold:g} nats" if cmp.threshold is not None
           else f"{cmp.threshold_frac:g} × the run's initial entropy")
    doc.p(
        f"Each cell: mean ± 95% band over the group's seeds of a per-run number, with the definitions of every "
        f"run's `summary.json` (`stare_lab.summary`). Initial H: the run's first logged entropy; final H: its last "
        f"logged entropy plus that step's measured change where logged (the entropy after the last update), nats. "
        f"Steps to threshold: first step with entropy < {thr}, mean over the seeds that got there (count in "
        f"brackets). In band: fraction of steps with |H − H_tgt| ≤ {cmp.band_half_width:g} nats. Final reward: "
        "mean reward over the last 10% of the run's steps. Other final values: last logged value. Wall time: sum "
        "of `time/step_s` (else summary.json). `stare-lab simulate`'s table reports the same H0, H_end, reward and "
        "in-band numbers; its R2(dH) is a per-seed fit averaged over seeds (section 2 here pools the seeds). "
        + BAND_RULE
    )
    header = ["group", "runs", "initial H (first logged, nats)", "final H (after the last update, nats)",
              "steps to threshold", "in band (fraction of steps)", "final reward (mean of last 10% of steps)",
              *[f"`{k[6:]}` (last logged)" for k in finals], "wall time (s)"]
    rows = []
    tables["summary"] = []
    for r in srows:
        mean, crossed, total = r["steps_to_threshold"]
        stt = "never" if mean is None else f"{mean:.0f} ({crossed}/{total})"
        rows.append([r["label"], str(r["n_runs"]), _mci(r["initial_entropy"], "initial_entropy"),
                     _mci(r["final_entropy"], "final_entropy"), stt, _mci(r["frac_in_band"], "frac_in_band"),
                     _mci(r["final_reward"], "final_reward"), *[_mci(r.get(k), k) for k in finals],
                     _mci(r["wall_time_s"], "wall_time_s")])
        entry: dict[str, Any] = {"group": r["label"], "method": r["method"], "source": r["source"],
                                 "n_runs": r["n_runs"], "target_entropy": r["target_entropy"],
                                 "steps_to_threshold": {"mean": mean, "crossed": crossed, "runs": total}}
        for k in ("initial_entropy", "final_entropy", "frac_in_band", "final_reward", *finals, "wall_time_s"):
            entry[k] = _jmci(r.get(k), k)
        tables["summary"].append(entry)
    doc.table(header, rows)


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
    return _jsonable({
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


def _critical_section(doc: Doc, cmp: Comparison, sweep: dict[str, Any] | None, add_figure: Any) -> None:
    """Critical STARE strength (docs/theory.md §7): the sweep's phase diagram and measured vs predicted W, and the
    critical W of every group whose runs log the decomposition terms (:mod:`analysis.phase`)."""
    crit_rows = phase.critical_rows(sweep) if sweep else []
    run_rows = phase.run_critical_rows(cmp)
    fig = phase.phase_figure(sweep) if sweep else None
    if not (crit_rows or run_rows or fig is not None):
        return
    doc.h(2, "Critical STARE strength")
    doc.p(
        "With the gate on, a step's first-order entropy change splits as D_GRPO + (W − 1)·D_L+ (+ (M − 1)·D_L− for "
        "C2), so W*(t) = 1 − D_GRPO(t)/D_L+(t) cancels the drift (docs/theory.md §7; `stare_lab.critical`). The critical "
        "W along a run is the largest W*(t) over its second half (meaningful on a run that holds the band); the "
        "GRPO-only estimate is W* where the entropy first falls below H_tgt (the larger of the two where W*(t) falls "
        "as the reward saturates, as in the tabular tasks; not on every model — compare both)."
    )
    if fig is not None:
        doc.p("Phase diagram: band deviation = mean over seeds of the mean |H − H_tgt| over the second half of each "
              "run; the band holds below the boundary. Over W alone the deviation is on a log axis down to a floor "
              f"(10^-{phase.FLOOR_DECADES} × the band, rounded down to a power of ten); smaller deviations are drawn "
              "on the floor with hollow markers, its tick reads '≤ floor'.")
        add_figure(doc, "phase", fig, "band deviation over the sweep grid")
    if crit_rows:
        doc.p("Measured critical W = the smallest grid W whose runs hold the band on every seed; first-order "
              "prediction = median over the held runs of their critical W; 'with measured drift' uses the measured "
              "one-step change of the ω ≡ 1 update instead of D_GRPO (second-order, noise-driven drift included); "
              "tolerance max(35 % of W − 1, one grid step).")
        doc.table(["method", "slice", "measured W", "first-order W*", "with measured drift", "GRPO-only W*",
                   "tolerance", "within"], crit_rows)
    if run_rows:
        doc.table(["group", "M (C2)", "critical W along the run (median over seeds)",
                   "W* at the H_tgt crossing (median)", "runs"], run_rows)


def write_report(
    cmp: Comparison,
    out_dir: str | os.PathLike,
    fmt: str = "png",
    metrics: Sequence[str] = (),
    paper: str | os.PathLike | None = None,
    paper_setting: str | None = None,
    paper_model: str | None = None,
    dpi: int = 90,
    title: str = "stare_lab analysis report",
    inputs: Sequence[str] = (),
    sweep: dict[str, Any] | None = None,
) -> ReportFiles:
    """Write the figures, ``report.md``, a self-contained ``report.html`` and ``report.json`` (:func:`report_data`)
    into ``out_dir``.

    Args:
        cmp: the grouped runs (:func:`analysis.compare`).
        out_dir: created if missing; files are overwritten.
        fmt: figure format: ``png``, ``svg`` or ``pdf`` (for pdf the HTML embeds PNG renders of the figures).
        metrics: extra metric keys to plot over steps and list in the summary table.
        paper: a Table-2 CSV (see :mod:`analysis.paper`) to put reported numbers next to measured ones.
        paper_setting, paper_model: restrict the paper rows.
        dpi: raster resolution (dots per inch) of PNG figures.
        title: the report's title.
        inputs: the paths analysed (listed in the report).
        sweep: a sweep's ``summary.json`` (:func:`analysis.phase.read_sweep_summary`): its headline goes at the
            top, its grid and critical W into the "Critical STARE strength" section.

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
                          sweep)
        except BaseException:
            if created:  # leave no half-written folder behind: everything in it but the lock is ours
                for p in out.iterdir():
                    if p.name != LOCK_FILE:
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            raise


def _write(
    cmp: Comparison, out: Path, fmt: str, metrics: Sequence[str], paper: Any, paper_rows: Any,
    paper_setting: str | None, paper_model: str | None, dpi: int, title: str, inputs: Sequence[str],
    sweep: dict[str, Any] | None = None,
) -> ReportFiles:
    figures: dict[str, Path] = {}
    built: list[tuple[Any, Path]] = []  # written together at the end (plots.save_figures: on all cores)

    def add_figure(doc: Doc, name: str, fig: Any, alt: str) -> None:
        if fig is None:
            return
        path = out / f"{name}.{fmt}"
        figures[name] = path
        built.append((fig, path))
        doc.img(path.name, alt)

    doc = Doc()
    doc.h(1, title)
    summaries = run_summaries(cmp)
    verdict = comparison_verdict(cmp, summaries, per_setting=not (sweep and sweep.get("critical")))
    doc.p(f"**Verdict:** {verdict}")
    crit = phase.critical_line(sweep) if sweep else None
    if crit:
        doc.p(f"**Critical W:** {crit}")
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
        "Lines: mean over seeds, one colour, line style and marker per method; shaded in the method's colour: 95% "
        "band (mean ± t·s/√n, none for a single seed; the entropy band cut at 0 nats, see section 4); gold, "
        "hatched: the target band H_tgt ± "
        f"{cmp.band_half_width:g} nats (`loss.stare.target_entropy`; one hatch per target when groups differ, each "
        "labelled in the legend). Gate: fraction of seeds with the STARE gate on (when a method has more than "
        f"{plots.MAX_GATE_LINES} groups, e.g. a sweep's grid points, one row per STARE group, black = on in every "
        "seed, white = off). W (STARE weight on L+) as logged, "
        "for the groups whose loss uses STARE; M (on L−) only for variant C2 (`loss.stare.variant`): O1 never "
        "applies M, whatever M its runs log."
    )
    add_figure(doc, "dynamics", plots.plot_dynamics(cmp), "entropy, reward, gate and W/M over steps")

    _prediction_section(doc, cmp, tables)
    add_figure(doc, "prediction", plots.plot_prediction(cmp), "predicted vs measured one-step entropy change")

    _quadrant_section(doc, cmp, tables)
    add_figure(doc, "quadrants", plots.plot_quadrants(cmp), "four quadrants over steps")

    _summary_section(doc, cmp, metrics, tables)
    _critical_section(doc, cmp, sweep, add_figure)

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
        rows = []
        for g in cmp.groups:
            agg = cmp.normalised_series(g).finite()
            rows.append([g.label, g.source, float(agg.mean[-1]) if agg.x.size else None])
        doc.table(["group", "source", "final H / initial H"], rows)
        tables["cross_source"] = [{"group": r[0], "source": r[1], "final_over_initial": r[2]} for r in rows]

    if paper_rows is not None:
        doc.h(2, "6. Paper comparison")
        header, rows, notes = paper_comparison(paper_rows, cmp, paper_setting, paper_model)
        tables["paper"] = {"header": list(header), "rows": [list(r) for r in rows], "notes": list(notes)}
        doc.p(f"Reported numbers from `{paper}` (percent) next to measured evaluation results; empty cells are "
              "empty in the source.")
        doc.ul(notes)
        if rows:
            doc.table(header, rows)
        else:
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

    pngs = plots.save_figures(built, dpi, png_copies=fmt == "pdf")
    images = {path.name: ("image/png", png) if fmt == "pdf" else (_MIME[fmt], path.read_bytes())
              for (_, path), png in zip(built, pngs)}
    md_path = out / "report.md"
    html_path = out / "report.html"
    md_path.write_text(doc.to_markdown(), encoding="utf-8")
    html_path.write_text(doc.to_html(images, title), encoding="utf-8")
    json_path = out / "report.json"
    data = report_data(cmp, tables, title, inputs, summaries, verdict)
    json_path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    logger.debug("wrote %s and %s (%d figures)", md_path, html_path, len(figures))
    return ReportFiles(md_path, html_path, figures, json_path, verdict)
