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
