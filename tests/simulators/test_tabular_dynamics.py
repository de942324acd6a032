"""Tabular simulator: the dynamics the issue asks to show (collapse, first-order agreement, mean field vs sampled,
control by a strong enough push). Expected numbers come from the theory of docs/theory.md §2/§6 and the issue's
thresholds; none are tuned into the presets for a method to pass (the presets only fix the task and step size).
"""

from __future__ import annotations

import json
import statistics

import pytest

from simulators.presets import get_preset
from simulators.tabular import config_from_overrides, run


def preset_config(name: str, **overrides):
    data = get_preset(name)["overrides"]
    for key, value in overrides.items():
        if key == "stare":
            data.setdefault("loss", {})["stare"] = value
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
    start, end = [], []
    for seed in range(3):
        s = run(preset_config(preset, method="grpo", seed=seed), tmp_path / f"s{seed}")
        start.append(s["initial_entropy"])
        end.append(s["final_entropy"])
    assert statistics.mean(end) < 0.1 * statistics.mean(start)


def test_theory_first_order_agreement_and_step_size(tmp_path):
    """`theory` preset: measured one-step ΔH vs the exact first-order prediction of the same Δz has R² ≥ 0.99 and
    slope 1 ± 0.05; the relative error ‖meas − pred‖/‖meas‖ shrinks when lr shrinks (second-order remainder O(lr²)
    against a first-order term O(lr), so the ratio is O(lr): a 4× smaller lr should give about 4× less)."""
    fits = {}
    for lr in (0.05, 0.0125):
        s = run(preset_config("theory", method="grpo", lr=lr), tmp_path / f"lr{lr}")
        fits[lr] = s
        assert s["pred_r2"] >= 0.99
        assert abs(s["pred_slope"] - 1) <= 0.05
    assert fits[0.0125]["pred_rel_err"] < 0.5 * fits[0.05]["pred_rel_err"]


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
        lr=1.0, steps=15, init_seed=0, target_entropy_frac=None, method=method,
    )
    if extra:
        base["loss"] = {"stare": extra}
    expected = entropies_of_run(tmp_path / "exp", {**base, "mode": "expected"})
    sampled = [entropies_of_run(tmp_path / f"s{seed}", {**base, "seed": seed}) for seed in range(seeds)]
    assert expected[-1] < expected[0] - 0.3  # the trajectory really moves
    for t in range(len(expected)):
        col = [h[t] for h in sampled]
        se = statistics.stdev(col) / len(col) ** 0.5
        assert abs(statistics.mean(col) - expected[t]) <= 4 * se + 0.003, (t, statistics.mean(col), expected[t], se)


def entropies_of_run(run_dir, data):
    run(config_from_overrides(data), run_dir)
    return entropies(run_dir)


@pytest.mark.slow
def test_strong_gated_push_holds_the_target_in_random_reward(tmp_path):
    """Control (docs/theory.md §6): in `random-reward`, gated C2 with W = 1.5, M = 0.5 (a push much stronger than the
    paper's 1.1 / 0.9) holds mean |H − H_tgt| < 0.05 nats over the second half of the run, for each of seeds 0–2,
    while GRPO (same seeds) ends far below the target."""
    for seed in range(3):
        s = run(preset_config("random-reward", method="c2", seed=seed, stare={"reweight_w": 1.5, "reweight_m": 0.5}),
                tmp_path / f"c2_{seed}")
        assert s["mean_abs_dev_second_half"] < 0.05, (seed, s["mean_abs_dev_second_half"])
    g = run(preset_config("random-reward", method="grpo", seed=0), tmp_path / "grpo")
    assert g["final_entropy"] < g["target_entropy"] - 0.3


@pytest.mark.slow
def test_c2_pushes_harder_than_o1_sampled(tmp_path):
    """Sampled `random-reward`, gate forced on, |W − 1| = |1 − M| = 0.5: C2's final entropy (mean over seeds 0–2)
    is above O1's, which is above GRPO's (C2 adds the M-softening of the Â<0 high-surprisal quadrant)."""
    final = {}
    for method in ("grpo", "o1", "c2"):
        final[method] = statistics.mean(
            run(preset_config("random-reward", method=method, seed=seed, steps=100,
                              stare={"gate": "always", "reweight_w": 1.5, "reweight_m": 0.5}),
                tmp_path / f"{method}{seed}")["final_entropy"]
            for seed in range(3)
        )
    assert final["grpo"] < final["o1"] < final["c2"]
