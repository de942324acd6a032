"""``stare-lab simulate``: run a simulator preset for several methods × seeds (× grid points) (registered via the
entry point ``stare_lab.commands: simulate = simulators.cli:register``).

Example::

    stare-lab simulate --preset demo --out runs/demo
    stare-lab simulate --preset demo --methods grpo,o1 --sweep stare.reweight_w=1.1,1.2,1.3,1.4,1.5,1.6,1.8,2.0

Writes ``OUT/<method>[/<grid point>]/seed<k>/`` run directories, ``OUT/summary.json`` and PNGs under
``OUT/figures`` (by ``stare-lab analyze`` through the front door, given exactly this sweep's run directories and its
summary, when available, else minimal plots of our own; ``--no-plots`` skips them), and prints one headline line,
a table per group and one-line notes (:mod:`simulators.notes`: why a STARE method did not hold the band, reasoned
from direction and regime; plan notes about the request). With ``--sweep KEY=V1,V2,…`` (repeatable) the runs cover
the grid; with a ``stare.reweight_w`` grid the summary holds the measured and predicted critical W
(``critical.<method>``, :mod:`simulators.grid`) and analyze draws the phase diagram. Tabular runs are batched and
spread over ``--workers`` processes (default: all cores). Any ``key=value`` overrides a config field of the
preset's simulator (``stare.*`` is short for ``loss.stare.*``), except the keys a method sets (use ``--methods``)
and ``steps`` together with ``--steps``. On tabular presets an explicit ``stare.target_entropy=X`` replaces the
preset's ``target_entropy_rel`` (giving both is an error unless ``target_entropy_rel=null``). ``--overwrite``
removes the previous sweep's runs that the new one drops (see :mod:`simulators.sweep`). This module imports nothing
heavy at registration time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["register", "handler"]


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` sub-parser to the front door's ``subparsers`` and set its handler."""
    from .presets import DEFAULT_METHODS, DEFAULT_PRESET, METHODS, PRESETS

    p = subparsers.add_parser(
        "simulate",
        help="run tabular / small-transformer policy simulations (simulators)",
        description=(
            "Run a simulator preset for methods x seeds; writes OUT/<method>/seed<k>/ run directories, "
            "OUT/summary.json, plots and a table. Tabular presets: "
            + ", ".join(PRESETS)
            + "; transformer presets come from simulators.transformer."
        ),
    )
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset name (default {DEFAULT_PRESET})")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated methods from {{{', '.join(METHODS)}}} (default: the preset's, else {','.join(DEFAULT_METHODS)})",
    )
    # --seeds / --steps are parsed by the handler so that a bad value is one clean line (exit 1), not usage
    p.add_argument("--seeds", default=None,
                   help="number of seeds, 0..N-1 (default: the preset's; 3 for tabular presets)")
    p.add_argument("--steps", default=None, help="steps per run (default: the preset's)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="run a grid over KEY (repeatable: the product of all grids), e.g. stare.reweight_w=1.1,1.3,1.5")
    p.add_argument("--workers", default=None, help="processes for tabular runs (default: all cores)")
    p.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    p.add_argument("--resume", action="store_true", help="continue existing runs bit-exactly from their checkpoints")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing runs in OUT; runs of the previous sweep in OUT that this one drops are "
                        "removed (only those listed in OUT/summary.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=0.5 stare.reweight_w=1.5")
    p.set_defaults(func=handler, extra_overrides=[])  # key=value words after options reach extra_overrides
    return p


def _int_option(name: str, text: str | None) -> int | None:
    """``--seeds`` / ``--steps`` as an integer ≥ 1 (None if not given).

    Raises:
        ConfigError: naming the option, its value and what is allowed.
    """
    from stare_lab.errors import ConfigError

    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"--{name}={text!r} must be an integer >= 1") from None
    if value < 1:
        raise ConfigError(f"--{name}={value} must be an integer >= 1")
    return value


def _critical_lines(summary: dict) -> list[str]:
    """One line per STARE method of a W grid: measured vs predicted critical W and whether they agree."""
    lines = []
    for method, c in (summary.get("critical") or {}).items():
        def f(x):
            return "-" if x is None else f"{x:.3g}"

        tol = c.get("tolerance")
        ok = c.get("predicted_w_within_tolerance")
        verdict = "" if ok is None else (" (within" if ok else " (outside") + f" the tolerance {tol:.3g})"
        lines.append(
            f"critical W ({method}): measured {f(c.get('measured_w'))} (smallest grid W held on every seed); "
            f"first-order prediction {f(c.get('predicted_w'))}{verdict}; with the measured one-step drift "
            f"{f(c.get('predicted_w_measured_drift'))}; GRPO-only estimate at the crossing {f(c.get('predicted_w_grpo'))}"
        )
    return lines


def _plots(out: Path, summary: dict, run_dirs: list[Path], group_by: list[str] = ()) -> str:
    """PNGs via ``stare-lab analyze`` of exactly ``run_dirs`` (this sweep's runs; through the front door: no
    sideways import of ``analysis``) and the sweep's ``summary.json`` (headline, phase diagram); if that is not
    available or fails, the sweep's fallback plots. Returns a one-line note."""
    from stare_lab.cli import main as front_door

    err = io.StringIO()
    extra = ["--summary", str(out / "summary.json")]
    for key in group_by:
        extra += ["--group-by", key]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = front_door(["analyze", *map(str, run_dirs), "--out", str(out / "figures"), *extra])
    except SystemExit as exc:  # argparse inside analyze
        rc = exc.code if isinstance(exc.code, int) else 1
    if rc == 0:
        return f"figures: {out / 'figures'} (stare-lab analyze)"
    from .sweep import fallback_plots

    paths = fallback_plots(out, summary)
    reason = (err.getvalue().strip().splitlines() or ["analyze failed"])[-1]
    logger.debug("stare-lab analyze unavailable (%s); wrote fallback plots", reason)
    return f"figures: {', '.join(str(p) for p in paths)} (fallback plots; stare-lab analyze: {reason})"


def handler(args: argparse.Namespace) -> int:
    """Run the sweep described by ``args``; returns 0. User errors raise StareLabError (the front door prints one
    line and exits 1)."""
    from stare_lab.errors import ConfigError

    from .presets import METHODS, get_preset, preset_names
    from .notes import plan_notes
    from .sweep import format_table, plan_sweep, run_sweep

    if args.list_presets:
        for name in preset_names():
            spec = get_preset(name)
            print(f"{name:<16} [{spec['kind']}] {spec['description']}")
        return 0
    t0 = time.perf_counter()
    methods = None
    if args.methods is not None:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        if not methods:
            raise ConfigError(
                f"--methods={args.methods!r} names no method; give a comma-separated list from {{{', '.join(METHODS)}}}"
            )
    if args.out is not None and not args.out.strip():
        raise ConfigError(f"--out={args.out!r} is empty; give an output directory (default runs/{args.preset})")
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume continues the runs, --overwrite "
                          "replaces them")
    seeds, steps = _int_option("seeds", args.seeds), _int_option("steps", args.steps)
    workers = _int_option("workers", args.workers)
    out = Path(args.out) if args.out is not None else Path("runs") / args.preset
    plan = plan_sweep(
        args.preset,
        methods,
        seeds,
        out,
        overrides=list(args.overrides) + list(getattr(args, "extra_overrides", None) or []),
        steps=steps,
        resume=args.resume,
        overwrite=args.overwrite,
        sweep=list(args.sweep),
        workers=workers,
    )
    notes = plan_notes(plan)
    total = sum(int(getattr(c, "steps", 1)) for c in plan.configs.values())
    from tqdm import tqdm

    with tqdm(total=total, desc=f"simulate {args.preset}", unit="step", disable=None, leave=False) as bar:
        summary = run_sweep(plan, progress=bar.update)
    print(summary["headline"])
    grid = f" x {len(plan.groups)} group(s)" if plan.grid else ""
    print(f"preset {args.preset} ({plan.kind}): {len(plan.methods)} method(s){grid} x {len(plan.seeds)} seed(s) "
          f"-> {out}")
    print(format_table(summary))
    for line in _critical_lines(summary):
        print(line)
    for note in [*summary.get("notes", []), *notes]:
        print(note)
    if not args.no_plots:
        group_by = [k for k, _ in plan.grid if not k.startswith("loss.stare.")]
        print(_plots(out, summary, list(plan.run_dirs.values()), group_by))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from stare_lab.cli import main

    sys.exit(main(["simulate", *sys.argv[1:]]))
