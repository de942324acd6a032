"""What ``stare-lab simulate`` tells the user after a sweep: the one-line headline (the core's verdict,
:mod:`stare_lab.platform.verdict`, plus the one recommended critical W per push with its kind:
:func:`stare_lab.theory.critical.recommended_clause`), a line per auto-schedule group with the W it found
(:func:`auto_lines`), the other estimates and the other slices of the grid (:func:`critical_lines`), and the notes.
The recommendation is said once, in the headline: the other lines and the notes refer to it.

The notes reason from direction and regime, in this order (docs/theory.md §6–§7), for each STARE group that did not
hold the band on every seed:

1. gate disabled (``stare.gate=never``) or never opened (the entropy stayed above H_tgt): STARE never acted;
2. outside the first-order regime: the push acted at less than :data:`simulators.run_stats.REGIME_RATIO` of its
   first-order size, or it moved the entropy the wrong way (ended below GRPO, collapsed earlier, or a larger W of
   the grid ended lower): lower lr — a stronger W does not help there;
3. GRPO itself did not collapse (no seed below 10 % of its initial entropy and its entropy not below the band):
   then nothing is said about STARE being too weak;
4. otherwise (in the regime, GRPO collapsed, the gate opened, the entropy stayed above GRPO's): the push is below
   the critical strength; the note refers to the recommended critical W of its slice and push (``critical_strength``,
   :func:`strength_block`; said in the headline, or the slice's line) when that is not the conservative one and above
   the group's W;
   else the conservative first-order estimate W* (:mod:`stare_lab.theory.critical`, seed median) where the entropy first
   crosses H_tgt (the group's own value, with its M for C2; else GRPO's) — or, when that is below the run's W but
   the group's own second-half W* is above it, the latter (the drift grew after the crossing); when both are below
   W, the drift is mostly second order. A group whose entropy first reached H_tgt in the second half is told to
   run more steps instead. An adaptive group is told to raise ``stare.w_max`` (its W's cap).

An adaptive group that held the band with W near its cap (:func:`stare_lab.platform.verdict.near_cap`) gets a note with its
mean W over the second half and the share of those steps at the cap: it has no headroom left.

Independently of 1–4, every group (GRPO's probe push included, and a STARE group that held the band) whose push
acted at less than :data:`~simulators.run_stats.REGIME_RATIO` of its first-order size gets a regime warning.

Plan notes (about the request, before any run): ``kl_cov`` with one update per batch equals GRPO; ``stare.*``
overrides without a STARE method change nothing; a target above the reward-optimal entropy.
"""

from __future__ import annotations

import copy
import math
import statistics
from typing import Any

from stare_lab.theory.critical import (
    STRENGTH_KINDS, CriticalStrength, also_text, at_grpo_floor, auto_entries, auto_line, lower_bound_reason, recommend,
    pushes_ran, recommendation_text, recommended_clause, run_strengths, variant_label,
)
from stare_lab.loss.losses import loss_needs
from stare_lab.platform.summary import w_cap
from stare_lab.platform.verdict import cap_key, cap_text, push_label, verdict

from simulators.grid import W_KEY, inert_keys, parse_grid, point_label
from simulators.presets import METHODS, get_preset
from simulators.run_stats import REGIME_RATIO
from simulators.tabular.runner import init_state, target_warning
from simulators.tabular.tasks import reward_optimal_entropy

__all__ = ["headline", "sweep_notes", "plan_notes", "group_facts", "strength_block", "critical_lines", "auto_lines",
           "STRENGTH_RULE"]

#: the grid key of M: a different M is a different push (a strength's ``m``), not a different slice
M_KEY = "loss.stare.reweight_m"
#: the precedence of the recommended critical W, as the outputs state it (docs/theory.md §7)
STRENGTH_RULE = " > ".join(STRENGTH_KINDS) + " (docs/theory.md §7)"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _f(x: Any, spec: str = ".3g") -> str:
    v = _num(x)
    return "-" if v is None else format(v, spec)


def group_facts(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per group label: ``method``, ``point``, ``stare`` (config dict of ``loss.stare`` when the group's loss uses
    the STARE gate and W/M — the group's ``stare`` flag of ``summary.json`` — else None), ``n`` seeds, ``held`` /
    ``collapsed`` / ``below`` seed counts (each seed once, :func:`stare_lab.platform.verdict.group_outcome`;
    ``below`` None in an older summary) and the seed means (``mean``)."""
    seed0 = (summary.get("seeds") or [0])[0]
    n = len(summary.get("seeds") or [0])
    out = {}
    for label, entry in (summary.get("methods") or {}).items():
        cfg = (summary.get("config") or {}).get(f"{label}/seed{seed0}") or {}
        loss = cfg.get("loss") or {}
        mean = entry.get("mean") or {}
        out[label] = {
            "method": entry.get("method", label), "point": entry.get("point") or {},
            "stare": (loss.get("stare") or {}) if entry.get("stare") else None,
            "n": n, "held": int(mean.get("held_runs") or 0), "collapsed": int(mean.get("collapsed_runs") or 0),
            "below": None if mean.get("below_runs") is None else int(mean["below_runs"]),
            "mean": mean, "lr": cfg.get("lr"), "runs": list((entry.get("runs") or {}).values()),
            "label": label, "sampled": cfg.get("mode") != "expected",
        }
    return out


def _seed_median(g: dict[str, Any], key: str) -> float | None:
    """Median over the group's seeds of a per-run statistic (the statistic the headline's critical-W line uses,
    :func:`simulators.grid.critical_summary`); the seed mean for a summary without per-seed runs."""
    vals = [v for v in (_num(r.get(key)) for r in g.get("runs") or []) if v is not None]
    return float(statistics.median(vals)) if vals else _num(g["mean"].get(key))


def _same_slice(a: dict, b: dict) -> bool:
    """Two groups at the same values of the grid keys that both have (``loss.stare.*`` keys ignored)."""
    keys = {k for k in a if not k.startswith("loss.stare.")} & {k for k in b if not k.startswith("loss.stare.")}
    return all(a[k] == b[k] for k in keys)


#: the methods that are GRPO itself (a STARE group's reference; their runs give the conservative W*)
GRPO_METHODS = ("grpo", "grpo-ds")


def _fixed_w(stare: dict[str, Any] | None) -> float | None:
    """The fixed W of a group's ``loss.stare`` settings; None for a baseline or the adaptive schedule."""
    return None if not stare or stare.get("adaptive") else _num(stare.get("reweight_w"))


def _grpo_for(facts: dict[str, dict[str, Any]], g: dict[str, Any]) -> dict[str, Any] | None:
    for f in facts.values():
        if f["method"] in GRPO_METHODS and _same_slice(f["point"], g["point"]):
            return f
    return None


def _is_auto(stare: dict[str, Any] | None) -> bool:
    """Whether a group's ``loss.stare`` settings use the auto schedule (``adaptive``, ``schedule: auto``)."""
    return bool(stare) and bool(stare.get("adaptive")) and stare.get("schedule") == "auto"


def _m_of(stare: dict[str, Any] | None) -> float | None:
    """C2's M of a group's ``loss.stare`` settings; None for O1 (and baselines)."""
    if not stare or str(stare.get("variant", "")).upper() != "C2":
        return None
    m = _num(stare.get("reweight_m"))
    return None if m is None or m == 1.0 else m


def _slice_of(point: dict[str, Any]) -> dict[str, Any]:
    """The grid keys that make a different experiment: all but W and M (a strength is *for* a W, at its M)."""
    return {k: v for k, v in point.items() if k not in (W_KEY, M_KEY)}


def _in_slice(point: dict[str, Any], sl: dict[str, Any]) -> bool:
    """A group belongs to a slice when it agrees on every slice key it has (GRPO lacks the ``loss.stare.*`` keys)."""
    return all(point.get(k, v) == v for k, v in sl.items())


def strength_block(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``critical_strength`` (docs/theory.md §7): per slice of the grid (the grid keys other than
    W and M; ``""`` without such keys) the labelled critical strengths of its runs — *measured* from a W sweep
    (``critical.<method>``, :func:`simulators.grid.critical_summary`), *predicted* / *conservative* from the runs
    (:func:`stare_lab.theory.critical.run_strengths`) — and the recommended one per push (``O1``, ``C2 (M=0.9)``:
    :func:`stare_lab.theory.critical.recommend`); at the top ``recommended``, the one W the headline names (the preset's
    own slice, ``slice``; for a push the sweep ran, O1 first; O1 from GRPO alone when no STARE method ran), and
    ``rule``, the precedence. A slice where every GRPO seed ends inside the band has no strengths (``floor``: the
    target sits at GRPO's floor, :func:`stare_lab.theory.critical.at_grpo_floor`). Each slice also lists its
    auto-schedule groups (``auto``: :func:`stare_lab.theory.critical.auto_entries`, the lines of :func:`auto_lines`)."""
    facts = group_facts(summary)
    stare_points = [_slice_of(f["point"]) for f in facts.values() if f["stare"] is not None]
    pts = stare_points or [_slice_of(f["point"]) for f in facts.values()]
    slices = {point_label(p): p for p in pts}
    base = _base_slice(summary, slices)
    out: dict[str, Any] = {"rule": STRENGTH_RULE, "slice": slices.get(base, {}), "recommended": None, "slices": {}}
    for label, sl in slices.items():
        groups = [{"label": name, "stare": f["stare"] is not None, "m": _m_of(f["stare"]), "runs": f["runs"],
                   "grpo": f["method"] in GRPO_METHODS, "w": _fixed_w(f["stare"]), "sampled": f["sampled"],
                   "auto": _is_auto(f["stare"]), "variant": (f["stare"] or {}).get("variant"),
                   "w_cap": w_cap(f["stare"])}
                  for name, f in facts.items() if _in_slice(f["point"], sl)]
        strengths: list[CriticalStrength] = []
        for c in (summary.get("critical") or {}).values():
            for entry in (c.get("by_slice") or {}).values():
                if _slice_of(entry.get("point") or {}) == sl:
                    strengths += [CriticalStrength.from_dict(d) for d in entry.get("strengths") or []
                                  if d.get("kind") == "measured"]
        swept = [x.m for x in strengths]  # a W sweep's measured strength: the runs' own would repeat it
        strengths += [x for x in run_strengths(groups) if not (x.kind == "measured" and x.m in swept)]
        floor = at_grpo_floor(groups)  # GRPO ends inside the band: no W to recommend, not even a measured one
        if floor:
            strengths = []
        ms = list(dict.fromkeys(x.m for x in strengths))
        rec = {variant_label(m): recommend(strengths, m) for m in ms}
        out["slices"][label] = {"point": sl, "strengths": [x.to_dict() for x in strengths],
                                "recommended": {k: v.to_dict() for k, v in rec.items() if v is not None},
                                "floor": floor, "auto": auto_entries(groups), "ran": pushes_ran(groups, strengths)}
    chosen = out["slices"].get(base, {}).get("recommended") or {}
    order = list(out["slices"].get(base, {}).get("ran") or []) + ["O1"]  # a push that ran, O1 first
    out["recommended"] = next((chosen[v] for v in order if v in chosen), None)
    return out


def _base_slice(summary: dict[str, Any], slices: dict[str, dict[str, Any]]) -> str:
    """The slice the headline speaks for: the one of the W sweep's top-level ``critical`` values (the preset's own
    values of the other keys), else the first."""
    for c in (summary.get("critical") or {}).values():
        label = point_label(_slice_of(c.get("slice") or {}))
        if label in slices:
            return label
    return next(iter(slices), "")


def _strengths(summary: dict[str, Any], point: dict[str, Any]) -> list[CriticalStrength]:
    """The labelled strengths of the slice ``point`` belongs to (``critical_strength`` of the summary)."""
    block = summary.get("critical_strength") or strength_block(summary)
    entry = block["slices"].get(point_label(_slice_of(point))) or {}
    return [CriticalStrength.from_dict(d) for d in entry.get("strengths") or []]


def critical_lines(summary: dict[str, Any]) -> list[str]:
    """The terminal's critical-strength lines besides the headline's recommendation (which they do not repeat): for
    the headline's slice, per push (O1, C2 at its M), the other kinds' numbers (``other estimates for O1: …``); for
    every other slice of a multi-key sweep its own recommendation with its kind and source; and, for a W sweep,
    whether the first-order prediction is within the tolerance of the measured W."""
    block = summary.get("critical_strength") or strength_block(summary)
    lines = []
    for label, entry in block["slices"].items():
        if entry.get("floor"):
            lines.append(f"critical W{' at ' + label if label else ''}: none: the target sits at GRPO's floor (every "
                         "GRPO seed ends inside the band): nothing to hold")
            continue
        strengths = [CriticalStrength.from_dict(d) for d in entry.get("strengths") or []]
        base = entry.get("point") == block.get("slice")
        for m in dict.fromkeys(x.m for x in strengths):
            tol = _tolerance_text(summary, entry["point"], m)
            if base:
                also = also_text(strengths, m)
                if also or tol:
                    lines.append(f"other estimates for {variant_label(m)}: {also or 'none'}{tol}")
                continue
            text = recommendation_text(strengths, m)
            if text is not None:
                lines.append(f"critical W{' at ' + label if label else ''}: {text}{tol}")
    return lines


def auto_lines(summary: dict[str, Any]) -> list[str]:
    """One line per auto-schedule group (:func:`stare_lab.theory.critical.auto_line`): how many seeds held, the W it
    found with its range, the mean balance W, its cap when W sat there, and the measured critical W of the same
    variant when a fixed-W sweep ran in the same slice; prefixed with the slice in a multi-key sweep."""
    block = summary.get("critical_strength") or strength_block(summary)
    many = len(block.get("slices") or {}) > 1
    lines = []
    for label, entry in (block.get("slices") or {}).items():
        strengths = [CriticalStrength.from_dict(d) for d in entry.get("strengths") or []]
        for e in entry.get("auto") or []:
            lines.append((f"at {label}: " if many and label else "") + auto_line(e, strengths))
    return lines


def _tolerance_text(summary: dict[str, Any], sl: dict[str, Any], m: float | None) -> str:
    """``; first-order prediction within the tolerance 0.105 of the measured W (o1)`` for the W-sweep methods of
    this slice and M."""
    out = []
    for method, c in (summary.get("critical") or {}).items():
        for entry in (c.get("by_slice") or {}).values():
            ok = entry.get("predicted_w_within_tolerance")
            if ok is None or _slice_of(entry.get("point") or {}) != sl or _num(entry.get("m")) != m:
                continue
            out.append(f"; predicted {_f(entry.get('predicted_w'))} is {'within' if ok else 'outside'} the tolerance "
                       f"{_f(entry.get('tolerance'))} of the measured W ({method})")
    return "".join(out)


def headline(summary: dict[str, Any]) -> str:
    """One line that says what happened: the core's verdict (:func:`stare_lab.platform.verdict.verdict`: which methods
    collapsed, which STARE settings held the band and at what reward, which did not), then the one recommended
    critical W per push with its kind (:func:`stare_lab.theory.critical.recommended_clause` of
    ``critical_strength``, :func:`strength_block`)."""
    facts = group_facts(summary)
    groups = [{"label": label, "method": f["method"], "stare": f["stare"], "n": f["n"], "held": f["held"],
               "collapsed": f["collapsed"], "below": f["below"],
               **{k: v for k, v in f["mean"].items() if k not in ("held", "collapsed", "below")},
               "slice": {k: v for k, v in f["point"].items() if not k.startswith("loss.stare.")}}
              for label, f in facts.items()]
    parts = [verdict(groups, per_setting="critical" not in summary)] if groups else []
    block = summary.get("critical_strength") or strength_block(summary)
    clause = recommended_clause(block)
    if clause:
        parts.append(clause + ("; every slice below" if len(block.get("slices") or {}) > 1 else ""))
    return "; ".join(parts) if parts else "no runs"


def sweep_notes(summary: dict[str, Any]) -> list[str]:
    """The notes of the module docstring for a sweep summary (``simulators.sweep.run_sweep``); [] if none."""
    facts = group_facts(summary)
    notes: list[str] = []
    warned = set()
    below: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for label, g in facts.items():  # the regime first, for every group (a held band too: it held outside the theory)
        ratio = _num(g["mean"].get("push_ratio"))
        if ratio is None or ratio >= REGIME_RATIO or (g["stare"] is not None and g["held"] != g["n"]):
            continue
        warned.add(label)
        what = "its push acted" if g["stare"] is not None and (_num(g["mean"].get("gate_on_frac")) or 0) > 0 else \
            "a probe push (W − 1 on L+, not applied) acted"
        notes.append(f"warning: {label} stepped outside the first-order regime (lr={_f(g['lr'], 'g')}): {what} at "
                     f"{ratio:.0%} of its first-order size (median over steps and seeds), so the first-order "
                     "predictions (D terms, W*) do not describe it; lower lr (docs/theory.md §7)")
    for label, g in facts.items():
        st = g["stare"]
        if st is None or g["held"] == g["n"]:
            continue
        m = g["mean"]
        gate = _num(m.get("gate_on_frac")) or 0.0
        if st.get("gate") == "never":
            notes.append(f"note: {label} ended like GRPO because the gate is disabled (stare.gate=never: the STARE "
                         "weights are never applied); use stare.gate=entropy (the paper's gate) to see STARE act")
            continue
        if gate == 0:
            notes.append(f"note: {label} never acted: the gate never opened (the entropy stayed above "
                         f"H_tgt={_f(m.get('target_entropy'))}); raise stare.target_entropy (or target_entropy_rel) "
                         "or run more steps to see STARE act")
            continue
        ref = _grpo_for(facts, g)
        ratio = _num(m.get("push_ratio"))
        wrong = _wrong_direction(g, ref)
        if (ratio is not None and ratio < REGIME_RATIO) or wrong:
            why = []
            if ratio is not None and ratio < REGIME_RATIO:
                why.append(f"its push acted at {ratio:.0%} of its first-order size")
            if wrong:
                why.append(wrong)
            notes.append(f"note: {label} is outside the first-order regime (lr={_f(g['lr'], 'g')}): "
                         f"{' and '.join(why)}; one step moves the policy too far for the reweighting to act as the "
                         "theory says, so a stronger W does not help here: lower lr (docs/theory.md §7)")
            continue
        if _below_measured(g, summary):  # a W sweep's grid point below the W it measured: said once per method
            below.setdefault((g["method"], point_label(_slice_of(g["point"]))), []).append(g)
            continue
        if ref is not None and not _grpo_fell(ref):
            notes.append(f"note: GRPO did not collapse at these settings (its entropy ended at "
                         f"{_f(ref['mean'].get('final_entropy'))} nats, not below the band around H_tgt="
                         f"{_f(m.get('target_entropy'))}), so {label} not holding the band is not a sign of a weak "
                         "push: there is no drift below the target to cancel; run more steps or lower the target")
            continue
        notes.append(_weak_push_note(label, g, st, ref, summary))
    notes += [_below_note(gs, summary) for gs in below.values()]
    notes += _cap_notes(facts)
    notes += _grid_direction_notes(facts)
    return notes


def _below_measured(g: dict[str, Any], summary: dict[str, Any]) -> bool:
    """A fixed-W group at a point of a W sweep whose slice and push recommend a *measured* W above the group's W."""
    st = g["stare"]
    w = _fixed_w(st)
    if w is None or W_KEY not in g["point"]:
        return False
    rec = recommend(_strengths(summary, g["point"]), _m_of(st))
    return rec is not None and rec.kind == "measured" and (rec.w is None or rec.w > w)


def _below_note(groups: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """One note for the grid points of a W sweep below the W it measured (:func:`_below_measured`): they did not hold
    the band, as the measurement says; the recommendation is referred to, not repeated."""
    g = groups[0]
    st = g["stare"]
    rec = recommend(_strengths(summary, g["point"]), _m_of(st))
    ws = ", ".join(f"{_fixed_w(x['stare']):g}" for x in groups)
    seeds = ", ".join(f"{x['n'] - x['held']}/{x['n']}" for x in groups)
    target = rec.w if rec.w is not None else rec.low
    return (f"note: {g['method']} at W={ws} did not hold the band (on {seeds} seeds): the push is below the "
            f"recommended W {_said_where(summary, g['point'], _m_of(st))}, which the W sweep measured; try "
            f"{_raise_tip(st, target, rec.lower_bound, above=rec.w is None, refer=True)} (docs/theory.md §7)")


def _cap_notes(facts: dict[str, dict[str, Any]]) -> list[str]:
    """A note for every adaptive group that held the band with W near its cap (:func:`stare_lab.platform.verdict.near_cap`):
    the mean W over the second half and the share of those steps at the cap, and what that means."""
    notes = []
    for label, g in facts.items():
        st = g["stare"]
        if st is None or not st.get("adaptive") or g["held"] != g["n"]:
            continue
        text = cap_text({"stare": st, **g["mean"]})
        if text:
            notes.append(f"note: {label} held the band with W near its cap ({text}, seed means): the schedule has "
                         f"little headroom left, so a harder drift (another task, sampling noise, a longer run) can "
                         f"break it; set stare.{cap_key(st)} above {_f(w_cap(st), 'g')} for a margin, or a fixed "
                         "stare.reweight_w at the recommended critical W (docs/theory.md §7)")
    return notes


def _auto_method(st: dict[str, Any]) -> str:
    """The auto-schedule method of a group's variant: ``c2-auto`` for C2, else ``o1-auto``."""
    return "c2-auto" if str(st.get("variant", "")).upper() == "C2" else "o1-auto"


def _raise_tip(st: dict[str, Any], w: float, lower: str = "", above: bool = False, refer: bool = False) -> str:
    """How to get a W of at least ``w`` (``above``: more than ``w``, which failed): the fixed weight, or the adaptive
    schedule's cap (which bounds W). ``lower``: why ``w`` is only a lower bound of the critical W — then no W is
    offered as enough: a W sweep from ``w`` up measures it. ``refer``: ``w`` is the recommended W said elsewhere
    (the headline): the tip calls it "it" instead of repeating it (a sweep's grid still starts from it)."""
    it = "it" if refer else f"{w:.2f}"
    if lower:
        grid = ",".join(f"{1 + (w - 1) * k:.3g}" for k in (1, 1.5, 2, 3))
        why = "" if refer else f": {lower}"
        if st.get("adaptive"):
            return (f"stare.{cap_key(st)} well above {it} ({it} is only a lower bound here{why}; the adaptive "
                    f"schedule's cap on W, now {_f(w_cap(st), 'g')})")
        return (f"a W sweep from {it} up, e.g. --sweep stare.reweight_w={grid} ({it} is only a lower bound "
                f"here, not a W that suffices{why}), or {_auto_method(st)}")
    rel = "above" if above else "≥" if not refer else "at or above"
    if st.get("adaptive"):
        return f"stare.{cap_key(st)} {rel} {it} (the adaptive schedule's cap on W, now {_f(w_cap(st), 'g')})"
    return f"a fixed stare.reweight_w {rel} {it}, or {_auto_method(st)} (it finds its W itself)"


def _auto_note(head: str, g: dict[str, Any], st: dict[str, Any]) -> str:
    """Case 4 for an auto-schedule group: its W sat at its cap (raise it), or the schedule did not settle."""
    share, cap = _num(g["mean"].get("w_cap_share")), _f(w_cap(st), "g")
    if share:
        return (f"{head}: its W sat at its cap stare.auto_w_max={cap} on {share:.0%} of the steps from the crossing "
                "on (seed mean): the push the band needs is above the cap, and the W it found is only a lower bound; "
                f"raise stare.auto_w_max (docs/theory.md §7)")
    return (f"{head}: the auto schedule did not settle (its W stayed below its cap {cap}), so the W it found is only "
            "a lower bound; run more steps (docs/theory.md §7)")


def _weak_push_note(label: str, g: dict[str, Any], st: dict[str, Any], ref: dict[str, Any] | None,
                    summary: dict[str, Any]) -> str:
    """Case 4 of the module docstring: a group in the regime, gate opened, GRPO fell, band not held."""
    head = f"note: {label} did not hold the band on {g['n'] - g['held']}/{g['n']} seeds"
    crossing, steps = _seed_median(g, "crossing_step"), _seed_median(g, "steps")
    if crossing is not None and steps and crossing > steps / 2:
        return (f"{head}: its entropy first reached H_tgt at step {crossing:.0f} of {steps:.0f}, inside the second "
                "half over which the band is judged, so the controller had no time to settle; run more steps")
    w_now = _num(st.get("reweight_w")) or 1.0
    if st.get("adaptive"):
        w_now = _num(w_cap(st)) or w_now
    capped = cap_text({"stare": st, **g["mean"]}) if st.get("adaptive") else None
    cap = f" (its W sat near the cap: {capped})" if capped else ""
    if _is_auto(st):
        return _auto_note(head, g, st)
    strengths = _strengths(summary, g["point"])
    rec = recommend(strengths, _m_of(st))
    where = _said_where(summary, g["point"], _m_of(st))
    if rec is not None and rec.kind != "conservative" and (rec.w is None or rec.w > w_now):
        target = rec.w if rec.w is not None else rec.low
        return (f"{head}: at {push_label(st)} the push is below the recommended W {where}{cap}; try "
                f"{_raise_tip(st, target, rec.lower_bound, above=rec.w is None, refer=True)} (docs/theory.md §7)")
    c2 = st.get("variant") == "C2"
    # W* where the entropy first crosses H_tgt: the group's own value (with its M for C2; the trajectory equals
    # GRPO's up to the crossing), else GRPO's (M = 1)
    est, src = _seed_median(g, "w_star_at_crossing"), g
    if est is None or not c2:
        theirs = _seed_median(ref, "w_star_at_crossing") if ref else None
        est, src = (theirs, ref) if theirs else (est, g)
    est_what = f"with M={_f(st.get('reweight_m'), 'g')}" if c2 and _seed_median(g, "w_star_at_crossing") else "for O1"
    own = _seed_median(g, "critical_w")  # the first-order critical W along this group's own runs (second half)
    # a first-order W from sampled rollouts or an under-acting push is only a lower bound (docs/theory.md §7)
    lower_own = lower_bound_reason(g["runs"] or [g["mean"]], g["sampled"])
    lower_est = lower_bound_reason(src["runs"] or [src["mean"]], src["sampled"]) if src else ""
    if est is not None and est <= w_now and own is not None and own > w_now:
        return (f"{head}: at {push_label(st)} the push is below the critical strength along its own runs (first-order "
                f"W* over the second half ≈ {own:.2f}, median over seeds), although W* where the entropy crosses "
                f"H_tgt is {est:.2f}: the drift to cancel grew after the crossing; try "
                f"{_raise_tip(st, own, lower_own)} (docs/theory.md §7)")
    if est is not None and est <= w_now:  # the first order says this W suffices, and it did not: second order
        return (f"{head} although the first-order estimate where the entropy crosses H_tgt (W* ≈ {est:.2f} "
                f"{est_what}, median over seeds) is below W={w_now:g}: the drift at H_tgt is then mostly second "
                "order (sampling noise, ∝ lr²), which the D terms leave out; try a larger push "
                "(" + ("stare.w_max / stare.m_min" if st.get("adaptive") else
                       "stare.reweight_w / reweight_m, " + _auto_method(st)) + ")"
                " or a smaller lr (docs/theory.md §7)")
    said = rec is not None and rec.kind == "conservative" and est is not None and rec.w is not None and \
        math.isclose(rec.w, est, rel_tol=1e-9)  # the headline's recommendation: referred to, not repeated
    if said:
        est_s = f" (the recommended W {where}: the conservative first-order estimate where the entropy crosses H_tgt)"
    else:
        est_s = (f" (recommended: the conservative first-order estimate {est_what} where the entropy crosses H_tgt, "
                 f"median over seeds: W* ≈ {est:.2f}" + (", a lower bound" if lower_est else "") + ")"
                 ) if est is not None else ""
    tip = _raise_tip(st, est, lower_est, refer=said) if est is not None else (
        f"a larger stare.{cap_key(st)}" if st.get("adaptive") else
        f"a larger stare.reweight_w / smaller reweight_m or {_auto_method(st)}")
    return (f"{head}: at {push_label(st)} the push is below the critical strength{cap}{est_s}; try {tip} "
            "(docs/theory.md §7)")


def _said_where(summary: dict[str, Any], point: dict[str, Any], m: float | None) -> str:
    """Where the recommended W of a group's slice and push is said: ``for O1 (first line)`` for the headline's
    slice, ``for O1 at lr=0.5 (its line above)`` for another slice of the grid."""
    block = summary.get("critical_strength") or strength_block(summary)
    label = point_label(_slice_of(point))
    entry = (block.get("slices") or {}).get(label) or {}
    base = entry.get("point", _slice_of(point)) == block.get("slice")
    return f"for {variant_label(m)}" + (" (first line)" if base else f" at {label} (its line above)")


def _grpo_fell(ref: dict[str, Any]) -> bool:
    """GRPO collapsed (a seed fell below 10 % of its initial entropy) or its entropy ended below the band
    (final H < H_tgt − 0.05 nats on average): there is a drift below the target for STARE to cancel."""
    if ref["collapsed"]:
        return True
    h, tgt = _num(ref["mean"].get("final_entropy")), _num(ref["mean"].get("target_entropy"))
    return h is not None and tgt is not None and h < tgt - 0.05


def _wrong_direction(g: dict[str, Any], ref: dict[str, Any] | None) -> str | None:
    """Why the push moved the entropy the wrong way against GRPO (same grid slice), or None."""
    if ref is None:
        return None
    m, r = g["mean"], ref["mean"]
    h, hr = _num(m.get("final_entropy")), _num(r.get("final_entropy"))
    tgt = _num(m.get("target_entropy")) or 0.0
    if h is not None and hr is not None and h < hr - 0.05 * max(hr, tgt):
        return f"it ended below GRPO's entropy ({h:.3g} vs {hr:.3g} nats)"
    c, cr = _num(m.get("steps_to_collapse")), _num(r.get("steps_to_collapse"))
    if c is not None and cr is not None and g["collapsed"] and c < 0.9 * cr:
        return f"it collapsed earlier than GRPO (step {c:.0f} vs {cr:.0f})"
    return None


def _grid_direction_notes(facts: dict[str, dict[str, Any]]) -> list[str]:
    """A note when, in a W grid, a larger W ended with clearly less entropy than a smaller one (same method and
    other grid keys): the push then acts against its first-order direction."""
    series: dict[tuple, list[tuple[float, float]]] = {}
    for g in facts.values():
        w = g["point"].get(W_KEY)
        h = _num(g["mean"].get("final_entropy"))
        if g["stare"] is None or w is None or h is None:
            continue
        other = tuple(sorted((k, repr(v)) for k, v in g["point"].items() if k != W_KEY))
        series.setdefault((g["method"], other), []).append((float(w), h))
    notes = []
    for (method, other), pts in series.items():
        pts.sort()
        drops = [(a, b) for a, b in zip(pts, pts[1:]) if b[1] < a[1] - 0.05 * max(a[1], 1e-9) - 0.01]
        if drops:
            (w1, h1), (w2, h2) = drops[0]
            where = ", ".join(f"{k}={v}" for k, v in other)
            notes.append(f"note: {method}{' at ' + where if where else ''}: W={w2:g} ended with less entropy than "
                         f"W={w1:g} ({h2:.3g} vs {h1:.3g} nats): a stronger push lowered the entropy, so the step size "
                         "is outside the first-order regime; lower lr rather than raising W (docs/theory.md §7)")
    return notes


def plan_notes(plan) -> list[str]:
    """One-line notes about the request itself (not its results), printed with the other notes:

    * ``kl_cov`` with one on-policy update per rollout batch (tabular: always; transformer: ``updates_per_batch``
      = 1): ρ ≡ 1, so log ρ = 0 and the gradient of its penalty β·|log ρ| is 0 — it equals GRPO.
    * ``loss.stare.*`` overrides when no method of the sweep uses the STARE loss: they change no update.
    * a STARE target above the reward-optimal entropy of a tabular task
      (:func:`simulators.tabular.runner.target_warning`);
    * an auto-schedule method in a sweep over a key it ignores (:func:`simulators.grid.inert_keys`): it runs once
      (not said for the preset's own grid, whose description says it).
    """
    notes = []
    own = parse_grid(list(get_preset(plan.preset).get("sweep") or []))  # the preset's own story says it elsewhere
    swept = [k for k, _ in plan.grid] if plan.grid != own else []
    for m in plan.methods:
        unused = [k for k in swept if k in inert_keys(m)]
        if unused:
            notes.append(f"note: {m} ran once per point of the other grid keys: the auto schedule sets W itself, so "
                         f"--sweep {', '.join(unused)} does not change its runs")
    first = {}
    for (label, seed), c in plan.configs.items():
        first.setdefault(plan.groups.get(label, {}).get("method", label), c)
    single = [m for m, c in first.items() if m == "kl_cov" and int(getattr(c, "updates_per_batch", 1)) == 1]
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
    if stare_items and not any(g.get("stare") for g in plan.groups.values()):
        stare_methods = [m for m, spec in METHODS.items() if loss_needs(spec["loss"]["loss_mode"]).stare]
        shown = " ".join(o[len("loss."):] if o.startswith("loss.stare.") else o for o in stare_items)
        tgt = any(o.split("=", 1)[0].strip() == "loss.stare.target_entropy" for o in stare_items)
        notes.append(
            f"note: {shown} change{'s' if len(stare_items) == 1 else ''} no update: none of the methods run "
            f"({','.join(plan.methods)}) uses the STARE loss; add one of {','.join(stare_methods)} to --methods"
            + (" (stare.target_entropy still sets the table's H_tgt / in_band reference)" if tgt else "")
        )
    if plan.kind == "tabular":
        notes += _target_notes(plan)
    return notes


def _target_notes(plan) -> list[str]:
    seen, notes = set(), []
    for c in plan.configs.values():
        if not c.is_stare:
            continue
        cfg = copy.deepcopy(c)
        state = init_state(cfg)  # resolves a relative target; cheap (tables only)
        warn = target_warning(cfg, reward_optimal_entropy(cfg, state.correct))
        if warn and warn not in seen:
            seen.add(warn)
            notes.append("note: " + warn)
    return notes
