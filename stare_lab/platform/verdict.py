"""The one-line verdict of a set of runs: which methods collapsed, which held the target band, at what reward.

``stare-lab simulate`` prints it as its headline and ``stare-lab analyze`` puts it at the top of every report, both
from the same per-run statistics (:func:`stare_lab.platform.summary.run_summary`), so the two say the same thing about the
same runs. The wings cannot import each other, hence this function lives in the core.

Definitions, per group of runs (one method or one setting, several seeds), from each run's summary:

* a run **collapsed** when its ``steps_to_collapse`` is set (its entropy fell below ``collapse_frac`` × its initial
  entropy);
* a run **held the band** when :func:`stare_lab.platform.summary.band_held` says so: its mean |H − H_tgt| over the second
  half is below min(``band``, H_tgt/4) (``band`` the half-width, 0.05 nats by default) and its final entropy is at
  least H_tgt/2 — a run whose entropy collapsed never counts as held, however small H_tgt (docs/theory.md §7); a
  group held it when every seed did;
* an adaptive group (``stare.adaptive``) that held the band **with W near its cap** — mean W over the second half
  at least :data:`NEAR_CAP` of the way from 1 to ``w_max``, or W at the cap on at least :data:`CAP_SHARE` of those
  steps (:func:`near_cap`) — is said so, with the mean W and the share of steps at the cap: it has no headroom;
* a baseline (a group whose loss does not use STARE) **fell below the band** when it did not collapse but its mean
  final entropy ended below H_tgt − band;
* rewards are the seeds' mean ``final_reward`` (the mean over the last 10 % of each run's steps).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from stare_lab.platform.completeness import status_clause
from stare_lab.platform.summary import band_held, w_cap

__all__ = ["group_outcome", "verdict", "push_label", "near_cap", "cap_text", "NEAR_CAP", "CAP_SHARE"]

#: more STARE settings than this are summarised (count and best) instead of listed one by one
MAX_LISTED = 6
#: an adaptive W whose second-half mean is at least this far from 1 towards w_max is near its cap
NEAR_CAP = 0.8
#: … or one at the cap on at least this share of the second half's steps
CAP_SHARE = 0.1


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _mean(values: Sequence[Any]) -> float | None:
    vals = [v for v in (_num(x) for x in values) if v is not None]
    return sum(vals) / len(vals) if vals else None


def _f(x: Any, spec: str = ".3g") -> str:
    v = _num(x)
    return "-" if v is None else format(v, spec)


def group_outcome(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The aggregates :func:`verdict` reads, from the runs' summaries (:func:`stare_lab.platform.summary.run_summary` keys):
    ``n`` runs, ``collapsed`` / ``held`` run counts (module docstring), and the means over the runs (None values
    skipped) of ``initial_entropy``, ``final_entropy``, ``target_entropy``, ``band``, ``final_reward``,
    ``mean_abs_dev_second_half``, ``steps_to_collapse`` (over the runs that collapsed), ``w_mean_second_half`` and
    ``w_cap_share`` (adaptive runs)."""
    runs = list(runs)
    held = sum(band_held(r) is True for r in runs)
    out: dict[str, Any] = {"n": len(runs), "held": held,
                           "collapsed": sum(r.get("steps_to_collapse") is not None for r in runs)}
    for key in ("initial_entropy", "final_entropy", "target_entropy", "band", "final_reward",
                "mean_abs_dev_second_half", "steps_to_collapse", "w_mean_second_half", "w_cap_share"):
        out[key] = _mean([r.get(key) for r in runs])
    return out


def push_label(stare: Mapping[str, Any]) -> str:
    """``W=1.1``, ``W=1.1, M=0.9`` (C2), ``… adaptive`` — the STARE push of a group's ``loss.stare`` settings."""
    w, m = stare.get("reweight_w"), stare.get("reweight_m")
    return f"W={_f(w, 'g')}" + (f", M={_f(m, 'g')}" if str(stare.get("variant", "")).upper() == "C2" else "") + (
        " adaptive" if stare.get("adaptive") else "")


def near_cap(w_mean: Any, cap_share: Any, w_max: Any) -> bool:
    """Whether an adaptive W sat near its cap ``w_max`` over the second half: mean W ≥ 1 + :data:`NEAR_CAP`·(w_max − 1)
    or a share ≥ :data:`CAP_SHARE` of the steps at the cap (module docstring)."""
    w, share, cap = _num(w_mean), _num(cap_share), _num(w_max)
    if cap is None or (w is None and share is None):
        return False
    return (w is not None and w >= 1.0 + NEAR_CAP * (cap - 1.0) - 1e-12) or (share is not None and share >= CAP_SHARE)


def cap_text(g: Mapping[str, Any]) -> str | None:
    """``mean W 1.46 over the second half, at the cap w_max=1.5 on 38% of those steps`` for an adaptive group
    (``stare.adaptive``, :func:`group_outcome` means) near its cap (:func:`near_cap`), else None."""
    st = g.get("stare") or {}
    if not st.get("adaptive") or not near_cap(g.get("w_mean_second_half"), g.get("w_cap_share"), w_cap(st)):
        return None
    return (f"mean W {_f(g.get('w_mean_second_half'))} over the second half, at the cap {cap_key(st)}={_f(w_cap(st), 'g')}"
            f" on {_f(g.get('w_cap_share'), '.0%')} of those steps")


def cap_key(stare: Mapping[str, Any]) -> str:
    """The config key of the adaptive schedule's cap on W: ``auto_w_max`` for ``schedule: auto``, else ``w_max``."""
    return "auto_w_max" if stare.get("schedule") == "auto" else "w_max"


def _fell(g: Mapping[str, Any]) -> bool:
    h, tgt, band = _num(g.get("final_entropy")), _num(g.get("target_entropy")), _num(g.get("band"))
    return h is not None and tgt is not None and h < tgt - (0.05 if band is None else band)


def _reference(groups: Sequence[Mapping[str, Any]], g: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The baseline to compare ``g``'s reward with: a GRPO group (else any baseline) of the same slice."""
    same = [b for b in groups if b.get("stare") is None and (b.get("slice") or {}) == (g.get("slice") or {})]
    grpo = [b for b in same if b.get("method") in ("grpo", "grpo-ds")]
    return (grpo or same or [None])[0]


def verdict(groups: Sequence[Mapping[str, Any]], *, per_setting: bool = True) -> str:
    """One line that says what happened to ``groups`` (module docstring).

    Args:
        groups: in display order, each ``{"label", "method", "stare"}``, optionally ``n_total`` and ``left_out``
            (``(seed, reason)`` of the runs not counted: :func:`stare_lab.platform.completeness.status_clause` names them
            first; a group with no counted run appears only there) — ``stare`` the group's ``loss.stare``
            settings when its loss uses the STARE gate and W/M, else None (a baseline) — plus
            :func:`group_outcome` of its runs and optionally ``slice`` (the values of non-STARE grid keys: the
            reward of a STARE group is compared with the baseline of the same slice).
        per_setting: list the STARE groups that did not hold the band one by one (a sweep over W says this with its
            critical W instead); more than :data:`MAX_LISTED` STARE groups are always summarised.

    Returns:
        The verdict, clauses joined by ``"; "``; ``"no runs"`` for no group.
    """
    # runs left out (unfinished, not measurable: stare_lab.platform.completeness) are named first and counted nowhere
    parts: list[str] = [c for g in groups
                        if (c := status_clause(g["label"], g.get("n_total", g["n"]), g.get("left_out") or ()))]
    groups = [g for g in groups if g["n"]]
    for g in groups:
        if g.get("stare") is not None:
            continue
        h = f"H {_f(g.get('initial_entropy'))} -> {_f(g.get('final_entropy'))} nats"
        if g["collapsed"]:
            parts.append(f"{g['label']} collapsed on {g['collapsed']}/{g['n']} seeds ({h}, ~step "
                         f"{_f(g.get('steps_to_collapse'), '.0f')})")
        elif _fell(g):
            parts.append(f"{g['label']} fell below the band ({h}; no seed collapsed)")
        else:
            parts.append(f"{g['label']} did not collapse ({h})")
    stare = [g for g in groups if g.get("stare") is not None and _num(g.get("target_entropy")) is not None]
    held = [g for g in stare if g["n"] and g["held"] == g["n"]]
    missed = [g for g in stare if g not in held]
    many = len(stare) > MAX_LISTED
    if held:
        best = min(held, key=lambda g: _num(g.get("mean_abs_dev_second_half")) or 0.0)
        ref = _reference(groups, best)
        rew = f" ({ref['label']} {_f(ref.get('final_reward'))})" if ref else ""
        text = (f"{best['label']} held H_tgt={_f(best.get('target_entropy'))} on {best['n']}/{best['n']} seeds (mean "
                f"|H-H_tgt| {_f(best.get('mean_abs_dev_second_half'), '.3f')} over the second half) at reward "
                f"{_f(best.get('final_reward'))}{rew}")
        others = [g["label"] for g in held if g is not best]
        if others and many:
            text += f"; {len(held)} of {len(stare)} STARE settings held the band on every seed"
        elif others:
            text += f"; also held: {', '.join(others)}"
        parts.append(text)
        capped = [(g, cap_text(g)) for g in held]
        parts += [f"{g['label']} held it with W near its cap ({c}): little headroom" for g, c in capped if c]
    elif stare:
        parts.append("no STARE setting held the band on every seed")
    collapsed = [g for g in stare if g["collapsed"]]
    if missed and per_setting and not many:
        parts.append("not held: " + ", ".join(
            f"{g['label']} ({push_label(g['stare'])}: {g['held']}/{g['n']} seeds, |H-H_tgt| "
            f"{_f(g.get('mean_abs_dev_second_half'), '.3f')}" + (f", collapsed on {g['collapsed']}" if g["collapsed"]
                                                                  else "") + ")" for g in missed))
    elif collapsed:
        parts.append(f"STARE settings that collapsed: {len(collapsed)} of {len(stare)}")
    return "; ".join(parts) if parts else "no runs"
