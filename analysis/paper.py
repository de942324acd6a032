"""Reported benchmark numbers (a paper's Table 2 CSV) next to measured evaluation results of runs.

The CSV has the columns ``setting,model,method,aime24,aime25,amc23,math500,minerva,olympiadbench,avg,source``
(STARE arXiv 2606.19236, Table 2; accuracies in percent, empty cells where the paper has none). Measured results
come from a run's ``eval.json`` (written by ``stare-lab evaluate``: ``{"model": …, "benchmarks": {"aime24":
{"avg@k": …, "pass@k": …}, …}, "average": …}``, accuracies as fractions in [0, 1]; read defensively) or from
``eval/<benchmark>/avg@<k>`` keys in its metrics (same fractions). Measured fractions are shown ×100 to match the
paper's percent. Nothing is invented: a cell the paper or the runs do not have stays empty, and the measured
``avg`` is only filled when all six benchmarks were measured (Table 2's avg is the mean of the six).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from stare_lab.errors import ConfigError, DataError
from stare_lab.platform.files import read_text

from .compare import Comparison
from .load import RunData
from .stats import last_finite

logger = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "METHOD_TO_PAPER",
    "load_paper_table",
    "check_paper_filters",
    "measured_results",
    "paper_comparison",
]

#: Benchmarks of Table 2, in column order; the paper's ``avg`` is their plain mean.
BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
_REQUIRED = ("setting", "model", "method")
#: stare_lab method name → the paper's row name (methods without a row in Table 2 are absent).
METHOD_TO_PAPER = {
    "grpo": "GRPO",
    "grpo-ds": "GRPO-ds",
    "o1": "STARE-O1",
    "c2": "STARE-C2",
    "kl_cov": "KL-Cov",
    "forking_tokens": "80/20",
    "entropy_bonus": "EntroReg",  # the paper's entropy-regularisation baseline
}
_MODEL_KEYS = ("model", "model.name", "model.name_or_path", "model.path", "model_name", "trainer.model")
_EVAL_KEY_RE = re.compile(r"^eval/([^/]+)/(avg@\w+|accuracy|mean)$")


def _cell(value: str | None) -> float | None:
    if value is None or not value.strip():
        return None
    try:
        v = float(value)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def load_paper_table(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a Table-2 CSV: one dict per row with ``setting``, ``model``, ``method``, ``source`` (str) and each
    benchmark column plus ``avg`` as float (percent) or None (empty or non-numeric cell).

    Raises:
        DataError: if the file is missing or unreadable, has no header, or lacks a required column
            (setting, model, method).
    """
    p = Path(path)
    text = read_text(p, "paper table", DataError, allow_empty=True)  # UTF-8, or one line with file:line
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames
        raw = list(reader)
    except csv.Error as err:
        raise DataError(f"paper table {str(p)!r} is not readable: {err}") from None
    if not header:
        raise DataError(f"paper table {str(p)!r} is empty (no CSV header)")
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise DataError(
            f"paper table {str(p)!r} lacks column(s) {', '.join(missing)}; expected "
            "setting,model,method," + ",".join(BENCHMARKS) + ",avg,source"
        )
    rows = []
    for rec in raw:
        row: dict[str, Any] = {k: (rec.get(k) or "").strip() for k in ("setting", "model", "method", "source")}
        for b in BENCHMARKS + ("avg",):
            row[b] = _cell(rec.get(b))
        rows.append(row)
    return rows


def _pick_score(entry: Any) -> float | None:
    """A benchmark score from an eval.json entry: a number, or a dict's ``avg@…`` (else ``accuracy``/``mean``)."""
    if isinstance(entry, bool):
        return None
    if isinstance(entry, (int, float)):
        return float(entry) if math.isfinite(entry) else None
    if isinstance(entry, dict):
        keys = [k for k in entry if isinstance(k, str) and k.startswith("avg@")] + ["accuracy", "mean"]
        for k in keys:
            v = entry.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return float(v)
    return None


def measured_results(run: RunData) -> dict[str, float]:
    """Measured benchmark scores of one run as its source gives them (fractions from ``stare-lab evaluate``):
    benchmark → score. eval.json wins over ``eval/<benchmark>/avg@<k>`` metric keys (last finite value). Unknown
    shapes are ignored (logged), never guessed. Averages are not read: :func:`paper_comparison` fills ``avg`` only
    from all six benchmarks."""
    out: dict[str, float] = {}
    for key in run.columns:
        m = _EVAL_KEY_RE.match(key)
        if m and m.group(1) in BENCHMARKS and m.group(1) not in out:
            v = last_finite(run.column(key))
            if v is not None:
                out[m.group(1)] = v
    ev = run.eval
    if isinstance(ev, dict):
        benches = ev.get("benchmarks")
        if isinstance(benches, dict):
            for name, entry in benches.items():
                v = _pick_score(entry)
                if v is not None and name in BENCHMARKS:
                    out[name] = v
        elif benches is not None:
            logger.warning("%s: eval.json 'benchmarks' is not a mapping; ignored", run.path)
    return out


def _run_models(run: RunData) -> list[str]:
    """Model names a run mentions (config model keys, then eval.json's ``model``)."""
    vals = [run.config_value(k) for k in _MODEL_KEYS]
    if isinstance(run.eval, dict):
        vals.append(run.eval.get("model"))
    return [v for v in vals if isinstance(v, str) and v]


def check_paper_filters(table: list[dict[str, Any]], setting: str | None = None, model: str | None = None) -> None:
    """Check that ``setting`` and ``model`` (case-insensitive) name rows of ``table``.

    Raises:
        ConfigError: if either matches no row; the message lists the table's settings (or models).
    """
    for what, value in (("setting", setting), ("model", model)):
        if value is None:
            continue
        have = sorted({r[what] for r in table if r[what]})
        if value.lower() not in {h.lower() for h in have}:
            raise ConfigError(f"paper {what} {value!r} is not in the paper table; its {what}s: {', '.join(have)}")


def paper_comparison(
    table: list[dict[str, Any]], cmp: Comparison, setting: str | None = None, model: str | None = None
) -> tuple[list[str], list[list[Any]], list[str]]:
    """Reported (paper) and measured rows side by side.

    For every group whose method has a paper row (:data:`METHOD_TO_PAPER`): the paper's rows for that method (once,
    before the method's first group), then the group's measured row (mean over its runs with results, fractions ×100 = percent; ``avg`` = the mean of
    the six benchmarks when all six are measured, else empty).

    Args:
        table: from :func:`load_paper_table`.
        cmp: the runs.
        setting, model: keep only paper rows of this setting / model (case-insensitive). If ``model`` is None and
            the runs' configs name a model that appears in the table, only that model's rows are kept.

    Returns:
        ``(header, rows, notes)``; cells are str/float/None (None = empty, never filled in).

    Raises:
        ConfigError: if ``setting`` or ``model`` names no row of the table (:func:`check_paper_filters`).
    """
    check_paper_filters(table, setting, model)
    notes: list[str] = []
    rows_t = table
    if setting:
        rows_t = [r for r in rows_t if r["setting"].lower() == setting.lower()]
    if model is None:
        run_models = " ".join(m for r in cmp.runs for m in _run_models(r)).lower()
        hits = sorted({r["model"] for r in rows_t if r["model"] and r["model"].lower() in run_models})
        if hits:
            model = hits[0]
            notes.append(f"paper rows restricted to model {model} (named in the runs' configs)")
    if model:
        rows_t = [r for r in rows_t if r["model"].lower() == model.lower()]
    header = ["row", "kind", "setting", "model", *BENCHMARKS, "avg"]
    out: list[list[Any]] = []
    any_measured = False
    shown: set[int] = set()  # each paper row once, before the first group of its method
    for g in cmp.groups:
        paper_name = METHOD_TO_PAPER.get(g.method)
        paper_rows = [r for r in rows_t if paper_name and r["method"] == paper_name and id(r) not in shown]
        shown.update(id(r) for r in paper_rows)
        per_run = [measured_results(r) for r in g.runs]
        per_run = [m for m in per_run if m]
        if not paper_rows and not per_run:
            continue
        for r in paper_rows:
            kind = "reported" + (f" ({r['source']})" if r.get("source") else "")
            out.append([r["method"], kind, r["setting"], r["model"], *[r[b] for b in BENCHMARKS], r["avg"]])
        if per_run:
            any_measured = True
            scaled = []
            for m in per_run:  # stare-lab evaluate writes fractions in [0, 1]; the paper shows percent
                if any(v > 1.0 for v in m.values()):
                    notes.append(f"{g.label}: a measured score is > 1, so not a fraction; shown as is")
                    scaled.append(dict(m))
                else:
                    scaled.append({k: 100.0 * v for k, v in m.items()})
            cells = []
            for b in BENCHMARKS:
                vals = [m[b] for m in scaled if b in m]
                cells.append(float(np.mean(vals)) if vals else None)
            if all(c is not None for c in cells):
                cells.append(float(np.mean(cells)))
            else:
                cells.append(None)
                n_have = sum(c is not None for c in cells[:-1])
                notes.append(f"{g.label}: measured avg left empty ({n_have} of {len(BENCHMARKS)} benchmarks measured)")
            model_name = next((m for r in g.runs for m in _run_models(r)), None)
            out.append([g.label, f"measured ({len(per_run)} run{'s' * (len(per_run) > 1)})", None, model_name, *cells])
    if not any_measured:
        notes.append("no run has evaluation results (eval.json or eval/<benchmark>/avg@k); reported numbers only")
    return header, out, list(dict.fromkeys(notes))
