"""stare_lab.platform.verdict: the held count never counts a collapsed run, and the adaptive-cap clause (hand-made runs)."""

from __future__ import annotations

from stare_lab.platform.summary import run_summary
from stare_lab.platform.verdict import group_outcome, near_cap, verdict


def _run(entropies, target):
    return run_summary([{"step": i, "entropy": h, "reward": 0.9} for i, h in enumerate(entropies)],
                       target_entropy=target, band=0.05)


def test_a_collapsed_stare_group_is_not_held():
    """H_tgt 0.08: a run that fell from 1.0 to 0.04 nats has a second-half deviation 0.038 < 0.05 (the old fixed band
    called it held) but not below min(0.05, 0.08/4) = 0.02 → 0 held, and the verdict does not say it held."""
    collapsed = _run([1.0, 0.5, 0.2, 0.1, 0.07, 0.05, 0.04, 0.04, 0.04, 0.04], 0.08)
    g = {"label": "o1", "method": "o1", "stare": {"reweight_w": 1.1}, **group_outcome([collapsed, collapsed])}
    assert g["held"] == 0 and g["collapsed"] == 2
    line = verdict([g])
    assert line == ("no STARE setting held the band on every seed; not held: o1 (W=1.1: 0/2 seeds, |H-H_tgt| 0.038, "
                    "collapsed on 2)")


def test_near_cap_thresholds():
    """w_max 1.5: near the cap from a mean W of 1 + 0.8·0.5 = 1.4 on, or with ≥ 10 % of the steps at the cap;
    1.39 with 5 % at the cap is not; without a cap (not adaptive) never."""
    assert near_cap(1.4, 0.0, 1.5) and near_cap(1.2, 0.1, 1.5)
    assert not near_cap(1.39, 0.05, 1.5) and not near_cap(1.5, 1.0, None) and not near_cap(None, None, 1.5)


def _grpo(h_end: float, mid: float | None = None) -> dict:
    """A GRPO run from 1.0 nats: down to ``mid`` at step 5, then flat at ``h_end`` for the second half (H_tgt 0.4,
    band 0.05, collapse below 0.1 nats)."""
    first = [1.0, 0.85, 0.7, 0.55, 0.45, h_end if mid is None else mid]
    return _run(first + [h_end] * 6, 0.4)


def test_a_baseline_is_told_seed_by_seed_as_the_table_counts():
    """Issue 29: "grpo fell below the band" next to a table where GRPO held 1 of 3 seeds (its mean final entropy was
    below the band, one seed was inside it). Seeds: 0.41 (inside: |0.41 - 0.4| < min(0.05, 0.1)), 0.3 and 0.32
    (below 0.35, above the collapse line 0.1): held 1, below 2, collapsed 0, and the clause says exactly that."""
    runs = [_grpo(0.41), _grpo(0.3), _grpo(0.32)]
    out = group_outcome(runs)
    assert (out["held"], out["below"], out["collapsed"]) == (1, 2, 0)
    line = verdict([{"label": "grpo", "method": "grpo", "stare": None, **out}])
    assert line == ("grpo fell below the band on 2/3 seeds, ended inside the band on 1/3 (H 1 -> 0.343 nats; no seed "
                    "collapsed)")


def test_a_target_at_grpos_floor_is_said_and_no_run_is_collapsed_and_held():
    """Issue 29: at H_tgt 0.2 on demo GRPO was "collapsed 3/3" and "held 3/3" at once: its end point 0.163 lies
    inside the band [0.15, 0.25] and below 10 % of H0 = 0.174. Here H0 1.74 -> 0.163 nats with H_tgt 0.2: the run
    holds the band (second-half deviation 0.037 < min(0.05, 0.2/4)) and crosses the collapse line: it counts as held
    only, and the verdict says that the target sits at GRPO's floor."""
    h = [1.74, 1.2, 0.8, 0.5, 0.3, 0.2] + [0.163] * 6
    run = run_summary([{"step": i, "entropy": x, "reward": 0.9} for i, x in enumerate(h)], target_entropy=0.2,
                      band=0.05)
    assert run["steps_to_collapse"] is not None  # below 0.174: by itself a collapse
    out = group_outcome([run, run, run])
    assert (out["held"], out["collapsed"], out["steps_to_collapse"]) == (3, 0, None)
    line = verdict([{"label": "grpo", "method": "grpo", "stare": None, **out}])
    assert line == ("grpo ended inside the band on 3/3 seeds (H 1.74 -> 0.163 nats): the target sits at GRPO's floor: "
                    "nothing to hold")
    assert "collapsed" not in line
