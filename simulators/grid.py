"""Sweep grids (``stare-lab simulate --sweep KEY=V1,V2,…``) and the critical STARE strength read off them.

A grid is a list of ``(dotted key, values)``; its points are the cartesian product. A method only sees the keys that
can change its runs (``loss.stare.*`` keys are dropped for methods without the STARE loss, and the fixed-W keys for
the auto schedule, which sets W itself: :func:`inert_keys`), so GRPO runs once per point of the
other keys. Run directories: ``OUT/<method>/<label>/seed<k>`` with ``label`` = ``W=1.2,lr=0.5`` (the
short names of :data:`SHORT_NAMES`), or ``OUT/<method>/seed<k>`` for a method without grid keys.

:func:`critical_summary` turns a sweep over ``loss.stare.reweight_w`` into ``critical.<method>`` (docs/theory.md §7,
:mod:`stare_lab.theory.critical`): ``strengths`` (the labelled *measured* / *predicted* / *conservative* critical strengths,
:class:`stare_lab.theory.critical.CriticalStrength`) and ``recommended`` (the one to act on), and the same numbers under
their older keys: ``measured_w`` (the smallest grid W whose runs hold the band on every seed),
``predicted_w`` (the first-order prediction: median over the held runs of their largest W*(t) over the second
half), ``predicted_w_grpo`` (the conservative estimate: median over the GRPO seeds of W* where they first cross
H_tgt; for C2 at M its own runs' W* with M there, as the conservative strength), ``predicted_w_measured_drift`` (like ``predicted_w`` but with the *measured* one-step change of the ω ≡ 1
update in place of D_GRPO: it includes the second-order, noise-driven drift the first order leaves out), and
``tolerance`` / ``within_tolerance`` (max(35 % of W − 1, one grid step)). With other grid keys (e.g. ``lr``) the
same is given per slice of those keys under ``by_slice``; the top-level values are those of the slice at the
preset's own values of those keys (``slice``), else of the first slice.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from stare_lab.config import parse_overrides
from stare_lab.loss.methods import method_overrides
from stare_lab.theory.critical import measured_strength, recommend, run_strengths, tolerance
from stare_lab.platform.summary import band_held
from stare_lab.errors import ConfigError

__all__ = ["SHORT_NAMES", "parse_grid", "method_points", "point_label", "critical_summary", "W_KEY", "inert_keys",
           "AUTO_INERT_KEYS"]

W_KEY = "loss.stare.reweight_w"
#: short names of grid keys in run-directory labels and tables
SHORT_NAMES = {W_KEY: "W", "loss.stare.reweight_m": "M", "loss.stare.target_entropy": "H_tgt",
               "target_entropy_rel": "H_tgt_rel"}


def parse_grid(items: list[str]) -> list[tuple[str, list[Any]]]:
    """``["stare.reweight_w=1.1,1.2", "lr=0.5,1"]`` → ``[("loss.stare.reweight_w", [1.1, 1.2]), ("lr", [0.5, 1.0])]``
    (``stare.`` is short for ``loss.stare.``; values parsed like overrides).

    Raises:
        ConfigError: an item without ``=``, an empty value list or value, a key given twice, or ``method`` /
            ``seed`` (use ``--methods`` / ``--seeds``).
    """
    grid: list[tuple[str, list[Any]]] = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--sweep {item!r} must look like KEY=V1,V2,... (e.g. stare.reweight_w=1.1,1.3,1.5)")
        key, raw = item.split("=", 1)
        key = key.strip()
        key = "loss." + key if key.startswith("stare.") else key
        parts = [p.strip() for p in raw.split(",")]
        if not key or not parts or any(p == "" for p in parts):
            raise ConfigError(f"--sweep {item!r} needs a key and a comma-separated list of values without gaps")
        if key in ("method", "seed"):
            raise ConfigError(f"--sweep {item!r}: set {key} with --{key}s")
        if any(k == key for k, _ in grid):
            raise ConfigError(f"--sweep gives {key} twice")
        values = [v for _, v in parse_overrides(f"{key}={p}" for p in parts)]
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"--sweep {item!r} lists a value twice")
        grid.append((key, values))
    return grid


#: the ``loss.stare`` keys the auto schedule ignores: it sets W (and M = 1/W for C2) itself (docs/theory.md §9)
AUTO_INERT_KEYS = frozenset(f"loss.stare.{k}" for k in ("reweight_w", "reweight_m", "w_max", "m_min", "alpha"))


def inert_keys(method: str) -> frozenset[str]:
    """The ``loss.stare.*`` keys whose value does not change ``method``'s runs: :data:`AUTO_INERT_KEYS` for a method
    with the auto schedule (``o1-auto``, ``c2-auto``), none otherwise. A ``--sweep`` over them runs such a method
    once.

    Raises:
        ConfigError: ``method`` is not in the method table (:func:`stare_lab.loss.methods.method_overrides`).
    """
    st = method_overrides(method)["loss"].get("stare") or {}
    return AUTO_INERT_KEYS if st.get("adaptive") and st.get("schedule") == "auto" else frozenset()


def method_points(grid: list[tuple[str, list[Any]]], is_stare: bool, inert: frozenset[str] | set[str] = frozenset()
                  ) -> list[dict[str, Any]]:
    """The grid points a method runs: the product over the keys that can change its runs (``loss.stare.*`` only for
    STARE methods, none of ``inert``: the keys its settings ignore); ``[{}]`` when none."""
    keys = [(k, v) for k, v in grid if (is_stare or not k.startswith("loss.stare.")) and k not in inert]
    return [dict(zip([k for k, _ in keys], combo)) for combo in itertools.product(*[v for _, v in keys])]


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def point_label(point: dict[str, Any]) -> str:
    """``{"loss.stare.reweight_w": 1.2, "lr": 0.5}`` → ``"W=1.2,lr=0.5"`` ("" for no keys)."""
    return ",".join(f"{SHORT_NAMES.get(k, k.rsplit('.', 1)[-1])}={_fmt(v)}" for k, v in point.items())


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def critical_summary(
    groups: dict[str, dict[str, Any]], grid: list[tuple[str, list[Any]]], band: float,
    base: dict[str, Any] | None = None,
) -> dict:
    """``critical.<method>`` (module docstring) from the sweep's groups: label → ``{"method", "point", "is_stare",
    "runs": {seed: stats}}`` (optionally ``"m"``: C2's M, and ``"adaptive"``) with each run's
    :func:`simulators.run_stats.run_stats` (the band keys of :func:`stare_lab.platform.summary.band_held`,
    ``critical_w``, ``critical_w_measured_drift``, ``w_star_at_crossing``). Empty without a W grid. With other grid
    keys the top-level values are those of the slice at ``base`` (the preset's own values of those keys) when the
    grid has it, else of the first slice.

    Each slice also carries ``strengths`` — its *measured*, *predicted* and *conservative* critical strengths
    (:class:`stare_lab.theory.critical.CriticalStrength` records, :func:`stare_lab.theory.critical.measured_strength` and
    :func:`stare_lab.theory.critical.run_strengths`) — and ``recommended`` (:func:`stare_lab.theory.critical.recommend`). A W
    grid of an adaptive method sets the schedule's starting W, not the W it applies: it gives no *measured*
    strength (``measured_w`` None)."""
    w_values = next((v for k, v in grid if k == W_KEY), None)
    if not w_values:
        return {}
    ws = sorted(float(w) for w in w_values)
    step = min((b - a for a, b in zip(ws, ws[1:])), default=0.0)
    others = [k for k, _ in grid if k != W_KEY]
    out: dict[str, Any] = {}
    methods = sorted({g["method"] for g in groups.values() if g["is_stare"] and W_KEY in g["point"]})
    for method in methods:
        slices: dict[str, dict[str, Any]] = {}
        for g in groups.values():
            if g["method"] != method or W_KEY not in g["point"]:
                continue
            other = {k: g["point"][k] for k in others if k in g["point"]}
            slices.setdefault(point_label(other), {"point": other, "by_w": {}})["by_w"][float(g["point"][W_KEY])] = g
        by_slice = {}
        for label, sl in slices.items():
            by_w = sl["by_w"]
            first = next(iter(by_w.values()))
            m, adaptive = first.get("m"), bool(first.get("adaptive"))
            devs = {w: [r.get("mean_abs_dev_second_half") for r in g["runs"].values()] for w, g in by_w.items()}
            held_by_w = {w: [band_held(r) for r in g["runs"].values()] for w, g in by_w.items()}
            n_seeds = max(len(v) for v in held_by_w.values())
            where = f"{method} W sweep" + (f" at {label}" if label else "")
            measured = None if adaptive else measured_strength(
                held_by_w, m, f"{where}: grid {', '.join(f'{w:g}' for w in sorted(by_w))}; {n_seeds} seeds")
            # the runs that held the band, each on its own (stare_lab.theory.critical.run_strengths' definition: the
            # predicted W here and in the strengths is one number)
            held = [r for g in by_w.values() for r in g["runs"].values() if band_held(r)]
            grpo = [g for g in groups.values() if not g["is_stare"] and g["method"] in ("grpo", "grpo-ds")
                    and all(g["point"].get(k) == v for k, v in sl["point"].items())]
            run_groups = [{"label": _group_label(g, method), "stare": True, "m": m, "runs": list(g["runs"].values()),
                           "sampled": g.get("sampled", True)} for g in by_w.values()]
            run_groups += [{"label": g["method"], "stare": False, "m": None, "runs": list(g["runs"].values()),
                            "grpo": True, "sampled": g.get("sampled", True)} for g in grpo]
            strengths = ([measured] if measured is not None else []) + [
                s for s in run_strengths(run_groups) if _same(s.m, m)]
            entry = {
                "point": sl["point"],
                "m": m,
                "measured_w": None if measured is None else measured.w,
                "predicted_w": _median([r.get("critical_w") for r in held]),
                "predicted_w_measured_drift": _median([r.get("critical_w_measured_drift") for r in held]),
                # the conservative strength of this M (for C2 its own runs' W* with M, as the critical-W table)
                "predicted_w_grpo": next((x.w for x in strengths if x.kind == "conservative"), None)
                if m not in (None, 1.0) else
                _median([r.get("w_star_at_crossing") for g in grpo for r in g["runs"].values()]),
                "held_runs": len(held),
                "grid_step": step,
                "deviation_by_w": {f"{w:g}": devs[w] for w in sorted(devs)},
                "strengths": [x.to_dict() for x in strengths],
                "recommended": (lambda r: None if r is None else r.to_dict())(recommend(strengths, m)),
            }
            if entry["measured_w"] is not None:
                entry["tolerance"] = tolerance(entry["measured_w"], step)
                for key in ("predicted_w", "predicted_w_measured_drift"):
                    p = entry[key]
                    entry[f"{key}_within_tolerance"] = None if p is None else abs(p - entry["measured_w"]) <= entry["tolerance"]
            by_slice[label] = entry
        first = by_slice.get(point_label({k: (base or {}).get(k) for k in others}), next(iter(by_slice.values())))
        out[method] = {**{k: v for k, v in first.items() if k != "point"}, "slice": first["point"],
                       "by_slice": by_slice}
    return out


def _group_label(g: dict[str, Any], method: str) -> str:
    """``o1 [W=1.3]``: a grid group's label for the sources of its strengths."""
    label = point_label(g["point"])
    return f"{method} [{label}]" if label else method


def _same(a: float | None, b: float | None) -> bool:
    a = None if a in (None, 1.0) else a
    b = None if b in (None, 1.0) else b
    return a == b


def _holds(held: list[bool | None]) -> bool:
    return bool(held) and all(x is True for x in held)
