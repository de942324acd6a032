"""Run one preset for several methods × seeds (× grid points): validation up front, the runs, ``summary.json`` and
the end table.

Layout written under ``out``::

    out/<method>/seed<k>/          one run directory per (method, seed) (stare_lab.platform.runs format)
    out/<method>/<label>/seed<k>/  with ``--sweep`` grids: one per (method, grid point, seed), label ``W=1.2,lr=1``
                                   (:mod:`simulators.grid`; a method only sees the grid keys that change its runs)
    out/sweep.json                 the request (preset, methods, seeds, steps, grid, overrides, plugins), written
                                   when the sweep starts: what --resume continues (:mod:`simulators.sweep_out`)
    out/summary.json               per group (a method, or a method at one grid point): every seed's statistics
                                   (simulators.run_stats) and their mean over seeds; with a W grid the critical
                                   strength (``critical.<method>``, :func:`simulators.grid.critical_summary`); the
                                   labelled critical strengths and the recommended one (``critical_strength``,
                                   :func:`simulators.notes.strength_block`); the headline and the notes
                                   (:mod:`simulators.notes`)
    out/figures/                   the report and its figures (``stare-lab simulate`` asks the analysis wing for
                                   them; :mod:`simulators.cli`)

Tabular runs go through :func:`simulators.parallel.run_many`: batched tensor computations over the machine's cores.
Everything that can be wrong with the request (preset, method, sizes, ranges, conflicting options, overrides of
keys the method sets, grid keys, output directory) is checked by :func:`plan_sweep` before anything is created, so
a bad request leaves nothing behind.

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
from pathlib import Path
from typing import Any, Callable


from stare_lab.config import apply_overrides, from_dict, to_dict
from stare_lab.errors import ConfigError, RunError
from stare_lab.platform.verdict import group_outcome

from simulators.grid import AUTO_INERT_KEYS, critical_summary, inert_keys, method_points, parse_grid, point_label
from simulators.presets import (DEFAULT_METHODS, DEFAULT_PRESET, MAX_SEEDS, METHODS, SEED_MAX, get_preset,
                                method_overrides)
from simulators.run_stats import STAT_KEYS
from simulators.sweep_out import (check_out, check_previous_sweep, check_resumable, check_writable_dir, clear_run,
                                  recorded_request, remove_run, resume_changes, stale_runs, write_request,
                                  REQUEST_FILE)
from simulators.tabular.config import TabularSimConfig, resolve_target_entropy
from simulators.transformer.config import TransformerSimConfig

logger = logging.getLogger(__name__)

__all__ = [
    "SweepPlan", "plan_sweep", "run_sweep", "format_table", "check_writable_dir", "stale_runs", "method_set_keys",
    "group_label", "seed_list", "uses_stare", "check_grid_used",
]

#: the config class of each preset kind (torch-free: a request is validated before the simulators are imported)
CONFIGS = {"tabular": TabularSimConfig, "transformer": TransformerSimConfig}


def simulator_module(kind: str) -> Any:
    """The simulator module of a preset kind (``run(config, run_dir, resume)``), imported on first use (it pulls in
    torch)."""
    if kind == "tabular":
        from simulators.tabular import runner
    else:
        from simulators.transformer import runner
    return runner


@dataclasses.dataclass
class SweepPlan:
    """A validated sweep: ``groups[label] = {"method", "point"}`` (a method, or a method at one grid point),
    ``configs[(label, seed)]`` the built config dataclasses and ``run_dirs[(label, seed)]`` their directories;
    ``grid`` the ``--sweep`` grid; ``module`` the simulator module (``run(config, run_dir, resume)``); ``request``
    what ``OUT/sweep.json`` records (:func:`simulators.sweep_out.write_request`); ``resume_notes`` what a resumed
    request adds to the sweep (to be said on screen)."""

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
    grid: list[tuple[str, list[Any]]] = dataclasses.field(default_factory=list)
    groups: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    workers: int | None = None
    request: dict[str, Any] = dataclasses.field(default_factory=dict)
    resume_notes: list[str] = dataclasses.field(default_factory=list)


def group_label(method: str, point: dict[str, Any]) -> str:
    """``o1`` or, at a grid point, ``o1 [W=1.2]``."""
    label = point_label(point)
    return f"{method} [{label}]" if label else method


def uses_stare(method: str) -> bool:
    """Whether ``method``'s loss uses the STARE gate and W/M (its declared needs, :func:`stare_lab.loss.losses.loss_needs`):
    only such methods see ``loss.stare.*`` grid keys."""
    from stare_lab.loss.losses import loss_needs

    loss = method_overrides(method)["loss"]
    return loss_needs(loss["loss_mode"]).stare


def check_grid_used(grid: list[tuple[str, list[Any]]], methods: list[str]) -> None:
    """Every ``--sweep`` key must change the runs of at least one of ``methods``: ``loss.stare.*`` keys are seen by
    STARE methods only (:func:`uses_stare`), ``loss.stare.reweight_m`` only by variant C2 (docs/theory.md §1), the
    fixed-W keys not by the auto schedule (:func:`simulators.grid.inert_keys`).

    Raises:
        ConfigError: naming the key, the methods and which methods would use it.
    """
    for key, _ in grid:
        if not key.startswith("loss.stare."):
            continue
        users = [m for m in methods if uses_stare(m) and key not in inert_keys(m)]
        need = "STARE methods (e.g. o1, c2)"
        auto = [m for m in methods if key in inert_keys(m)]
        if key == "loss.stare.reweight_m":
            users = [m for m in users if str(method_overrides(m)["loss"]["stare"].get("variant", "")).upper() == "C2"]
            need = "variant C2 (e.g. c2)"
        extra = f"; the auto schedule of {', '.join(auto)} sets W itself" if auto else ""
        if not users:
            raise ConfigError(f"--sweep {key}: none of the methods {','.join(methods)} uses {key} (only {need} "
                              f"do{extra}), so every grid point would be the same run; add such a method to --methods "
                              "or sweep another key")


def seed_list(seeds: int | list[int] | tuple[int, ...] | None, default: list[int]) -> list[int]:
    """The seeds of a sweep: None → ``default``; an integer N in [1, 10000] (:data:`~simulators.presets.MAX_SEEDS`)
    → the first N seeds 0 … N − 1; a list (at most 10000) → exactly those (distinct integers in [0, 2**31 − 1],
    :data:`~simulators.presets.SEED_MAX`, in the given order).

    Raises:
        ConfigError: a count outside [1, 10000], a seed outside [0, 2**31 − 1] or repeated, an empty or too long
            list, or something else.
    """
    if seeds is None:
        return list(default)
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if not 1 <= seeds <= MAX_SEEDS:
            raise ConfigError(f"seeds={seeds!r} must be a count in [1, {MAX_SEEDS}] (or a list of seeds)")
        return list(range(seeds))
    if isinstance(seeds, (list, tuple)) and seeds:
        bad = [x for x in seeds if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= SEED_MAX]
        if bad:
            raise ConfigError(f"seed {bad[0]!r} must be an integer in [0, {SEED_MAX}] (2**31 - 1)")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"seeds {','.join(map(str, seeds))} list a seed twice")
        if len(seeds) > MAX_SEEDS:
            raise ConfigError(f"{len(seeds)} seeds: one sweep runs at most {MAX_SEEDS}")
        return list(seeds)
    raise ConfigError(f"seeds={seeds!r} must be a count >= 1 or a non-empty list of seeds")


def _method_config(cls: Any, data: dict[str, Any], method: str) -> Any:
    """``cls`` from ``data`` for ``method``; an error that the method's own settings cause (the same request
    passes with plain ``grpo``) names the method and the settings it implies."""
    try:
        return from_dict(cls, data)
    except ConfigError as err:
        if method == "grpo":
            raise
        try:
            from_dict(cls, {**data, "method": "grpo"})
        except ConfigError:
            raise err from None
        spec = method_overrides(method)
        implied = [f"loss.loss_mode={spec['loss']['loss_mode']}"]
        implied += [f"loss.stare.{k}={v}" for k, v in spec["loss"].get("stare", {}).items()]
        if spec["dynamic_sampling"]:
            implied.append("dynamic_sampling=true")
        raise ConfigError(f"method {method!r} (which sets {', '.join(implied)}): {err}; change the override or "
                          f"leave {method} out of --methods") from None


def _run_data(spec: dict[str, Any], kind: str, items: list[str], method: str, seed: int, steps: int | None,
              user_keys: set[str]) -> dict[str, Any]:
    """The config dict of one run: the preset's overrides, then ``items`` (the user's overrides and a grid point's),
    ``method``, ``seed`` and ``steps``. ``user_keys``: the keys the user set (an explicit
    ``loss.stare.target_entropy`` switches a tabular preset's relative target off)."""
    data = apply_overrides(copy.deepcopy(spec["overrides"]), items)
    if kind == "tabular":
        resolve_target_entropy(data, "loss.stare.target_entropy" in user_keys, "target_entropy_rel" in user_keys)
    data["method"] = method
    data["seed"] = seed
    if steps is not None:
        data["steps"] = steps
    return data


def _normalise_override(item: str) -> str:
    """``stare.x=v`` is accepted as shorthand for ``loss.stare.x=v``."""
    return "loss." + item if item.startswith("stare.") else item


def method_set_keys(method: str) -> set[str]:
    """Dotted config keys whose value ``method`` sets (:data:`stare_lab.loss.methods.METHODS`), so that an override of
    them would be silently replaced: ``loss.loss_mode``, the method's ``loss.stare.*`` settings and, for methods
    that switch it on, ``dynamic_sampling``."""
    spec = method_overrides(method)
    keys = {f"loss.{k}" for k in spec["loss"] if k != "stare"}
    keys |= {f"loss.stare.{k}" for k in spec["loss"].get("stare", {})}
    if spec["dynamic_sampling"]:
        keys.add("dynamic_sampling")
    return keys


def plan_sweep(
    preset: str | None,
    methods: list[str] | None,
    seeds: int | list[int] | None,
    out: str | os.PathLike,
    overrides: list[str] = (),
    steps: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    sweep: list[str] = (),
    workers: int | None = None,
) -> SweepPlan:
    """Validate a sweep request and build every run's config; creates nothing on disk.

    Args:
        preset: preset name (``simulators.presets.get_preset``); None → with ``resume`` the sweep's own, else
            :data:`~simulators.presets.DEFAULT_PRESET`.
        methods: method names (None → the preset's ``methods`` or ``DEFAULT_METHODS``; with neither ``methods`` nor
            ``sweep`` given, and not resumed, the preset's own grid ``sweep`` too — without the keys ``overrides``
            set — e.g. the ``demo`` preset's W sweep of o1).
        seeds: the first N seeds 0 … N−1 (an integer N ≥ 1) or a list of seeds (:func:`seed_list`); None → the
            preset's ``seeds`` or 0, 1, 2.
        out: the sweep directory.
        overrides: dotted ``key=value`` config overrides (``stare.*`` is short for ``loss.stare.*``).
        steps: number of steps (overrides the preset's), ≥ 1; not together with a ``steps=`` override.
        resume: continue the sweep ``out`` holds, its runs from their checkpoints. What is not given (preset,
            methods, seeds, steps, ``sweep``, ``overrides``: None or empty) is the sweep's own
            (:func:`simulators.sweep_out.recorded_request`), not the preset's; what is given and extends the sweep
            is listed in ``plan.resume_notes`` (:func:`simulators.sweep_out.resume_changes`).
        overwrite: replace existing runs (and remove the previous sweep's runs the new plan drops, see
            :func:`stale_runs`); not together with ``resume``.
        sweep: grid items ``KEY=V1,V2,…`` (:func:`simulators.grid.parse_grid`); the runs cover their product.
        workers: processes for tabular runs (None: all cores, :func:`simulators.parallel.default_workers`).

    Raises:
        ConfigError: unknown preset / method / key (a grid key or value too: before torch is imported), a value
            outside its range, zero or negative sizes, an empty ``out``, ``resume`` with ``overwrite``, ``steps``
            given twice, an override or grid key that one of the methods sets (:func:`method_set_keys`: choose the
            method with ``methods`` instead), a key both overridden and swept, an explicit
            ``loss.stare.target_entropy`` together with a (non-null) ``target_entropy_rel`` (tabular presets:
            :func:`simulators.tabular.config.resolve_target_entropy`); an error caused by a method's own settings
            names the method (e.g. ``o1-adaptive``, whose default ``loss.stare.w_max`` caps W, with
            ``stare.reweight_w=2``); tabular runs whose estimated peak memory exceeds the machine's available memory
            (:func:`simulators.parallel.check_memory`); with ``resume``, another preset than the sweep's, or a
            method of the sweep that no loaded plugin registers (naming the sweep's ``--plugin``).
        RunError: the output directory is not writable, or already holds runs (without resume / overwrite: before
            torch is imported); with resume, a run whose config or rows do not match its checkpoint
            (:func:`simulators.driver.check_resume`).
    """
    if str(out).strip() == "":
        raise ConfigError("out='' is empty: give an output directory (default runs/<preset>)")
    if resume and overwrite:
        raise ConfigError("resume and overwrite exclude each other: --resume continues the runs, --overwrite replaces them")
    out = Path(out)
    recorded = recorded_request(out) if resume else None
    recorded_grid = None
    if recorded is not None:
        preset, methods, seeds, steps, recorded_grid, overrides = _resume_defaults(
            recorded, out, preset, methods, seeds, steps, list(sweep), list(overrides))
    preset = DEFAULT_PRESET if preset is None else preset
    spec = get_preset(preset)
    kind = spec["kind"]
    seeds = seed_list(seeds, spec.get("seeds", [0, 1, 2]))
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"steps={steps!r} must be an integer >= 1")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    story = not methods and not sweep and recorded is None  # the preset's own request: its methods and its grid
    methods = list(methods) if methods else list(spec.get("methods") or DEFAULT_METHODS)
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"method {m!r} is not one of {{{', '.join(METHODS)}}}" + _plugin_hint(recorded, out))
    if len(set(methods)) != len(methods):
        raise ConfigError(f"methods {','.join(methods)} lists a method twice")
    overrides = [_normalise_override(o) for o in overrides]
    grid = parse_grid(list(sweep)) if recorded_grid is None else recorded_grid
    if story and spec.get("sweep"):  # a key the user overrides leaves the preset's grid
        given = {o.split("=", 1)[0].strip() for o in overrides}
        grid = [(k, v) for k, v in parse_grid(list(spec["sweep"])) if k not in given]
    grid_keys = {k for k, _ in grid}
    for item in overrides + [f"{k}=" for k in grid_keys]:
        key = item.split("=", 1)[0].strip()
        what = f"--sweep {key}" if item.endswith("=") and key in grid_keys else f"override {item!r}"
        if key in ("method", "seed"):
            raise ConfigError(f"{what}: set {key} with --methods / --seeds")
        if key == "steps" and steps is not None:
            raise ConfigError(f"{what} and --steps {steps} both set steps: give one of them")
        setters = [m for m in methods if key in method_set_keys(m)]
        if setters:
            raise ConfigError(
                f"{what}: {key} is set by method {setters[0]!r}; choose the method with --methods "
                f"(one of {{{', '.join(METHODS)}}}) instead"
            )
    both = grid_keys & {o.split("=", 1)[0].strip() for o in overrides}
    if both:
        raise ConfigError(f"{sorted(both)[0]} is both overridden and swept: give it once")
    cls = CONFIGS[kind]
    user_keys = {item.split("=", 1)[0].strip() for item in overrides}
    # the overrides' and the grid's keys and values before the losses and simulators (torch) are imported
    for method in methods:
        _method_config(cls, _run_data(spec, kind, overrides, method, seeds[0], steps, user_keys), method)
    for key, values in grid:
        for value in values:
            item = _grid_item(key, value)
            try:
                _method_config(cls, _run_data(spec, kind, overrides + [item], methods[0], seeds[0], steps,
                                              user_keys | grid_keys), methods[0])
            except ConfigError as err:
                raise ConfigError(f"--sweep {key}: {err}") from None
    # a used --out before torch too: every directory the plan can give a run (with or without the STARE keys)
    candidates = [_run_dir(out, m, point, seed) for m in methods for stare in (True, False)
                  for inert in (frozenset(), AUTO_INERT_KEYS) for point in method_points(grid, stare, inert)
                  for seed in seeds]
    check_writable_dir(out)
    check_out(out, resume, overwrite, candidates)
    from simulators.driver import check_resume
    from simulators.parallel import check_memory

    check_grid_used(grid, methods)
    if kind == "transformer":
        import importlib.util

        if importlib.util.find_spec("transformers") is None:
            raise ConfigError(f"preset {preset!r} runs a transformers model, and transformers is not installed (the "
                              "demo's install holds the tabular simulators only): `make install`, or pip install "
                              "-e '.[trainer]'")
    module = simulator_module(kind)
    user_keys |= grid_keys
    configs, run_dirs, groups = {}, {}, {}
    for method in methods:
        stare = uses_stare(method)
        for point in method_points(grid, stare, inert_keys(method)):
            label = group_label(method, point)
            groups[label] = {"method": method, "point": point, "stare": stare}
            point_items = [_grid_item(k, v) for k, v in point.items()]
            for seed in seeds:
                data = _run_data(spec, kind, overrides + point_items, method, seed, steps, user_keys)
                configs[(label, seed)] = _method_config(cls, data, method)
                run_dirs[(label, seed)] = _run_dir(out, method, point, seed)
    if kind == "tabular":  # before anything is created: a request the machine cannot hold is refused here
        check_memory(list(configs.values()), workers)
    check_previous_sweep(out, run_dirs, resume, overwrite)
    saved_steps = []
    if resume:
        for key, run_dir in run_dirs.items():
            if kind == "tabular":
                check_resumable(run_dir, configs[key])
            saved = check_resume(run_dir)  # the rows up to its checkpoint are all there (the driver checks it again)
            done, want = (int(saved["step"]) if saved else 0), int(getattr(configs[key], "steps", 0))
            if done > want:
                raise RunError(f"--resume: {str(run_dir)!r} has {done} steps done, more than steps={want}; a resume "
                               f"continues a run, it does not shorten it: give steps >= {done}, or --overwrite")
            had = _saved_steps(run_dir)
            if had is not None:
                saved_steps.append((had, want))
    run_steps = {int(getattr(c, "steps", 0)) for c in configs.values()}
    request = {"preset": preset, "methods": methods, "seeds": seeds,
               "steps": run_steps.pop() if len(run_steps) == 1 else None,
               "grid": [[k, v] for k, v in grid], "overrides": list(overrides), "plugins": _plugins()}
    notes = resume_changes(recorded, request, saved_steps) if recorded is not None else []
    return SweepPlan(
        preset, kind, out, methods, seeds, configs, run_dirs, module, resume, overwrite,
        list(overrides), grid, groups, workers, request,
        [f"note: --resume {str(out)!r}: this request {c}" for c in notes],
    )


def _grid_item(key: str, value: Any) -> str:
    """``key=value`` of one grid value (a string quoted, as an override)."""
    return f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"


def _run_dir(out: Path, method: str, point: dict[str, Any], seed: int) -> Path:
    """``out/<method>[/<grid point label>]/seed<k>``."""
    sub = point_label(point)
    return out / method / sub / f"seed{seed}" if sub else out / method / f"seed{seed}"


def _saved_steps(run_dir: Path) -> int | None:
    """``steps`` of a run directory's ``config.yaml`` (None: no run there, or no readable value)."""
    import yaml

    try:
        steps = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("steps")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def _plugins() -> list[str]:
    """The ``--plugin`` modules loaded in this process, as given (the installed entry points load by themselves)."""
    from stare_lab.platform.plugins import loaded_plugins

    return [name for name in loaded_plugins() if " = " not in name]


def _plugin_hint(recorded: dict[str, Any] | None, out: Path) -> str:
    """For ``--resume``: the sweep's ``--plugin`` modules to give again (a method they registered is unknown)."""
    if recorded is None:
        return ""
    plugins = [str(p) for p in recorded.get("plugins") or []]
    if plugins:
        flags = " ".join(f"--plugin {p}" for p in plugins)
        return (f"; the sweep in {str(out)!r} was run with {flags}: give it again "
                f"(stare-lab {flags} simulate ... --resume)")
    return (f"; the sweep in {str(out)!r} ran it: load the plugin that registers it "
            "(stare-lab --plugin MODULE simulate ... --resume)")


def _resume_defaults(recorded: dict[str, Any], out: Path, preset: str | None, methods: list[str] | None,
                     seeds: int | list[int] | None, steps: int | None, sweep: list[str], overrides: list[str]
                     ) -> tuple:
    """``--resume``: what the request does not give, the sweep's own (:func:`plan_sweep`); returns ``(preset,
    methods, seeds, steps, grid, overrides)`` with ``grid`` the recorded grid (parsed) when ``sweep`` is empty and
    the sweep had one, else None (``sweep`` is parsed as given). The sweep's steps count unless ``steps``, a
    ``steps=`` override or a grid over steps is given.

    Raises:
        ConfigError: a preset other than the sweep's.
    """
    rec_preset = recorded.get("preset")
    if preset is not None and rec_preset is not None and preset != rec_preset:
        raise ConfigError(f"--resume: {str(out)!r} holds a sweep of preset {rec_preset!r}, not {preset!r}: leave "
                          f"--preset out (or give --preset {rec_preset}), or choose another --out")
    preset = preset if preset is not None else rec_preset
    methods = methods if methods else recorded.get("methods")
    seeds = seeds if seeds is not None else recorded.get("seeds")
    grid = None
    if not sweep and recorded.get("grid"):
        grid = [(str(k), list(v)) for k, v in recorded["grid"]]
    if not overrides and recorded.get("overrides"):
        overrides = [o for o in recorded["overrides"] if o.split("=", 1)[0].strip() != "steps"]
    keys = {o.split("=", 1)[0].strip() for o in overrides} | {k for k, _ in grid or []}
    keys |= {item.split("=", 1)[0].strip() for item in sweep}
    if steps is None and "steps" not in keys:
        steps = recorded.get("steps")
    return preset, methods, seeds, steps, grid, overrides


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def run_sweep(
    plan: SweepPlan, progress: Callable[[int], None] | None = None, meanwhile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run every planned run, write ``out/summary.json`` and return it. Tabular runs are batched and spread over
    ``plan.workers`` processes (:func:`simulators.parallel.run_many`); transformer runs go one after the other.

    ``progress(n)`` is called as run-steps (tabular) or whole runs (other kinds, counted as their ``steps``) finish;
    ``meanwhile()`` once while the runs compute (:func:`simulators.parallel.run_many`; first, for other kinds).
    With ``plan.overwrite`` the previous sweep's runs that the plan drops are removed first (:func:`stale_runs`).
    If a run fails, the error propagates (the other tabular runs finish first); folders this call created and left
    empty are removed (a tabular run removes its own directory when it failed before completing a step).

    Raises:
        RunError: from a run (e.g. diverged to non-finite logits), or ``out`` cannot be written.
    """
    dirs = list(plan.run_dirs.values())
    parents = {d.parent for d in dirs} | {d.parent.parent for d in dirs if d.parent.parent != plan.out.parent}
    created = [d for d in [plan.out, *parents] if not d.exists()]
    plan.out.mkdir(parents=True, exist_ok=True)
    had_request = (plan.out / REQUEST_FILE).is_file()
    if plan.request:  # what --resume continues (simulators.sweep_out.recorded_request)
        write_request(plan.out, plan.request)
    if plan.overwrite:
        for run_dir in stale_runs(plan):
            logger.info("--overwrite: removing %s (a run of the previous sweep that this one drops)", run_dir)
            remove_run(run_dir)
        for run_dir in dirs:
            if (run_dir / "metrics.jsonl").exists():
                clear_run(run_dir)
    from simulators.notes import headline, strength_block, sweep_notes
    from simulators.parallel import run_many

    keys = list(plan.configs)
    try:
        if plan.kind == "tabular":
            summaries = run_many([plan.configs[k] for k in keys], [plan.run_dirs[k] for k in keys],
                                 resume=plan.resume, progress=progress, workers=plan.workers, meanwhile=meanwhile)
            stats = {k: {x: s.get(x) for x in STAT_KEYS} for k, s in zip(keys, summaries)}
        else:
            if meanwhile is not None:
                meanwhile()
            stats = {}
            for k in keys:
                config = plan.configs[k]
                summary = plan.module.run(config, plan.run_dirs[k], resume=plan.resume)
                if progress is not None:
                    progress(int(getattr(config, "steps", 1)))
                # the run's own summary.json numbers (one definition: run_stats with the run's M and window)
                stats[k] = {**{x: summary.get(x) for x in STAT_KEYS}, "run_summary": summary}
    except BaseException:
        if not had_request and not any(d.exists() for d in dirs):  # nothing of this sweep is left to resume
            (plan.out / REQUEST_FILE).unlink(missing_ok=True)
        for d in sorted(created, key=lambda p: len(p.parts), reverse=True):  # deepest first
            try:
                d.rmdir()
            except OSError:  # not empty: it holds finished runs
                pass
        raise
    per_group: dict[str, Any] = {}
    for label, g in plan.groups.items():
        runs = {f"seed{s}": stats[(label, s)] for s in plan.seeds}
        mean = {k: _mean([r.get(k) for r in runs.values()]) for k in STAT_KEYS if k != "steps"}
        outcome = group_outcome(list(runs.values()))  # the verdict's definitions (stare_lab.platform.verdict)
        # each run counted once (held, collapsed, below the band): the table and the verdict agree
        mean["collapsed_runs"], mean["held_runs"] = outcome["collapsed"], outcome["held"]
        mean["below_runs"], mean["steps_to_collapse"] = outcome["below"], outcome["steps_to_collapse"]
        per_group[label] = {
            "method": g["method"], "point": g["point"], "stare": g["stare"], "runs": runs, "mean": mean,
            "run_dirs": {f"seed{s}": plan.run_dirs[(label, s)].relative_to(plan.out).as_posix() for s in plan.seeds},
        }
    summary = {
        "preset": plan.preset,
        "kind": plan.kind,
        "methods": per_group,
        "seeds": plan.seeds,
        "band": getattr(plan.configs[keys[0]], "band", 0.05),
        "config": {f"{label}/seed{s}": to_dict(c) for (label, s), c in plan.configs.items()},
    }
    if plan.grid:
        summary["sweep"] = {"grid": [[k, v] for k, v in plan.grid]}
        crit_groups = {label: {**e, "is_stare": e["stare"], **_push_of(plan.configs[(label, plan.seeds[0])])}
                       for label, e in per_group.items()}
        critical = critical_summary(crit_groups, plan.grid, summary["band"], _base_point(plan))
        if critical:
            summary["critical"] = critical
    summary["critical_strength"] = strength_block(summary)
    summary["notes"] = sweep_notes(summary)
    summary["headline"] = headline(summary)
    tmp = plan.out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, plan.out / "summary.json")
    return summary


def _push_of(config: Any) -> dict[str, Any]:
    """``{"m": C2's M or None, "adaptive": bool, "sampled": bool}`` of a run config (the push a critical strength is
    for, and whether its rollouts are sampled: a first-order W is then a lower bound)."""
    from stare_lab.loss.losses import loss_needs

    st = config.loss.stare
    stare = loss_needs(config.loss.loss_mode, config.loss).stare
    c2 = stare and str(st.variant).upper() == "C2" and float(st.reweight_m) != 1.0
    return {"m": float(st.reweight_m) if c2 else None, "adaptive": bool(stare and st.adaptive),
            "sampled": getattr(config, "mode", "sampled") != "expected"}


def _base_point(plan: SweepPlan) -> dict[str, Any]:
    """The preset's own value (with the user's overrides) of each grid key: the dotted key in the preset's
    overrides, else the config dataclass default."""
    data = apply_overrides(copy.deepcopy(get_preset(plan.preset)["overrides"]), plan.overrides)
    default = to_dict(CONFIGS[plan.kind]())
    out = {}
    for key, _ in plan.grid:
        node, ref = data, default
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
            ref = ref.get(part) if isinstance(ref, dict) else None
        out[key] = node if node is not None else ref
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(summary: dict[str, Any]) -> str:
    """The end-of-sweep table: per group (mean over seeds) initial / final entropy (nats), H_tgt, steps to
    collapse (mean over the seeds that collapsed and did not hold the band, and how many: a seed is counted as
    collapsed or as held, never both, :func:`stare_lab.platform.verdict.group_outcome`), final reward, the fraction
    of steps in the band, the mean
    |H − H_tgt| over the second half and how many seeds held the band (:func:`stare_lab.platform.summary.band_held`), the push ratio (STARE's measured
    one-step effect over its first-order size) and the R² of measured on predicted one-step ΔH."""
    n_seeds = len(summary["seeds"])
    width = max([15] + [len(k) + 2 for k in summary["methods"]])
    head = (f"{'method':<{width}}{'H0':>7}{'H_end':>8}{'H_tgt':>7}{'collapse@':>13}{'reward':>8}{'in_band':>9}"
            f"{'|H-Ht|':>8}{'held':>6}{'push':>7}{'R2(dH)':>8}")
    lines = [head, "-" * len(head)]
    for label, entry in summary["methods"].items():
        m = entry["mean"]
        collapse = (
            f"{m['steps_to_collapse']:.0f} ({m['collapsed_runs']}/{n_seeds})"
            if m.get("collapsed_runs") and m["steps_to_collapse"] is not None else f"- (0/{n_seeds})"
        )
        held = f"{m.get('held_runs', 0)}/{n_seeds}" if m.get("mean_abs_dev_second_half") is not None else "-"
        lines.append(
            f"{label:<{width}}{_fmt(m['initial_entropy']):>7}{_fmt(m['final_entropy']):>8}"
            f"{_fmt(m['target_entropy']):>7}{collapse:>13}{_fmt(m['final_reward']):>8}"
            f"{_fmt(m['time_in_band'], '.2f'):>9}{_fmt(m['mean_abs_dev_second_half']):>8}{held:>6}"
            f"{_fmt(m.get('push_ratio'), '.2f'):>7}{_fmt(m['pred_r2']):>8}"
        )
    lines.append(TABLE_LEGEND)
    return "\n".join(lines)


#: Printed under the end-of-sweep table (definitions in :func:`simulators.run_stats.run_stats`).
TABLE_LEGEND = (
    "H0 / H_end: entropy (nats) at the first / last step; collapse@: first step with H < 10 % of H0 (seeds that "
    "collapsed / all; a seed that held the band counts as held only); in_band: fraction of steps with "
    "|H - H_tgt| <= 0.05 nats (as in the report); |H-Ht|: mean |H - H_tgt| over the "
    "second half; held: seeds that held the band (|H-Ht| < min(0.05, H_tgt/4) and final H >= H_tgt/2, so a "
    "collapsed run never counts); push: STARE's measured one-step effect / its "
    "first-order size (median; below 0.8 the step size is outside the theory's regime; for runs whose gate never "
    "opened a probe that is not applied); R2(dH): R^2 of the measured on the predicted one-step entropy change"
)
