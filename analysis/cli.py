"""``stare-lab analyze``: figures and a report (report.md + self-contained report.html) from run directories.

Registered under the entry-point group ``stare_lab.commands`` (pyproject.toml) and discovered by the front door
:mod:`stare_lab.cli`. User errors raise :class:`~stare_lab.errors.StareLabError` subclasses; the front door prints
them as one line.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

from stare_lab.errors import ConfigError, RunError

__all__ = ["register", "run_analyze"]
# The work is in analysis.analyze (imported by the handler): this module only parses the command line.


# Numeric options are parsed in the handler, not by argparse ``type=``: argparse turns any ValueError (ConfigError
# is one) into its usage text and exit 2; a ConfigError raised from the handler is one line and exit 1.
def _positive_float(option: str, value: str | float | None) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except ValueError:
        raise ConfigError(f"{option}={value!r} is not a number; expected a finite number > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{option}={value} is not allowed; expected a finite number > 0")
    return v


def _positive_int(option: str, value: str | int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise ConfigError(f"{option}={value!r} is not an integer; expected an integer > 0") from None
    if v <= 0:
        raise ConfigError(f"{option}={value} is not allowed; expected an integer > 0")
    return v


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``analyze`` sub-parser (entry point of the ``stare_lab.commands`` group)."""
    p = subparsers.add_parser(
        "analyze",
        help="plots and a report from run directories (analysis)",
        description="Find runs (recursively) under the given directories, group them by method (runs of one method "
        "whose sweep folder, simulator kind/preset, loss.stare settings or target entropy differ are separate groups "
        "unless --merge; more splits with --group-by), aggregate seeds (mean and 95% band), and write figures, "
        "report.md and a self-contained report.html.",
    )
    p.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP_DIR", help="run directories or folders above them, or framework log files (verl's file logger)")
    p.add_argument("--out", help="output folder (default: PATH/figures for a single PATH; required for several)")
    p.add_argument("--format", dest="fmt", choices=["png", "svg", "pdf"], default="png", help="figure format")
    p.add_argument("--metric", nargs="+", action="extend", default=[], metavar="KEY",
                   help="extra metric keys to plot over steps and list in the summary (put it after the paths)")
    p.add_argument("--group-by", action="append", default=[], metavar="CONFIG_KEY",
                   help="dotted config key that splits methods into groups (e.g. loss.stare.reweight_w); repeatable")
    p.add_argument("--merge", action="store_true",
                   help="average all runs of a method even when their sweep folder, simulator kind/preset, loss.stare "
                   "settings or target entropy differ (default: such runs are separate groups, e.g. "
                   "'c2 [transformer]', 'c2 (W=5)')")
    p.add_argument("--band", default=0.05, metavar="NATS",
                   help="half-width of the target-entropy band (default 0.05 nats)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--threshold", metavar="NATS",
                   help="absolute entropy threshold for 'steps to threshold'")
    g.add_argument("--threshold-frac", default=0.1, metavar="FRAC",
                   help="relative threshold: FRAC × the initial entropy (default 0.1)")
    p.add_argument("--paper", metavar="CSV", help="paper Table-2 CSV (e.g. papers/stare_2606.19236/table2.csv)")
    p.add_argument("--paper-setting", help="keep only paper rows of this setting (short_cot, long_cot, tool_use)")
    p.add_argument("--paper-model", help="keep only paper rows of this model")
    p.add_argument("--dpi", help="resolution of PNG figures in dots per inch (default 150)")
    p.add_argument("--summary", metavar="SUMMARY_JSON",
                   help="a sweep's summary.json (stare-lab simulate): its headline on top, its phase diagram and "
                   "critical W (default: a summary.json in a single given directory)")
    p.set_defaults(func=run_analyze)
    return p


def run_analyze(args: argparse.Namespace) -> int:
    """Handler of ``stare-lab analyze`` (:func:`analysis.analyze.analyze`); prints the verdict, the sweep's critical
    W (the report's line, when a sweep over W is analysed), where the report went and a one-line summary per
    group."""
    t0 = time.perf_counter()
    band = _positive_float("--band", args.band)
    threshold = _positive_float("--threshold", args.threshold)
    threshold_frac = _positive_float("--threshold-frac", args.threshold_frac)
    dpi = {} if args.dpi is None else {"dpi": _positive_int("--dpi", args.dpi)}  # default: analysis.figstyle.DPI
    if threshold_frac is not None and threshold_frac > 1:
        raise ConfigError(f"--threshold-frac={threshold_frac} is outside (0, 1]")
    for opt, val in (("--paper-setting", args.paper_setting), ("--paper-model", args.paper_model)):
        if val is not None and args.paper is None:
            raise ConfigError(f"{opt}={val!r} needs --paper CSV (it selects rows of the paper table)")
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:  # a report without some of the runs asked for would read as the whole picture
        more = f" (nor {len(missing) - 1} more of the {len(args.paths)} paths)" if len(missing) > 1 else ""
        raise ConfigError(f"{missing[0]!r} does not exist{more}: nothing analysed; give existing run directories or "
                          "folders above them")
    # here, after the option checks (a bad option is one line before the plotting library loads), not at the top:
    # the front door imports every wing's cli to build its parser
    from .analyze import analyze
    res = analyze(args.paths, args.out, group_by=args.group_by, band=band, threshold=threshold,
                  threshold_frac=threshold_frac if threshold_frac is not None else 0.1, merge=args.merge,
                  metrics=args.metric, fmt=args.fmt, **dpi, paper=args.paper, paper_setting=args.paper_setting,
                  paper_model=args.paper_model, summary=args.summary)
    cmp, files = res.comparison, res.files
    print(f"verdict: {res.verdict}")
    if res.critical:
        print(f"critical W: {res.critical}")
    for row in cmp.summary_rows():
        h0, h1 = row["initial_entropy"][0], row["final_entropy"][0]
        band_frac = row["frac_in_band"]
        band_s = f", in band {band_frac[0]:.2f}" if band_frac[2] else ""
        left = sum(str(r.path) in cmp.left_out for r in cmp.group(row["label"]).runs)
        left_s = f" ({left} unfinished or not measurable: not in the verdict's counts)" if left else ""
        print(f"  {row['label']:<24} runs {row['n_runs']}{left_s}  entropy {h0:.3g} -> {h1:.3g} nats{band_s}")
    n_warn, n_note = len(set(cmp.warnings)), len(cmp.notes)
    counts = [f"{n} {word}{'s' * (n != 1)}" for n, word in ((n_warn, "warning"), (n_note, "note")) if n]
    print(
        f"stare-lab analyze: {len(cmp.runs)} runs, {len(cmp.groups)} groups, {len(files.figures)} figures"
        + (f", {' and '.join(counts)} (listed in the report)" if counts else "")
        + f"; report: {files.markdown} and {files.html} ({time.perf_counter() - t0:.1f} s)"
    )
    return 0
