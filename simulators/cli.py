"""``stare-lab simulate``: run a simulator preset for several methods × seeds (× grid points) (registered via the
entry point ``stare_lab.commands: simulate = simulators.cli:register``).

Example::

    stare-lab simulate --preset demo --out runs/demo
    stare-lab simulate --preset demo --methods grpo,o1 --sweep stare.reweight_w=1.1,1.2,1.3,1.4,1.5,1.6,1.8,2.0
    stare-lab simulate --preset collapse --seeds 3,7 lr=0.5      # exactly seeds 3 and 7
    stare-lab simulate --list-keys --preset transformer           # every override key, its value and range

Writes ``OUT/<method>[/<grid point>]/seed<k>/`` run directories, ``OUT/summary.json`` and the report with its
figures under ``OUT/figures`` (made by the analysis wing's ``analyze`` function, found under the entry-point group
``stare_lab.reports`` — this wing never imports ``analysis``; ``--no-plots`` skips it), and prints one headline
line (the verdict and the recommended critical W per push, said once), a table per group, a line per auto-schedule
method with the W it found, the other estimates and one-line notes (:mod:`simulators.notes`: why a STARE method
did not hold the band, reasoned from direction and regime; plan notes about the request). Seeds: ``--seeds N`` runs
the first N seeds 0 … N−1 (N ≤ 10000), ``--seeds A,B,…`` exactly those seeds, ``--seed S`` the one seed S (seeds in
[0, 2**31 − 1]). With ``--sweep KEY=V1,V2,…`` (repeatable) the runs cover the grid; with a ``stare.reweight_w``
grid the summary holds the measured and predicted critical W (``critical.<method>``, :mod:`simulators.grid`) and the
report draws the phase diagram. Tabular runs are
batched and spread over ``--workers`` processes (default: all cores). Any ``key=value`` overrides a config field of
the preset's simulator (``stare.*`` is short for ``loss.stare.*``; ``--list-keys`` lists them), except the keys a
method sets (use ``--methods``) and ``steps`` together with ``--steps``. On tabular presets an explicit
``stare.target_entropy=X`` replaces the preset's ``target_entropy_rel`` (giving both is an error unless
``target_entropy_rel=null``). ``--overwrite`` removes the previous sweep's runs that the new one drops (see
:mod:`simulators.sweep`). ``--resume`` continues the sweep ``OUT`` holds as it was started (``OUT/sweep.json``:
what the command does not give is the sweep's own, not the preset's); options that extend it are said on screen
before anything runs (:mod:`simulators.sweep_out`).
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from stare_lab.errors import ConfigError
from stare_lab.platform.runlock import lock_dir

from simulators.presets import (DEFAULT_METHODS, DEFAULT_PRESET, MAX_SEEDS, METHODS, SEED_MAX, get_preset,
                                preset_names)

__all__ = ["register", "handler", "parse_seeds", "REPORT_GROUP", "register_calibrate", "calibrate_handler"]

#: the entry-point group where the analysis wing publishes its report function (pyproject.toml)
REPORT_GROUP = "stare_lab.reports"


class _Progress(tqdm):
    """The progress bar without tqdm's monitor thread (``monitor_interval = 0``): the sweep forks its worker
    processes while the bar is open, and a fork copies a lock that another thread holds as held for ever."""

    monitor_interval = 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` sub-parser to the front door's ``subparsers`` and set its handler."""
    p = subparsers.add_parser(
        "simulate",
        help="run tabular / small-transformer policy simulations (simulators)",
        description=(
            "Run a simulator preset for methods x seeds; writes OUT/<method>/seed<k>/ run directories, "
            "OUT/summary.json, the report with its figures (OUT/figures) and a table. Presets: "
            + ", ".join(preset_names()) + " (--list-presets describes them). Override any config key with "
            "KEY=VALUE (--list-keys lists them with their values and ranges)."
        ),
    )
    p.add_argument("--preset", default=None,
                   help=f"preset name (default {DEFAULT_PRESET}; with --resume the sweep's own)")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated methods from {{{', '.join(METHODS)}}} (default: the preset's, else {','.join(DEFAULT_METHODS)})",
    )
    # --seeds / --seed / --steps are parsed by the handler so that a bad value is one clean line (exit 1), not usage
    p.add_argument("--seeds", default=None, metavar="N | A,B,...",
                   help="N: the first N seeds 0..N-1 (N <= 10000); A,B,...: exactly these seeds, each in [0, 2**31-1] "
                        "(default: the preset's; 0,1,2 for tabular presets)")
    p.add_argument("--seed", default=None, metavar="S", help="run the one seed S (instead of --seeds)")
    p.add_argument("--steps", default=None, help="steps per run (default: the preset's)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="run a grid over KEY (repeatable: the product of all grids), e.g. stare.reweight_w=1.1,1.3,1.5")
    p.add_argument("--workers", default=None, help="processes for tabular runs (default: all cores)")
    p.add_argument("--out", default=None, help="output directory (default runs/<preset>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in OUT as it was started: its preset, methods, seeds, steps, --sweep grid "
                        "and overrides (OUT/sweep.json), each run bit-exactly from its checkpoint; options given with "
                        "it that extend the sweep (methods, seeds, grid values, more steps) are said on screen before "
                        "anything runs; leaving runs of the sweep out, another preset or another config is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing runs in OUT; runs of the previous sweep in OUT that this one drops are "
                        "removed (only those listed in OUT/summary.json)")
    p.add_argument("--no-plots", action="store_true", help="skip the report and its figures")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("--list-keys", action="store_true",
                   help="list the override keys of --preset with the preset's values and their ranges, and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. lr=0.5 stare.reweight_w=1.5")
    p.set_defaults(func=handler, extra_overrides=[])  # key=value words after options reach extra_overrides
    return p


def _int_option(name: str, text: str | None) -> int | None:
    """``--steps`` / ``--workers`` as an integer ≥ 1 (None if not given).

    Raises:
        ConfigError: naming the option, its value and what is allowed.
    """
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"--{name}={text!r} must be an integer >= 1") from None
    if value < 1:
        raise ConfigError(f"--{name}={value} must be an integer >= 1")
    return value


def parse_seeds(seeds: str | None, seed: str | None, option: str = "--seeds", has_seed: bool = True
                ) -> int | list[int] | None:
    """The seeds of ``--seeds`` (``option``: its name in messages, e.g. calibrate's ``--fit-seeds``; ``has_seed``:
    the command has ``--seed``) / ``--seed``: ``--seeds N`` → the count N (seeds 0 … N−1), ``--seeds A,B,…`` → the
    list [A, B, …], ``--seed S`` → [S]; None when neither is given (the preset's seeds). A seed is an integer in
    [0, 2**31 − 1] (:data:`~simulators.presets.SEED_MAX`), a count in [1, 10000]
    (:data:`~simulators.presets.MAX_SEEDS`).

    Raises:
        ConfigError: both options, a count outside [1, 10000], a seed that is not an integer in [0, 2**31 − 1], an
            empty item, a repeated seed.
    """
    if seeds is not None and seed is not None:
        raise ConfigError(f"{option}={seeds!r} and --seed={seed!r} both choose the seeds: give one of them")
    in_range = f"an integer in [0, {SEED_MAX}] (2**31 - 1)"
    if seed is not None:
        try:
            value = int(seed.strip())
        except ValueError:
            value = -1
        if not 0 <= value <= SEED_MAX:
            raise ConfigError(f"--seed={seed!r} must be {in_range}")
        return [value]
    if seeds is None:
        return None
    text = seeds.strip()
    if "," not in text:
        try:
            count = int(text)
        except ValueError:
            raise ConfigError(f"{option}={seeds!r} must be a count N >= 1 or a comma-separated list of seeds") from None
        if count < 1:
            hint = " (a single chosen seed: --seed S)" if has_seed else ""
            raise ConfigError(f"{option}={count} must be a count >= 1{hint}")
        if count > MAX_SEEDS:
            raise ConfigError(f"{option}={count} is more seeds than one sweep runs: give a count in [1, {MAX_SEEDS}] "
                              "or a list of seeds")
        return count
    items = [x.strip() for x in text.split(",")]
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise ConfigError(f"{option}={seeds!r}: every seed of the list must be {in_range}") from None
    if any(not 0 <= v <= SEED_MAX for v in values):
        raise ConfigError(f"{option}={seeds!r}: every seed of the list must be {in_range}")
    if len(values) > MAX_SEEDS:
        raise ConfigError(f"{option} lists {len(values)} seeds; one sweep runs at most {MAX_SEEDS}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{option}={seeds!r} lists a seed twice")
    return values


def _report_function():
    """The analysis wing's ``analyze`` function from the entry-point group :data:`REPORT_GROUP`, or the reason why
    it is unavailable (a string)."""
    try:
        eps = [ep for ep in metadata.entry_points(group=REPORT_GROUP) if ep.name == "analyze"]
    except Exception as err:  # noqa: BLE001 - broken metadata: no report, but the runs are done
        return f"cannot read the installed entry points ({err})"
    if not eps:
        return f"no installed package provides the {REPORT_GROUP} entry point 'analyze' (install the project)"
    try:
        return eps[0].load()
    except Exception as err:  # noqa: BLE001 - e.g. matplotlib missing: the sweep's results stand without figures
        return f"{type(err).__name__}: {err}"


def _figures(analyze, out: Path, run_dirs: list[Path], group_by: list[str]) -> str:
    """The report of exactly this sweep's runs (``run_dirs``) and its ``summary.json``, written into
    ``OUT/figures`` by one call of the analysis wing's ``analyze`` (:func:`_report_function`; a string: why it is
    unavailable). Returns the line to print."""
    if isinstance(analyze, str):
        return f"figures: not written ({analyze})"
    res = analyze([str(d) for d in run_dirs], out / "figures", summary=out / "summary.json", group_by=group_by)
    return (f"figures: {len(res.files.figures)} in {out / 'figures'}; report: {res.files.markdown.name}, "
            f"{res.files.html.name}, report.json")


def handler(args: argparse.Namespace) -> int:
    """Run the sweep described by ``args``; returns 0. User errors raise StareLabError (the front door prints one
    line and exits 1)."""
    if args.list_presets:
        for name in preset_names():
            spec = get_preset(name)
            print(f"{name:<16} [{spec['kind']}] {spec['description']}")
        return 0
    if args.list_keys:
        from simulators.keys import format_keys

        print(format_keys(args.preset or DEFAULT_PRESET))
        return 0
    t0 = time.perf_counter()
    methods = None
    if args.methods is not None:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        if not methods:
            raise ConfigError(
                f"--methods={args.methods!r} names no method; give a comma-separated list from {{{', '.join(METHODS)}}}"
            )
    preset = args.preset or DEFAULT_PRESET  # with --resume and no --preset: the sweep's own (simulators.sweep)
    if args.out is not None and not args.out.strip():
        raise ConfigError(f"--out={args.out!r} is empty; give an output directory (default runs/{preset})")
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume continues the runs, --overwrite "
                          "replaces them")
    seeds = parse_seeds(args.seeds, args.seed)
    steps, workers = _int_option("steps", args.steps), _int_option("workers", args.workers)
    get_preset(preset)  # an unknown preset or method: one line, before torch is imported
    for m in [] if args.resume else methods or []:  # (a resume's: with the sweep's --plugin hint, simulators.sweep)
        if m not in METHODS:  # METHODS is the live table: built-ins and what the loaded plugins registered
            raise ConfigError(f"method {m!r} is not one of {{{', '.join(METHODS)}}}")
    out = Path(args.out) if args.out is not None else Path("runs") / preset
    if args.resume and not out.exists():  # a typo in the path would otherwise start afresh without a word
        print(f"note: --resume: {str(out)!r} does not exist yet; starting the sweep there", file=sys.stderr)
    # one writer per sweep directory, taken before anything in it is read for the plan, written or deleted
    with lock_dir(out, command=f"stare-lab simulate --preset {preset}", option="--out"):
        return _run(args, t0, methods, seeds, steps, workers, out)


def _run(args: argparse.Namespace, t0: float, methods: list[str] | None, seeds: int | list[int] | None,
         steps: int | None, workers: int | None, out: Path) -> int:
    """Plan and run the sweep into ``out`` (whose lock the caller holds); print the results."""
    # here, not at the top: the front door imports every wing's cli to build its parser, and these pull in torch
    from simulators.sweep import format_table, plan_sweep, run_sweep

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
    for note in plan.resume_notes:  # what --resume adds to the sweep, before anything runs
        print(note, file=sys.stderr)
    from simulators.notes import auto_lines, critical_lines, plan_notes  # after the plan: they import torch

    notes = plan_notes(plan)
    total = sum(int(getattr(c, "steps", 1)) for c in plan.configs.values())
    report = []  # the report function, loaded while the runs compute (it imports the plotting library)
    meanwhile = None if args.no_plots else lambda: report.append(_report_function())
    with _Progress(total=total, desc=f"simulate {plan.preset}", unit="step", disable=None, leave=False) as bar:
        summary = run_sweep(plan, progress=bar.update, meanwhile=meanwhile)
    print(summary["headline"])
    grid = f" x {len(plan.groups)} group(s)" if plan.grid else ""
    seeds_s = ",".join(map(str, plan.seeds))
    print(f"preset {plan.preset} ({plan.kind}): {len(plan.methods)} method(s){grid} x {len(plan.seeds)} seed(s) "
          f"[{seeds_s}] -> {out}")
    print(format_table(summary))
    for line in auto_lines(summary) + critical_lines(summary):
        print(line)
    for note in [*summary.get("notes", []), *notes]:
        print(note)
    if not args.no_plots:
        group_by = [k for k, _ in plan.grid if not k.startswith("loss.stare.")]
        print(_figures(report[0], out, list(plan.run_dirs.values()), group_by))
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


# ---------------------------------------------------------------------------------------------------- calibrate
def register_calibrate(subparsers) -> argparse.ArgumentParser:
    """Add the ``calibrate`` sub-parser (entry point ``stare_lab.commands: calibrate``; :mod:`simulators.calibrate`)."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit the tabular 'llm' toy to a probe run and read off its critical W (simulators)",
        description=(
            "Fit the knobs of the tabular 'llm' preset (reward coupling, fork width: forking positions and correct "
            "tokens at a fork, verifier noise) so that it shows the probe's D_L+/|D_GRPO| and L+-above-s* share at "
            "the matching entropy — a GRPO probe around its target crossing, or a STARE probe that holds the band "
            "over its second half, where the balance W that held it is matched too — then sweep W on the "
            "calibrated toy: critical W for O1, C2 (at --c2-m) and w_max for the adaptive schedule. Writes "
            "OUT/calibration.json, OUT/fit.json and the runs (OUT/fit, OUT/sweep). docs/calibration.md."
        ),
    )
    p.add_argument("probe", nargs="+", metavar="PROBE_RUN",
                   help="run directories with the D terms (pooled): trainer, small transformer or tabular")
    p.add_argument("--out", default=None, help="output directory (default runs/calibrate)")
    p.add_argument("--target", default=None, help="target entropy (nats) the probe window is centred on "
                                                  "(default: the probe's loss.stare.target_entropy)")
    p.add_argument("--initial-entropy", default=None,
                   help="the entropy at the start of RL (nats), when the probe is a later checkpoint "
                        "(default: the probe's first step)")
    p.add_argument("--window", default=None, help="probe steps around the target crossing (default 10%% of the run)")
    p.add_argument("--probe-kind", default="auto", choices=["auto", "crossing", "held"],
                   help="where the probe is read: crossing = around a GRPO run's first step below the target, held = "
                        "the second half of a STARE run that holds the band (then the fit also matches the push "
                        "that held it, and the toy runs the probe's STARE schedule); auto (default): held for "
                        "STARE runs, crossing otherwise")
    p.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2,...",
                   help="fit grid of one knob (repeatable): reward_coupling, forking_positions, num_correct, "
                        "reward_noise (default 0.4,0.6,0.8,1 / 2,4,6,8 / 4,8 / 0,0.1,0.3); push_efficiency (the "
                        "share of the STARE push that reaches the toy's policy, 'off' for all of it: default "
                        "off,0.7,0.5,0.35,0.25 for a held probe, not fitted for a crossing one); clip_rel (the toy's "
                        "gradient-norm clip relative to its GRPO step, 'off' for none), fitted only when given")
    p.add_argument("--fit-seeds", default="2", metavar="N | A,B,...", help="seeds per knob setting (default 2)")
    p.add_argument("--seeds", default="3", metavar="N | A,B,...", help="seeds of the W sweep (default 3)")
    p.add_argument("--w-grid", default=None, metavar="W1,W2,...",
                   help="W values of the sweep (default 1.05,1.1,1.2,1.3,1.5,2,3,5,8,12)")
    p.add_argument("--c2-m", default=None, help="the M of the C2 sweep (default 0.9, the paper's)")
    p.add_argument("--workers", default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace a previous calibration in OUT")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="further 'llm' preset overrides for the fit and the sweep, e.g. steps=600")
    p.set_defaults(func=calibrate_handler, extra_overrides=[])
    return p


def _float_option(name: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--{name}={text!r} must be a number") from None
    return value


def _floats(name: str, text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--{name}={text!r} must be a comma-separated list of numbers") from None



def calibrate_handler(args: argparse.Namespace) -> int:
    """Run :func:`simulators.calibrate.calibrate` and print the probe, the fit and the critical W; returns 0."""
    from stare_lab.config import parse_overrides, split_paths

    from simulators.calibrate import DEFAULT_C2_M, DEFAULT_W_GRID, KNOBS, OPTIONAL_KNOBS, PRESET, calibrate

    t0 = time.perf_counter()
    probe_args, overrides = split_paths([*args.probe, *args.overrides, *(getattr(args, "extra_overrides", None) or [])])
    if not probe_args:
        raise ConfigError("calibrate needs at least one PROBE_RUN directory")
    grid = {}
    for item in args.grid:
        key, _, raw = item.partition("=")
        if key.strip() not in KNOBS + OPTIONAL_KNOBS or not raw.strip():
            raise ConfigError(f"--grid {item!r} must look like KNOB=V1,V2,... with KNOB one of "
                              f"{{{', '.join(KNOBS + OPTIONAL_KNOBS)}}}")
        texts = [x.strip() for x in raw.split(",") if x.strip()]
        optional = key.strip() in OPTIONAL_KNOBS  # "off" / "null": the knob switched off (None)
        values = [None if optional and x.lower() in ("off", "null", "none") else v
                  for x, (_, v) in zip(texts, parse_overrides(f"{key}={x}" for x in texts))]
        integer = key.strip() in ("num_correct", "forking_positions")
        grid[key.strip()] = [int(v) if integer and float(v).is_integer() else v for v in values]

    def seeds_of(name: str, text: str) -> list[int]:
        seeds = parse_seeds(text, None, f"--{name}", has_seed=False)
        if seeds is None:
            raise ConfigError(f"--{name} is empty")
        return list(range(seeds)) if isinstance(seeds, int) else seeds

    window = _int_option("window", args.window)
    c2_m = _float_option("c2-m", args.c2_m)
    out = Path(args.out) if args.out else Path("runs") / "calibrate"
    with _Progress(desc="calibrate", unit="step", disable=None, leave=False) as bar:
        result = calibrate(
            probe_args, out, target=_float_option("target", args.target),
            initial_entropy=_float_option("initial-entropy", args.initial_entropy), window=window, grid=grid,
            fit_seeds=seeds_of("fit-seeds", args.fit_seeds), seeds=seeds_of("seeds", args.seeds),
            w_grid=_floats("w-grid", args.w_grid) if args.w_grid is not None else DEFAULT_W_GRID,
            c2_m=DEFAULT_C2_M if c2_m is None else c2_m, overrides=dict(parse_overrides(overrides)),
            workers=_int_option("workers", args.workers), overwrite=args.overwrite, progress=bar.update,
            probe_kind=args.probe_kind,
        )
    pr, fit, crit = result["probe"], result["fit"], result["critical"]

    def f(x, spec=".3g"):
        return "-" if x is None else format(x, spec)

    held = pr["kind"] == "held"
    print(f"probe ({pr['kind']}): {pr['run']} ({pr['source']}, {pr['model'] or '-'}): steps {pr['steps'][0]}-"
          f"{pr['steps'][-1]}, H {f(pr['entropy'])} nats, D_L+/|D_GRPO| {f(pr['d_ratio'])}, L+ above s* "
          f"{f(pr['lplus_above_sstar'])}" + (f", held balance W {f(pr['balance_w'])}" if held else ""))
    from stare_lab.theory.regime import POOR_FIT_RESIDUAL as POOR_FIT  # the one threshold (promote uses it too)

    if fit["residual"] is not None and fit["residual"] > POOR_FIT:
        print(f"note: the best toy reproduces the probe poorly (residual {f(fit['residual'])} > {POOR_FIT:g}; "
              "0.2 is about the tolerance of a critical W near 7): read its W with care, or widen --grid")
    if not held and any(v is not None for v in grid.get("clip_rel") or []):
        print("note: a crossing probe cannot fit clip_rel: its fit runs are GRPO, which a clip_rel >= 1 never "
              "clips (the residuals tie); fit it from a held probe (docs/calibration.md)")
    if not held and any(v is not None for v in grid.get("push_efficiency") or []):
        print("note: a crossing probe cannot fit push_efficiency: its fit runs are GRPO, which has no push "
              "(the residuals tie); fit it from a held probe (docs/calibration.md)")
    knobs = ", ".join(f"{k}={'off' if v is None else v}" for k, v in result["knobs"].items())
    print(f"calibrated toy ({PRESET}): {knobs}; its D_L+/|D_GRPO| {f(fit['d_ratio'])}, L+ above s* "
          f"{f(fit['lplus_above_sstar'])}" + (f", held balance W {f(fit['balance_w'])}" if held else "")
          + f" (residual {f(fit['residual'])}) at H_tgt "
          f"{f(result['preset']['overrides']['loss.stare.target_entropy'])} nats")
    for name in ("o1", "c2"):
        c = crit[name]
        m = f" at M {c['m']:g}" if name == "c2" else ""
        print(f"critical W ({name}{m}, calibrated): " + (
            f"{f(c['w'])} (between {f(c['low'])} and {f(c['high'])} on the grid)" if c["w"] is not None else
            f"none up to {f(c['low'])} (no W of the grid held the band on every seed: extend --w-grid)"))
    w_max = crit["adaptive"]["w_max"]
    print(f"adaptive schedule: w_max >= {f(w_max)}" if w_max is not None
          else "adaptive schedule: no w_max from this grid (O1 held at no W of it)")
    over = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={'null' if v is None else v}"
                    for k, v in result["preset"]["overrides"].items())
    print(f"the calibrated toy: stare-lab simulate --preset {PRESET} {over}")
    print(f"wrote {out / 'calibration.json'} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from stare_lab.cli import main

    sys.exit(main(["simulate", *sys.argv[1:]]))
