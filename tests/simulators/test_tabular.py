"""Tabular simulator: the exact math (hand / brute-force / closed forms), determinism, resume and gate semantics.

The dynamics claims of the issue (collapse, first-order agreement, control) are in test_tabular_dynamics.py.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from simulators.presets import get_preset
from simulators.run_stats import fit_line, run_stats
from simulators.tabular import TabularSimConfig, config_from_overrides, init_state, run, sampled_step
from simulators.tabular_expected import expected_step, success_given_token, top_mass_fraction
from stare_lab.config import LossConfig
from stare_lab.errors import ConfigError, RunError

TINY = {
    "num_prompts": 4, "group_size": 4, "seq_len": 3, "vocab_size": 5, "num_correct": 2, "threshold": 2, "reward_noise": 0.0,
    "steps": 6,
}


def tiny(**kw) -> TabularSimConfig:
    data = dict(TINY)
    data.update(kw)
    return config_from_overrides(data)


def rows_of(run_dir, drop_time=True):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if drop_time:
        rows = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]
    return rows


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "data, key",
    [
        ({"num_prompts": 0}, "num_prompts=0"),
        ({"group_size": -2}, "group_size=-2"),
        ({"vocab_size": 1}, "vocab_size=1"),
        ({"num_correct": 9, "vocab_size": 8}, "num_correct=9"),
        ({"threshold": 5, "seq_len": 4}, "threshold=5"),
        ({"task": "bandit", "seq_len": 3}, "seq_len=3"),
        ({"lr": 0.0}, "lr=0 "),
        ({"method": "ppo"}, "method='ppo'"),
        ({"mode": "expected", "method": "clip_cov"}, "method='clip_cov'"),
        ({"reward_noise": 0.7}, "reward_noise=0.7"),
        ({"loss": {"stare": {"top_p_ratio": 1.5}}}, "loss.stare.top_p_ratio=1.5"),
        ({"loss": {"stare": {"reweight_w": 0.9}}}, "loss.stare.reweight_w=0.9"),
        ({"loss": {"stare": {"reweight_m": 1.2}}}, "loss.stare.reweight_m=1.2"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_bad_config_names_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(".", r"\.")):
        config_from_overrides(data)


def test_method_sets_the_loss():
    """The method table (presets.METHODS) decides the registry name / STARE variant / switches."""
    assert tiny(method="c2").loss.loss_mode == "stare" and tiny(method="c2").loss.stare.variant == "C2"
    assert tiny(method="o1-adaptive").loss.stare.adaptive is True
    assert tiny(method="grpo-ds").dynamic_sampling is True
    assert tiny(method="entropy_bonus").loss.entropy_coeff == pytest.approx(0.01)
    assert tiny(method="forking_tokens").loss.loss_mode == "forking_tokens"


# ------------------------------------------------------------------------------------------------ exact math


def test_success_given_token_matches_enumeration():
    """P(r=1 | a_l = k) from the Poisson-binomial DP equals brute-force enumeration of all V^L responses."""
    cfg = tiny(num_prompts=2, seq_len=3, vocab_size=3, num_correct=1, threshold=2, reward_noise=0.1)
    st = init_state(cfg)
    probs = torch.softmax(st.logits, -1)
    p_bar, given = success_given_token(cfg, probs, st.correct)
    for p in range(2):
        num = torch.zeros(3, 3, dtype=torch.float64)
        total = 0.0
        for resp in itertools.product(range(3), repeat=3):
            pr = math.prod(float(probs[p, l, a]) for l, a in enumerate(resp))
            ok = sum(bool(st.correct[p, l, a]) for l, a in enumerate(resp)) >= 2
            r = 0.1 + 0.8 * ok  # noisy verifier: P(r=1) = ε + (1 − 2ε)·1[rule]
            total += pr * r
            for l, a in enumerate(resp):
                num[l, a] += pr * r
        cond = num / probs[p]  # P(r=1, a_l=k) / π_lk
        assert float(p_bar[p]) == pytest.approx(total, abs=1e-12)
        assert torch.allclose(given[p], cond, atol=1e-12)


def test_top_mass_fraction_by_hand():
    """Masses 1,1,2 at surprisals 3,2,1 (total 4): P = 0.375 selects 1.5 units → the top entry fully (1) and half of
    the second; P = 1 selects everything; zero mass is never selected."""
    s = torch.tensor([3.0, 2.0, 1.0, 5.0], dtype=torch.float64)
    m = torch.tensor([1.0, 1.0, 2.0, 0.0], dtype=torch.float64)
    assert top_mass_fraction(s, m, 0.375).tolist() == [1.0, 0.5, 0.0, 0.0]
    assert top_mass_fraction(s, m, 1.0).tolist() == [1.0, 1.0, 1.0, 0.0]


def test_sampled_grpo_update_is_the_group_formula():
    """One sampled GRPO step: at every state Δz = (lr/G) Σ_i Â_i (e_{a_i} − π) (docs/theory.md §2 with the documented
    lr scaling), rebuilt by hand from the same rollouts and the grpo advantage convention (unbiased std, ε=1e-6)."""
    cfg = tiny(lr=0.7)
    st = init_state(cfg)
    rng = st.generator.get_state()
    from simulators.tabular import _rollouts

    batch = _rollouts(cfg, st)
    st.generator.set_state(rng)
    delta, row = sampled_step(cfg, st)
    S, G, L, V = 4, 4, 3, 5
    r = batch["rewards"].double().reshape(S, G)
    std = r.std(dim=1, keepdim=True)
    adv = torch.where(std > 0, (r - r.mean(1, keepdim=True)) / (std + 1e-6), torch.zeros_like(r))
    pi = torch.softmax(st.logits, -1)
    want = torch.zeros(S, L, V, dtype=torch.float64)
    tokens = batch["tokens"].reshape(S, G, L)
    for p in range(S):
        for i in range(G):
            for l in range(L):
                e = torch.zeros(V, dtype=torch.float64)
                e[tokens[p, i, l]] = 1
                want[p, l] += cfg.lr / G * adv[p, i] * (e - pi[p, l])
    assert torch.allclose(delta, want, atol=1e-6)
    # the token-level Φ decomposition is exact for a Δz that is a sum of (e_a − π) terms
    assert row["pred/phi_tokens"] == pytest.approx(row["pred_entropy_change"], rel=1e-5, abs=1e-9)
    quad = sum(row[f"quadrant/{a}_{b}/dH"] for a in ("pos", "neg") for b in ("high", "low"))
    assert quad == pytest.approx(row["pred/phi_tokens"], rel=1e-6, abs=1e-12)


def test_expected_grpo_is_the_covariance_law():
    """Expected-mode GRPO: the first-order ΔH of its update equals −lr·Cov_π(log π, π A) per state (docs/theory.md §2,
    Cui et al. PG law), with A_k = (P(r=1|k) − p̄)/(σ + ε) computed here by enumeration; and the measured ΔH of a
    tiny step agrees with it to first order (finite difference)."""
    cfg = tiny(mode="expected", lr=1e-4, num_prompts=3, seq_len=2, vocab_size=4, threshold=1)
    st = init_state(cfg)
    delta, row = expected_step(cfg, st)
    pi = torch.softmax(st.logits, -1)
    logp = pi.log()
    covs = []
    for p in range(3):
        total, num = 0.0, torch.zeros(2, 4, dtype=torch.float64)
        for resp in itertools.product(range(4), repeat=2):
            pr = float(pi[p, 0, resp[0]] * pi[p, 1, resp[1]])
            ok = float(any(bool(st.correct[p, l, a]) for l, a in enumerate(resp)))
            total += pr * ok
            for l, a in enumerate(resp):
                num[l, a] += pr * ok
        sigma = math.sqrt(total * (1 - total))
        A = (num / pi[p] - total) / (sigma + 1e-6)
        for l in range(2):
            x, y = logp[p, l], pi[p, l] * A[l]
            cov = (pi[p, l] * x * y).sum() - (pi[p, l] * x).sum() * (pi[p, l] * y).sum()
            covs.append(-cfg.lr * float(cov))
    assert row["pred_entropy_change"] == pytest.approx(sum(covs) / len(covs), rel=1e-9)
    from simulators.tabular import mean_entropy

    measured = mean_entropy(st.logits + delta, 1.0) - mean_entropy(st.logits, 1.0)
    assert measured == pytest.approx(row["pred_entropy_change"], rel=1e-3)


def test_expected_random_reward_grpo_does_not_move():
    """Random rewards: B ≡ 0, the mean-field GRPO update is exactly zero (near-criticality, docs/theory.md §2)."""
    cfg = tiny(mode="expected", reward="random")
    delta, row = expected_step(cfg, init_state(cfg))
    assert float(delta.abs().max()) == 0.0 and row["pred_entropy_change"] == 0.0


def test_fit_line_by_hand():
    """meas = 1 + 2·pred exactly → slope 2, intercept 1, R² 1."""
    fit = fit_line([0.0, 1.0, 2.0], [1.0, 3.0, 5.0])
    assert fit["slope"] == pytest.approx(2.0) and fit["intercept"] == pytest.approx(1.0) and fit["r2"] == 1.0


# ------------------------------------------------------------------------------------------------ runs


REQUIRED = ("step", "entropy", "reward", "gate_on", "stare_w", "stare_m", "pred_entropy_change", "entropy_change")


@pytest.mark.parametrize("method", ["grpo", "grpo-ds", "o1", "c2", "o1-adaptive", "clip_cov", "kl_cov", "entropy_bonus", "forking_tokens"])
def test_every_method_runs_and_logs(tmp_path, method):
    # an absolute target of 100 nats, above every entropy (at most log V = log 4 nats): the gate is always on
    # (target_entropy_frac must be in (0, 1], so the target is given directly)
    cfg = tiny(method=method, steps=3, target_entropy_frac=None, loss={"stare": {"target_entropy": 100.0}})
    summary = run(cfg, tmp_path / method)
    rows = rows_of(tmp_path / method, drop_time=False)
    assert len(rows) == 3 and summary["steps"] == 3
    for r in rows:
        assert all(k in r for k in REQUIRED)
        assert all(f"quadrant/{a}_{b}/{c}" in r for a in ("pos", "neg") for b in ("high", "low") for c in ("count", "dH"))
        assert "pass@4" in r and "time/step_s" in r and "pred/phi_tokens" in r
        assert all(v is None or not isinstance(v, float) or math.isfinite(v) for v in r.values())
    if method in ("o1", "c2", "o1-adaptive"):
        assert all(r["gate_on"] == 1 for r in rows)  # target 100 nats is above every entropy
        assert rows[0]["stare/num_pos_selected"] > 0


def test_same_seed_same_metrics(tmp_path):
    run(tiny(method="c2", target_entropy_frac=1.0), tmp_path / "a")
    run(tiny(method="c2", target_entropy_frac=1.0), tmp_path / "b")
    assert rows_of(tmp_path / "a") == rows_of(tmp_path / "b")
    run(tiny(method="c2", target_entropy_frac=1.0, seed=1), tmp_path / "c")
    assert rows_of(tmp_path / "a") != rows_of(tmp_path / "c")


@pytest.mark.parametrize("method", ["o1-adaptive", "grpo-ds"])
def test_interrupt_and_resume_is_bit_exact(tmp_path, method):
    """Interrupt after 7 steps (checkpoint at 5), resume to 12 → the rows equal an uninterrupted 12-step run."""
    cfg = tiny(method=method, steps=12, checkpoint_every=5, target_entropy_frac=1.0)
    run(cfg, tmp_path / "full")

    def stop_at_7(_n, count=[0]):
        count[0] += 1
        if count[0] == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", progress=stop_at_7)
    assert len(rows_of(tmp_path / "cut")) == 7
    run(cfg, tmp_path / "cut", resume=True)
    assert rows_of(tmp_path / "cut") == rows_of(tmp_path / "full")
    a = torch.load(tmp_path / "full" / "checkpoint" / "state.pt", weights_only=False)
    b = torch.load(tmp_path / "cut" / "checkpoint" / "state.pt", weights_only=False)
    assert torch.equal(a["logits"], b["logits"]) and a["controller"] == b["controller"]


def test_extend_a_finished_run(tmp_path):
    """Run 6 steps, then resume with steps=12 → identical to a 12-step run (checkpoint at the end of each part)."""
    run(tiny(method="o1", steps=12, checkpoint_every=6, target_entropy_frac=1.0), tmp_path / "full")
    run(tiny(method="o1", steps=6, checkpoint_every=6, target_entropy_frac=1.0), tmp_path / "ext")
    run(tiny(method="o1", steps=12, checkpoint_every=6, target_entropy_frac=1.0), tmp_path / "ext", resume=True)
    assert rows_of(tmp_path / "ext") == rows_of(tmp_path / "full")


def test_resume_with_a_different_config_is_refused(tmp_path):
    run(tiny(steps=4), tmp_path / "r")
    with pytest.raises(RunError, match="lr"):
        run(tiny(steps=8, lr=0.1), tmp_path / "r", resume=True)
    with pytest.raises(RunError, match="already holds a run"):
        run(tiny(steps=4), tmp_path / "r")


@pytest.mark.parametrize("mode", ["sampled", "expected"])
def test_gate_off_is_grpo_bit_for_bit(tmp_path, mode):
    """Target 0 nats (given directly: target_entropy_frac must be > 0) is below every entropy → the gate never opens → o1 and c2 reproduce grpo exactly (same seed):
    same logits at the end and the same trajectory columns (docs/theory.md §6)."""
    keys = ("entropy", "reward", "entropy_change", "pred_entropy_change", "pred/phi_tokens", "accuracy")
    out = {}
    for method in ("grpo", "o1", "c2"):
        cfg = tiny(method=method, mode=mode, steps=10, target_entropy_frac=None, loss={"stare": {"target_entropy": 0.0}})
        run(cfg, tmp_path / method)
        out[method] = (
            [[r[k] for k in keys] for r in rows_of(tmp_path / method)],
            torch.load(tmp_path / method / "checkpoint" / "state.pt", weights_only=False)["logits"],
        )
        assert all(r["gate_on"] == 0 for r in rows_of(tmp_path / method))
    for method in ("o1", "c2"):
        assert out[method][0] == out["grpo"][0]
        assert torch.equal(out[method][1], out["grpo"][1])


def test_c2_pushes_harder_than_o1_expected_mode(tmp_path):
    """Random rewards, gate forced on, |W−1| = |1−M| = 0.3: the mean-field update of C2 raises the entropy more than
    O1's (C2 also softens the entropy-lowering Â<0 high-surprisal tokens, docs/theory.md §2 quadrants); GRPO is 0."""
    h = {}
    for method in ("o1", "c2"):
        cfg = tiny(
            method=method, mode="expected", reward="random", steps=20, lr=1.0,
            loss={"stare": {"gate": "always", "reweight_w": 1.3, "reweight_m": 0.7}},
        )
        h[method] = run(cfg, tmp_path / method)["final_entropy"]
    h0 = run(tiny(mode="expected", reward="random", steps=1), tmp_path / "g")["initial_entropy"]
    assert h0 < h["o1"] < h["c2"]


def test_bandit_preset_runs(tmp_path):
    data = get_preset("bandit")["overrides"]
    data["steps"] = 5
    summary = run(config_from_overrides(data), tmp_path / "b")
    assert summary["steps"] == 5


def test_loss_config_is_the_core_dataclass():
    assert isinstance(TabularSimConfig().loss, LossConfig)


def test_run_stats_by_hand():
    """Entropies 1.0, 0.5, 0.05, 0.04 (+ last change −0.01), target 0.5, band 0.05, collapse at < 0.1 × 1.0: collapse
    at step 2; final 0.03; in band: only 0.5 → 1/4; second half |0.05−0.5|, |0.04−0.5| → 0.455; rewards: last 10 %
    of 4 rows = the last row → 1.0; gate on in 2 of 4 rows."""
    rows = [
        {"step": i, "entropy": h, "reward": r, "gate_on": g, "pred_entropy_change": -0.1, "entropy_change": dh}
        for i, (h, r, g, dh) in enumerate([(1.0, 0, 0, -0.5), (0.5, 0, 0, -0.45), (0.05, 1, 1, -0.01), (0.04, 1, 1, -0.01)])
    ]
    s = run_stats(rows, 0.5, collapse_frac=0.1, band=0.05)
    assert s["steps_to_collapse"] == 2 and s["final_entropy"] == pytest.approx(0.03)
    assert s["time_in_band"] == 0.25 and s["mean_abs_dev_second_half"] == pytest.approx(0.455)
    assert s["final_reward"] == 1.0 and s["gate_on_frac"] == 0.5 and s["min_entropy"] == pytest.approx(0.03)


def test_accuracy_is_the_noise_free_rule(tmp_path):
    """Random rewards carry no task signal, but `accuracy` still reports the verifiable rule's success: it must equal
    the rule success of the same initial policy measured under verifiable rewards without noise (same init, the
    first step's rollouts differ only in the reward draws), and expected-mode accuracy is the exact rule law."""
    a = run(tiny(reward="random", steps=1, mode="expected"), tmp_path / "a")
    b = run(tiny(reward="verifiable", reward_noise=0.0, steps=1, mode="expected"), tmp_path / "b")
    ra, rb = rows_of(tmp_path / "a")[0], rows_of(tmp_path / "b")[0]
    assert ra["accuracy"] == rb["accuracy"] == rb["reward"] and ra["reward"] == 0.5
    assert a["initial_entropy"] == b["initial_entropy"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("group_size", 1, "group_size=1 is outside [2, inf]"),  # one response per group: every Â = 0
        ("target_entropy_frac", 0.0, "target_entropy_frac=0 is outside (0, 1]"),
        ("target_entropy_frac", 1.5, "target_entropy_frac=1.5 is outside (0, 1]"),
    ],
)
@pytest.mark.parametrize("mode", ["sampled", "expected"])
def test_config_ranges(field, value, message, mode):
    """Review items 10 and 15: G ≥ 2 (GRPO advantages of a group of one are all 0, nothing learns) and
    H_tgt = frac × H0 with frac in (0, 1] (frac > 1 asked for more than the initial entropy, e.g. 3.47 nats for a
    policy whose entropy per position is at most log 8 = 2.08 nats)."""
    with pytest.raises(ConfigError) as err:
        tiny(mode=mode, **{field: value})
    assert message in str(err.value)
