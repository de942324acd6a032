"""What ``stare-lab promote`` reads (:mod:`trainer.planning.promote`): the source runs' STARE settings, the evidence the
promoted W comes from, and the regime check (docs/theory.md §7–8).

* :func:`collect_settings`: the common STARE settings of a method's runs under the sources, with the band refusals.
* :func:`evidence`: the critical strength the promoted W (and M, ``w_max``) comes from — *calibrated* (a
  ``calibration.json``: evidence about the target model) where a W sweep's *measured* W (its smallest W held on
  every seed) agrees with it or there is none, the measured W where the two disagree (recorded with both numbers),
  *auto* for a method with the auto schedule (the W its runs found: :func:`stare_lab.theory.critical.auto_strength`)
  — and every candidate seen (:class:`stare_lab.theory.critical.CriticalStrength`); without any, the runs' own W
  (:func:`own_w_text`: no critical strength, an upper bound when they all held). :func:`evidence_kind` names it.
* :func:`regime_check`: the source's regime against the target's (:mod:`stare_lab.theory.regime`), and the proposal to
  calibrate when a probe run of the target is given without a calibration.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LPLUS, KEY_D_RATIO, CriticalStrength, auto_strength
from stare_lab.config import STAREConfig, to_dict
from stare_lab.errors import ConfigError, RunError
from stare_lab.loss.methods import METHODS
from stare_lab.platform.files import read_json
from stare_lab.theory.regime import (
    CALIBRATION_FILE, POOR_FIT_RESIDUAL, calibrated_strengths, read_calibration, regime_mismatches, run_regime,
)
from stare_lab.platform.evidence import check_run
from stare_lab.platform.runs import find_runs, read_run
from stare_lab.platform.summary import band_held

__all__ = ["PROMOTED_KEYS", "collect_settings", "evidence", "evidence_kind", "is_auto_method", "own_w_text",
           "read_probe_run", "regime_check", "AUTO_FREE_KEYS"]

#: The STARE keys carried from a simulation into the trainer config (``loss.stare.*``); target_entropy is not.
PROMOTED_KEYS = ("variant", "top_p_ratio", "reweight_w", "reweight_m", "adaptive", "alpha", "w_max", "m_min", "scope",
                 "schedule", "auto_w_max")
#: keys a run written before the auto schedule lacks: their value then is the STAREConfig default
_OPTIONAL_KEYS = ("schedule", "auto_w_max")
#: the promoted keys the auto schedule ignores (it sets W, and M = 1/W for C2, itself): its runs may differ in them
AUTO_FREE_KEYS = ("reweight_w", "reweight_m", "w_max", "m_min", "alpha")
_DEFAULT_BAND = 0.05


def _dotted(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _matches(config: dict[str, Any], point: dict[str, Any]) -> bool:
    """The run's config has every dotted ``key = value`` of ``point`` (numbers compared to 1e-9)."""
    for key, want in point.items():
        got = _dotted(config, key)
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(got, bool):
            if not math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif got != want:
            return False
    return True


def _held(summary: dict[str, Any] | None) -> bool | None:
    """:func:`stare_lab.platform.summary.band_held` of a run's summary recomputed from its rows
    (:func:`stare_lab.platform.evidence.check_run`: its own target and band)."""
    return band_held(summary or {})


def _merged_regime(runs: list[Any]) -> dict[str, Any]:
    """The median over ``runs`` of each number of :func:`stare_lab.theory.regime.run_regime` (each run measured where its
    entropy crosses its own H_tgt), and their ``mode`` when they share one."""
    regs = [run_regime(r.metrics, _dotted(r.config, "loss.stare.target_entropy"), r.config) for r in runs]
    out: dict[str, Any] = {}
    for key in ("d_ratio", "lplus_above_sstar", "target_over_optimal", "entropy"):
        vals = sorted(v[key] for v in regs if v[key] is not None)
        out[key] = (vals[len(vals) // 2] + vals[(len(vals) - 1) // 2]) / 2 if vals else None
    modes = {v["mode"] for v in regs}
    out["mode"] = modes.pop() if len(modes) == 1 else None
    return out


def collect_settings(
    sources: list[str | Path], method: str, force: bool = False, *, point: dict[str, Any] | None = None,
    free_keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Find the runs of ``method`` under ``sources`` and return their common STARE settings and provenance.

    Args:
        point: keep only the runs whose config has these dotted values (a W sweep's measured W and its slice).
        free_keys: :data:`PROMOTED_KEYS` that come from a calibration or that the runs' auto schedule ignores
            (:data:`AUTO_FREE_KEYS`): the runs may differ in them, and their band criterion is not checked (the
            promoted W is not theirs; an auto run that did not hold gives a lower bound instead, :func:`evidence`).

    Every run of ``method`` (and every run whose ``config.yaml`` cannot be read) goes through the evidence check
    (:func:`stare_lab.platform.evidence.check_run`: its metrics parse, it is complete against its config and its
    sweep, its ``summary.json`` matches its rows); a run that is not sound is refused, or with ``force`` left out
    (recorded in ``left_out``). The summaries used (band criterion, provenance) are those recomputed from the rows.

    Returns:
        ``{"stare": {key: value for PROMOTED_KEYS}, "runs": [{"path", "seed", "summary"}], "refusals": [...],
        "left_out": [...], "held": [bool | None per run], "regime": ...}`` (``refusals`` lists what ``force``
        overrode, ``left_out`` the runs it left out as not sound, each ``run PATH: why``; ``regime``
        the runs' :func:`_merged_regime`; in ``stare`` a free key holds the first run's value).

    Raises:
        RunError: no run directory under the sources, no run of ``method`` (the message lists the methods found),
            a run that is not sound evidence (without ``force``), or no sound run left (with it).
        ConfigError: the runs of ``method`` disagree on the STARE settings (ambiguous), a run's config is incomplete,
            its method has no STARE settings, or it failed its band criterion — the last three only without
            ``force``.
    """
    for s in sources:
        if not Path(s).exists():
            raise RunError(f"{str(s)!r} does not exist")
    paths = find_runs(sources)
    if not paths:
        raise RunError(f"no run directories (with metrics.jsonl) under {', '.join(map(str, sources))}")
    runs = [read_run(p, log=False) for p in paths]  # what reading skipped is in each run's evidence check
    # a run whose config cannot be read may be one of the method's: it is checked (and refused) with them
    candidates = [r for r in runs if r.config.get("method") == method or r.config_error is not None]
    if not candidates:
        found = sorted({str(r.config.get("method")) for r in runs})
        raise RunError(f"no run of method {method!r} under {', '.join(map(str, sources))}; methods found: "
                       + ", ".join(found))
    checked = {r.path: check_run(r) for r in candidates}
    unsound = [checked[r.path] for r in candidates if not checked[r.path].sound]
    left_out: list[str] = []
    if unsound:  # never used as evidence: refused, or with --force left out and recorded
        more = f" (and {len(unsound) - 1} more run(s) of {method!r} that are not sound)" if len(unsound) > 1 else ""
        if not force:
            raise RunError(f"{unsound[0].reason()}{more}: not sound evidence (use --force to leave such runs out)")
        left_out = [e.reason() for e in unsound]
    matching = [r for r in candidates if checked[r.path].sound and r.config.get("method") == method]
    if not matching:
        raise RunError(f"no sound run of method {method!r} under {', '.join(map(str, sources))}"
                       + (f": {unsound[0].reason()}" if unsound else ""))
    if point:
        matching = [r for r in matching if _matches(r.config, point)]
        if not matching:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            raise RunError(f"no run of method {method!r} at {where} under {', '.join(map(str, sources))}")
    refusals: list[str] = []

    def refuse(msg: str) -> None:
        if not force:
            raise ConfigError(msg + " (use --force to promote anyway)")
        refusals.append(msg)

    settings: dict[tuple, list] = {}
    for r in matching:
        loss = r.config.get("loss") if isinstance(r.config.get("loss"), dict) else {}
        stare = loss.get("stare") if isinstance(loss.get("stare"), dict) else None
        if stare is None:
            raise ConfigError(f"run {r.path} has an incomplete config: no loss.stare section")
        stare = {**{k: _STARE_DEFAULTS[k] for k in _OPTIONAL_KEYS}, **stare}
        missing = [k for k in PROMOTED_KEYS if k not in stare]
        if missing:
            raise ConfigError(f"run {r.path} has an incomplete config: loss.stare lacks {', '.join(missing)}")
        if loss.get("loss_mode") != "stare":
            refuse(f"method {method!r} has no STARE settings (run {r.path} uses loss_mode={loss.get('loss_mode')!r})")
        summary = checked[r.path].summary or {}
        dev = summary.get("mean_abs_dev_second_half")
        band = r.config.get("band", _DEFAULT_BAND)
        if "reweight_w" in free_keys:
            pass  # the promoted W comes from a calibration: this run's band says nothing about it
        elif dev is None:
            refuse(f"run {r.path} has no band result (mean |H - H_tgt| over the second half): its config has no "
                   "target entropy (loss.stare.target_entropy)")
        elif _held(summary) is False:
            refuse(f"run {r.path} failed its band criterion: mean |H - H_tgt| over the second half = {dev:.4g} "
                   f"(held below min(band {band:g}, H_tgt/4), with a final entropy >= H_tgt/2)")
        key = tuple(None if k in free_keys else stare[k] for k in PROMOTED_KEYS)
        settings.setdefault(key, []).append(r)
    if len(settings) > 1:
        variants = "; ".join(
            ", ".join(f"{k}={v}" for k, v in zip(PROMOTED_KEYS, key)) + f" ({len(rs)} runs, e.g. {rs[0].path})"
            for key, rs in settings.items()
        )
        raise ConfigError(f"method {method!r} is ambiguous: its runs have {len(settings)} different STARE settings: "
                          f"{variants}; pass one run directory or a narrower sweep")
    first = {**{k: _STARE_DEFAULTS[k] for k in _OPTIONAL_KEYS}, **matching[0].config["loss"]["stare"]}
    return {
        "stare": {k: first[k] for k in PROMOTED_KEYS},
        "runs": [
            {"path": str(r.path), "seed": r.config.get("seed"), "summary": checked[r.path].summary} for r in matching
        ],
        "refusals": refusals,
        "left_out": left_out,
        "held": [_held(checked[r.path].summary) for r in matching],
        "regime": _merged_regime(matching),
    }


_W_KEY = "loss.stare.reweight_w"
_STARE_DEFAULTS = to_dict(STAREConfig())


def is_auto_method(method: str) -> bool:
    """Whether ``method`` (:data:`stare_lab.loss.methods.METHODS`) runs the auto schedule (``o1-auto``,
    ``c2-auto``); False for a name the table does not know."""
    st = (METHODS.get(method) or {}).get("loss", {}).get("stare") or {}
    return bool(st.get("adaptive")) and st.get("schedule") == "auto"


def _auto_evidence(sources: list[str | Path], method: str, force: bool) -> tuple[dict[str, Any], CriticalStrength]:
    """The settings of an auto method's runs (:func:`collect_settings`, free in :data:`AUTO_FREE_KEYS`) and the *auto*
    strength they found (:func:`stare_lab.theory.critical.auto_strength` of their recomputed summaries: the median
    balance W over the strongest stretch of the held runs; a lower bound when not every run held).

    Raises:
        RunError: as :func:`collect_settings`, or the runs log no balance W (no ``gate_on`` / ``stare_w`` rows).
    """
    found = collect_settings(sources, method, force=force, free_keys=AUTO_FREE_KEYS)
    st = found["stare"]
    variant = "C2" if str(st["variant"]).upper() == "C2" else "O1"
    group = {"label": method, "auto": True, "variant": variant, "w_cap": st.get("auto_w_max"),
             "runs": [r["summary"] or {} for r in found["runs"]]}
    rec = auto_strength([group], variant)
    if rec is None:
        raise RunError(f"the runs of {method!r} under {', '.join(map(str, sources))} log no balance W (gate_on and "
                       "stare_w over their second half): no W found to promote")
    return found, rec


def evidence_kind(strength: CriticalStrength | None, calibration: dict[str, Any] | None) -> str:
    """What the promoted W comes from, in words for the header and the provenance: ``auto run``, ``W sweep``
    (measured), ``calibration``, or ``the runs' own setting`` (no critical strength)."""
    if strength is None:
        return "the runs' own setting"
    if strength.kind == "auto":
        return "auto run"
    return "calibration" if calibration is not None else "W sweep"


def _find_calibration(sources: list[str | Path], calibration: str | Path | None) -> dict[str, Any] | None:
    """The calibration to promote from: ``calibration`` (a file or the folder holding one), else a
    ``calibration.json`` directly inside a source folder (``stare-lab calibrate``'s output), else None.

    Raises:
        ConfigError: several source folders hold one (say which with --calibration).
        RunError / DataError: :func:`stare_lab.theory.regime.read_calibration`.
    """
    if calibration is not None:
        return read_calibration(calibration)
    found = [Path(src) / CALIBRATION_FILE for src in sources if (Path(src) / CALIBRATION_FILE).is_file()]
    if len(found) > 1:
        raise ConfigError(f"{len(found)} source folders hold a {CALIBRATION_FILE} ({', '.join(map(str, found))}); "
                          "choose one with --calibration")
    return read_calibration(found[0]) if found else None


def _sweep_measured(sources: list[str | Path], method: str) -> tuple[CriticalStrength, dict[str, Any]] | None:
    """The *measured* critical W of ``method`` from a W sweep among ``sources`` (a folder whose ``summary.json`` has
    ``critical.<method>``, written by ``stare-lab simulate --sweep stare.reweight_w=…``): the record and the
    dotted config values of its runs (W and the slice). None when no source is such a sweep.

    Raises:
        ConfigError: the sweep found no grid W that held the band on every seed.
        RunError: a source's ``summary.json`` cannot be read (one line naming the file and why).
    """
    for src in sources:
        path = Path(src) / "summary.json"
        if not path.is_file():
            continue
        data = read_json(path, "sweep summary", RunError)  # an unreadable one is named, not taken for "no sweep"
        c = ((data.get("critical") or {}) if isinstance(data, dict) else {}).get(method)
        if not isinstance(c, dict) or not any(d.get("kind") == "measured" for d in c.get("strengths") or []):
            continue
        rec = CriticalStrength.from_dict(next(d for d in c["strengths"] if d.get("kind") == "measured"))
        rec = CriticalStrength(rec.kind, rec.w, rec.m, rec.low, rec.high, f"{rec.source} ({path})")
        if rec.w is None:
            raise ConfigError(f"the W sweep of {method!r} in {str(src)!r} found no grid W that held the band on every "
                              f"seed (the largest tried: {rec.low:g}): no measured critical W to promote; extend the "
                              "grid, or promote a calibrated W (--calibration)")
        return rec, {_W_KEY: rec.w, **(c.get("slice") or {})}
    return None


def own_w_text(found: dict[str, Any], method: str, sources: list[str | Path]) -> str:
    """Where the promoted W comes from without a W sweep or calibration: the source runs' own W, which is no critical
    strength of any kind (not *measured*: that needs a W sweep); all runs held → an upper bound of the critical W."""
    held, st = found["held"], found["stare"]
    w = f"{st['reweight_w']:g}" + (f" at M={st['reweight_m']:g}" if str(st["variant"]).upper() == "C2" else "")
    head = (f"{w}, the source runs' own setting, not a critical W (no W sweep and no calibration under "
            f"{', '.join(map(str, sources))}")
    if held and all(h is True for h in held):
        return (f"{head}; {method} held the band on {len(held)}/{len(held)} runs at it: an upper bound of the "
                "critical W)")
    return f"{head}; not every run held the band: promoted with --force)"


def _calibrated_choice(cal: dict[str, Any], stare: dict[str, Any]) -> CriticalStrength:
    """The calibrated strength for the promoted variant (O1: ``critical.o1``; C2: ``critical.c2`` at its M).

    Raises:
        ConfigError: the calibration has none for this variant, or its W is infinite (no W holds the band).
    """
    c2 = str(stare["variant"]).upper() == "C2"
    pick = [x for x in calibrated_strengths(cal) if (x.m is not None) == c2]
    if not pick:
        raise ConfigError(f"calibration {cal.get('path')!r} has no critical.{'c2' if c2 else 'o1'}.w for the promoted "
                          f"variant {stare['variant']}")
    if not math.isfinite(pick[0].w):
        raise ConfigError(f"calibration {cal.get('path')!r} says no W holds the band for {stare['variant']} (critical "
                          "W infinite): nothing to promote; see docs/theory.md §8")
    return pick[0]


def read_probe_run(probe: str | Path) -> Any:
    """The ``--probe`` run directory, read and checked as evidence (:func:`stare_lab.platform.evidence.check_run`).

    Raises:
        RunError: not a run directory, or not sound evidence (the one line names the run and why).
    """
    run = read_run(probe, log=False)
    ev = check_run(run)
    if not ev.sound:
        raise RunError(f"--probe: {ev.reason()}: not sound evidence")
    return run


def _probe_regime(probe: str | Path | None) -> dict[str, Any] | None:
    """The target model's regime from a ``--probe`` run directory that logs the D terms or ``pred/d_ratio``
    (:func:`stare_lab.theory.regime.run_regime` over all its rows), else None."""
    if probe is None or not Path(probe).is_dir():
        return None
    run = read_probe_run(probe)
    if not any(k in row for row in run.metrics for k in (KEY_D_GRPO, KEY_D_LPLUS, KEY_D_RATIO)):
        return None
    reg = run_regime(run.metrics, None, {**run.config, "mode": "sampled"})
    return reg if reg["d_ratio"] is not None else None


def _calibrate_available() -> bool:
    """Whether a ``stare-lab calibrate`` command is installed (entry point ``calibrate``)."""
    from importlib import metadata

    try:
        return any(ep.name == "calibrate" for ep in metadata.entry_points(group="stare_lab.commands"))
    except Exception:  # noqa: BLE001 - broken metadata: say it is not available
        return False


def _agrees(calibrated: CriticalStrength, measured: CriticalStrength) -> bool:
    """Whether a calibrated W lies in a measured critical W's range (low, w] (≤ w when the smallest grid W held):
    the sweep cannot tell the two apart."""
    if measured.w is None:
        return False
    return calibrated.w <= measured.w + 1e-9 and (measured.low is None or calibrated.w > measured.low + 1e-9)


def _conflict(cal: dict[str, Any], calibrated: CriticalStrength, measured: CriticalStrength) -> dict[str, Any]:
    """The record of a measured and a calibrated critical W that disagree (:func:`evidence`): both values, the
    calibration's fit residual, and the sentence the header and stderr print."""
    fit = cal.get("fit") if isinstance(cal.get("fit"), dict) else {}
    res = fit.get("residual")
    res = float(res) if isinstance(res, (int, float)) and not isinstance(res, bool) and math.isfinite(res) else None
    poor = res is not None and res > POOR_FIT_RESIDUAL
    fit_text = (f"; its fit is poor: residual {res:.3g} > {POOR_FIT_RESIDUAL:g}, the toy reproduces the probe poorly"
                if poor else f"; fit residual {res:.3g}" if res is not None else "")
    text = (f"measured and calibrated evidence disagree: the W sweep measured a critical W of {measured.w:g} "
            f"(range {measured.range_text()}; {measured.source}), the calibration ({cal.get('path')}) gives "
            f"{calibrated.w:g} (range {calibrated.range_text()}{fit_text}); the measured W {measured.w:g} is promoted")
    return {"measured": measured.to_dict(), "calibrated": calibrated.to_dict(), "calibration": cal.get("path"),
            "residual": res, "poor_fit": poor, "text": text}


def evidence(sources: list[str | Path], method: str, force: bool, calibration: str | Path | None
             ) -> tuple[dict[str, Any], CriticalStrength | None, list[CriticalStrength], dict[str, Any] | None,
                        dict[str, Any] | None]:
    """``(found, strength, evidence, calibration, conflict)``: the source runs' settings (:func:`collect_settings`),
    the critical strength the promoted W comes from, every candidate seen, the calibration dict the promoted W comes
    from (None when it does not) and, when a W sweep's measured critical W and a calibration disagree, their
    record (:func:`_conflict`; else None).

    Precedence: a calibration's W when no W sweep measured one, or when the measured W's range holds it (the sweep
    cannot tell them apart); a measured W when there is no calibration, or when the two disagree — a measurement
    wins over a model of it, and the conflict is recorded with both numbers and the calibration's fit residual;
    neither: the runs' own W (:func:`own_w_text`). A source folder that ``stare-lab calibrate`` wrote counts with
    its ``sweep/`` runs only. A method with the auto schedule (:func:`is_auto_method`): the *auto* strength its runs
    found (:func:`_auto_evidence`), the one candidate; a run of it that did not hold the band is no refusal, it
    makes the W a lower bound.

    Raises:
        ConfigError: a calibration together with an auto method (the two are different evidence: give one).
    """
    if is_auto_method(method):
        if calibration is not None:
            raise ConfigError(f"--calibration promotes a calibrated fixed W; the evidence of --method {method} is the "
                              "W its own auto runs found: give one of them")
        found, rec = _auto_evidence(sources, method, force)
        return found, rec, [rec], None, None
    cal = _find_calibration(sources, calibration)
    # a calibration folder's fit runs (toys that lost the fit) are not evidence: its sweep/ is
    sources = [Path(s) / "sweep" if (Path(s) / CALIBRATION_FILE).is_file() and (Path(s) / "sweep").is_dir() else s
               for s in sources]
    measured = _sweep_measured(sources, method)
    if cal is not None:
        found = collect_settings(sources, method, force=force, free_keys=("reweight_w", "reweight_m", "w_max"))
        chosen = _calibrated_choice(cal, found["stare"])
        candidates = calibrated_strengths(cal) + ([measured[0]] if measured else [])
        if measured is None or _agrees(chosen, measured[0]):
            return found, chosen, candidates, cal, None
        conflict = _conflict(cal, chosen, measured[0])
        found = collect_settings(sources, method, force=force, point=measured[1])
        return found, measured[0], candidates, None, conflict
    if measured is not None:
        found = collect_settings(sources, method, force=force, point=measured[1])
        return found, measured[0], [measured[0]], None, None
    found = collect_settings(sources, method, force=force)
    return found, None, [], None, None  # the runs' own W: no critical strength (own_w_text)


def regime_check(found: dict[str, Any], cal: dict[str, Any] | None, probe: str | Path | None,
                  notices: list[str]) -> dict[str, Any]:
    """``{"source", "target", "warnings"}``: the regime the promoted W was found in (the calibration's ``regime``,
    else the source runs'), the target's (a ``--probe`` run's, else the calibration's ``probe``, else "sampled":
    the trainer samples G responses), and :func:`stare_lab.theory.regime.regime_mismatches` between them. Adds the
    calibration proposal to ``notices`` when a probe run is given without a calibration."""
    if cal is not None:
        source = {**(cal.get("regime") or {}), "name": f"the calibrated toy ({cal.get('path')})"}
    else:
        source = {**found["regime"], "name": "the source runs (at their H_tgt crossing)"}
    probe_reg = _probe_regime(probe)
    if probe_reg is not None:
        target = {**probe_reg, "name": f"the target model's probe ({probe})"}
        if cal is None:
            how = (f"`stare-lab calibrate {probe}`, then promote from its output folder (it holds "
                   f"{CALIBRATION_FILE}) or pass --calibration" if _calibrate_available() else
                   "stare-lab calibrate (not installed here: install the project's simulators)")
            notices.append(f"the probe measured D_L+/|D_GRPO| = {probe_reg['d_ratio']:.3g} on the target model; for a "
                           f"W calibrated to it run {how}")
    elif cal is not None and isinstance(cal.get("probe"), dict):
        p = cal["probe"]
        target = {"d_ratio": p.get("d_ratio"), "lplus_above_sstar": p.get("lplus_above_sstar"),
                  "entropy": p.get("entropy"), "target_over_optimal": None, "mode": "sampled",
                  "name": f"the target model's probe ({p.get('run', '?')})"}
    else:
        target = {"mode": "sampled", "name": "the trainer"}
    warnings = regime_mismatches(source, target, (source["name"], target["name"]))
    return {"source": source, "target": target, "warnings": warnings}
