"""The end-of-sweep notes and headline (simulators.notes) on constructed summaries: they reason from direction and
regime — never "stronger W" when the push acted outside the regime or lowered the entropy, nothing about a weak
push when GRPO did not collapse."""

from __future__ import annotations

from simulators.notes import headline, sweep_notes

W_KEY = "loss.stare.reweight_w"


def summary(groups, lr=1.0, seeds=3, mode="expected"):
    """groups: label → (method, point, mean-stats dict, stare dict or None); mean field (``mode``) and pushes at
    their first-order size unless given: first-order Ws that are not lower bounds."""
    methods, config = {}, {}
    for label, (method, point, mean, stare) in groups.items():
        base = {"initial_entropy": 1.74, "target_entropy": 0.4, "gate_on_frac": 0.6, "push_ratio": 1.0,
                "held_runs": 0, "collapsed_runs": 0, "final_reward": 0.9}
        methods[label] = {"method": method, "point": point, "stare": stare is not None, "mean": {**base, **mean}}
        loss = {"loss_mode": "stare", "stare": {"reweight_w": 1.1, "reweight_m": 0.9, "variant": "O1",
                                                 "adaptive": False, "gate": "entropy", **(stare or {})}}
        config[f"{label}/seed0"] = {"lr": lr, "mode": mode,
                                    "loss": loss if stare is not None else {"loss_mode": "grpo"}}
    return {"seeds": list(range(seeds)), "methods": methods, "config": config}


GRPO_COLLAPSED = ("grpo", {}, {"final_entropy": 0.16, "collapsed_runs": 3, "steps_to_collapse": 510,
                               "w_star_at_crossing": 1.47, "gate_on_frac": 0.0}, None)


def test_in_regime_too_weak_gives_the_critical_estimate():
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1": ("o1", {}, {"final_entropy": 0.27, "mean_abs_dev_second_half": 0.126}, {})})
    notes = sweep_notes(s)
    assert len(notes) == 1
    assert "o1 did not hold the band on 3/3 seeds" in notes[0] and "below the critical strength" in notes[0]
    assert "W* ≈ 1.47)" in notes[0] and "stare.reweight_w ≥ 1.47, or o1-auto" in notes[0]


def test_outside_the_regime_never_says_stronger():
    """lr 6: the push acted at 18 % of its first-order size, and O1 ended below GRPO: regime note only."""
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1": ("o1", {}, {"final_entropy": 0.08, "push_ratio": 0.18, "collapsed_runs": 3,
                                   "steps_to_collapse": 300}, {"reweight_w": 5.0})}, lr=6.0)
    notes = sweep_notes(s)
    assert len(notes) == 1
    assert "outside the first-order regime (lr=6)" in notes[0] and "18% of its first-order size" in notes[0]
    assert "ended below GRPO's entropy" in notes[0] and "lower lr" in notes[0]
    assert "stronger W does not help" in notes[0]
    assert "try" not in notes[0] and "critical strength" not in notes[0]


def test_wrong_direction_alone_is_a_regime_note():
    """Push ratio fine, but STARE collapsed earlier than GRPO (step 16 vs 42): the push acts against its direction."""
    grpo = ("grpo", {}, {"final_entropy": 0.08, "collapsed_runs": 3, "steps_to_collapse": 42, "gate_on_frac": 0.0}, None)
    s = summary({"grpo": grpo, "o1": ("o1", {}, {"final_entropy": 0.079, "collapsed_runs": 3,
                                                  "steps_to_collapse": 16}, {})})
    notes = sweep_notes(s)
    assert len(notes) == 1 and "collapsed earlier than GRPO (step 16 vs 42)" in notes[0]
    assert "critical strength" not in notes[0]


def test_no_weak_push_note_when_grpo_did_not_collapse():
    grpo = ("grpo", {}, {"final_entropy": 0.7, "collapsed_runs": 0, "gate_on_frac": 0.0}, None)
    s = summary({"grpo": grpo, "c2": ("c2", {}, {"final_entropy": 0.72, "mean_abs_dev_second_half": 0.3},
                                      {"variant": "C2"})})
    notes = sweep_notes(s)
    assert len(notes) == 1 and notes[0].startswith("note: GRPO did not collapse at these settings")
    assert "weak" in notes[0] and "not a sign of a weak push" in notes[0]
    assert "critical strength" not in notes[0] and "try" not in notes[0]
    assert headline(s).startswith("grpo did not collapse (H 1.74 -> 0.7 nats)")


def test_gate_never_opened_and_gate_disabled():
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1": ("o1", {}, {"final_entropy": 1.5, "gate_on_frac": 0.0}, {}),
                 "c2": ("c2", {}, {"final_entropy": 0.16, "gate_on_frac": 0.0}, {"gate": "never", "variant": "C2"})})
    notes = sweep_notes(s)
    assert any("o1 never acted: the gate never opened" in n and "raise stare.target_entropy" in n for n in notes)
    assert any("c2 ended like GRPO because the gate is disabled (stare.gate=never" in n for n in notes)
    assert len(notes) == 2


def test_held_gives_no_note_and_leads_the_headline():
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1-adaptive": ("o1-adaptive", {}, {"final_entropy": 0.4, "held_runs": 3,
                                                     "mean_abs_dev_second_half": 0.001}, {"adaptive": True}),
                 "o1": ("o1", {}, {"final_entropy": 0.27, "mean_abs_dev_second_half": 0.126}, {})})
    notes = sweep_notes(s)
    assert len(notes) == 1 and notes[0].startswith("note: o1 did not hold")
    line = headline(s)
    assert line.startswith("grpo collapsed on 3/3 seeds (H 1.74 -> 0.16 nats, ~step 510)")
    assert "o1-adaptive held H_tgt=0.4 on 3/3 seeds" in line and "reward 0.9 (grpo 0.9)" in line
    assert "not held: o1 (W=1.1: 0/3 seeds, |H-H_tgt| 0.126)" in line


def test_grid_where_a_larger_w_ended_lower_is_flagged():
    groups = {"grpo": GRPO_COLLAPSED}
    for w, h in ((1.1, 0.10), (2.0, 0.09), (5.0, 0.05)):
        groups[f"o1 [W={w:g}]"] = ("o1", {W_KEY: w}, {"final_entropy": h, "push_ratio": 0.9}, {"reweight_w": w})
    notes = sweep_notes(summary(groups, lr=6.0))
    grid = [n for n in notes if "ended with less entropy than" in n]
    assert len(grid) == 1 and "W=5 ended with less entropy than W=2 (0.05 vs 0.09 nats)" in grid[0]
    assert not any("critical strength" in n for n in notes)


def test_a_band_held_outside_the_regime_is_still_a_warning():
    """forking preset at W 8: the band holds, but the push acts at 19 % of its first-order size."""
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1 [W=8]": ("o1", {W_KEY: 8.0}, {"final_entropy": 0.3, "held_runs": 3, "push_ratio": 0.19,
                                                    "mean_abs_dev_second_half": 0.001}, {"reweight_w": 8.0})})
    notes = sweep_notes(s)
    assert notes == [n for n in notes if n.startswith("warning: o1 [W=8] stepped outside the first-order regime")]
    assert len(notes) == 1 and "19% of its first-order size" in notes[0] and "lower lr" in notes[0]


def test_a_first_order_estimate_below_the_failed_w_points_to_second_order():
    """random-reward: W* at GRPO's crossing 1.06 < W = 1.1, yet O1 did not hold: the note says the drift is mostly
    second order and does not claim that W ≥ 1.06 suffices."""
    grpo = ("grpo", {}, {"final_entropy": 0.17, "collapsed_runs": 3, "steps_to_collapse": 2818,
                         "w_star_at_crossing": 1.06, "gate_on_frac": 0.0}, None)
    s = summary({"grpo": grpo, "o1": ("o1", {}, {"final_entropy": 0.54, "mean_abs_dev_second_half": 0.22}, {})})
    notes = sweep_notes(s)
    assert len(notes) == 1 and "mostly second order" in notes[0] and "W* ≈ 1.06" in notes[0]
    assert "≥ 1.06" not in notes[0]


def test_own_critical_w_above_the_failed_w_says_below_critical_along_the_run():
    """transformer preset: W* at GRPO's crossing 2.05 < W = 5, but along the O1 run itself the second-half W* is
    6.17 > 5 (and 4.03 < 5 along C2, which held): the note names the run's own estimate, not second order."""
    grpo = ("grpo", {}, {"final_entropy": 0.12, "collapsed_runs": 1, "steps_to_collapse": 136,
                         "w_star_at_crossing": 2.05, "gate_on_frac": 0.0}, None)
    s = summary({"grpo": grpo, "o1": ("o1", {}, {"final_entropy": 0.57, "mean_abs_dev_second_half": 0.09,
                                                 "critical_w": 6.17}, {"reweight_w": 5.0})}, seeds=1)
    notes = sweep_notes(s)
    assert len(notes) == 1 and "below the critical strength along its own runs" in notes[0]
    assert "≈ 6.17" in notes[0] and "entropy crosses H_tgt is 2.05" in notes[0]
    assert "stare.reweight_w ≥ 6.17, or o1-auto" in notes[0] and "second order" not in notes[0]


def test_c2_quotes_its_own_crossing_estimate_and_adaptive_names_w_max():
    """demo: C2's own W* at the crossing (with its M = 0.9) is 1.25, O1's (GRPO's) 1.35: the C2 note quotes 1.25;
    an adaptive group is told to raise w_max (its schedule's cap), not reweight_w."""
    s = summary({"grpo": GRPO_COLLAPSED,
                 "c2": ("c2", {}, {"final_entropy": 0.357, "mean_abs_dev_second_half": 0.051, "held_runs": 2,
                                   "w_star_at_crossing": 1.25}, {"variant": "C2"}),
                 "o1-adaptive": ("o1-adaptive", {}, {"final_entropy": 0.30, "mean_abs_dev_second_half": 0.1,
                                                     "w_star_at_crossing": 1.47},
                                 {"adaptive": True, "w_max": 1.3})})
    notes = sweep_notes(s)
    c2 = next(n for n in notes if n.startswith("note: c2"))
    assert "W* ≈ 1.25" in c2 and "with M=0.9" in c2 and "1.47" not in c2
    ad = next(n for n in notes if n.startswith("note: o1-adaptive"))
    assert "stare.w_max ≥ 1.47" in ad and "now 1.3" in ad and "reweight_w" not in ad


def test_a_crossing_in_the_second_half_says_run_longer():
    """40-step transformer run: the entropy first reached H_tgt at step 30 of 40, so the band (judged over steps
    21–40) says nothing about the push: the note asks for more steps instead of blaming second order."""
    s = summary({"grpo": GRPO_COLLAPSED,
                 "c2": ("c2", {}, {"final_entropy": 0.5, "mean_abs_dev_second_half": 0.12, "crossing_step": 30,
                                   "steps": 40, "w_star_at_crossing": 1.2}, {"variant": "C2", "reweight_w": 5.0})})
    (note,) = sweep_notes(s)
    assert "step 30 of 40" in note and "run more steps" in note and "second order" not in note


def test_adaptive_at_its_cap_is_said_in_the_verdict_and_the_notes():
    """demo: o1-adaptive holds the band with W 1.46 on average over the second half at w_max 1.5 (15 % of those
    steps at the cap): near the cap (1.46 ≥ 1 + 0.8·0.5 = 1.4), so the headline and a note say so with both numbers;
    the same group at mean W 1.2 (0 % at the cap) is not near it and gets neither."""
    def s(w_mean, share):
        return summary({"grpo": GRPO_COLLAPSED,
                        "o1-adaptive": ("o1-adaptive", {}, {"final_entropy": 0.4, "held_runs": 3,
                                                            "mean_abs_dev_second_half": 0.001,
                                                            "w_mean_second_half": w_mean, "w_cap_share": share},
                                        {"adaptive": True, "w_max": 1.5})})
    capped = s(1.46, 0.15)
    (note,) = sweep_notes(capped)
    assert note.startswith("note: o1-adaptive held the band with W near its cap (mean W 1.46 over the second half, "
                           "at the cap w_max=1.5 on 15% of those steps")
    assert "stare.w_max above 1.5" in note
    assert "o1-adaptive held it with W near its cap (mean W 1.46" in headline(capped)
    calm = s(1.2, 0.0)
    assert sweep_notes(calm) == [] and "near its cap" not in headline(calm)


def test_headline_and_note_name_one_recommended_w_with_its_kind():
    """demo without a W sweep: o1-adaptive's 3 runs held the band with critical W (largest W*(t) over the second
    half) 1.28, 1.30, 1.36 → predicted 1.30; GRPO's W* at the crossing 1.34, 1.35, 1.7 → conservative 1.35. The
    recommendation is the predicted 1.3 (predicted > conservative), said once, in the headline with its kind; the
    o1 note refers to it without repeating it, and tells to try a fixed W at or above it."""
    held = {"mean_abs_dev_second_half": 0.0005, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4}
    s = summary({"grpo": GRPO_COLLAPSED,
                 "o1-adaptive": ("o1-adaptive", {}, {"final_entropy": 0.4, "held_runs": 3,
                                                     "mean_abs_dev_second_half": 0.0005}, {"adaptive": True}),
                 "o1": ("o1", {}, {"final_entropy": 0.27, "mean_abs_dev_second_half": 0.126}, {})})
    s["methods"]["grpo"]["runs"] = {f"seed{i}": {"w_star_at_crossing": w} for i, w in enumerate((1.34, 1.35, 1.7))}
    s["methods"]["o1-adaptive"]["runs"] = {f"seed{i}": {**held, "critical_w": w}
                                           for i, w in enumerate((1.28, 1.30, 1.36))}
    line = headline(s)
    assert "recommended W: O1 1.3 (predicted: range 1.28–1.36; 3 held runs of o1-adaptive)" in line
    note = next(n for n in sweep_notes(s) if n.startswith("note: o1 did not hold"))
    assert "below the recommended W for O1 (first line)" in note and "1.3" not in note.replace("§7", "")
    assert "try a fixed stare.reweight_w at or above it, or o1-auto" in note


def test_recommendation_agrees_with_promote_on_a_w_that_held():
    """Issue 29: simulate recommended W 1.12 while promote called the W 1.1 that held on every seed "an upper bound of
    the critical W". c2 at W 1.1, M 0.9 held 3/3 (its runs' first-order critical W 1.10–1.14, predicted 1.12): the
    headline now recommends 1.1 at M 0.9 as an upper bound, the words promote uses for the same runs."""
    from trainer.planning.promote_sources import own_w_text

    held = {"mean_abs_dev_second_half": 0.001, "target_entropy": 0.4, "band": 0.05, "final_entropy": 0.4,
            "push_ratio": 1.0}
    s = summary({"grpo": GRPO_COLLAPSED,
                 "c2": ("c2", {}, {"final_entropy": 0.4, "held_runs": 3, "mean_abs_dev_second_half": 0.001},
                        {"variant": "C2"})})
    s["methods"]["c2"]["runs"] = {f"seed{i}": {**held, "critical_w": w} for i, w in enumerate((1.10, 1.12, 1.14))}
    line = headline(s)
    assert "recommended W: C2 (M=0.9) 1.1 (measured: range ≤ 1.1" in line
    assert "an upper bound of the critical W" in line and "1.12 (predicted" not in line
    promote = own_w_text({"held": [True] * 3, "stare": {"reweight_w": 1.1, "reweight_m": 0.9, "variant": "C2"}},
                         "c2", ["runs/c2"])
    assert promote.startswith("1.1 at M=0.9") and "an upper bound of the critical W" in promote


def test_a_plugin_baseline_is_not_pooled_into_grpos_conservative_w():
    """Issue 29: "1.6 (… 4 runs of grpo, half-grpo)" where GRPO alone gives 1.43: the sweep's critical-W block takes
    GRPO's runs only (W* 1.4, 1.43, 1.46 → 1.43), not a plugin baseline's (2.0, 2.1)."""
    from simulators.notes import strength_block

    s = summary({"grpo": GRPO_COLLAPSED, "half-grpo": ("half-grpo", {}, {"final_entropy": 0.2}, None)})
    s["methods"]["grpo"]["runs"] = {f"seed{i}": {"w_star_at_crossing": w} for i, w in enumerate((1.4, 1.43, 1.46))}
    s["methods"]["half-grpo"]["runs"] = {f"seed{i}": {"w_star_at_crossing": w} for i, w in enumerate((2.0, 2.1))}
    rec = strength_block(s)["recommended"]
    assert rec["kind"] == "conservative" and rec["w"] == 1.43 and rec["source"] == "3 runs of grpo"
