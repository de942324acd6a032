"""Run one preset for several methods × seeds: validation up front, the runs, ``summary.json``, the end table and
fallback plots.

Layout written under ``out``::

    out/<method>/seed<k>/     one run directory per (method, seed) (stare_lab.runs format)
    out/summary.json          per method: every seed's statistics (simulators.run_stats, computed from its
                              metrics.jsonl, plus the simulator's own summary) and their mean over seeds
    out/figures/*.png         plots (by ``stare-lab analyze`` if available, else :func:`fallback_plots`)

Everything that can be wrong with the request (preset, method, sizes, ranges, output directory) is checked by
:func:`plan_sweep` before anything is created, so a bad request leaves nothing behind.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from stare_lab.config import apply_overrides, from_dict, to_dict
from stare_lab.errors import ConfigError, RunError

from .presets import METHODS, get_preset
from .run_stats import STAT_KEYS, run_stats

logger = logging.getLogger(__name__)

__all__ = ["SweepPlan", "plan_sweep", "run_sweep", "format_table", "fallback_plots", "check_writable_dir"]

@dataclasses.dataclass
class SweepPlan:
    """A validated sweep: ``configs[(method, seed)]`` are built config dataclasses, ``run_dirs`` their
    directories; ``module`` is the simulator module (``run(config, run_dir, resume)``)."""

    preset: str
    kind: str
    out: Path
    methods: list[str]
    seeds: list[int]
    configs: dict[tuple[str, int], Any]
    run_dirs: dict[tuple[str, int], Path]
    module: Any
    resume: bool = False
    overwrite: bool = False


def _simulator_module(kind: str):
    if kind == "tabular":
        from . import tabular

        return tabular, tabular.TabularSimConfig
    try:
        from . import transformer
    except ImportError as err:
        raise ConfigError(f"transformer presets need simulators.transformer: {err}") from None
    return transformer, transformer.TransformerSimConfig


def _normalise_override(item: str) -> str:
    """``stare.x=v`` is accepted as shorthand for ``loss.stare.x=v``."""
    return "loss." + item if item.startswith("stare.") else item


def check_writable_dir(out: Path) -> None:
    """Raise :class:`RunError` unless ``out`` is (or can be created as) a writable directory."""
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise RunError(f"output path {str(out)!r} is not a directory ({str(probe)!r} is a file)")
    try:  # a real probe: os.access says yes to root even on read-only or virtual file systems
        fd, name = tempfile.mkstemp(prefix=".stare_lab_probe_", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise RunError(f"output directory {str(out)!r} is not writable ({str(probe)!r}: {err.strerror or err})") from None


def plan_sweep(
    preset: str,
    methods: list[str] | None,
    seeds: int | None,
    out: str | os.PathLike,
    overrides: list[str] = (),
    steps: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> SweepPlan:
    """Validate a sweep request and build every run's config; creates nothing on disk.

    Args:
        preset: preset name (``simulators.presets.get_preset``).
        methods: method names (None → the preset's ``methods`` or ``DEFAULT_METHODS``).
        seeds: number of seeds ≥ 1 (seeds 0 … seeds−1); None → the preset's ``seeds`` or 3.
        out: the sweep directory.
        overrides: dotted ``key=value`` config overrides (``stare.*`` is short for ``loss.stare.*``).
        steps: number of steps (overrides the preset's), ≥ 1.
        resume: continue existing runs from their checkpoints.
        overwrite: replace existing runs.

    Raises:
        ConfigError: unknown preset / method / key, a value outside its range, zero or negative sizes.
        RunError: the output directory is not writable, or already holds runs (without resume / overwrite).
    """
    from .presets import DEFAULT_METHODS

    spec = get_preset(preset)
    kind = spec["kind"]
    if seeds is None:
        seeds = spec.get("seeds", 3)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds={seeds!r} must be an integer >= 1")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"steps={steps!r} must be an integer >= 1")
    methods = list(methods) if methods else list(spec.get("methods") or DEFAULT_METHODS)
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"method {m!r} is not one of {{{', '.join(METHODS)}}}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"methods {','.join(methods)} lists a method twice")
    overrides = [_normalise_override(o) for o in overrides]
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in ("method", "seed"):
            raise ConfigError(f"override {item!r}: set {key} with --methods / --seeds")
    module, cls = _simulator_module(kind)
    configs, run_dirs = {}, {}
    out = Path(out)
    for method in methods:
        for seed in range(seeds):
            data = copy.deepcopy(spec["overrides"])
            data = apply_overrides(data, overrides)
            data["method"] = method
            data["seed"] = seed
            if steps is not None:
                data["steps"] = steps
            configs[(method, seed)] = from_dict(cls, data)
            run_dirs[(method, seed)] = out / method / f"seed{seed}"
    check_writable_dir(out)
    if not resume and not overwrite:
        taken = [d for d in run_dirs.values() if (d / "metrics.jsonl").exists()]
        if taken:
            raise RunError(
                f"{str(taken[0])!r} already holds a run; pass --resume to continue or --overwrite to replace "
                f"({len(taken)} run(s) in {str(out)!r})"
            )
    if resume and kind == "tabular":
        for key, run_dir in run_dirs.items():
            _check_resumable(run_dir, configs[key])
    return SweepPlan(preset, kind, out, methods, list(range(seeds)), configs, run_dirs, module, resume, overwrite)


def _check_resumable(run_dir: Path, config: Any) -> None:
    """Before anything runs: a tabular run to resume must have been written with the same config (except
    ``steps`` / ``checkpoint_every``, and a target entropy resolved from ``target_entropy_frac``).

    Raises:
        RunError: naming the first differing key.
    """
    cfg_path = run_dir / "config.yaml"
    if not (run_dir / "checkpoint").is_dir() or not cfg_path.is_file():
        return
    import yaml

    try:
        saved = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RunError(f"cannot resume {str(run_dir)!r}: config.yaml is not valid YAML ({err})") from None
    current = to_dict(config)
    if current.get("target_entropy_frac") is not None:
        current["loss"]["stare"].pop("target_entropy", None)
        saved.get("loss", {}).get("stare", {}).pop("target_entropy", None)

    def diff(a: Any, b: Any, prefix: str = "") -> str | None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a:
                if prefix == "" and k in ("steps", "checkpoint_every"):
                    continue
                found = diff(a[k], b.get(k), f"{prefix}{k}.") if k in b else f"{prefix}{k}"
                if found:
                    return found
            return None
        return None if a == b else prefix.rstrip(".")

    key = diff(current, saved)
    if key is not None:
        raise RunError(f"cannot resume {str(run_dir)!r}: {key} differs from the run's config.yaml")


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def run_sweep(plan: SweepPlan, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run every (method, seed) of ``plan`` in order (one process), write ``out/summary.json`` and return it.

    ``progress(n)`` is called as steps (tabular) or whole runs (other kinds, counted as their ``steps``) finish.
    """
    plan.out.mkdir(parents=True, exist_ok=True)
    per_method: dict[str, Any] = {}
    for method in plan.methods:
        runs = {}
        for seed in plan.seeds:
            config, run_dir = plan.configs[(method, seed)], plan.run_dirs[(method, seed)]
            if plan.overwrite and (run_dir / "metrics.jsonl").exists():
                _clear_run(run_dir)
            if plan.kind == "tabular":
                summary = plan.module.run(config, run_dir, resume=plan.resume, progress=progress)
            else:
                summary = plan.module.run(config, run_dir, resume=plan.resume)
                if progress is not None:
                    progress(int(getattr(config, "steps", 1)))
            runs[f"seed{seed}"] = {**_stats_of(run_dir, config), "run_summary": summary}
        collapsed = [r.get("steps_to_collapse") for r in runs.values()]
        mean = {k: _mean([r.get(k) for r in runs.values()]) for k in STAT_KEYS if k != "steps"}
        mean["collapsed_runs"] = sum(c is not None for c in collapsed)
        per_method[method] = {"runs": runs, "mean": mean}
    summary = {
        "preset": plan.preset,
        "kind": plan.kind,
        "methods": per_method,
        "seeds": plan.seeds,
        "config": {f"{m}/seed{s}": to_dict(c) for (m, s), c in plan.configs.items()},
    }
    tmp = plan.out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, plan.out / "summary.json")
    return summary


def _stats_of(run_dir: Path, config: Any) -> dict[str, Any]:
    """:func:`simulators.run_stats.run_stats` of a finished run directory; H_tgt from its ``config.yaml``
    (``loss.stare.target_entropy``, the resolved value), collapse fraction / band from the config if it has them."""
    from stare_lab.runs import read_run

    run = read_run(run_dir)
    target = ((run.config.get("loss") or {}).get("stare") or {}).get("target_entropy")
    return run_stats(
        run.metrics, target, getattr(config, "collapse_frac", 0.1), getattr(config, "band", 0.05)
    )


def _clear_run(run_dir: Path) -> None:
    """Remove the files a previous run wrote in ``run_dir`` (metrics, summary, config, checkpoint)."""
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        (run_dir / name).unlink(missing_ok=True)
    ckpt = run_dir / "checkpoint"
    if ckpt.is_dir():
        for f in ckpt.iterdir():
            f.unlink()
        ckpt.rmdir()


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(summary: dict[str, Any]) -> str:
    """The end-of-sweep table: per method (mean over seeds) initial / final entropy (nats), steps to collapse
    (mean over the seeds that collapsed, and how many did), final reward, time in band around H_tgt, and the R²
    of measured on predicted one-step ΔH."""
    n_seeds = len(summary["seeds"])
    head = f"{'method':<15}{'H0':>7}{'H_end':>8}{'H_tgt':>7}{'collapse@':>13}{'reward':>8}{'in_band':>9}{'R2(dH)':>8}"
    lines = [head, "-" * len(head)]
    for method, entry in summary["methods"].items():
        m = entry["mean"]
        collapse = (
            f"{m['steps_to_collapse']:.0f} ({m['collapsed_runs']}/{n_seeds})" if m["steps_to_collapse"] is not None
            else f"- (0/{n_seeds})"
        )
        lines.append(
            f"{method:<15}{_fmt(m['initial_entropy']):>7}{_fmt(m['final_entropy']):>8}{_fmt(m['target_entropy']):>7}"
            f"{collapse:>13}{_fmt(m['final_reward']):>8}{_fmt(m['time_in_band'], '.0%'):>9}{_fmt(m['pred_r2']):>8}"
        )
    return "\n".join(lines)


def fallback_plots(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Minimal PNGs when ``stare-lab analyze`` is unavailable: entropy, reward and gate over steps per method
    (mean over seeds with a min–max band), and measured vs predicted one-step ΔH (all steps of all runs) with the
    fitted slope and R². Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from stare_lab.runs import read_run

    from .run_stats import fit_line

    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    data = {}
    for method in summary["methods"]:
        runs = [read_run(out / method / f"seed{s}").metrics for s in summary["seeds"]]
        data[method] = runs
    written = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for method, runs in data.items():
        for ax, key in zip(axes, ("entropy", "reward", "gate_on")):
            n = min(len(r) for r in runs)
            cols = [[float(r[i][key] or 0.0) for r in runs] for i in range(n)]
            steps = [runs[0][i]["step"] for i in range(n)]
            mean = [sum(c) / len(c) for c in cols]
            line = ax.plot(steps, mean, label=method)[0]
            ax.fill_between(steps, [min(c) for c in cols], [max(c) for c in cols], alpha=0.2, color=line.get_color())
    target = _mean([e["mean"]["target_entropy"] for e in summary["methods"].values()])
    if target is not None:
        axes[0].axhline(target, color="k", ls=":", lw=1, label="H_tgt")
    for ax, title in zip(axes, ("entropy (nats)", "reward", "gate on")):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = fig_dir / "dynamics.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    all_p, all_m = [], []
    for method, runs in data.items():
        p = [row["pred_entropy_change"] for r in runs for row in r]
        m = [row["entropy_change"] for r in runs for row in r]
        ax.scatter(p, m, s=4, label=method)
        all_p += p
        all_m += m
    fit = fit_line(all_p, all_m)
    lo, hi = min(all_p + all_m), max(all_p + all_m)
    ax.plot([lo, hi], [lo, hi], "k:", lw=1)
    ax.set_title(f"one-step dH: slope {_fmt(fit['slope'])}, R2 {_fmt(fit['r2'])}", fontsize=9)
    ax.set_xlabel("predicted (first order)")
    ax.set_ylabel("measured")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = fig_dir / "pred_vs_measured.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written
