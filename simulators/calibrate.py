"""``stare-lab calibrate PROBE_RUN``: fit the tabular ``llm`` task to a probe of a real (or simulated) model and read
off the critical STARE strength of the calibrated toy (docs/theory.md §8, docs/calibration.md).

Why. The toys' critical W does not transfer: in a tabular task every position decides the reward, so each token is
linked to the advantage far more strongly than in a language model, where a few tokens out of thousands matter
(docs/theory.md §8). Two quantities, measurable on any GRPO run near its target entropy, say how strongly: the ratio
D_L+/|D_GRPO| of the first-order entropy change STARE's L+ tokens carry to GRPO's drift (``pred/d_ratio``), and the
share of the L+ tokens' probability mass whose surprisal is above their position's critical surprisal s*
(``pred/lplus_above_sstar``: the tokens whose reinforcement raises the entropy). Calibration chooses the knobs of
the ``llm`` preset — the reward-coupling fraction (``reward_coupling``), the fork width (how many of the positions
fork, ``forking_positions``, and between how many correct tokens, ``num_correct``) and the verifier noise
(``reward_noise``) — so that the toy's GRPO run shows the probe's two values at the matching entropy, then sweeps W
on that toy. The share of forking positions is the main lever of the L+-above-s* share (measured: with 2 of 10
positions forking it stays ≤ 0.2 at the crossing, with 5 of 10 it reaches 0.5–1.0), the coupling and the noise
that of D_L+/|D_GRPO| (docs/calibration.md).

Steps (:func:`calibrate`):

1. **Probe** (:func:`read_probe`): one or more run directories whose metrics rows carry ``entropy``,
   ``pred/d_grpo`` and ``pred/d_lplus`` (optional ``pred/d_lminus``, ``pred/d_ratio``,
   ``pred/lplus_above_sstar``): a trainer run with the D-term probe, a small-transformer run with
   ``measure_decomposition=true`` or a tabular run. The probe's steps are the window of :func:`probe_window` —
   ``window`` steps (default 10 % of the run, :data:`WINDOW_FRAC`) centred on the first step whose entropy is
   below the target entropy (``--target``, else the run's ``loss.stare.target_entropy``), or every step when the run
   never gets there (a probe of a checkpoint near its target) — a *crossing* probe (GRPO or another baseline). A
   *held* probe (a run of the gated STARE loss that holds the band, ``probe_kind`` ``auto`` picks it by the loss:
   :func:`probe_kind`) is read over its second half instead, the span of the band criterion, and adds the
   **balance W** (:func:`held_balance`): 1 + the mean of gate·(W − 1) there, the push that really held the entropy
   (first-order drift, sampling, gradient clipping and the gap between a batch and fresh samples included). A held
   probe run that did not hold the band is refused. Over the probe's steps, pooled over the runs: d_ratio =
   ΣD_L+ / |ΣD_GRPO| (a ratio of sums, as :mod:`stare_lab.theory.critical` windows W*), lplus_above_sstar = the mean of
   the per-step shares, entropy = the mean entropy.
2. **Matching entropy.** Entropies of a toy and of a language model are not on one scale, so they are matched
   relative to the start of RL: the probe sits at ρ = H_match / H_0 of its initial entropy H_0 (the first row's
   entropy, or ``--initial-entropy`` for a probe of a later checkpoint), with H_match the target when the probe
   crosses it and the window's mean entropy otherwise; each toy setting is read, and the calibrated toy's band is
   set, at ρ × that setting's own initial entropy (:func:`matched_target`; the number of forks changes it).
3. **Fit** (:func:`fit_knobs`): runs of the ``llm`` preset (sampled, G responses per prompt, as in training) over a
   grid of the four knobs (default :data:`DEFAULT_GRID`; for a held probe :data:`HELD_DEFAULT_GRID`, with
   ``push_efficiency``; ``clip_rel`` of :data:`OPTIONAL_KNOBS` when the grid names it), ``fit_seeds`` seeds
   each, read like the probe at the matched target: GRPO runs for a crossing probe, runs of the probe's STARE
   schedule (its method and :data:`SCHEDULE_KEYS`) for a held one. The residual (:func:`residual`) is the Euclidean distance of (g(d_ratio),
   lplus_above_sstar, and for a held probe ln balance W) between toy and probe with g(x) = x / (1 + |x|) (monotone,
   bounded: the ratio spans −1 … 60 between toys and models, and W* = 1 + 1/ratio changes little among large
   ratios; ln W: a relative error, 0.2 ≈ the tolerance of a critical W near 7); a knob setting whose run never
   reaches the matched target (crossing) or does not hold the band on every seed (held) cannot reproduce the probe
   (residual ∞). The smallest residual wins.
4. **Critical W** (:func:`critical_sweep`): ``stare-lab simulate --preset llm`` with the fitted knobs, the matched
   target, methods grpo, o1 and c2 (C2 at ``c2_m``) over a W grid, ``seeds`` seeds: the measured critical W of each
   method (the smallest grid W held on every seed, :func:`stare_lab.theory.critical.measured_critical_w`) with its
   uncertainty range — (``low``, ``high``] = (the largest grid W below it, the measured W]: the toy's critical W
   lies in between on this grid (``low`` = 1 when the smallest grid W holds; ``w``/``high`` null and ``low`` the
   largest grid W when no W holds). The adaptive schedule's cap must reach it: ``w_max`` = the O1 ``high``.

Time (:mod:`simulators.calibrate_time`): the fit runs in slices of about a tenth of its settings; with a progress
reporter or a budget a pilot of the first slice first says how long the calibration takes (:func:`estimate`), and
``max_minutes`` refuses one over it or stops one before a slice or the sweep that would end past it.

Output folder ``OUT``: ``fit/`` (the fit's runs), ``sweep/`` (the sweep: run directories and its ``summary.json``),
``fit.json`` (``probe``, every knob setting done with its observables and residual, ``partial``: null, or what a
budget stop left: ``max_minutes``, ``stopped_before``, ``settings_done``, ``settings_total``) and
``calibration.json``::

    {"kind": "calibrated",
     "probe": {"run": str, "kind": "crossing|held", "source": "trainer|simulator", "model": str|null,
               "steps": [int], "entropy": float, "d_ratio": float, "lplus_above_sstar": float|null,
               "balance_w": float|null, "schedule": {str: value}|null, "target_entropy": float|null},
     "knobs": {"reward_coupling": float, "forking_positions": int, "num_correct": int, "reward_noise": float,
               ["push_efficiency": float|null: held probe or named in the grid],
               ["clip_rel": float|null: only when the grid names it]},
     "preset": {"name": "llm", "overrides": {dotted key: value}},
     "fit": {"d_ratio": float, "lplus_above_sstar": float|null, "balance_w": float|null, "residual": float},
     "critical": {"o1": {"w": float|null, "low": float, "high": float|null},
                  "c2": {"w": float|null, "m": float, "low": float, "high": float|null},
                  "adaptive": {"w_max": float|null}},
     "regime": {"d_ratio": float, "target_over_optimal": float|null, "mode": "sampled|expected"}}

``probe.run``: the probe directories, comma-separated; ``probe.steps``: the step numbers of the window (of the first
probe run); ``probe.entropy``: the window's mean entropy (nats); ``probe.target_entropy``: the target the window is
centred on (null when the probe never crosses it), for a held probe its H_tgt; ``probe.kind``: step 1;
``probe.balance_w`` / ``probe.schedule``: a held probe's balance W and STARE schedule (null for a crossing probe);
``fit.balance_w``: the calibrated toy's balance W under that schedule. ``preset.overrides``: what ``stare-lab
simulate --preset llm`` takes to run the calibrated toy (the knobs and the matched target). ``fit``: the calibrated
toy's own observables at its matched target. ``critical``: module docstring step 4 (W for O1 with M = 1; C2 at the recorded M).
``regime``: the calibrated toy's regime — its D_L+/|D_GRPO| at the target, its target over its reward-optimal
entropy, its mode — for comparing the toy with a training target before acting on its W (``promote``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LPLUS, KEY_LPLUS_ABOVE
from stare_lab.errors import ConfigError, DataError
from stare_lab.platform.evidence import check_run
from stare_lab.platform.outdir import CALIBRATION, check_kind, check_outside_writers
from stare_lab.platform.runlock import lock_dir
from stare_lab.platform.runs import read_run
from stare_lab.platform.summary import band_held, run_summary, summary_settings

from simulators.calibrate_grid import (  # noqa: F401 (the grid's names are part of this module's interface)
    DEFAULT_GRID, HELD_DEFAULT_GRID, KNOBS, OPTIONAL_KNOBS, _check_grid, _label,
)
from simulators.calibrate_time import Budget, BudgetError, Cost, Progress, measure, minutes, slices
from simulators.parallel import check_memory, default_workers, run_many
from simulators.presets import get_preset
from simulators.sweep import check_writable_dir, plan_sweep, run_sweep
from simulators.sweep_out import claim_calibration_out
from simulators.tabular.runner import config_from_overrides, init_state, mean_entropy
from simulators.tabular.tasks import reward_optimal_entropy

logger = logging.getLogger(__name__)

__all__ = [
    "KNOBS", "OPTIONAL_KNOBS", "DEFAULT_GRID", "HELD_DEFAULT_GRID", "DEFAULT_W_GRID", "PROBE_KINDS", "SCHEDULE_KEYS",
    "Probe", "probe_window", "probe_kind", "held_balance", "read_probe", "matched_target", "residual",
    "toy_observables", "fit_knobs", "critical_sweep", "calibrate", "estimate", "Estimate", "FitStopped", "PRESET",
    "OUTPUTS",
]

#: the preset whose knobs are fitted
PRESET = "llm"
#: the default W grid of the critical-W sweep
DEFAULT_W_GRID = [1.05, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0]
#: the probe / toy window as a share of the run's steps (unless ``window`` is given)
WINDOW_FRAC = 0.1
#: what a calibration writes in its ``OUT`` (all that ``--overwrite`` removes)
OUTPUTS = ("calibration.json", "fit.json", "fit", "sweep", "calibration.json.tmp")
#: the C2 M of the sweep unless given (the paper's, docs/theory.md §4)
DEFAULT_C2_M = 0.9
#: where the probe is read (module docstring, step 1): ``crossing`` = around a GRPO run's first step below the
#: target, ``held`` = the second half of a STARE run that holds the band
PROBE_KINDS = ("crossing", "held")
#: the ``loss.stare`` keys of a held probe's schedule that the toy's fit runs copy
SCHEDULE_KEYS = ("variant", "reweight_w", "reweight_m", "adaptive", "alpha", "w_max", "m_min", "top_p_ratio")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


@dataclasses.dataclass
class Probe:
    """The probe's observables (module docstring, step 1): ``runs`` (paths), ``source`` (``trainer`` /
    ``simulator``), ``model`` (name or None), ``steps`` (step numbers of the window of the first run),
    ``entropy`` (window mean, nats), ``initial_entropy`` (H_0, nats), ``d_ratio``, ``lplus_above_sstar`` (None when
    the rows do not carry it), ``target_entropy`` (the target the window is centred on; None when not crossed),
    ``rel_entropy`` (ρ = H_match / H_0); ``kind`` (:data:`PROBE_KINDS`), and for a held probe ``balance_w``
    (:func:`held_balance` over the window, pooled) and ``schedule`` (``method`` and the :data:`SCHEDULE_KEYS` of
    its ``loss.stare``: what the toy's fit runs copy)."""

    runs: list[str]
    source: str
    model: str | None
    steps: list[int]
    entropy: float
    initial_entropy: float
    d_ratio: float
    lplus_above_sstar: float | None
    target_entropy: float | None
    rel_entropy: float
    kind: str = "crossing"
    balance_w: float | None = None
    schedule: dict[str, Any] | None = None


def probe_window(rows: Sequence[dict[str, Any]], target: float | None, window: int) -> tuple[int, int, bool]:
    """The probe steps of one run's ``rows``: ``(start, stop, crossed)`` row indices of the ``window`` rows centred on
    the first row whose ``entropy`` is below ``target`` (clipped to the run, as
    :func:`stare_lab.theory.critical.w_star_at_crossing`), or ``(0, len(rows), False)`` when there is no target or the
    entropy never falls below it."""
    n = len(rows)
    cross = None
    if target is not None:
        cross = next((i for i, r in enumerate(rows) if _num(r.get("entropy")) is not None and r["entropy"] < target),
                     None)
    if cross is None:
        return 0, n, False
    window = max(1, min(window, n))
    a = max(0, min(cross - window // 2, n - window))
    return a, a + window, True


def _window_sums(rows: Sequence[dict[str, Any]], start: int, stop: int) -> dict[str, Any]:
    """ΣD_GRPO, ΣD_L+, the per-step L+-above-s* shares and the entropies of ``rows[start:stop]`` (steps with a
    missing D term are left out of the sums)."""
    dg = dl = 0.0
    shares, ents, pushes, used = [], [], [], 0
    for r in rows[start:stop]:
        g, p = _num(r.get(KEY_D_GRPO)), _num(r.get(KEY_D_LPLUS))
        if g is not None and p is not None:
            dg, dl, used = dg + g, dl + p, used + 1
        s = _num(r.get(KEY_LPLUS_ABOVE))
        if s is not None:
            shares.append(s)
        h = _num(r.get("entropy"))
        if h is not None:
            ents.append(h)
        g, w = _num(r.get("gate_on")), _num(r.get("stare_w"))
        if g is not None and w is not None:
            pushes.append(g * (w - 1.0))
    return {"d_grpo": dg, "d_lplus": dl, "shares": shares, "entropies": ents, "pushes": pushes, "used": used}


def _observables(parts: list[dict[str, Any]]) -> tuple[float | None, float | None, float | None, float | None]:
    """(d_ratio, lplus_above_sstar, entropy, balance W) pooled over the windows ``parts`` of :func:`_window_sums`
    (balance W: 1 + the mean of gate·(W − 1) over every step of the windows, :func:`held_balance`)."""
    dg = sum(p["d_grpo"] for p in parts)
    dl = sum(p["d_lplus"] for p in parts)
    used = sum(p["used"] for p in parts)
    shares = [s for p in parts for s in p["shares"]]
    ents = [h for p in parts for h in p["entropies"]]
    pushes = [x for p in parts for x in p.get("pushes", [])]
    ratio = dl / abs(dg) if used and dg != 0 else None
    return (ratio, statistics.fmean(shares) if shares else None, statistics.fmean(ents) if ents else None,
            1.0 + statistics.fmean(pushes) if pushes else None)


def _model_name(config: dict[str, Any]) -> str | None:
    if config.get("source") == "trainer":
        path = (config.get("model") or {}).get("path")
        return Path(str(path)).name if path else None
    sim = config.get("simulator")
    if sim == "transformer":
        m = config.get("model") or {}
        return f"small transformer ({m.get('arch', '?')}, hidden {m.get('hidden_size', '?')}, " \
               f"{m.get('num_layers', '?')} layers)"
    return f"tabular {config.get('task')}" if sim == "tabular" else None


def probe_kind(config: dict[str, Any]) -> str:
    """``held`` for a run of the gated STARE loss (``loss.loss_mode`` ``stare``, ``loss.stare.gate`` ``entropy``),
    else ``crossing`` (GRPO or another baseline): where :func:`read_probe` reads it by default."""
    loss = config.get("loss") if isinstance(config.get("loss"), dict) else {}
    stare = loss.get("stare") if isinstance(loss.get("stare"), dict) else {}
    return "held" if loss.get("loss_mode") == "stare" and stare.get("gate", "entropy") == "entropy" else "crossing"


def held_balance(rows: Sequence[dict[str, Any]]) -> float | None:
    """The push that held the entropy, as a W: 1 + the mean over ``rows`` of gate·(W − 1) (``gate_on`` 0/1,
    ``stare_w``; rows without both are left out), None without any. Along the held second half of a run the entropy
    is stationary, so this mean extra weight on L+ cancels the drift the run really had — first order, second order
    (sampling), gradient clipping and all (docs/calibration.md, the held probe). A gate always on at W gives W."""
    parts = _window_sums(rows, 0, len(rows))
    return 1.0 + statistics.fmean(parts["pushes"]) if parts["pushes"] else None


def _schedule(config: dict[str, Any]) -> dict[str, Any]:
    """``{"method": "o1" | "c2", **the SCHEDULE_KEYS of loss.stare}`` of a STARE run's config."""
    stare = dict(((config.get("loss") or {}).get("stare") or {}))
    out = {k: stare[k] for k in SCHEDULE_KEYS if k in stare}
    return {"method": "c2" if str(stare.get("variant", "O1")).upper() == "C2" else "o1", **out}


def _run_rows(path: str | os.PathLike) -> tuple[Any, list[dict[str, Any]]]:
    run = read_run(path, log=False)  # the evidence check below says what reading skipped
    if run.config_error is not None or not run.config:
        why = f" (it is {run.config_error})" if run.config_error else ""
        raise DataError(f"probe run {str(path)!r} has no readable config.yaml: its loss (GRPO or STARE), schedule "
                        f"and target entropy are unknown, so its window and kind cannot be read; restore the run's "
                        f"config.yaml{why}")
    evidence = check_run(run)  # the one evidence check (stare_lab.platform.evidence): parses, complete, consistent
    if not evidence.sound:
        raise DataError(f"probe {evidence.reason()}: not sound evidence")
    rows = [r for r in run.metrics if _num(r.get("entropy")) is not None]
    if not rows or not any(_num(r.get(KEY_D_GRPO)) is not None and _num(r.get(KEY_D_LPLUS)) is not None
                           for r in rows):
        raise DataError(
            f"probe run {str(path)!r} has no rows with entropy, {KEY_D_GRPO} and {KEY_D_LPLUS}: log the D terms "
            "(small transformer: measure_decomposition=true; trainer: schedule.measure_entropy_change=true; "
            "tabular runs always log them)")
    return run, rows


def read_probe(
    paths: Sequence[str | os.PathLike], target: float | None = None, initial_entropy: float | None = None,
    window: int | None = None, kind: str = "auto",
) -> Probe:
    """Read and pool the probe runs ``paths`` (module docstring, steps 1–2).

    Args:
        paths: run directories (``stare_lab.platform.runs`` format).
        target: the target entropy (nats) the window is centred on; None → each run's ``loss.stare.target_entropy``.
        initial_entropy: H_0 (nats) for the matching entropy; None → the first run's first ``entropy``.
        window: steps per window of a crossing probe; None → :data:`WINDOW_FRAC` of each run (at least 1).
        kind: ``crossing``, ``held`` (:data:`PROBE_KINDS`) or ``auto``: :func:`probe_kind` of the runs.

    Raises:
        DataError: a path is not a run directory (``RunError``), a run has no readable ``config.yaml``, a run is
            not sound evidence (:func:`stare_lab.platform.evidence.check_run`: no rows, damaged or unfinished
            metrics, a summary its rows do not reproduce), a run has no rows with ``entropy``,
            ``pred/d_grpo`` and ``pred/d_lplus`` (the message says how to log them), the pooled ΣD_GRPO is 0, the
            runs disagree on whether they cross the target, on their kind (``auto``) or on their schedule (held), or
            a held probe run did not hold the band.
        ConfigError: ``target`` / ``initial_entropy`` / ``window`` / ``kind`` out of range, or ``held`` for a run
            without the gated STARE loss.
    """
    if not paths:
        raise ConfigError("calibrate needs at least one PROBE_RUN directory")
    if target is not None and not (_num(target) is not None and target > 0):
        raise ConfigError(f"--target={target!r} must be a number > 0 (nats)")
    if initial_entropy is not None and not (_num(initial_entropy) is not None and initial_entropy > 0):
        raise ConfigError(f"--initial-entropy={initial_entropy!r} must be a number > 0 (nats)")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(f"--window={window!r} must be an integer >= 1")
    if kind not in ("auto", *PROBE_KINDS):
        raise ConfigError(f"--probe-kind={kind!r} is not one of {{auto, {', '.join(PROBE_KINDS)}}}")
    runs = [(path, *_run_rows(path)) for path in paths]
    kinds = {probe_kind(run.config) for _, run, _ in runs}
    if kind == "auto":
        if len(kinds) > 1:
            raise DataError("the probe runs mix GRPO (crossing) and STARE (held) runs; give one kind, or "
                            "--probe-kind")
        kind = kinds.pop()
    elif kind == "held" and "crossing" in kinds:
        bad = next(str(p) for p, run, _ in runs if probe_kind(run.config) == "crossing")
        raise ConfigError(f"--probe-kind=held needs runs of the gated STARE loss; {bad!r} is not one")
    parts, crossed, first, schedules = [], [], None, []
    for path, run, rows in runs:
        tgt = target if target is not None else _num(((run.config.get("loss") or {}).get("stare") or {})
                                                     .get("target_entropy"))
        if kind == "held":
            settings = {**summary_settings(run.config), "target_entropy": tgt}
            summ = run_summary(rows, **settings)
            if not band_held(summ):
                raise DataError(
                    f"probe run {str(path)!r} did not hold the band (mean |H - H_tgt| over the second half "
                    f"{summ['mean_abs_dev_second_half']:.3g} nats at H_tgt {tgt}): a held probe needs a STARE run "
                    "that holds it (raise stare.reweight_w or w_max), or read it as a crossing probe (--probe-kind crossing)")
            a, b, did = len(rows) // 2, len(rows), True
            schedules.append(_schedule(run.config))
        else:
            a, b, did = probe_window(rows, tgt, window or max(1, round(WINDOW_FRAC * len(rows))))
        parts.append(_window_sums(rows, a, b))
        crossed.append(tgt if did else None)
        if first is None:
            first = (run, rows, a, b)
    if len({c is None for c in crossed}) > 1:
        raise DataError(f"the probe runs disagree: {sum(c is not None for c in crossed)} of {len(crossed)} cross "
                        "their target entropy; give runs that all cross it (or none)")
    if any(s != schedules[0] for s in schedules):
        raise DataError(f"the held probe runs use different STARE schedules ({schedules[0]} and "
                        f"{next(s for s in schedules if s != schedules[0])}); give runs of one schedule")
    ratio, share, entropy, balance = _observables(parts)
    if ratio is None:
        raise DataError(f"the probe's window has ΣD_GRPO = 0 ({', '.join(map(str, paths))}): no drift to compare "
                        "with; choose other steps (--window, --target)")
    if share is None:
        logger.warning("the probe rows carry no %s: the fit matches D_L+/|D_GRPO| alone", KEY_LPLUS_ABOVE)
    run, rows, a, b = first
    h0 = initial_entropy if initial_entropy is not None else float(rows[0]["entropy"])
    tgt = crossed[0]
    h_match = tgt if tgt is not None else entropy
    held = kind == "held"
    return Probe(
        runs=[str(p) for p in paths], source=str(run.config.get("source") or "simulator"),
        model=_model_name(run.config), steps=[int(r.get("step", i + 1)) for i, r in enumerate(rows[a:b], a)],
        entropy=float(entropy), initial_entropy=float(h0), d_ratio=float(ratio), lplus_above_sstar=share,
        target_entropy=tgt, rel_entropy=float(h_match / h0), kind=kind, balance_w=balance if held else None,
        schedule=schedules[0] if held else None,
    )


def residual(toy_ratio: float | None, toy_share: float | None, probe: Probe, toy_balance: float | None = None
             ) -> float:
    """The fit's distance (module docstring, step 3): √((g(r_toy) − g(r_probe))² + (share_toy − share_probe)²
    + (ln b_toy − ln b_probe)²) with g(x) = x/(1 + |x|); the share term only when the probe has it, the balance
    term (b: :func:`held_balance`, ≥ 1) only for a held probe. ``inf`` when the toy lacks a value the probe has."""
    g = lambda x: x / (1.0 + abs(x))  # noqa: E731
    if toy_ratio is None or (probe.lplus_above_sstar is not None and toy_share is None):
        return math.inf
    if probe.balance_w is not None and toy_balance is None:
        return math.inf
    d = (g(toy_ratio) - g(probe.d_ratio)) ** 2
    if probe.lplus_above_sstar is not None:
        d += (toy_share - probe.lplus_above_sstar) ** 2
    if probe.balance_w is not None:
        d += (math.log(toy_balance) - math.log(probe.balance_w)) ** 2
    return math.sqrt(d)


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Refuse, before anything runs, an override the calibration would ignore (a fit knob, a key it sets itself)
    or that the ``llm`` preset does not take (ConfigError, one line)."""
    for key, value in overrides.items():
        if key in KNOBS + OPTIONAL_KNOBS:
            raise ConfigError(f"{key}={value} is a fit knob: give its values with --grid {key}=V1,V2,...")
        if key.startswith(("loss.stare.", "stare.")) or key in ("method", "seed", "target_entropy_rel"):
            raise ConfigError(f"{key}={value} is set by the calibration itself (the probe's schedule, the matched "
                              "target, the W grid and --c2-m): leave it out")
    config_from_overrides(_base_overrides(overrides))


def _base_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    data = copy.deepcopy(get_preset(PRESET)["overrides"])
    for key, value in (overrides or {}).items():
        node = data
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def matched_target(probe: Probe, seeds: Sequence[int], overrides: dict[str, Any] | None = None) -> tuple[float, float]:
    """``(toy target, toy initial entropy)`` in nats: ρ × the mean initial entropy over ``seeds`` of the ``llm`` toy
    with ``overrides`` (dotted keys; module docstring, step 2)."""
    data = _base_overrides(overrides)
    h0 = statistics.fmean(mean_entropy(init_state(config_from_overrides({**data, "seed": s})).logits, 1.0)
                          for s in seeds)
    return probe.rel_entropy * h0, h0


def toy_observables(run_dirs: Sequence[str | os.PathLike], target: float, window: int | None = None,
                    kind: str = "crossing") -> dict[str, Any]:
    """The toy's d_ratio, lplus_above_sstar, balance W (:func:`held_balance`) and crossing steps at ``target``
    (nats), pooled over its seeds' ``run_dirs``: ``crossing`` — the window rule of :func:`probe_window`,
    ``d_ratio`` None when a seed never crosses ``target``; ``held`` — the second half of each run, ``d_ratio`` None
    when a seed did not hold the band (:func:`stare_lab.platform.summary.band_held`)."""
    parts, crossings = [], []
    for d in run_dirs:
        run = read_run(d)
        rows = run.metrics
        if kind == "held":
            a, b = len(rows) // 2, len(rows)
            did = bool(band_held(run_summary(rows, **{**summary_settings(run.config), "target_entropy": target})))
        else:
            a, b, did = probe_window(rows, target, window or max(1, round(WINDOW_FRAC * len(rows))))
        crossings.append(a + (b - a) // 2 if did else None)
        if did:
            parts.append(_window_sums(rows, a, b))
    if not parts or len(parts) < len(crossings):
        return {"d_ratio": None, "lplus_above_sstar": None, "balance_w": None, "crossing": crossings}
    ratio, share, _, balance = _observables(parts)
    return {"d_ratio": ratio, "lplus_above_sstar": share, "balance_w": balance, "crossing": crossings}


def _fit_plan(probe: Probe, out: Path, grid: dict[str, list], seeds: Sequence[int],
              overrides: dict[str, Any] | None) -> tuple[list[dict[str, Any]], list[Any], list[Path], list[float]]:
    """(settings, configs, run directories, matched targets) of the fit over the checked ``grid``: ``len(seeds)``
    consecutive configs per setting (:func:`fit_knobs`)."""
    settings = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    method, schedule = "grpo", {}
    if probe.kind == "held":
        method = probe.schedule["method"]
        schedule = {f"loss.stare.{k}": v for k, v in probe.schedule.items() if k != "method"}
    configs, dirs, targets = [], [], []
    for knobs in settings:
        try:
            target, _ = matched_target(probe, seeds, {**(overrides or {}), **knobs})
            data = _base_overrides({**(overrides or {}), **schedule, **knobs, "loss.stare.target_entropy": target})
            data["target_entropy_rel"] = None
            for s in seeds:
                configs.append(config_from_overrides({**data, "method": method, "seed": int(s)}))
                dirs.append(out / _label(knobs) / f"seed{s}")
        except ConfigError as err:
            raise ConfigError(f"fit grid point {_label(knobs)}: {err}") from None
        targets.append(target)
    return settings, configs, dirs, targets


class FitStopped(BudgetError):
    """The fit stopped at its budget before a slice: ``table`` holds the settings done (of ``total``)."""

    def __init__(self, message: str, table: list[dict[str, Any]], total: int) -> None:
        super().__init__(message)
        self.table, self.total = table, total


def fit_knobs(
    probe: Probe, out: Path, grid: dict[str, list] | None = None, seeds: Sequence[int] = (0, 1),
    overrides: dict[str, Any] | None = None, workers: int | None = None,
    progress: Callable[[int], None] | None = None, budget: Budget | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the fit (module docstring, step 3) into ``out`` (``out/<knobs>/seed<k>``).

    Args:
        probe: :func:`read_probe`'s result. grid: knob → values (missing knobs: :data:`DEFAULT_GRID`, and for a
            held probe :data:`HELD_DEFAULT_GRID`).
        seeds: seeds per knob setting. overrides: further ``llm`` preset overrides (dotted keys, e.g. ``lr``).
        workers: processes (None: all cores). progress: called with run-steps done.
        budget: checked before each slice after the first (:func:`simulators.calibrate_time.slices`), against
            the mean time of the slices done.

    A crossing probe's settings run GRPO; a held probe's run its STARE schedule (``probe.schedule``: method and
    ``loss.stare`` keys) and are read over their held second half (:func:`toy_observables`). The settings run in
    slices of about a tenth, in grid order (a run's numbers do not depend on its batch). The runs' own
    warnings (``simulators.tabular.runner``) are not logged: a setting is judged by its residual.

    Returns:
        (the best setting, every setting in grid order); a setting is ``{"knobs", "target", "d_ratio",
        "lplus_above_sstar", "balance_w", "crossing", "residual"}`` with ``target`` its matched target (nats).

    Raises:
        ConfigError: a bad grid or override (one line, the key named), or a slice whose runs would not fit in
            memory (:func:`simulators.parallel.check_memory`). DataError: no knob setting reaches its matched target.
        FitStopped: the next slice would end past ``budget`` (its ``table``: the settings done).
    """
    grid = _check_grid(grid or {}, held=probe.kind == "held")
    settings, configs, dirs, targets = _fit_plan(probe, out, grid, seeds, overrides)
    n = len(seeds)
    parts = slices(len(settings), n, default_workers() if workers is None else max(1, int(workers)))
    check_memory(configs[:len(parts[0]) * n], workers)  # a slice the machine cannot hold is refused first
    table: list[dict[str, Any]] = []

    def read(part: range) -> None:
        for i in part:
            obs = toy_observables(dirs[i * n:(i + 1) * n], targets[i], kind=probe.kind)
            table.append({"knobs": settings[i], "target": targets[i], **obs,
                          "residual": residual(obs["d_ratio"], obs["lplus_above_sstar"], probe, obs["balance_w"])})

    # a grid point's toy is judged by its residual, not by its runs' warnings (a target above the reward-optimal
    # entropy, a push outside the first-order regime: hundreds of lines on a default grid); errors still show
    runner_log = logging.getLogger("simulators.tabular.runner")
    level = runner_log.level
    runner_log.setLevel(logging.ERROR)
    took = 0.0
    try:
        for k, part in enumerate(parts):
            if budget is not None and k and not budget.fits(took / len(table) * len(part)):
                raise FitStopped(f"{len(table)} of {len(settings)} fit settings", table, len(settings))
            t0 = time.perf_counter()
            idx = slice(part.start * n, part.stop * n)
            run_many(configs[idx], dirs[idx], workers=workers, progress=progress)
            read(part)
            took += time.perf_counter() - t0
    finally:
        runner_log.setLevel(level)
    finite = [t for t in table if math.isfinite(t["residual"])]
    if not finite:
        what = ("holds the band at its matched target with the probe's schedule" if probe.kind == "held"
                else "reaches its matched target")
        raise DataError(f"no knob setting of the fit grid {what} (ρ = {probe.rel_entropy:.3g} of its initial "
                        f"entropy) within {configs[0].steps} steps; give more steps (steps=...) or another grid")
    return min(finite, key=lambda t: t["residual"]), table


def _bracket(measured: float | None, ws: list[float]) -> dict[str, float | None]:
    """``{"w", "low", "high"}``: module docstring, step 4."""
    if measured is None:
        return {"w": None, "low": max(ws), "high": None}
    below = [w for w in ws if w < measured]
    return {"w": measured, "low": max(below) if below else 1.0, "high": measured}


def critical_sweep(
    overrides: dict[str, Any], out: Path, w_grid: Sequence[float] = DEFAULT_W_GRID, seeds: Sequence[int] = (0, 1, 2),
    c2_m: float = DEFAULT_C2_M, workers: int | None = None, progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The W sweep of the calibrated toy (module docstring, step 4) into ``out``: ``stare-lab simulate --preset
    llm`` with ``overrides`` (dotted keys), ``stare.reweight_m=c2_m``, methods grpo, o1, c2 over ``w_grid``.

    Returns:
        (``{"o1": {"w", "low", "high"}, "c2": {"w", "m", "low", "high"}, "adaptive": {"w_max"}}``, the sweep's
        ``summary.json``).

    Raises:
        ConfigError / RunError: as :func:`simulators.sweep.plan_sweep` (e.g. ``c2_m`` outside (0, 1]).
    """
    ws = sorted(float(w) for w in w_grid)
    items = [f"{k}={'null' if v is None else v}" for k, v in overrides.items()] + [f"loss.stare.reweight_m={c2_m}"]
    plan = plan_sweep(PRESET, ["grpo", "o1", "c2"], list(seeds), out, overrides=items, overwrite=True,
                      sweep=[f"stare.reweight_w={','.join(f'{w:g}' for w in ws)}"], workers=workers)
    summary = run_sweep(plan, progress=progress)
    crit = summary.get("critical") or {}
    o1 = _bracket((crit.get("o1") or {}).get("measured_w"), ws)
    c2 = {**_bracket((crit.get("c2") or {}).get("measured_w"), ws), "m": float(c2_m)}
    c2 = {k: c2[k] for k in ("w", "m", "low", "high")}
    return {"o1": o1, "c2": c2, "adaptive": {"w_max": o1["high"]}}, summary


def calibrate(
    paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, target: float | None = None,
    initial_entropy: float | None = None, window: int | None = None, grid: dict[str, list] | None = None,
    fit_seeds: Sequence[int] = (0, 1), seeds: Sequence[int] = (0, 1, 2), w_grid: Sequence[float] = DEFAULT_W_GRID,
    c2_m: float = DEFAULT_C2_M, overrides: dict[str, Any] | None = None, workers: int | None = None,
    overwrite: bool = False, progress: Progress | None = None, probe_kind: str = "auto",
    max_minutes: float | None = None,
) -> dict[str, Any]:
    """Calibrate the ``llm`` toy to the probe ``paths`` and sweep it (module docstring); writes ``out/fit/``,
    ``out/sweep/``, ``out/fit.json`` and ``out/calibration.json`` and returns the latter's dict. ``overwrite``
    replaces a previous calibration in ``out`` (those four entries; nothing else is touched). ``out``'s lock
    (:func:`stare_lab.platform.runlock.lock_dir`) is held for the whole calibration.

    With ``progress`` (:class:`simulators.calibrate_time.Progress`) or ``max_minutes``, a pilot of the fit's first
    slice first measures how long the calibration takes here (:func:`estimate`), ``progress`` says it and then
    counts the fit's settings and the sweep's runs. ``max_minutes`` refuses a calibration estimated over it, and
    stops one before a slice of the fit or the sweep that would end past it; ``fit.json`` then holds the settings
    done, named partial (``"partial": {...}``; ``null`` when complete).

    Raises:
        ConfigError / DataError / RunError: as :func:`read_probe`, :func:`fit_knobs` and :func:`critical_sweep`;
            ConfigError also for an override that is a fit knob, a key the calibration sets, or unknown, or
            ``max_minutes`` not > 0; RunError also when ``out`` already holds a calibration and ``overwrite`` is
            False, is not writable, holds another kind of output (:func:`stare_lab.platform.outdir.check_kind`), is
            inside a directory another live process writes, or is locked by another writer
            (:class:`stare_lab.platform.runlock.RunLockError`).
        BudgetError: over ``max_minutes`` (one line: the estimate, or what was done and where it is).
    """
    budget = Budget(max_minutes)
    out = Path(out)
    if max_minutes is not None and not (_num(max_minutes) is not None and max_minutes > 0):
        raise ConfigError(f"--max-minutes={max_minutes!r} must be a number > 0")
    _check_overrides(overrides or {})
    if not (_num(c2_m) is not None and 0 < c2_m <= 1):
        raise ConfigError(f"--c2-m={c2_m!r} is outside (0, 1]")
    ws = [_num(w) for w in w_grid]
    if not ws or any(w is None or w < 1 for w in ws):
        raise ConfigError(f"--w-grid={','.join(map(str, w_grid))} must be numbers >= 1")
    if len(set(ws)) != len(ws):
        raise ConfigError(f"--w-grid={','.join(map(str, w_grid))} lists a value twice")
    probe = read_probe(paths, target, initial_entropy, window, probe_kind)
    check_writable_dir(out)
    with lock_dir(out, command=f"stare-lab calibrate --out {out}", option="--out"):
        check_kind(out, CALIBRATION)  # the refusals that remove nothing, before the pilot
        check_outside_writers(out)
        if not overwrite:
            claim_calibration_out(out, False, OUTPUTS)
        est = None
        if progress is not None or max_minutes is not None:
            est, line = estimate(probe, grid, fit_seeds, len(seeds) * (1 + 2 * len(ws)), overrides, workers)
            if not budget.fits(est.total):
                raise BudgetError(f"{line}), over --max-minutes {max_minutes:g}: nothing was run; shrink the grid "
                                  "(--grid KNOB=V1,V2,...) or the seeds (--fit-seeds, --seeds), or raise --max-minutes")
            if progress is not None:
                progress.note(f"calibrate: {line}; --grid KNOB=V1,V2,... to shrink it, --max-minutes M to cap it)")
        claim_calibration_out(out, overwrite, OUTPUTS)
        return _run(probe, out, grid, fit_seeds, seeds, w_grid, c2_m, overrides, workers, progress, budget, est)


@dataclasses.dataclass
class Estimate:
    """:func:`estimate`'s measured cost: the fit's and the sweep's seconds, ``cost`` the slice model."""

    fit: float
    sweep: float
    cost: Cost
    sweep_runs: int

    @property
    def total(self) -> float:
        return self.fit + self.sweep


def estimate(probe: Probe, grid: dict[str, list] | None, fit_seeds: Sequence[int], sweep_runs: int,
             overrides: dict[str, Any] | None, workers: int | None) -> tuple[Estimate, str]:
    """Measure the calibration's time on this machine: the fit's first slice runs a few steps in a temporary
    folder (:func:`simulators.calibrate_time.measure`), scaled to the fit's slices and to a sweep of
    ``sweep_runs`` runs; returns the :class:`Estimate` and its words ``N settings × S seeds, about M min on this
    machine (fit ..., W sweep ...; measured ...`` (the parenthesis left open)."""
    grid = _check_grid(grid or {}, held=probe.kind == "held")
    settings, configs, _, targets = _fit_plan(probe, Path("fit"), grid, fit_seeds, overrides)
    n = len(fit_seeds)
    parts = slices(len(settings), n, default_workers() if workers is None else max(1, int(workers)))
    first = configs[:len(parts[0]) * n]
    check_memory(first, workers)

    def read(dirs: list[Path]) -> None:
        for i in range(len(parts[0])):
            toy_observables(dirs[i * n:(i + 1) * n], targets[i], kind=probe.kind)

    cost = measure(first, workers, read)
    fit, sweep = cost.estimate([len(p) * n for p in parts], sweep_runs)
    est = Estimate(fit, sweep, cost, sweep_runs)
    line = (f"{len(settings)} settings × {n} seeds, about {minutes(est.total)} on this machine (fit "
            f"{minutes(fit)}, W sweep of {sweep_runs} runs {minutes(sweep)}; measured over {cost.pilot} steps of "
            f"{len(first)} runs")
    return est, line


def _run(probe: Probe, out: Path, grid: dict[str, list] | None, fit_seeds: Sequence[int], seeds: Sequence[int],
         w_grid: Sequence[float], c2_m: float, overrides: dict[str, Any] | None, workers: int | None,
         progress: Progress | None = None, budget: Budget | None = None, est: Estimate | None = None,
         ) -> dict[str, Any]:
    """Fit, sweep and write ``calibration.json`` (:func:`calibrate`, which holds ``out``'s lock)."""
    budget = budget or Budget(None)
    steps = int(config_from_overrides(_base_overrides(overrides)).steps)
    n_settings = math.prod(len(v) for v in _check_grid(grid or {}, held=probe.kind == "held").values())
    t0 = time.perf_counter()

    def write_fit(table: list[dict[str, Any]], partial: dict[str, Any] | None) -> None:
        (out / "fit.json").write_text(json.dumps({"probe": dataclasses.asdict(probe), "partial": partial,
                                                 "settings": table}, indent=2, default=str) + "\n")

    def stopped(done: int, before: str) -> dict[str, Any]:
        return {"max_minutes": budget.seconds / 60, "stopped_before": before, "settings_done": done,
                "settings_total": n_settings}

    try:
        with _phase(progress, "calibrate fit", n_settings, "settings", steps * len(fit_seeds)) as update:
            best, table = fit_knobs(probe, out / "fit", grid, fit_seeds, overrides, workers, update, budget)
    except FitStopped as stop:
        write_fit(stop.table, stopped(len(stop.table), "a fit slice"))
        raise BudgetError(
            f"calibrate stopped at --max-minutes {budget.seconds / 60:g} ({minutes(budget.elapsed())}) after "
            f"{len(stop.table)} of {stop.total} fit settings (the machine ran slower than measured): the partial "
            f"fit is in {out / 'fit.json'} (\"partial\"); no calibration.json — rerun with --overwrite and a "
            "smaller --grid or a larger --max-minutes") from None
    toy_target = best["target"]
    runs = len(seeds) * (1 + 2 * len(w_grid))
    if est is not None:  # the sweep's estimate, scaled by how the fit's measured time compares with its estimate
        sweep_s = est.sweep * (time.perf_counter() - t0) / est.fit if est.fit > 0 else est.sweep
        if not budget.fits(sweep_s):
            write_fit(table, stopped(len(table), "the W sweep"))
            raise BudgetError(
                f"calibrate stopped at --max-minutes {budget.seconds / 60:g} before the W sweep (about "
                f"{minutes(sweep_s)} more after {minutes(budget.elapsed())}): the fit is complete in "
                f"{out / 'fit.json'} (\"partial\": no sweep); no calibration.json — rerun with --overwrite and a "
                "larger --max-minutes, or sweep the fitted toy with stare-lab simulate")
    write_fit(table, None)
    preset_overrides = {**(overrides or {}), **best["knobs"], "loss.stare.target_entropy": toy_target}
    with _phase(progress, "calibrate W sweep", runs, "runs", steps) as update:
        critical, _ = critical_sweep(preset_overrides, out / "sweep", w_grid, seeds, c2_m, workers, update)
    cfg = config_from_overrides(_base_overrides(preset_overrides) | {"seed": int(seeds[0])})
    h_opt = reward_optimal_entropy(cfg, init_state(cfg).correct)
    result = {
        "kind": "calibrated",
        "probe": {"run": ",".join(probe.runs), "kind": probe.kind, "source": probe.source, "model": probe.model,
                  "steps": probe.steps, "entropy": probe.entropy, "d_ratio": probe.d_ratio,
                  "lplus_above_sstar": probe.lplus_above_sstar, "balance_w": probe.balance_w,
                  "schedule": probe.schedule, "target_entropy": probe.target_entropy},
        "knobs": dict(best["knobs"]),
        "preset": {"name": PRESET, "overrides": preset_overrides},
        "fit": {"d_ratio": best["d_ratio"], "lplus_above_sstar": best["lplus_above_sstar"],
                "balance_w": best["balance_w"], "residual": best["residual"]},
        "critical": critical,
        "regime": {"d_ratio": best["d_ratio"], "target_over_optimal": toy_target / h_opt if h_opt > 0 else None,
                   "mode": cfg.mode},
    }
    tmp = out / "calibration.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out / "calibration.json")
    return result


@contextlib.contextmanager
def _phase(progress: Progress | None, desc: str, total: int, unit: str, per: int):
    """``progress.phase(...)``, or a callback that does nothing without ``progress``."""
    if progress is None:
        yield None
        return
    with progress.phase(desc, total, unit, per) as update:
        yield update
