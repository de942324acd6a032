"""``stare-lab promote``: carry STARE settings validated in simulation into a full-scale trainer config.

Reads the chosen method's STARE settings (variant, P, W, M, adaptive schedule, scope) from simulator run
directories (``config.yaml`` → ``loss.stare``), merges them into a trainer base config (e.g.
``papers/stare_2606.19236/<setting>.yaml``) and writes either

* ``--format stare-lab``: a trainer YAML (loadable with :func:`trainer.config.load_trainer_config`) headed by a
  commented provenance block, plus ``OUT.provenance.json`` with the same facts machine-readable; or
* ``--format verl``: Hydra ``key=value`` overrides for mainline verl 0.9 with stare_lab's plugin
  (docs/integrations-verl.md: ``trainer.v1.trainer_mode=stare``, the policy loss ``stare`` with
  ``STAREPolicyLossConfig`` and its ``+actor_rollout_ref.actor.policy_loss.*`` keys), one per line, with the
  provenance as ``#`` comment lines (not YAML: name it e.g. ``c2_7b.overrides``), plus ``OUT.provenance.json``. Only
  the STARE and loss keys have lines (:data:`VERL_CARRIED_KEYS`); any other command-line override (``optim.lr=…``)
  is named in a warning.

What is deliberately NOT copied from a toy run: the target entropy (entropy scales differ between a simulator and an
LLM). It comes from the base config (default), ``--target-entropy X``, or ``--target-entropy-frac F`` × the initial
entropy measured by a probe (``--probe``: a trainer run directory — its first metrics row — or a JSON file with
``initial_entropy`` or ``entropy``). The output says which.

Model-size guidance (STARE paper, docs/theory.md §4): 14B/32B models use a milder push (W 1.05, M 0.95 instead of
1.1 / 0.9). When the base config's model path names a size ≥ 14B and the user did not override ``reweight_w`` /
``reweight_m``, the promoted push |W − 1| and |1 − M| is halved (1.1 → 1.05, 0.9 → 0.95) and a notice is printed.

Warnings (stderr, the provenance's ``warnings`` and ``WARNING:`` header lines; nothing is refused): the written
push — promoted or set on the command line — is far stronger than the base config's (W − 1 more than 3 × the base's
W − 1, or 1 − M more than 3 × the base's 1 − M: a toy run's W 5 / M 0.2 against the paper's 1.1 / 0.9 at 7B); a
command-line W or ``w_max`` below (M above) the evidence's critical value, the least push that held the band; and the
source runs all share one seed. A command-line W, M or ``w_max`` wins over the evidence: the header, the notices and
the provenance's ``overridden`` name both values.

Every source run (and a ``--probe`` run directory) goes through the evidence check
(:func:`stare_lab.platform.evidence.check_run`): its ``metrics.jsonl`` parses, it is complete against its config
and its sweep, its ``summary.json`` matches its rows. A run that fails it is refused (one line naming the run and
why), or with ``--force`` left out and recorded (the provenance's ``left_out``); a probe that fails it is refused.
The band criterion and the header's facts are computed from the rows.

Refusals (override with ``--force``, recorded in the provenance): a run whose config is incomplete (no
``loss.stare`` or missing keys), a method without STARE settings (``loss.loss_mode`` is not ``stare``), or a run
whose summary shows it failed its own band criterion (:func:`stare_lab.platform.summary.band_held`: mean |H − H_tgt| over the
second half below min(band, H_tgt/4), final entropy ≥ H_tgt/2). An existing ``--out`` file is never replaced without
``--overwrite``; an empty base config, and an ``--out`` that ends in a slash or is a directory, are refused.

**W and M from evidence** (docs/theory.md §7). The promoted W (and M for C2, ``w_max`` for the adaptive schedule) is
a critical strength of a named kind (:class:`stare_lab.theory.critical.CriticalStrength`), recorded in the provenance
(``strength``, and every candidate under ``evidence``):

* *calibrated* — ``--calibration PATH`` (``calibration.json`` or the folder ``stare-lab calibrate`` wrote), or a
  source folder that holds a ``calibration.json``: the critical W of a toy calibrated to a probe of the target model
  (:mod:`stare_lab.theory.regime`): evidence about the model you will train; the source runs then give only the other
  STARE settings (variant, P, scope, …), and neither the size guidance nor the push warning applies to the
  calibrated values.
* *measured* — a W sweep (a source folder whose ``summary.json`` has ``critical.<method>``): its measured critical
  W, the smallest grid W held on every seed (the top-level slice); the runs at that W give the settings.

With both, the calibrated W is promoted when it lies in the measured W's range (low, W] (the sweep cannot tell
them apart); when it does not, the two disagree and the measurement wins: the measured W is promoted, and the
header's ``WARNING`` line (and stderr) gives both numbers with the calibration's fit residual, named poor above
:data:`stare_lab.theory.regime.POOR_FIT_RESIDUAL` (the provenance's ``evidence_conflict``).

Without either, W is the source runs' own setting — no critical strength of any kind (``strength`` null; the
header's ``W:`` line and ``w_from`` say so), an upper bound of the critical W when they all held the band.

*auto* — ``--method o1-auto`` / ``c2-auto``: the W its runs found (:func:`stare_lab.theory.critical.auto_strength`:
the median over the held runs of the balance W over the strongest stretch of the second half). ``--schedule auto``
(the default) writes the auto schedule, which finds the target model's own W while training (a toy's W does not
carry over to a model: docs/theory.md §8), and records the W found; ``--schedule fixed`` writes that W as a fixed
W (method ``o1`` / ``c2``, M = 1/W for C2). A run of it that did not hold the band is not refused: the W is then
"at least" (a lower bound) and a warning says why. The header's ``evidence:`` line and the provenance's
``evidence_kind`` (``auto run``, ``W sweep``, ``calibration``, ``the runs' own setting``) and ``schedule`` name
the source.

**Regime check.** The source's regime (D_L+/|D_GRPO| where its entropy crosses H_tgt, H_tgt over the reward-optimal
entropy, sampled vs mean field; :func:`stare_lab.theory.regime.run_regime`, or the calibration's ``regime``) is compared with
the target's — a probe run of the target model (``--probe`` with ``pred/d_grpo``, ``pred/d_lplus`` or
``pred/d_ratio`` rows), else the calibration's ``probe``, else just "sampled" (the trainer samples G responses) —
and every difference is a warning with both numbers (:func:`stare_lab.theory.regime.regime_mismatches`). Given such a probe
run and no calibration, promote proposes the command that calibrates the toy to it (``stare-lab calibrate``; a
calibration sweeps a toy for minutes, which promote does not start by itself).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from stare_lab import __version__
from stare_lab.config import (STAREConfig, apply_overrides, expand_shorthand, load_yaml, parse_overrides, split_paths,
                              to_dict)
from stare_lab.theory.critical import CriticalStrength
from stare_lab.platform.files import read_json
from stare_lab.errors import ConfigError, DataError, RunError
from stare_lab.theory.regime import calibrated_w_max

from trainer.planning.promote_sources import (
    PROMOTED_KEYS, collect_settings, evidence, evidence_kind, is_auto_method, own_w_text, read_probe_run, regime_check,
)

logger = logging.getLogger(__name__)

__all__ = ["PROMOTED_KEYS", "collect_settings", "promote", "add_arguments", "main"]

#: the STARE keys of verl's plugin config (``+actor_rollout_ref.actor.policy_loss.<key>``): every field of the core's
#: STAREConfig, as the plugin derives them (``stare_lab.integrations.verl.STARE_KEYS``, which imports verl)
_VERL_STARE_KEYS = tuple(f.name for f in dataclasses.fields(STAREConfig))
#: the plugin's policy-loss config class (``actor_rollout_ref.actor.policy_loss._target_``)
VERL_POLICY_LOSS_TARGET = "stare_lab.integrations.verl.STAREPolicyLossConfig"
#: the trainer keys ``--format verl`` writes a line for (:func:`_verl_lines`); other overrides are warned about
VERL_CARRIED_KEYS = frozenset([f"loss.stare.{k}" for k in _VERL_STARE_KEYS] + [
    "loss.loss_mode", "loss.clip_ratio_low", "loss.clip_ratio_high", "loss.clip_ratio_c", "loss.loss_agg_mode",
    "loss.entropy_coeff"])


def _model_size_b(path: str) -> float | None:
    """Parameter count in billions named in a model path (``Qwen2.5-32B-Base`` → 32.0), else None."""
    sizes = [float(m) for m in re.findall(r"(?<![\d.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])", path or "")]
    return max(sizes) if sizes else None


def _probe_entropy(probe: str | Path) -> float:
    """The initial entropy (nats) a ``--probe`` reports.

    Raises:
        RunError: the probe is missing, not JSON, or has no entropy.
        DataError: the probe's entropy is not a finite positive number (an entropy is >= 0; 0 would give a zero
            target).
    """
    h0 = _probe_value(probe)
    if not math.isfinite(h0) or h0 <= 0:
        raise DataError(f"--probe {str(probe)!r} reports an initial entropy of {h0:g} nats; an entropy is positive "
                        "(> 0), so this probe is not a usable measurement (wrong file or column?)")
    return h0


def _probe_value(probe: str | Path) -> float:
    p = Path(probe)
    if p.is_dir():
        run = read_probe_run(p)
        values = [row.get("entropy") for row in run.metrics if isinstance(row.get("entropy"), (int, float))]
        if not values:
            raise RunError(f"probe run {str(p)!r} has no entropy in its metrics")
        return float(values[0])
    if p.is_file():
        data = read_json(p, "probe file", RunError)  # UTF-8 JSON, or one line naming file and line
        for key in ("initial_entropy", "entropy"):
            if isinstance(data, dict) and isinstance(data.get(key), (int, float)):
                return float(data[key])
        raise RunError(f"probe file {str(p)!r} has no numeric 'initial_entropy' or 'entropy'")
    raise RunError(f"probe {str(p)!r} does not exist")


def promote(
    sources: list[str | Path],
    method: str,
    base: str | Path,
    *,
    fmt: str = "stare-lab",
    overrides: list[str] = (),
    target_entropy: float | None = None,
    target_entropy_frac: float | None = None,
    probe: str | Path | None = None,
    force: bool = False,
    calibration: str | Path | None = None,
    schedule: str | None = None,
) -> tuple[str, dict[str, Any], list[str]]:
    """Build the promoted config (W/M from evidence, the regime check and the proposal: module docstring).

    ``schedule`` (auto-run evidence only, ``--method o1-auto`` / ``c2-auto``): ``"auto"`` (the default) writes the
    auto schedule, ``"fixed"`` the fixed W it found (method ``o1`` / ``c2``, M = 1/W for C2).

    Returns:
        ``(text, provenance, notices)``: the file content (YAML or verl override lines), the provenance dict and
        human-readable notices (where the target entropy came from, size guidance, forced refusals). Warnings
        (a push far stronger than the base's, a single source seed) are in ``provenance["warnings"]`` and the
        text's header.

    Raises:
        ConfigError / RunError: bad format, missing/ambiguous runs, refusals (see :func:`collect_settings`),
            conflicting target-entropy options, a merged config the trainer's loader rejects, a W sweep where no
            grid W held, a calibration without a finite W for the promoted variant, ``schedule`` not one of
            :data:`SCHEDULES` or given for a method without the auto schedule, a calibration with an auto method.
        DataError: the ``--probe`` reports a non-positive or non-finite initial entropy; a malformed calibration.
    """
    from trainer.config import load_trainer_config  # the trainer's own loader validates the result

    if fmt not in ("stare-lab", "verl"):
        raise ConfigError(f"--format={fmt!r} is not one of {{'stare-lab', 'verl'}}")
    if target_entropy is not None and target_entropy_frac is not None:
        raise ConfigError("give at most one of --target-entropy and --target-entropy-frac")
    if target_entropy_frac is not None and probe is None:
        raise ConfigError("--target-entropy-frac needs --probe (a run directory or JSON with the initial entropy)")
    data = load_yaml(base)  # the base file is checked first (encoding, YAML): one line naming file and line
    if not data:
        raise ConfigError(f"--base {str(base)!r}: the base config file is empty (no keys); give a trainer config "
                          "YAML, e.g. papers/stare_2606.19236/configs/<setting>.yaml")
    if schedule is not None and schedule not in SCHEDULES:
        raise ConfigError(f"--schedule={schedule!r} is not one of {{{', '.join(SCHEDULES)}}}")
    if schedule is not None and not is_auto_method(method):
        raise ConfigError(f"--schedule {schedule} chooses what an auto run's evidence becomes (--method o1-auto or "
                          f"c2-auto); the runs of {method!r} have no auto schedule: leave --schedule out")
    found, strength, candidates, cal, conflict = evidence(sources, method, force, calibration)
    base_stare = load_trainer_config(data).loss.stare  # the base itself must be valid
    base_w, base_m = float(base_stare.reweight_w), float(base_stare.reweight_m)
    notices = [f"refused without --force, promoted anyway: {msg}" for msg in found["refusals"]]
    notices += [f"left out with --force, not sound evidence: {msg}" for msg in found["left_out"]]

    loss = data.setdefault("loss", {})
    loss["loss_mode"] = "stare"
    stare = loss.setdefault("stare", {})
    stare.update(found["stare"])
    data["method"] = method
    auto = strength is not None and strength.kind == "auto"
    written = (schedule or "auto") if auto else None
    auto_warnings = _auto_warnings(strength, written) if auto else []
    if written == "fixed":  # the fixed W (and M = 1/W for C2) the auto run found, under the fixed-W method
        data["method"] = _FIXED_METHOD["C2" if strength.m is not None else "O1"]
        stare.update(adaptive=False, schedule="paper", reweight_w=round(strength.w, 4))
        if strength.m is not None:
            stare["reweight_m"] = round(strength.m, 4)
    if written is not None:
        notices.append(_auto_notice(strength, written, method, data["method"]))
    calibrated: set[str] = set()
    if cal is not None and strength is not None:
        stare["reweight_w"] = strength.w
        calibrated.add("reweight_w")
        if strength.m is not None:
            stare["reweight_m"] = strength.m
            calibrated.add("reweight_m")
        if stare.get("adaptive") and calibrated_w_max(cal) is not None:
            stare["w_max"] = calibrated_w_max(cal)
            calibrated.add("w_max")
    probed = _probe_of_model(cal, data) if cal is not None and strength is not None else None
    if probed is not None:
        notices.append(f"W{'/M' if strength.m is not None else ''}{' and w_max' if 'w_max' in calibrated else ''} "
                       f"calibrated to {probed[0]}: {strength.describe()}")
    model_calibrated = calibrated if probed is not None and probed[1] else set()  # evidence about a trained model

    user_keys = {k for k, _ in parse_overrides(overrides)}
    size = _model_size_b(str((data.get("model") or {}).get("path", "")))
    if size is not None and size >= 14 and model_calibrated:
        notices.append(f"model size guidance ({size:g}B) not applied: W/M are calibrated to the target model")
    elif size is not None and size >= 14 and written == "auto":
        notices.append(f"model size guidance ({size:g}B) not applied: the auto schedule finds its W while training")
    elif size is not None and size >= 14:
        touched = {"loss.stare.reweight_w", "loss.stare.reweight_m"} & user_keys
        if not touched:
            w0, m0 = float(stare["reweight_w"]), float(stare["reweight_m"])
            stare["reweight_w"] = round(1.0 + (w0 - 1.0) / 2, 6)
            stare["reweight_m"] = round(1.0 - (1.0 - m0) / 2, 6)
            notices.append(
                f"model size guidance: the base model is {size:g}B (>= 14B); the paper uses a milder push there, so "
                f"W {w0:g} -> {stare['reweight_w']:g} and M {m0:g} -> {stare['reweight_m']:g} (halved |W-1|, |1-M|); "
                "override with loss.stare.reweight_w=… / loss.stare.reweight_m=…"
            )

    if target_entropy is not None:
        stare["target_entropy"] = float(target_entropy)
        tgt_source = f"--target-entropy {target_entropy:g}"
    elif target_entropy_frac is not None:
        h0 = _probe_entropy(probe)
        stare["target_entropy"] = round(float(target_entropy_frac) * h0, 6)
        tgt_source = f"--target-entropy-frac {target_entropy_frac:g} x probe initial entropy {h0:.4g} ({probe})"
    else:
        tgt_source = f"base config {base}"
        if "target_entropy" not in stare:
            tgt_source += " (not set there: the STAREConfig default)"
    evidence_values = {k: stare.get(k, getattr(base_stare, k)) for k in _EVIDENCE_KEYS}
    apply_overrides(data, overrides)
    cfg = load_trainer_config(data)
    tgt = cfg.loss.stare.target_entropy
    if "loss.stare.target_entropy" in user_keys:
        tgt_source = "the command line override loss.stare.target_entropy"
    notices.insert(0, f"target entropy {tgt:g} nats from {tgt_source} (never copied from a simulation)")
    w_from = strength.describe() if strength is not None else own_w_text(found, method, sources)
    overridden = _overridden(cfg.loss.stare, evidence_values, user_keys, strength, calibrated)
    notices[:0] = [v["note"] for v in overridden.values()]
    pushed = [] if written == "auto" else _push_warnings(cfg.loss.stare, base_w, base_m,
                                                         model_calibrated - _keys(user_keys), _keys(user_keys))
    warnings = (auto_warnings + pushed
                + _weaker_warnings(overridden, strength, calibrated) + _seed_warnings(found["runs"])
                + (probed[2] if probed is not None else []) + ([conflict["text"]] if conflict else []))
    regime = regime_check(found, cal, probe, notices)
    warnings += [f"regime: {w}" for w in regime["warnings"]]
    if fmt == "verl" and _verl_dropped(user_keys):
        warnings.append(
            f"--format verl emits only the STARE and loss keys; not carried: {', '.join(_verl_dropped(user_keys))} "
            "(set them in the verl launch script, or write the trainer YAML with --format stare-lab)")

    provenance = {
        "promoted_by": f"stare-lab promote (stare_lab {__version__})",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "method": method,
        "base": str(base),
        "source_runs": found["runs"],
        "promoted": {k: getattr(cfg.loss.stare, k) for k in PROMOTED_KEYS},
        "strength": None if strength is None else strength.to_dict(),
        "evidence_kind": evidence_kind(strength, cal),
        "schedule": written,
        "w_from": w_from,
        "overridden": {k: {"value": v["value"], "evidence": v["evidence"]} for k, v in overridden.items()},
        "evidence": [x.to_dict() for x in candidates],
        "calibration": None if cal is None else cal.get("path"),
        "evidence_conflict": None if conflict is None else {k: v for k, v in conflict.items() if k != "text"},
        "regime": regime,
        "target_entropy": {"value": tgt, "from": tgt_source},
        "overrides": list(overrides),
        "forced": bool(found["refusals"] or found["left_out"]),
        "forced_refusals": found["refusals"],
        "left_out": found["left_out"],
        "warnings": warnings,
        "format": fmt,
    }
    header = _comment_block(provenance, notices)
    if fmt == "stare-lab":
        import yaml

        text = header + yaml.safe_dump(to_dict(cfg), sort_keys=False)
    else:
        text = header + "\n".join(_verl_lines(cfg)) + "\n"
    return text, provenance, notices


#: what ``--schedule`` may write from an auto run's evidence: the auto schedule itself, or the fixed W it found
SCHEDULES = ("auto", "fixed")
#: the fixed-W method of each variant (``--schedule fixed``)
_FIXED_METHOD = {"O1": "o1", "C2": "c2"}


def _auto_notice(strength: CriticalStrength, written: str, method: str, fixed: str) -> str:
    """What ``promote`` wrote from an auto run (``written``: ``auto`` or ``fixed``), with the W it found."""
    found = strength.value_text()
    if written == "auto":
        return (f"from an auto run: the auto schedule is written (method {method}): it finds the target model's own W "
                f"while training; the W it found here, {found}, is recorded, not applied (--schedule fixed writes it)")
    return (f"from an auto run: the fixed W it found, {found}, is written (method {fixed}, adaptive false; "
            "--schedule auto writes the schedule instead)")


def _auto_warnings(strength: CriticalStrength, written: str) -> list[str]:
    """A warning when the auto run's W is only a lower bound (not every run held the band; its W at the cap)."""
    if not strength.lower_bound:
        return []
    what = ("the written fixed W may be too weak: run a W sweep from it up, or more steps / a higher auto_w_max in "
            "the simulation" if written == "fixed" else "raise loss.stare.auto_w_max if its W sat at the cap")
    return [f"the auto run's W is only a lower bound, at least {strength.w:.3g}: {strength.lower_bound}; {what}"]


def _verl_dropped(user_keys: set[str]) -> list[str]:
    """The command-line override keys that ``--format verl`` has no line for (only the STARE and loss keys of
    :func:`_verl_lines` are emitted; the rest of a verl run is set in its own launch script)."""
    return sorted(k for k in user_keys if k not in VERL_CARRIED_KEYS)


#: a promoted push |W − 1| or |1 − M| more than this many times the base config's is warned about
PUSH_WARN_FACTOR = 3.0


def _probe_of_model(cal: dict[str, Any], data: dict[str, Any]) -> tuple[str, bool, list[str]]:
    """What a calibration was calibrated to: ``(text for the notice, True when its probe is a trainer run of a
    model, warnings)`` — a warning when that model is not the base config's (``model.path``, compared by its last
    path part)."""
    probe = cal.get("probe") or {}
    model = str(probe.get("model") or "")
    if probe.get("source") != "trainer":
        return (f"a {probe.get('source') or 'non-trainer'} probe ({model or 'model unknown'}), not a model the "
                "trainer ran: evidence about that toy, not the target model", False, [])
    base_model = str((data.get("model") or {}).get("path") or "")
    name = lambda p: Path(p.rstrip("/")).name.lower()  # noqa: E731
    warnings = []
    if model and base_model and name(model) != name(base_model):
        warnings.append(f"the calibration's probe is of {model!r}, the base config trains {base_model!r}: its W is "
                        "evidence about the probed model; probe the target model and calibrate again")
    return f"the target model's probe ({model or 'model unknown'})", True, warnings


def _push_warnings(stare: Any, base_w: float, base_m: float, calibrated: set[str], user: set[str]) -> list[str]:
    """Warnings when the written push is far stronger than the base config's: W − 1 > 3 × (base W − 1) or
    1 − M > 3 × (1 − base M) (:data:`PUSH_WARN_FACTOR`), for a promoted value and a command-line one (``user``,
    bare keys) alike; a calibrated value (evidence about the target model) is not warned about, nor M for O1 (it
    does not use M)."""
    out = []
    for key, name, push, base_value, base_push in (
        ("reweight_w", "W", float(stare.reweight_w) - 1.0, base_w, base_w - 1.0),
        ("reweight_m", "M", 1.0 - float(stare.reweight_m), base_m, 1.0 - base_m),
    ):
        if key in calibrated or (key == "reweight_m" and str(stare.variant).upper() != "C2"):
            continue  # O1 does not use M
        label = "W-1" if name == "W" else "1-M"
        limit = PUSH_WARN_FACTOR * base_push
        if push > limit + 1e-9 * max(1.0, abs(limit)):  # tolerance: 1.3 vs 1.1 is exactly 3x, not more
            factor = f"{push / base_push:.3g}x" if base_push > 0 else "infinitely"
            origin, why = (("command-line", "it may be far too strong at full scale")
                           if key in user else ("promoted", "a push tuned on a toy simulation may be far too strong "
                                                "at full scale"))
            out.append(
                f"{origin} {name}={getattr(stare, key):g} ({label}={push:.3g}) is {factor} the base config's "
                f"{label}={base_push:.3g} ({name}={base_value:g}; warned above {PUSH_WARN_FACTOR:g}x): {why} "
                f"(paper: W 1.1 / M 0.9 at 7B, 1.05 / 0.95 at 14B/32B); check it, or set loss.stare.{key}=…"
            )
    return out


#: the STARE keys whose promoted value comes from the evidence (W, M, the adaptive cap)
_EVIDENCE_KEYS = ("reweight_w", "reweight_m", "w_max")
_NAMES = {"reweight_w": "W", "reweight_m": "M", "w_max": "w_max"}


def _keys(user_keys: set[str]) -> set[str]:
    """The bare STARE keys (``reweight_w``) among dotted ``loss.stare.*`` override keys."""
    return {k.rsplit(".", 1)[1] for k in user_keys if k.startswith("loss.stare.")}


def _overridden(stare: Any, evidence_values: dict[str, Any], user_keys: set[str], strength: CriticalStrength | None,
                calibrated: set[str]) -> dict[str, dict[str, Any]]:
    """``{key: {"value", "evidence", "note"}}`` for each evidence key (W, M, ``w_max``) set on the command line: the
    override wins; the note names both values and where the evidence's came from."""
    out = {}
    for key in _EVIDENCE_KEYS:
        if key not in _keys(user_keys):
            continue
        name, value, ev = _NAMES[key], getattr(stare, key), evidence_values[key]
        if key == "reweight_w" and strength is not None:
            src = f"the {strength.kind} critical W"
        elif key in calibrated:
            src = "the calibration"
        else:
            src = "the source runs' own setting"
        out[key] = {"value": value, "evidence": ev, "note": (
            f"override: {name}={value:g} from the command line (loss.stare.{key}) wins over the evidence, which "
            f"recommends {name}={ev:g} ({src}); the written config has {name}={value:g}")}
    return out


def _weaker_warnings(overridden: dict[str, dict[str, Any]], strength: CriticalStrength | None,
                     calibrated: set[str]) -> list[str]:
    """A warning for each command-line W / ``w_max`` below, or M above, a critical value of the evidence (a sweep's
    critical W or a calibration): a weaker push than the one the evidence found the least that holds the band."""
    out = []
    for key, v in overridden.items():
        critical = (key == "reweight_w" and strength is not None) or key in calibrated
        weaker = v["value"] > v["evidence"] if key == "reweight_m" else v["value"] < v["evidence"]
        if critical and weaker:
            name = _NAMES[key]
            out.append(f"{name}={v['value']:g} from the command line is a weaker push than the evidence's "
                       f"{name}={v['evidence']:g}, the least that held the band there: expect the entropy to fall "
                       "below the target")
    return out


def _seed_warnings(runs: list[dict[str, Any]]) -> list[str]:
    """A warning when all source runs share one seed (one sample of a noisy simulation)."""
    seeds = sorted({str(r.get("seed")) for r in runs})
    if len(seeds) > 1:
        return []
    return [
        f"the promoted settings come from a single seed (seed {seeds[0] if seeds else '?'}, {len(runs)} run(s)): "
        "one sample of a noisy simulation; confirm them over several seeds (stare-lab simulate --seeds 3) first"
    ]


def _comment_block(provenance: dict[str, Any], notices: list[str]) -> str:
    lines = [
        f"Promoted by {provenance['promoted_by']} on {provenance['date']}",
        f"method: {provenance['method']}   base: {provenance['base']}",
        "source runs:",
    ]
    for run in provenance["source_runs"]:
        s = run.get("summary") or {}
        facts = ", ".join(
            f"{k}={s[k]:.4g}" if isinstance(s.get(k), float) else f"{k}={s.get(k)}"
            for k in ("initial_entropy", "final_entropy", "mean_abs_dev_second_half", "final_reward")
            if k in s
        )
        lines.append(f"  {run['path']} (seed {run.get('seed')}): {facts}")
    lines.append(f"evidence: {provenance['evidence_kind']}" + (
        f"; written: {'the auto schedule' if provenance['schedule'] == 'auto' else 'the fixed W it found'}"
        if provenance.get("schedule") else ""))
    if provenance.get("strength"):
        lines.append(f"critical W: {provenance['w_from']}")
    else:
        lines.append(f"W: {provenance['w_from']}")
    lines += [f"note: {n}" for n in notices]
    lines += [f"WARNING: {w}" for w in provenance.get("warnings") or []]
    if provenance["forced"]:
        lines.append("FORCED: promoted with --force despite the refusals above")
    return "".join(f"# {line}\n" for line in lines)


def _verl_lines(cfg: Any) -> list[str]:
    """Hydra overrides for mainline verl 0.9 plus stare_lab's plugin (docs/integrations-verl.md): the v1 trainer
    ``stare``, the policy loss ``stare`` with its config class and STARE keys, the clip and aggregation keys."""
    s, loss = cfg.loss.stare, cfg.loss

    def fmt(v: Any) -> str:
        return ("True" if v else "False") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)

    lines = [
        "trainer.use_v1=True",
        "trainer.v1.trainer_mode=stare",
        f"actor_rollout_ref.actor.policy_loss._target_={VERL_POLICY_LOSS_TARGET}",
        "actor_rollout_ref.actor.policy_loss.loss_mode=stare",
    ]
    lines += [f"+actor_rollout_ref.actor.policy_loss.{k}={fmt(getattr(s, k))}" for k in _VERL_STARE_KEYS]
    lines += [
        f"actor_rollout_ref.actor.clip_ratio_low={fmt(loss.clip_ratio_low)}",
        f"actor_rollout_ref.actor.clip_ratio_high={fmt(loss.clip_ratio_high)}",
        f"actor_rollout_ref.actor.clip_ratio_c={fmt(loss.clip_ratio_c)}",
        f"actor_rollout_ref.actor.loss_agg_mode={loss.loss_agg_mode}",
        f"actor_rollout_ref.actor.entropy_coeff={fmt(loss.entropy_coeff)}",
    ]
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stare-lab promote``."""
    parser.add_argument("sources", nargs="+", metavar="SWEEP_OR_RUN [KEY=VALUE]",
                        help="simulator sweep or run directories, then dotted overrides of the merged trainer config "
                        "(e.g. optim.lr=2e-6)")
    parser.add_argument("--method", required=True, help="method whose STARE settings to promote (e.g. c2)")
    parser.add_argument("--base", required=True, help="trainer base config YAML (e.g. papers/stare_2606.19236/…)")
    parser.add_argument("--out", required=True,
                        help="output file (not a directory), with OUT.provenance.json written beside it: a trainer "
                        "YAML for --format stare-lab (e.g. c2_7b.yaml), Hydra override lines for --format verl "
                        "(e.g. c2_7b.overrides)")
    parser.add_argument("--format", default="stare-lab", dest="fmt",
                        help="stare-lab (a trainer YAML) or verl (key=value Hydra overrides, one a line, for mainline "
                        "verl with stare_lab's plugin: not YAML)")
    parser.add_argument("--target-entropy", type=float, default=None, help="H_tgt in nats (else from --base)")
    parser.add_argument("--target-entropy-frac", type=float, default=None,
                        help="H_tgt = FRAC x the model's initial entropy measured by --probe")
    parser.add_argument("--probe", default=None,
                        help="trainer run dir or JSON with initial_entropy; a probe run of the target model with "
                        "pred/d_grpo, pred/d_lplus (or pred/d_ratio) rows also gives its regime for the check")
    parser.add_argument("--calibration", default=None,
                        help="calibration.json (or the folder stare-lab calibrate wrote): promote its calibrated W "
                        "(and M for C2, w_max for the adaptive schedule)")
    parser.add_argument("--schedule", default=None, choices=SCHEDULES,
                        help="with an auto run's evidence (--method o1-auto / c2-auto): write the auto schedule "
                        "(auto, the default: it finds the target model's own W) or the fixed W it found (fixed)")
    parser.add_argument("--force", action="store_true", help="promote despite refusals (recorded)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    parser.set_defaults(extra_overrides=[])


def _write_outputs(files: dict[Path, str]) -> None:
    """Write each file beside itself first, then rename them into place: both or neither (a rename within a folder
    does not fail for lack of space or permission once the temporary files exist).

    Raises:
        RunError: a file cannot be written (a read-only folder, a full disk): one line naming it.
    """
    tmps: list[Path] = []
    try:
        for path, text in files.items():
            tmp = path.with_name(f".{path.name}.tmp")
            tmps.append(tmp)
            tmp.write_text(text, encoding="utf-8")
        for (path, _), tmp in zip(files.items(), tmps):
            os.replace(tmp, path)
    except OSError as err:
        for tmp in tmps:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise RunError(f"cannot write {str(next(iter(files)))!r}: {err.strerror or err}") from None


def main(args: argparse.Namespace) -> int:
    """Run ``stare-lab promote``; print notices; write the output and ``OUT.provenance.json`` (both formats).

    Raises:
        ConfigError / RunError / DataError: see :func:`promote`; also ``--out`` ending in a slash, in a missing
            directory, a directory, or an existing file without ``--overwrite`` (checked before any work).
    """
    # key=value words given positionally among the sources are overrides
    sources, overrides = split_paths([*args.sources, *(getattr(args, "extra_overrides", None) or [])])
    overrides = expand_shorthand(overrides)  # stare.* = loss.stare.*, as stare-lab simulate accepts
    if not sources:
        raise RunError("no SWEEP_OR_RUN directory given")
    if str(args.out).endswith(("/", os.sep)):
        raise ConfigError(f"--out={str(args.out)!r} ends with a slash: --out names the output file (e.g. c2_7b.yaml), "
                          "not a directory")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise ConfigError(f"--out={str(out)!r}: directory {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise ConfigError(f"--out={str(out)!r} is a directory; give a file name")
    from stare_lab.platform.outdir import held_kind

    held = held_kind(out.parent)  # a run's, a sweep's or an evaluation's own folder: its files are not promote's
    if held is not None:
        raise RunError(f"--out={str(out)!r} is inside {str(out.parent)!r}, which holds a {held[0]} ({held[1]}): "
                       "promote does not write there, --overwrite or not; give a path outside it")
    if out.exists() and not getattr(args, "overwrite", False):
        raise RunError(f"--out={str(out)!r} already exists; pass --overwrite to replace it")
    text, provenance, notices = promote(
        sources, args.method, args.base, fmt=args.fmt, overrides=overrides,
        target_entropy=args.target_entropy, target_entropy_frac=args.target_entropy_frac, probe=args.probe,
        force=args.force, calibration=getattr(args, "calibration", None), schedule=getattr(args, "schedule", None),
    )
    _write_outputs({out: text, out.with_name(out.name + ".provenance.json"):
                    json.dumps(provenance, indent=2, default=str) + "\n"})
    if args.fmt == "verl" and out.suffix.lower() in (".yaml", ".yml"):
        notices.append(f"{out.name} holds Hydra override lines for verl, not YAML: a name such as "
                       f"{out.stem}.overrides says so")
    for n in notices:
        print(f"notice: {n}")
    for w in provenance.get("warnings") or []:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {out}")
    return 0
