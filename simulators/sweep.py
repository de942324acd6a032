"""Run one preset for several methods × seeds: validation up front, the runs, ``summary.json``, the end table and
fallback plots.

Layout written under ``out``::

    out/<method>/seed<k>/     one run directory per (method, seed) (stare_lab.runs format)
    out/summary.json          per method: every seed's statistics (simulators.run_stats, computed from its
                              metrics.jsonl, plus the simulator's own summary) and their mean over seeds
    out/figures/*.png         plots (by ``stare-lab analyze`` if available, else :func:`fallback_plots`)

Everything that can be wrong with the request (preset, method, sizes, ranges, conflicting options, overrides of
keys the method sets, output directory) is checked by :func:`plan_sweep` before anything is created, so a bad
request leaves nothing behind.

A sweep covers exactly its planned runs: ``summary.json``, the table and the plots (``stare-lab analyze`` is given
the planned run directories, not ``out``) never include other runs found under ``out``. With ``overwrite``, run
directories under ``out`` that the previous sweep's ``summary.json`` lists (so ``stare-lab simulate`` wrote them)
but the new plan does not are removed (:func:`stale_runs`); anything else under ``out`` is left alone. ``resume``
removes nothing.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from stare_lab.config import apply_overrides, from_dict, to_dict
from stare_lab.errors import ConfigError, RunError

from .presets import METHODS, get_preset, method_overrides
from .run_stats import STAT_KEYS, run_stats
from .tabular_config import resolve_target_entropy

logger = logging.getLogger(__name__)

__all__ = [
    "SweepPlan", "plan_sweep", "run_sweep", "format_table", "stare_note", "fallback_plots", "check_writable_dir",
    "stale_runs", "method_set_keys", "plan_notes",
]

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
    overrides: list[str] = dataclasses.field(default_factory=list)


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
    """Raise :class:`RunError` unless ``out`` is (or can be created as) a writable directory.

    The message names ``out`` and, when ``out`` does not exist yet, the existing ancestor that refused the new
    entry, e.g. ``cannot create output directory '/proc/x': '/proc' does not accept new entries (...)``.
    """
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
        reason = err.strerror or str(err)
        if probe != out:
            raise RunError(
                f"cannot create output directory {str(out)!r}: {str(probe)!r} does not accept new entries ({reason})"
            ) from None
        raise RunError(f"output directory {str(out)!r} is not writable ({reason})") from None


def method_set_keys(method: str) -> set[str]:
    """Dotted config keys whose value ``method`` sets (:data:`stare_lab.methods.METHODS`), so that an override of
    them would be silently replaced: ``loss.loss_mode``, the method's ``loss.stare.*`` settings and, for methods
    that switch it on, ``dynamic_sampling``."""
    spec = method_overrides(method)
    keys = {f"loss.{k}" for k in spec["loss"] if k != "stare"}
    keys |= {f"loss.stare.{k}" for k in spec["loss"].get("stare", {})}
    if spec["dynamic_sampling"]:
        keys.add("dynamic_sampling")
    return keys


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
        steps: number of steps (overrides the preset's), ≥ 1; not together with a ``steps=`` override.
        resume: continue existing runs from their checkpoints.
        overwrite: replace existing runs (and remove the previous sweep's runs the new plan drops, see
            :func:`stale_runs`); not together with ``resume``.

    Raises:
        ConfigError: unknown preset / method / key, a value outside its range, zero or negative sizes, an empty
            ``out``, ``resume`` with ``overwrite``, ``steps`` given twice, an override of a key that one of the
            methods sets (:func:`method_set_keys`: choose the method with ``methods`` instead), an explicit
            ``loss.stare.target_entropy`` together with a (non-null) ``target_entropy_frac`` (tabular presets:
            :func:`simulators.tabular_config.resolve_target_entropy`).
        RunError: the output directory is not writable, or already holds runs (without resume / overwrite).
    """
    from .presets import DEFAULT_METHODS

    if str(out).strip() == "":
        raise ConfigError("out='' is empty: give an output directory (default runs/<preset>)")
    if resume and overwrite:
        raise ConfigError("resume and overwrite exclude each other: --resume continues the runs, --overwrite replaces them")
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
        if key == "steps" and steps is not None:
            raise ConfigError(f"override {item!r} and --steps {steps} both set steps: give one of them")
        setters = [m for m in methods if key in method_set_keys(m)]
        if setters:
            raise ConfigError(
                f"override {item!r}: {key} is set by method {setters[0]!r}; choose the method with --methods "
                f"(one of {{{', '.join(METHODS)}}}) instead"
            )
    module, cls = _simulator_module(kind)
    user_keys = {item.split("=", 1)[0].strip() for item in overrides}
    explicit = ("loss.stare.target_entropy" in user_keys, "target_entropy_frac" in user_keys)
    configs, run_dirs = {}, {}
    out = Path(out)
    for method in methods:
        for seed in range(seeds):
            data = copy.deepcopy(spec["overrides"])
            data = apply_overrides(data, overrides)
            if kind == "tabular":  # an explicit target switches the preset's fraction off
                resolve_target_entropy(data, *explicit)
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
    return SweepPlan(
        preset, kind, out, methods, list(range(seeds)), configs, run_dirs, module, resume, overwrite, list(overrides)
    )


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


def stale_runs(plan: SweepPlan) -> list[Path]:
    """Run directories under ``plan.out`` that the previous sweep there wrote (listed in its ``summary.json``, with
    a ``config.yaml`` whose ``source`` is ``simulator``) and that ``plan`` does not include. :func:`run_sweep`
    removes them when ``plan.overwrite`` is set; other runs under ``out`` are never touched."""
    import yaml

    path = plan.out / "summary.json"
    if not path.is_file():
        return []
    try:
        previous = json.loads(path.read_text())
        names = list((previous.get("config") or {}).keys())
    except (OSError, ValueError, AttributeError):
        return []
    planned = {d.resolve() for d in plan.run_dirs.values()}
    stale = []
    for name in names:
        parts = str(name).split("/")
        if len(parts) != 2 or not parts[1].startswith("seed") or any(x in ("", ".", "..") for x in parts):
            continue
        run_dir = plan.out / parts[0] / parts[1]
        if run_dir.resolve() in planned or not (run_dir / "config.yaml").is_file():
            continue
        try:
            source = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("source")
        except (OSError, AttributeError, yaml.YAMLError):  # an unreadable config is not ours to delete
            continue
        if source == "simulator":
            stale.append(run_dir)
    return stale


def _remove_run(run_dir: Path) -> None:
    """Remove the files a simulator run wrote in ``run_dir``, then ``run_dir`` and its method folder if empty."""
    _clear_run(run_dir)
    for d in (run_dir, run_dir.parent):
        try:
            d.rmdir()
        except OSError:  # not empty (foreign files) or already gone: leave it
            break


def run_sweep(plan: SweepPlan, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run every (method, seed) of ``plan`` in order (one process), write ``out/summary.json`` and return it.

    ``progress(n)`` is called as steps (tabular) or whole runs (other kinds, counted as their ``steps``) finish.
    With ``plan.overwrite`` the previous sweep's runs that the plan drops are removed first (:func:`stale_runs`).
    If a run fails, the error propagates; folders this call created and left empty (``out``, ``out/<method>``) are
    removed (a tabular run removes its own directory when it failed before completing a step).

    Raises:
        RunError: from a run (e.g. diverged to non-finite logits), or ``out`` cannot be written.
    """
    created = [d for d in [plan.out, *{d.parent for d in plan.run_dirs.values()}] if not d.exists()]
    plan.out.mkdir(parents=True, exist_ok=True)
    if plan.overwrite:
        for run_dir in stale_runs(plan):
            logger.info("--overwrite: removing %s (a run of the previous sweep that this one drops)", run_dir)
            _remove_run(run_dir)
    per_method: dict[str, Any] = {}
    try:
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
    except BaseException:
        for d in sorted(created, key=lambda p: len(p.parts), reverse=True):  # deepest first
            try:
                d.rmdir()
            except OSError:  # not empty: it holds finished runs
                pass
        raise
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
        shutil.rmtree(ckpt)


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
    lines.append(TABLE_LEGEND)
    return "\n".join(lines)


#: Printed under the end-of-sweep table (definitions in :func:`simulators.run_stats.run_stats`).
TABLE_LEGEND = (
    "H0 / H_end: entropy (nats) at the first / last step; collapse@: first step with H < 10 % of H0 (seeds that "
    "collapsed / all); in_band: share of steps with |H - H_tgt| <= 0.05 nats; R2(dH): R^2 of the measured on the "
    "predicted one-step entropy change"
)


def stare_note(summary: dict[str, Any], rel_tol: float = 0.1) -> str | None:
    """A one-line note for the end of the table when STARE methods of the sweep (``loss.loss_mode='stare'``) ended
    within ``rel_tol`` × max(GRPO's final entropy, H_tgt) of GRPO's final entropy (means over seeds, nats), else
    ``None`` (also when there is no ``grpo`` row or its final entropy is not > 0). The H_tgt term keeps the test
    meaningful once GRPO has collapsed far below the target (a 0.08 vs 0.095 nats difference is no real difference
    when the target is 0.96 nats).

    docs/theory.md §6: at the paper's defaults (W = 1.1, M = 0.9) the push may be too weak for a given noise level, and
    the toolkit must say so rather than tune it away. If those methods never opened the gate (entropy stayed above
    H_tgt), the note says that instead (raise the target or run longer), and if their gate was switched off
    (``stare.gate=never``: the STARE weights are never applied) it says that.
    """
    methods = summary.get("methods") or {}
    h_grpo = ((methods.get("grpo") or {}).get("mean") or {}).get("final_entropy")
    if h_grpo is None or not h_grpo > 0:
        return None
    seed0 = (summary.get("seeds") or [0])[0]
    h_tgt = methods["grpo"]["mean"].get("target_entropy")
    tol = rel_tol * max(h_grpo, h_tgt if h_tgt is not None else 0.0)
    close = []
    for method, entry in methods.items():
        loss = (summary.get("config") or {}).get(f"{method}/seed{seed0}", {}).get("loss") or {}
        h = entry["mean"].get("final_entropy")
        if loss.get("loss_mode") == "stare" and h is not None and abs(h - h_grpo) <= tol:
            close.append((method, loss.get("stare") or {}, entry["mean"].get("gate_on_frac")))
    if not close:
        return None
    names = "/".join(m.upper() for m, _, _ in close)
    if all(not gate for _, _, gate in close):
        off = "/".join(m.upper() for m, st, _ in close if st.get("gate") == "never")
        shut = "/".join(m.upper() for m, st, _ in close if st.get("gate") != "never")
        parts = []
        if off:
            parts.append(
                f"{off} ended like GRPO because the gate is disabled (stare.gate=never: the STARE weights are never "
                "applied); use stare.gate=entropy (the paper's gate) to see STARE act"
            )
        if shut:
            parts.append(
                f"{shut} ended like GRPO because the gate never opened (entropy stayed above H_tgt); raise "
                "target_entropy_frac (or stare.target_entropy) or run more steps to see STARE act"
            )
        return "note: " + "; ".join(parts)
    pushes = sorted({(st.get("reweight_w"), st.get("reweight_m")) for _, st, _ in close}, key=str)
    push = "; ".join(f"W={_fmt(w, 'g')}, M={_fmt(m, 'g')}" for w, m in pushes)
    tip = "stronger stare.reweight_w / stare.reweight_m"
    if not any(bool(st.get("adaptive")) for _, st, _ in close):
        tip += " or o1-adaptive"
    return (
        f"note: at these settings {names} barely {'differ' if len(close) > 1 else 'differs'} from GRPO (final "
        f"entropy within {_fmt(tol, '.2g')} nats: the push "
        f"{push} is too weak for this noise level and step size — docs/theory.md §6); try {tip}"
    )


def plan_notes(plan: SweepPlan) -> list[str]:
    """One-line notes about the request itself (not its results), printed with the other notes:

    * ``kl_cov`` with one on-policy update per rollout batch (tabular: always; transformer: ``updates_per_batch``
      = 1): ρ ≡ 1, so log ρ = 0 and the gradient of its penalty β·|log ρ| is 0 — it equals GRPO.
    * ``loss.stare.*`` overrides when no method of the sweep uses the STARE loss: they change no update.
    """
    notes = []
    single = [
        m for m in plan.methods
        if plan.configs[(m, plan.seeds[0])].loss.loss_mode == "kl_cov"
        and int(getattr(plan.configs[(m, plan.seeds[0])], "updates_per_batch", 1)) == 1
    ]
    for m in single:
        how = (
            ", which the tabular simulator never takes (transformer presets: updates_per_batch=N, N > 1)"
            if plan.kind == "tabular" else " (updates_per_batch=N, N > 1)"
        )
        notes.append(
            f"note: {m} ran with one on-policy update per rollout batch: the policy ratio rho is 1, so log rho = 0, "
            f"the gradient of its penalty beta*|log rho| is 0 and {m} equals GRPO; it acts only with several "
            f"updates per batch{how}"
        )
    stare_items = [o for o in plan.overrides if o.split("=", 1)[0].strip().startswith("loss.stare.")]
    if stare_items and not any(c.loss.loss_mode == "stare" for c in plan.configs.values()):
        stare_methods = [m for m, spec in METHODS.items() if spec["loss"].get("loss_mode") == "stare"]
        shown = " ".join(o[len("loss."):] if o.startswith("loss.stare.") else o for o in stare_items)
        tgt = any(o.split("=", 1)[0].strip() == "loss.stare.target_entropy" for o in stare_items)
        notes.append(
            f"note: {shown} change{'s' if len(stare_items) == 1 else ''} no update: none of the methods run "
            f"({','.join(plan.methods)}) uses the STARE loss; add one of {','.join(stare_methods)} to --methods"
            + (" (stare.target_entropy still sets the table's H_tgt / in_band reference)" if tgt else "")
        )
    return notes


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
