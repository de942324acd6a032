"""Tabular simulator: the dynamics the issues ask to show (collapse, first-order agreement, mean field vs sampled,
control by a strong enough push, the regime of the first-order theory). Expected numbers come from the theory of
docs/theory.md §2/§6/§7 and the issues' thresholds; none are tuned into the presets for a method to pass (the presets
only fix the task, step size and target).
"""

from __future__ import annotations

import json
import statistics

import pytest

from simulators.notes import sweep_notes
from simulators.presets import PRESETS, get_preset
from simulators.run_stats import REGIME_RATIO
from simulators.tabular.runner import config_from_overrides, run, run_batch


def preset_config(name: str, **overrides):
    data = get_preset(name)["overrides"]
    for key, value in overrides.items():
        if key == "stare":
            data.setdefault("loss", {}).setdefault("stare", {}).update(value)
        else:
            data[key] = value
    return config_from_overrides(data)


def entropies(run_dir):
    return [json.loads(line)["entropy"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["collapse", "random-reward"])
def test_grpo_collapses(tmp_path, preset):
    """Issue: under grpo, mean entropy (over seeds 0–2) ends below 10 % of its start — with a verifiable reward and
    with rewards independent of the tokens (noise-driven collapse, docs/theory.md §2 near-criticality)."""
    configs = [preset_config(preset, method="grpo", seed=seed) for seed in range(3)]
    out = run_batch(configs, [tmp_path / f"s{seed}" for seed in range(3)])
    assert statistics.mean(s["final_entropy"] for s in out) < 0.1 * statistics.mean(s["initial_entropy"] for s in out)


def test_theory_first_order_agreement_gate_and_step_size(tmp_path):
    """`theory` preset: measured one-step ΔH vs the exact first-order prediction of the same Δz has R² ≥ 0.99 and
    slope 1 ± 0.05 (GRPO and O1), and the O1 runs open the gate (the entropy crosses H_tgt). The relative error
    ‖meas − pred‖/‖meas‖ shrinks when lr shrinks (second-order remainder O(lr²) against a first-order term O(lr),
    so the ratio is O(lr): a 4× smaller lr should give about 4× less; asserted: less than half)."""
    runs = run_batch([preset_config("theory", method=m) for m in ("grpo", "o1")], [tmp_path / "g", tmp_path / "o"])
    for s in runs:
        assert s["pred_r2"] >= 0.99 and abs(s["pred_slope"] - 1) <= 0.05
    assert runs[1]["gate_on_frac"] > 0
    short = run_batch([preset_config("theory", method="grpo", lr=lr, steps=100) for lr in (0.05, 0.0125)],
                      [tmp_path / "a", tmp_path / "b"])
    assert short[1]["pred_rel_err"] < 0.5 * short[0]["pred_rel_err"]


@pytest.mark.slow
def test_demo_tells_the_story(tmp_path):
    """Issue 13 item 2 on the demo preset (mean field, lr 1, 600 steps, H_tgt 0.4): GRPO collapses on every seed;
    at least one STARE method holds the band (mean |H − H_tgt| < 0.05 over the second half) on every seed at a final
    reward within 0.05 of GRPO's — the auto schedule; the paper's O1 (W 1.1) does not hold it here (a signal-driven
    drift)."""
    methods = get_preset("demo")["methods"]
    configs = [preset_config("demo", method=m, seed=s) for m in methods for s in range(3)]
    out = run_batch(configs, [tmp_path / f"{c.method}{c.seed}" for c in configs])
    by = {m: [s for c, s in zip(configs, out) if c.method == m] for m in methods}
    assert all(s["steps_to_collapse"] is not None for s in by["grpo"])
    reward = statistics.mean(s["final_reward"] for s in by["grpo"])
    held = [m for m in methods if m != "grpo" and all(
        s["mean_abs_dev_second_half"] < 0.05 and abs(s["final_reward"] - reward) <= 0.05 for s in by[m])]
    assert "o1-auto" in held and "o1" not in held


@pytest.mark.slow
@pytest.mark.parametrize("method, seeds, extra", [
    ("grpo", 6, {}),
    ("c2", 4, {"gate": "always", "reweight_w": 1.5, "reweight_m": 0.5}),
])
def test_expected_mode_matches_sampled_mode_at_large_G(tmp_path, method, seeds, extra):
    """Same initial policy (init_seed 0), G = 1024: the mean over seeds of the sampled entropy trajectory agrees with
    the mean-field (expected-mode) trajectory within 4 standard errors of the seed mean plus 0.003 nats. The 0.003
    covers the O(1/G) finite-G bias (group mean includes the token's own reward, sample std, fluctuation effects):
    measured here +0.0095 nats at G = 256 and +0.019 at G = 64 after 14 steps, so ≈ 0.0024 expected at G = 1024."""
    base = dict(
        num_prompts=8, seq_len=2, vocab_size=4, num_correct=2, threshold=2, reward_noise=0.2, group_size=1024,
        lr=1.0, steps=15, init_seed=0, method=method,
    )
    if extra:
        base["loss"] = {"stare": extra}
    run(config_from_overrides({**base, "mode": "expected"}), tmp_path / "exp")
    expected = entropies(tmp_path / "exp")
    run_batch([config_from_overrides({**base, "seed": seed}) for seed in range(seeds)],
              [tmp_path / f"s{seed}" for seed in range(seeds)])
    sampled = [entropies(tmp_path / f"s{seed}") for seed in range(seeds)]
    assert expected[-1] < expected[0] - 0.3  # the trajectory really moves
    for t in range(len(expected)):
        col = [h[t] for h in sampled]
        se = statistics.stdev(col) / len(col) ** 0.5
        assert abs(statistics.mean(col) - expected[t]) <= 4 * se + 0.003, (t, statistics.mean(col), expected[t], se)


@pytest.mark.slow
def test_strong_gated_push_holds_the_target_in_random_reward(tmp_path):
    """Control (docs/theory.md §6): in `random-reward`, gated C2 with W = 1.5, M = 0.5 holds mean |H − H_tgt| < 0.05 nats
    over the second half of the run, for each of seeds 0–2, while GRPO (seed 0) ends far below the target."""
    configs = [preset_config("random-reward", method="c2", seed=seed, stare={"reweight_w": 1.5, "reweight_m": 0.5})
               for seed in range(3)] + [preset_config("random-reward", method="grpo", seed=0)]
    out = run_batch(configs, [tmp_path / f"r{i}" for i in range(4)])
    for s in out[:3]:
        assert s["mean_abs_dev_second_half"] < 0.05, (s["seed"], s["mean_abs_dev_second_half"])
    assert out[3]["final_entropy"] < out[3]["target_entropy"] - 0.3


@pytest.mark.slow
def test_c2_pushes_harder_than_o1_sampled(tmp_path):
    """Sampled `random-reward`, gate forced on, |W − 1| = |1 − M| = 0.5: C2's final entropy (mean over seeds 0–2)
    is above O1's, which is above GRPO's (C2 adds the M-softening of the Â<0 high-surprisal quadrant)."""
    methods = ("grpo", "o1", "c2")
    configs = [preset_config("random-reward", method=m, seed=seed, steps=300,
                             stare={"gate": "always", "reweight_w": 1.5, "reweight_m": 0.5})
               for m in methods for seed in range(3)]
    out = run_batch(configs, [tmp_path / f"{c.method}{c.seed}" for c in configs])
    final = {m: statistics.mean(s["final_entropy"] for c, s in zip(configs, out) if c.method == m) for m in methods}
    assert final["grpo"] < final["o1"] < final["c2"]


def _note_summary(configs, stats):
    """A one-group-per-method sweep summary (the shape simulators.sweep writes) of runs of seed 0."""
    methods, config = {}, {}
    for c, s in zip(configs, stats):
        mean = dict(s)
        mean["collapsed_runs"] = int(s["steps_to_collapse"] is not None)
        mean["held_runs"] = int(s["mean_abs_dev_second_half"] < 0.05)
        methods[c.method] = {"method": c.method, "point": {}, "mean": mean}
        config[f"{c.method}/seed0"] = {"lr": c.lr, "loss": {"loss_mode": c.loss.loss_mode,
                                                              "stare": vars(c.loss.stare)}}
    return {"seeds": [0], "methods": methods, "config": config}


def test_regime_warning_fires_at_lr_6(tmp_path):
    """The old `collapse` step size (lr 6, ~13 % entropy change per step): O1's push acts at far less than 80 % of
    its first-order size (issue 13 measured 18 %), and the note says outside the regime, never "stronger W"."""
    configs = [preset_config("collapse", method=m, lr=6.0, steps=40, stare={"gate": "always"}) for m in ("grpo", "o1")]
    out = run_batch(configs, [tmp_path / c.method for c in configs])
    assert out[1]["push_ratio"] < REGIME_RATIO
    notes = sweep_notes(_note_summary(configs, out))
    assert any("outside the first-order regime (lr=6)" in n for n in notes)
    assert not any("critical strength" in n or "try stare.reweight_w" in n for n in notes)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_no_regime_warning_on_the_presets(tmp_path, preset):
    """Every tabular preset steps inside the regime: with the gate forced on from the first step (the largest
    entropy changes of a run), O1's push acts at ≥ 80 % of its first-order size over the first 60 steps."""
    cfg = preset_config(preset, method="o1", steps=60, stare={"gate": "always"})
    s = run(cfg, tmp_path / preset)
    assert s["push_ratio"] >= REGIME_RATIO, (preset, s["push_ratio"])
