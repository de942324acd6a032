"""``analyze``: run directories in, the report out (figures, ``report.md``, ``report.html``, ``report.json``) — the
one function behind ``stare-lab analyze`` and behind the figures of ``stare-lab simulate``.

``stare-lab simulate`` reaches it without importing this wing (the wings import only the core, docs/design.md):
it is published under the entry-point group ``stare_lab.reports`` as ``analyze`` (``pyproject.toml``), and the
simulate command looks it up there with :mod:`importlib.metadata`, like the front door finds the commands.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Sequence

import matplotlib.figure  # noqa: F401 - the report's figures (imported here, with the function that draws them)

from stare_lab.errors import ConfigError
from stare_lab.platform.outdir import REPORT, check_kind

from .compare import Comparison, compare
from .figstyle import DPI
from .phase import read_sweep_summary
from .progress import sweep_steps
from .report import ReportFiles, write_report

__all__ = ["Analysis", "analyze", "sweep_group_by"]


@dataclasses.dataclass
class Analysis:
    """What :func:`analyze` produced: the grouped runs, the written files, the sweep summary it used (or None),
    the report's verdict line and its critical-W line (the recommended W with its kind per slice and push,
    :func:`analysis.phase.critical_line`; None when no run gives one)."""

    comparison: Comparison
    files: ReportFiles
    sweep: dict[str, Any] | None
    verdict: str
    critical: str | None = None


def analyze(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    group_by: Sequence[str] = (),
    band: float = 0.05,
    threshold: float | None = None,
    threshold_frac: float = 0.1,
    merge: bool = False,
    metrics: Sequence[str] = (),
    fmt: str = "png",
    dpi: int = DPI,
    paper: str | os.PathLike | None = None,
    paper_setting: str | None = None,
    paper_model: str | None = None,
    summary: str | os.PathLike | None = None,
) -> Analysis:
    """Group the runs found under ``paths`` (:func:`analysis.compare`) and write the report into ``out``.

    Args:
        paths: run directories or folders above them, or framework log files (:mod:`analysis.foreign`).
        out: the report folder; default ``PATH/figures`` for a single path (``figures`` beside a single log file;
            required for several paths).
        group_by, band, threshold, threshold_frac, merge: as :func:`analysis.compare` (``merge`` = not split);
            default ``group_by`` with a sweep summary: its grid keys outside ``loss.stare.*`` (:func:`sweep_group_by`,
            as ``stare-lab simulate`` groups its own report), so each grid slice is its own group.
        metrics: extra metric keys to plot and tabulate (each must be logged by some run).
        fmt, dpi, paper, paper_setting, paper_model: as :func:`analysis.report.write_report`.
        summary: a sweep's ``summary.json`` (``stare-lab simulate``): its grid and critical W go into the report;
            default: the ``summary.json`` of a single given directory, if it is a sweep's. A ``calibration.json``
            in a single given directory (``stare-lab calibrate``'s output) adds its calibrated critical W for the
            probed model.

    Returns:
        An :class:`Analysis`.

    Raises:
        ConfigError: several paths without ``out``, a ``--metric`` no run logs, a ``summary`` that is not a sweep
            summary, bad report options. RunError / DataError: unreadable runs or output folder; RunError
            also for an ``out`` that holds another command's output (:func:`stare_lab.platform.outdir.check_kind`).
    """
    if out is None and len(paths) > 1:
        raise ConfigError(f"{len(paths)} input paths given: pass --out DIR to say where the report goes")
    log_file = Path(paths[0]).is_file()  # a framework's log file (analysis.foreign): the report goes beside it
    out = Path(out) if out is not None else (Path(paths[0]).parent if log_file else Path(paths[0])) / "figures"
    check_kind(out, REPORT)  # a report folder is analyze's own: never another command's output
    read_warnings: list[str] = []
    if summary is not None:
        sweep = read_sweep_summary(summary)
        if sweep is None:
            raise ConfigError(f"--summary={str(summary)!r} is not a sweep summary.json written by stare-lab simulate")
    else:
        sweep = read_sweep_summary(paths[0], read_warnings) if len(paths) == 1 and not log_file else None
    calibration = _calibration(paths, read_warnings) if len(paths) == 1 and not log_file else None
    if not group_by and sweep is not None:
        group_by = sweep_group_by(sweep)
    cmp = compare(paths, group_by=group_by, band_half_width=band, threshold=threshold,
                  threshold_frac=threshold_frac if threshold is None else 0.1, split=not merge)
    cmp.warnings.extend(read_warnings)
    if sweep is not None:  # each run's steps against what its sweep planned too (analysis.progress)
        root = Path(summary).parent if summary is not None and Path(summary).is_file() else (
            Path(summary) if summary is not None else Path(paths[0]))
        cmp.mark_left_out(sweep_steps(sweep, root))
        # the sweep's own notes (why a method did not hold the band, what to try: the terminal's) go into the report
        cmp.notes.extend(n.removeprefix("note: ") for n in sweep.get("notes") or [] if isinstance(n, str))
    _check_metrics(metrics, cmp.runs)
    files = write_report(cmp, out, fmt=fmt, metrics=metrics, paper=paper, paper_setting=paper_setting,
                         paper_model=paper_model, dpi=dpi, inputs=[str(p) for p in paths], sweep=sweep,
                         calibration=calibration)
    return Analysis(cmp, files, sweep, files.verdict, files.critical)


def _calibration(paths: Sequence[str | os.PathLike], warnings: list[str]) -> dict[str, Any] | None:
    """The ``calibration.json`` directly inside the one given folder (``stare-lab calibrate``'s output), or None; an
    unreadable one is a warning of the report."""
    from stare_lab.errors import StareLabError
    from stare_lab.theory.regime import CALIBRATION_FILE, read_calibration

    path = Path(paths[0]) / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        return read_calibration(path)
    except StareLabError as err:
        warnings.append(f"{path}: {err}; ignored")
        return None


def sweep_group_by(sweep: dict[str, Any]) -> list[str]:
    """The grid keys of a sweep summary outside ``loss.stare.*`` (e.g. ``lr``): the keys that split a sweep's runs
    into grid slices, each with its own baseline (``loss.stare.*`` values split the STARE groups anyway)."""
    grid = (sweep.get("sweep") or {}).get("grid") or []
    return [k for k, *_ in grid if isinstance(k, str) and not k.startswith("loss.stare.")]


def _check_metrics(metrics: Sequence[str], runs: list) -> None:
    """Raise :class:`ConfigError` for a metric key that no run logs as a number (a typo would otherwise give an
    empty panel), naming the closest keys the runs do log."""
    logged = sorted({k for r in runs for k in r.columns})
    for key in metrics:
        if key not in logged:
            close = difflib.get_close_matches(key, logged, n=3, cutoff=0.5)
            if close:
                hint = f"; did you mean {'one of ' if len(close) > 1 else ''}{', '.join(repr(c) for c in close)}?"
            else:
                hint = f"; they log {len(logged)} keys, e.g. {', '.join(logged[:6])}"
            raise ConfigError(f"--metric {key!r} is not logged (as a number) by any of the {len(runs)} runs{hint}")
