"""The report's verdict compares each STARE group with the baseline of its own experiment (review finding: two
preset sweeps analysed together, H_tgt 0.4 and 0.6, compared the H_tgt=0.6 STARE group with the H_tgt=0.4 GRPO
group, the first GRPO group listed)."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.analyze import analyze, sweep_group_by
from analysis.compare import compare
from analysis.grouping import experiment_slice, sweep_root
from analysis.report import run_summaries
from analysis.verdict import comparison_verdict
from stare_lab.platform.runs import RunWriter


def _run(run_dir: Path, method: str, seed: int, target: float, entropy: float, reward: float, **extra) -> None:
    """A run with constant entropy and reward: its final reward (mean of the last 10 % of steps) is ``reward`` and
    its second-half |H − H_tgt| is |entropy − target| — numbers the verdict must quote unchanged."""
    stare = method != "grpo"
    cfg = {"source": "simulator", "simulator": "tabular", "method": method, "seed": seed, **extra,
           "loss": {"loss_mode": "stare" if stare else "grpo",
                    "stare": {"variant": "C2" if method == "c2" else "O1", "reweight_w": 1.1, "reweight_m": 0.9,
                              "target_entropy": target}}}
    with RunWriter(run_dir, cfg) as w:
        for i in range(40):
            w.log({"step": i, "entropy": entropy, "reward": reward, "gate_on": int(stare), "stare_w": 1.1,
                   "stare_m": 0.9, "pred_entropy_change": None, "entropy_change": None})


def _sweep(root: Path, target: float, grpo_h: float, grpo_reward: float, c2_reward: float, c2_dev: float = 0.01,
           **extra) -> Path:
    """``root/<method>/seed<k>`` like ``stare-lab simulate`` (c2 ``c2_dev`` nats above the target), with its sweep
    ``summary.json``."""
    for s in (0, 1):
        _run(root / "grpo" / f"seed{s}", "grpo", s, target, grpo_h, grpo_reward, **extra)
        _run(root / "c2" / f"seed{s}", "c2", s, target, target + c2_dev, c2_reward, **extra)
    (root / "summary.json").write_text(json.dumps({"preset": root.name, "methods": {"grpo": {}, "c2": {}}}))
    return root


def test_each_stare_group_is_compared_with_the_grpo_of_its_own_sweep(tmp_path):
    # "collapse": H_tgt 0.4, GRPO ends far below the band at reward 0.885, c2 misses the band (|H - H_tgt| 0.2)
    collapse = _sweep(tmp_path / "collapse", 0.4, 0.05, 0.885, 0.8, c2_dev=0.2)
    # "theory": H_tgt 0.6, GRPO at 0.489, c2 holds the band (|H - H_tgt| 0.01) at 0.492
    theory = _sweep(tmp_path / "theory", 0.6, 0.58, 0.489, 0.492)
    res = analyze([collapse, theory], tmp_path / "out")
    v = res.verdict
    held = v.split("c2 [theory] held", 1)[1]
    assert "at reward 0.492 (grpo [theory] 0.489)" in held, v
    assert "0.885" not in held, v
    assert json.loads((tmp_path / "out" / "report.json").read_text())["verdict"] == v


def test_same_target_different_sweeps_are_different_experiments(tmp_path):
    """Two sweep folders with the same target: the baseline comes from the STARE group's own folder; a folder
    without a GRPO group gets no reward comparison rather than another folder's."""
    a = _sweep(tmp_path / "a", 0.4, 0.41, 0.7, 0.71, lr=1.0)  # its c2: |H - H_tgt| = 0.01
    b = tmp_path / "b"
    for s in (0, 1):  # b's c2 holds the band more tightly (0.002), so it is the verdict's best group
        _run(b / "c2" / f"seed{s}", "c2", s, 0.4, 0.402, 0.75, lr=2.0)
    (b / "summary.json").write_text(json.dumps({"methods": {"c2": {}}}))
    cmp = compare([a, b])
    by_label = {g.label: g for g in cmp.groups}
    assert set(by_label) == {"grpo", "c2 [a]", "c2 [b]"}  # two sweeps: two experiments, not averaged together
    slices = {lab: experiment_slice(g.runs, g.key_values) for lab, g in by_label.items()}
    assert slices["grpo"] == slices["c2 [a]"] and slices["c2 [a]"]["sweep"] == str(a)
    assert slices["c2 [b]"]["sweep"] == str(b) and slices["c2 [b]"] != slices["grpo"]
    assert sweep_root(b / "c2" / "seed0") == b and sweep_root(tmp_path) is None
    v = comparison_verdict(cmp, run_summaries(cmp))
    held = v.split("c2 [b] held", 1)[1].split(";")[0]
    assert "at reward 0.75" in held and "grpo" not in held, v  # not "(grpo 0.7)": that GRPO ran another setting
    # --merge: one c2 group averaged over both folders, so no GRPO group shares its experiment either
    merged = compare([a, b], split=False)
    v = comparison_verdict(merged, run_summaries(merged))
    assert "c2 held" in v and "at reward 0.73 " not in v and "(grpo" not in v.split("c2 held", 1)[1], v


def test_grid_slices_of_a_sweep_get_their_own_baseline(tmp_path):
    """A sweep over lr: `analyze` on the sweep folder groups by the grid keys outside loss.stare (as simulate
    does), so c2 at lr=2 is compared with GRPO at lr=2 (0.3), not with GRPO at lr=1 (0.9)."""
    root = tmp_path / "sw"
    for lr, grpo_reward, c2_reward in ((1.0, 0.9, 0.5), (2.0, 0.3, 0.35)):
        for s in (0, 1):
            _run(root / "grpo" / f"lr={lr:g}" / f"seed{s}", "grpo", s, 0.4, 0.1, grpo_reward, lr=lr)
            dev = 0.001 if lr == 2.0 else 0.2  # only the lr=2 c2 holds the band
            _run(root / "c2" / f"lr={lr:g}" / f"seed{s}", "c2", s, 0.4, 0.4 + dev, c2_reward, lr=lr)
    summary = {"methods": {}, "sweep": {"grid": [["lr", [1.0, 2.0]], ["loss.stare.reweight_w", [1.1]]]}}
    (root / "summary.json").write_text(json.dumps(summary))
    assert sweep_group_by(summary) == ["lr"]
    res = analyze([root], tmp_path / "out")
    assert "c2 (lr=2) held" in res.verdict and "at reward 0.35 (grpo (lr=2) 0.3)" in res.verdict, res.verdict


def test_one_sweep_named_two_ways_is_one_experiment(tmp_path, monkeypatch):
    """The same sweep folder given as a relative and as an absolute path is one folder: its runs stay one group."""
    root = _sweep(tmp_path / "s", 0.4, 0.41, 0.7, 0.71)
    monkeypatch.chdir(tmp_path)
    cmp = compare([Path("s") / "grpo" / "seed0", root / "grpo" / "seed1"])
    assert [(g.label, len(g.runs)) for g in cmp.groups] == [("grpo", 2)]
    assert sweep_root(Path("s") / "grpo" / "seed0") == sweep_root(root / "c2" / "seed1") == root


def test_a_target_sweep_compares_with_its_one_grpo(tmp_path):
    """A sweep over stare.target_entropy runs GRPO once (at the preset's 0.4): the STARE group at H_tgt 0.3 is
    compared with that GRPO (reward 0.7). Outside a sweep folder, with GRPO at two other targets (0.4, 0.6), which
    one is the reference is not known: none is named."""
    root = tmp_path / "swt"
    for s in (0, 1):
        _run(root / "grpo" / f"seed{s}", "grpo", s, 0.4, 0.1, 0.7)
        _run(root / "c2" / "H_tgt=0.3" / f"seed{s}", "c2", s, 0.3, 0.301, 0.72)
    (root / "summary.json").write_text(json.dumps({"methods": {}, "sweep": {"grid": [
        ["loss.stare.target_entropy", [0.3]]]}}))
    v = analyze([root], tmp_path / "out").verdict
    assert "c2 held H_tgt=0.3" in v and "at reward 0.72 (grpo 0.7)" in v, v

    loose = tmp_path / "loose"
    for s in (0, 1):
        _run(loose / "grpo4" / f"seed{s}", "grpo", s, 0.4, 0.1, 0.7)
        _run(loose / "grpo6" / f"seed{s}", "grpo", s, 0.6, 0.1, 0.5)
        _run(loose / "c2" / f"seed{s}", "c2", s, 0.3, 0.301, 0.72)
    cmp = compare([loose])
    v = comparison_verdict(cmp, run_summaries(cmp))
    held = v.split("c2 held", 1)[1].split(";")[0]
    assert "at reward 0.72" in held and "grpo" not in held, v
    # ... but with GRPO at the STARE group's own target among them, that one is the reference
    for s in (0, 1):
        _run(loose / "grpo3" / f"seed{s}", "grpo", s, 0.3, 0.1, 0.4)
    cmp = compare([loose])
    v = comparison_verdict(cmp, run_summaries(cmp))
    assert "at reward 0.72 (grpo (H_tgt=0.3) 0.4)" in v, v
