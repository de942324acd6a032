"""The regime a critical strength was found in, whether it carries over to another system, and ``calibration.json``
(docs/theory.md §7–8).

A critical W measured on one system (a toy, a small model) is evidence about another (the model you will train)
only when the two are in the same regime. Three numbers describe it (docs/theory.md §8):

* ``d_ratio`` = D_L+/|D_GRPO| near the target: how much of the GRPO drift the selected positive-advantage
  high-surprisal tokens L+ carry (≈ 2 or negative in the tabular toys at their H_tgt crossing, 4–61 in a SmolLM2
  probe);
* ``target_over_optimal`` = H_tgt / the reward-optimal entropy (a target near or above it can only be held by
  keeping probability on wrong answers);
* ``mode``: ``sampled`` (G responses per prompt, as in training) or ``expected`` (the simulators' mean-field
  limit, G → ∞; sampling noise raises the critical W).

:func:`run_regime` reads them from a run's metrics rows and resolved config (``config.yaml``), :func:`regime_mismatches`
compares two and says what differs, with the numbers. ``calibration.json`` (written by ``stare-lab calibrate``) is
read by :func:`read_calibration`; :func:`calibrated_strengths` turns its ``critical`` block into *calibrated*
:class:`stare_lab.theory.critical.CriticalStrength` records. Its schema::

    {"kind": "calibrated",
     "probe": {"run", "kind", "source", "model", "steps", "entropy", "d_ratio", "lplus_above_sstar", "balance_w",
               "schedule", "target_entropy"},
     "knobs": {...}, "preset": {"name", "overrides"},
     "fit": {"d_ratio", "lplus_above_sstar", "balance_w", "residual"},
     "critical": {"o1": {"w", "low", "high"}, "c2": {"w", "m", "low", "high"}, "adaptive": {"w_max"}},
     "regime": {"d_ratio", "target_over_optimal", "mode"}}
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LPLUS, KEY_D_RATIO, KEY_LPLUS_ABOVE, CriticalStrength
from stare_lab.errors import DataError, RunError
from stare_lab.platform.files import read_json

__all__ = [
    "REGIME_KEYS", "RATIO_FACTOR", "CALIBRATION_FILE", "POOR_FIT_RESIDUAL", "run_regime", "regime_mismatches",
    "read_calibration",
    "calibrated_strengths", "calibrated_w_max", "MODES",
]

#: the numbers of a regime (module docstring), plus ``entropy``: the mean entropy (nats) where they were measured
REGIME_KEYS = ("d_ratio", "lplus_above_sstar", "target_over_optimal", "mode", "entropy")
#: ``mode`` values
MODES = ("sampled", "expected")
#: two ratios (``d_ratio``, ``target_over_optimal``) differ when one is more than this many times the other, or their
#: signs differ
RATIO_FACTOR = 2.0
#: the file ``stare-lab calibrate`` writes into its output folder
CALIBRATION_FILE = "calibration.json"
#: a calibration's fit residual (``fit.residual``) above this is a poor reproduction of the probe
#: (docs/calibration.md, step 3)
POOR_FIT_RESIDUAL = 0.5


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _mean(values: Sequence[Any]) -> float | None:
    vals = [v for v in (_num(x) for x in values) if v is not None]
    return sum(vals) / len(vals) if vals else None


def run_regime(
    rows: Sequence[Mapping[str, Any]], target_entropy: float | None = None,
    config: Mapping[str, Any] | None = None, window: int | None = None,
) -> dict[str, Any]:
    """The regime of one run (module docstring), measured where its entropy first falls below ``target_entropy``
    (the ``window`` steps centred there; default 5 % of the run, at least 1) — or over every row when it never does
    or no target is given (a probe run: a few steps at the current weights, far from any target).

    ``d_ratio`` = ΣD_L+ / |ΣD_GRPO| over those rows (ratio of sums, :data:`stare_lab.theory.critical.KEY_D_LPLUS` /
    ``KEY_D_GRPO``), else the mean of the logged :data:`~stare_lab.theory.critical.KEY_D_RATIO`; ``lplus_above_sstar`` the
    mean of :data:`~stare_lab.theory.critical.KEY_LPLUS_ABOVE`; ``entropy`` the mean entropy there (nats);
    ``target_over_optimal`` = H_tgt / ``config["reward_optimal_entropy"]`` (the tabular simulator writes it) when
    both are known; ``mode`` = ``config["mode"]`` when it is one of :data:`MODES`, ``sampled`` for a trainer run
    (``config["source"] == "trainer"``), else None. Every value is None where the rows do not tell.
    """
    rows = list(rows)
    config = config or {}
    n = len(rows)
    width = max(1, int(window) if window else n // 20)
    cross = None
    if _num(target_entropy) is not None:
        cross = next((i for i, r in enumerate(rows) if _num(r.get("entropy")) is not None
                      and r["entropy"] < target_entropy), None)
    if cross is None:
        chunk = rows
    else:
        a = max(0, min(cross - width // 2, n - width))
        chunk = rows[a:a + width]
    dg = [_num(r.get(KEY_D_GRPO)) for r in chunk]
    dl = [_num(r.get(KEY_D_LPLUS)) for r in chunk]
    ratio = None
    if chunk and all(x is not None for x in dg + dl) and sum(dg) != 0:
        ratio = sum(dl) / abs(sum(dg))
    elif any(_num(r.get(KEY_D_RATIO)) is not None for r in chunk):
        ratio = _mean([r.get(KEY_D_RATIO) for r in chunk])
    optimal = _num(config.get("reward_optimal_entropy"))
    target = _num(target_entropy)
    mode = config.get("mode") if config.get("mode") in MODES else (
        "sampled" if config.get("source") == "trainer" else None)
    return {
        "d_ratio": ratio,
        "lplus_above_sstar": _mean([r.get(KEY_LPLUS_ABOVE) for r in chunk]),
        "target_over_optimal": target / optimal if target is not None and optimal else None,
        "mode": mode,
        "entropy": _mean([r.get("entropy") for r in chunk]),
    }


def _ratio_differs(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return False
    if (a > 0) != (b > 0):
        return True
    lo, hi = sorted((abs(a), abs(b)))
    return lo == 0 or hi / lo > RATIO_FACTOR


def _at(reg: Mapping[str, Any]) -> str:
    h = _num(reg.get("entropy"))
    return f" at H {h:.3g} nats" if h is not None else ""


def regime_mismatches(source: Mapping[str, Any], target: Mapping[str, Any],
                      names: tuple[str, str] = ("the source", "the target")) -> list[str]:
    """What differs between two regimes (:func:`run_regime` dicts), one sentence each with both numbers: a
    ``d_ratio`` or ``target_over_optimal`` more than :data:`RATIO_FACTOR` times the other (or of another sign), a
    different ``mode``. Nothing is said about a number one side lacks. [] when they agree."""
    a, b = names
    out = []
    ra, rb = _num(source.get("d_ratio")), _num(target.get("d_ratio"))
    if _ratio_differs(ra, rb):
        out.append(f"D_L+/|D_GRPO| is {ra:.3g} in {a}{_at(source)} and {rb:.3g} in {b}{_at(target)} (more than "
                   f"{RATIO_FACTOR:g}x apart): the high-surprisal positive-advantage tokens carry a different share of "
                   "the drift, so a critical W does not carry over (docs/theory.md §8)")
    ta, tb = _num(source.get("target_over_optimal")), _num(target.get("target_over_optimal"))
    if _ratio_differs(ta, tb):
        out.append(f"H_tgt is {ta:.3g} x the reward-optimal entropy in {a} and {tb:.3g} x in {b} (more than "
                   f"{RATIO_FACTOR:g}x apart)")
    ma, mb = source.get("mode"), target.get("mode")
    if ma in MODES and mb in MODES and ma != mb:
        exp, smp = (a, b) if ma == "expected" else (b, a)
        out.append(f"{exp} ran in the mean-field limit (mode=expected, G -> infinity) and {smp} samples G responses "
                   "per prompt (mode=sampled): sampling noise raises the critical W (measured on the toys: 1.2 -> "
                   "1.5, 1.3 -> 2; docs/theory.md §8)")
    return out


def read_calibration(path: str | os.PathLike) -> dict[str, Any]:
    """``calibration.json`` (module docstring) at ``path``, or in the folder ``path`` (``stare-lab calibrate``'s
    output folder).

    Raises:
        RunError: no such file.
        DataError: not JSON, not a calibration (``kind`` is not ``calibrated``), or its ``critical`` block has no
            finite ``o1.w`` / ``c2.w``.
    """
    p = Path(path)
    if p.is_dir():
        p = p / CALIBRATION_FILE
    if not p.is_file():
        raise RunError(f"calibration {str(path)!r} does not exist (give calibration.json or the folder "
                       "`stare-lab calibrate` wrote)")
    data = read_json(p, "calibration", DataError)  # encoding, size, JSON: one line naming the file and line
    if not isinstance(data, dict) or data.get("kind") != "calibrated":
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise DataError(f"{str(p)!r} has kind={kind!r}; a calibration has kind 'calibrated' (stare-lab calibrate)")
    crit = data.get("critical")
    if not isinstance(crit, dict) or not any(isinstance(crit.get(k), dict) and _num(crit[k].get("w")) is not None
                                             for k in ("o1", "c2")):
        raise DataError(f"{str(p)!r} has no critical W (critical.o1.w or critical.c2.w, a finite number)")
    data["path"] = str(p)
    return data


def calibrated_strengths(calibration: Mapping[str, Any]) -> list[CriticalStrength]:
    """The *calibrated* strengths of a :func:`read_calibration` dict: O1 from ``critical.o1`` (``w``, ``low``,
    ``high``), C2 at ``critical.c2.m`` from ``critical.c2``; the source names the file and the probe's run."""
    crit = calibration.get("critical") or {}
    probe = calibration.get("probe") or {}
    where = f"{calibration.get('path', 'calibration.json')}, probe {probe.get('run', '?')}"
    out = []
    for key in ("o1", "c2"):
        c = crit.get(key)
        if not isinstance(c, Mapping) or _num(c.get("w")) is None:
            continue
        m = _num(c.get("m")) if key == "c2" else None
        try:
            out.append(CriticalStrength("calibrated", c["w"], m, _num(c.get("low")), _num(c.get("high")), where))
        except Exception as err:  # noqa: BLE001 - a bad value in the file is a data error naming it
            raise DataError(f"{where}: critical.{key} = {dict(c)!r} is not a critical strength ({err})") from None
    return out


def calibrated_w_max(calibration: Mapping[str, Any]) -> float | None:
    """``critical.adaptive.w_max`` of a calibration (the adaptive schedule's cap it recommends), or None."""
    ad = (calibration.get("critical") or {}).get("adaptive")
    return _num(ad.get("w_max")) if isinstance(ad, Mapping) else None
