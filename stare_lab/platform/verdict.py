"""The one-line verdict of a set of runs: which methods collapsed, which held the target band, at what reward.

``stare-lab simulate`` prints it as its headline and ``stare-lab analyze`` puts it at the top of every report, both
from the same per-run statistics (:func:`stare_lab.platform.summary.run_summary`), so the two say the same thing about the
same runs. The wings cannot import each other, hence this function lives in the core.

Definitions, per group of runs (one method or one setting, several seeds), from each run's summary:

* a run **held the band** when :func:`stare_lab.platform.summary.band_held` says so: its mean |H − H_tgt| over the second
  half is below min(``band``, H_tgt/4) (``band`` the half-width, 0.05 nats by default) and its final entropy is at
  least H_tgt/2 — a run whose entropy collapsed never counts as held, however small H_tgt (docs/theory.md §7); a
  group held it when every seed did;
* a run **collapsed** when its ``steps_to_collapse`` is set (its entropy fell below ``collapse_frac`` × its initial
  entropy) and it did not hold the band: each run is counted once, so no screen says "collapsed" and "held" of the
  same run (at a target whose band reaches below ``collapse_frac`` × H0 a run can do both);
* a baseline's runs (a group whose loss does not use STARE) are told seed by seed, each once: collapsed, **inside
  the band** (held it: the target sits at the baseline's floor, so there is nothing for STARE to hold), **below
  the band** (final entropy below H_tgt − band, not collapsed) or none of these (did not collapse);
* an adaptive group (``stare.adaptive``) that held the band **with W near its cap** — mean W over the second half
  at least :data:`NEAR_CAP` of the way from 1 to ``w_max``, or W at the cap on at least :data:`CAP_SHARE` of those
  steps (of the steps from the crossing on for the auto schedule: ``w_cap_share``, :func:`near_cap`) — is said so,
  with the mean W and the share of steps at the cap: it has no headroom;
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
    ``n`` runs, ``held`` / ``collapsed`` / ``below`` run counts (module docstring: each run in at most one), and the
    means over the runs (None values skipped) of ``initial_entropy``, ``final_entropy``, ``target_entropy``,
    ``band``, ``final_reward``, ``mean_abs_dev_second_half``, ``steps_to_collapse`` (over the runs counted as
    collapsed), ``w_mean_second_half`` and ``w_cap_share`` (adaptive runs)."""
    runs = list(runs)
    held = [band_held(r) is True for r in runs]
    collapsed = [not h and r.get("steps_to_collapse") is not None for r, h in zip(runs, held)]
    out: dict[str, Any] = {"n": len(runs), "held": sum(held), "collapsed": sum(collapsed),
                           "below": sum(not h and not c and _fell(r) for r, h, c in zip(runs, held, collapsed))}
    for key in ("initial_entropy", "final_entropy", "target_entropy", "band", "final_reward",
                "mean_abs_dev_second_half", "w_mean_second_half", "w_cap_share"):
        out[key] = _mean([r.get(key) for r in runs])
    out["steps_to_collapse"] = _mean([r.get("steps_to_collapse") for r, c in zip(runs, collapsed) if c])
    return out


def push_label(stare: Mapping[str, Any]) -> str:
    """``W=1.1``, ``W=1.1, M=0.9`` (C2), ``… adaptive`` — the STARE push of a group's ``loss.stare`` settings;
    ``W auto`` (``W auto, M=1/W`` for C2) for the auto schedule, which sets W itself."""
    if stare.get("adaptive") and stare.get("schedule") == "auto":
        return "W auto" + (", M=1/W" if str(stare.get("variant", "")).upper() == "C2" else "")
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
    steps = "the steps from the crossing on" if st.get("schedule") == "auto" else "those steps"
    return (f"mean W {_f(g.get('w_mean_second_half'))} over the second half, at the cap {cap_key(st)}={_f(w_cap(st), 'g')}"
            f" on {_f(g.get('w_cap_share'), '.0%')} of {steps}")


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


def _baseline_clause(g: Mapping[str, Any]) -> str:
    """One clause for a baseline group, each seed told once (module docstring): ``grpo collapsed on 3/3 seeds (H
    1.74 -> 0.163 nats, ~step 256)``; ``grpo fell below the band on 2/3 seeds, ended inside the band on 1/3 (H …; no
    seed collapsed)``; every seed inside the band: ``… : the target sits at GRPO's floor: nothing to hold``. A group
    without a ``below`` count (an older summary) counts as below the band when its mean final entropy is."""
    n, held, coll = g["n"], g.get("held") or 0, g.get("collapsed") or 0
    below = g.get("below")
    if below is None:
        below = n - held - coll if _fell(g) else 0
    rest = n - held - coll - below
    h = f"H {_f(g.get('initial_entropy'))} -> {_f(g.get('final_entropy'))} nats"
    parts = []
    for count, text in ((coll, "collapsed on"), (below, "fell below the band on"), (held, "ended inside the band on"),
                        (rest, "did not collapse on")):
        if count:
            parts.append(f"{text} {count}/{n}" + (" seeds" if not parts else ""))
    if rest == n:
        return f"{g['label']} did not collapse ({h})"
    if held == n:
        who = "GRPO" if g.get("method") in ("grpo", "grpo-ds") else g["label"]
        return (f"{g['label']} ended inside the band on {n}/{n} seeds ({h}): the target sits at {who}'s floor: "
                "nothing to hold")
    tail = f", ~step {_f(g.get('steps_to_collapse'), '.0f')}" if coll else "; no seed collapsed"
    return f"{g['label']} {', '.join(parts)} ({h}{tail})"


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
    parts += [_baseline_clause(g) for g in groups if g.get("stare") is None]
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
