"""Tests of stare_lab.loss.losses on small hand-computed cases.

Every expected number is worked out in the comment next to it from the formulas of docs/theory.md §3–4 (clipped
surrogate, dual clip, aggregation modes, KL estimators, Cov of Cui et al.), or checked by finite differences.
"""

from __future__ import annotations

import math

import pytest
import torch

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.losses import (
    SURROGATE_METRICS,
    PolicyLossInputs,
    aggregate_loss,
    clipped_surrogate,
    available_policy_losses,
    compute_policy_loss,
    forking_entropy_threshold,
    get_policy_loss,
    kl_penalty,
    loss_metric_names,
    register_policy_loss,
    unregister_policy_loss,
)

LN = math.log
ALL_LOSSES = ["grpo", "stare", "clip_cov", "kl_cov", "forking_tokens"]
MODES = list(LossConfig.AGG_MODES)


def make_inputs(ratios, adv, old=None, mask=None, **extra):
    """One row per advantage; log π = log π_old + log ρ so that the PPO ratio is exactly ``ratios``."""
    ratios = torch.tensor(ratios, dtype=torch.float32)
    old = torch.full_like(ratios, -1.0) if old is None else torch.tensor(old, dtype=torch.float32)
    lp = (old + torch.log(ratios)).requires_grad_(True)
    mask = torch.ones_like(ratios, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    return PolicyLossInputs(lp, old, torch.tensor(adv, dtype=torch.float32), mask, **extra)


def test_registry_names():
    assert set(ALL_LOSSES) <= set(available_policy_losses())
    with pytest.raises(ConfigError, match="loss_mode='nope'"):
        get_policy_loss("nope")
    with pytest.raises(ConfigError, match="already registered"):
        register_policy_loss("grpo")(lambda prep, cfg: None)


def test_grpo_positive_advantage_values_and_gradients():
    # Â = +1, ρ = [1, 1.5, 0.5], ε_low 0.2, ε_high 0.28:
    #   ρ=1:   max(−1, −1)       = −1     d/dlogπ = −Â ρ = −1
    #   ρ=1.5: max(−1.5, −1.28)  = −1.28  clipped → 0
    #   ρ=0.5: max(−0.5, −0.8)   = −0.5   d/dlogπ = −0.5
    # token-mean over 3 tokens: −2.78/3; gradients divided by 3.
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0])
    loss, metrics = compute_policy_loss("grpo", inp, LossConfig())
    assert loss.item() == pytest.approx(-2.78 / 3, abs=1e-6)
    loss.backward()
    assert inp.logprobs.grad.tolist()[0] == pytest.approx([-1 / 3, 0.0, -0.5 / 3], abs=1e-6)
    assert metrics["loss/clipfrac_high"] == pytest.approx(1 / 3)  # ρ = 1.5 > 1.28
    assert metrics["loss/clipfrac_low"] == 0.0
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["loss/ratio_max"] == pytest.approx(1.5, abs=1e-6)
    # approx KL = mean(log π_old − log π) = −(0 + ln 1.5 + ln 0.5)/3
    assert metrics["loss/approx_kl"] == pytest.approx(-(LN(1.5) + LN(0.5)) / 3, abs=1e-6)


def test_grpo_negative_advantage_dual_clip():
    # Â = −1, ρ = [1, 1.5, 0.5, 20], c = 10:
    #   ρ=1:   max(1, 1) = 1                    grad ρ = 1
    #   ρ=1.5: max(1.5, 1.28) = 1.5              grad 1.5
    #   ρ=0.5: max(0.5, 0.8) = 0.8 (clipped)     grad 0
    #   ρ=20:  max(20, 1.28) = 20 → min(20, 10)  = 10 (dual clip) grad 0
    # token-mean: 13.3 / 4
    inp = make_inputs([[1.0, 1.5, 0.5, 20.0]], [-1.0])
    loss, metrics = compute_policy_loss("grpo", inp, {"clip_ratio_c": 10.0})
    assert loss.item() == pytest.approx(13.3 / 4, abs=1e-5)
    loss.backward()
    assert inp.logprobs.grad.tolist()[0] == pytest.approx([0.25, 1.5 / 4, 0.0, 0.0], abs=1e-6)
    assert metrics["loss/clipfrac_low"] == pytest.approx(0.25)
    assert metrics["loss/clipfrac_dual"] == pytest.approx(0.25)
    assert metrics["loss/clipfrac_high"] == 0.0


def test_aggregation_modes_by_hand():
    # ℓ = [[1, 2, 3], [4, 5, 6], [7, 8, 9]], mask = [[1, 1, 0], [1, 0, 0], [0, 0, 0]] (third sequence empty)
    loss_mat = torch.arange(1.0, 10.0).view(3, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert aggregate_loss(loss_mat, mask, "token-mean").item() == pytest.approx(7 / 3)  # (1+2+4)/3
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5+4)/2
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)  # (3+4)/2
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 6)  # 7/(2·T=3)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(
        7 / 20
    )
    # global normalisers replace the call's own counts
    assert aggregate_loss(loss_mat, mask, "token-mean", global_num_tokens=14).item() == pytest.approx(0.5)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum", global_num_sequences=torch.tensor(7)).item() == (
        pytest.approx(1.0)  # (3 + 4)/7
    )
    # non-finite padding never leaks into the value
    nan_pad = loss_mat.clone()
    nan_pad[2] = float("nan")
    assert aggregate_loss(nan_pad, mask, "token-mean").item() == pytest.approx(7 / 3)
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        aggregate_loss(loss_mat, mask, "mean")
    with pytest.raises(DataError, match="global_num_tokens"):
        aggregate_loss(loss_mat, mask, "token-mean", global_num_tokens=-1)


def test_aggregation_with_token_weights_by_hand():
    # ℓ and mask as above, ω = [[2, 0.5, inf], [3, nan, 1], [1, 1, 1]]: only valid entries of ω are read.
    # Σ m·ω·ℓ = 2·1 + 0.5·2 + 3·4 = 15; per sequence: 3 (2 tokens), 12 (1 token).
    loss_mat = torch.arange(1.0, 10.0).view(3, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    w = torch.tensor([[2.0, 0.5, float("inf")], [3.0, float("nan"), 1.0], [1.0, 1.0, 1.0]])
    assert aggregate_loss(loss_mat, mask, "token-mean", token_weights=w).item() == pytest.approx(15 / 3)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean", token_weights=w).item() == pytest.approx(
        (3 / 2 + 12) / 2
    )
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum", token_weights=w).item() == pytest.approx(15 / 2)
    # the gradient w.r.t. ℓ is m·ω / N, and ω gets none
    x = loss_mat.clone().requires_grad_(True)
    wg = torch.tensor([[2.0, 0.5, 1.0], [3.0, 1.0, 1.0], [1.0, 1.0, 1.0]], requires_grad=True)
    aggregate_loss(x, mask, "token-mean", token_weights=wg).backward()
    assert x.grad.flatten().tolist() == pytest.approx([2 / 3, 0.5 / 3, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert wg.grad is None
    with pytest.raises(DataError, match="token_weights"):
        aggregate_loss(loss_mat, mask, "token-mean", token_weights=w[:2])


def test_stare_loss_rejects_non_finite_weights_on_valid_tokens_and_overflow():
    cfg = LossConfig(stare=STAREConfig(top_p_ratio=0.1, reweight_w=1.1))
    # a non-finite weight on padding is never read; on a valid token it is an error naming the position
    pad = make_inputs([[1.0, 1.5, 0.5]], [1.0], mask=[[1, 1, 0]], gate_on=True,
                      token_weights=torch.tensor([[1.0, 2.0, float("nan")]]))
    loss, _ = compute_policy_loss("stare", pad, cfg)
    assert loss.item() == pytest.approx((-1.0 - 2 * 1.28) / 2, abs=1e-6)  # ρ = 1.5 clipped at 1 + 0.28
    bad = make_inputs([[1.0, 1.5, 0.5]], [1.0], gate_on=True, token_weights=torch.tensor([[1.0, float("inf"), 1.0]]))
    with pytest.raises(DataError, match=r"token_weights\[0, 1\]"):
        compute_policy_loss("stare", bad, cfg)
    # finite inputs whose loss overflows float32 are an error, not an inf that travels
    huge = make_inputs([[1.0, 1.5, 0.5]], [3e38])
    with pytest.raises(DataError, match="overflow"):
        compute_policy_loss("grpo", huge, cfg)


@pytest.mark.parametrize("mode", MODES)
def test_zero_normaliser_gives_zero_not_nan(mode):
    loss_mat = torch.ones(2, 3, requires_grad=True)
    out = aggregate_loss(loss_mat, torch.ones(2, 3), mode, global_num_tokens=0, global_num_sequences=0)
    out.backward()
    assert out.item() == 0.0 and torch.equal(loss_mat.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("name", ALL_LOSSES)
@pytest.mark.parametrize("mode", MODES)
def test_all_masked_gives_exact_zero_and_zero_grad(name, mode):
    inp = make_inputs(
        [[1.2, 0.7], [1.0, 3.0]],
        [1.0, -1.0],
        mask=[[0, 0], [0, 0]],
        entropy=torch.rand(2, 2),
        ref_logprobs=torch.full((2, 2), -2.0),
        rollout_logprobs=torch.full((2, 2), -1.5),
    )
    cfg = {"loss_agg_mode": mode, "entropy_coeff": 0.1, "kl_coef": 0.1, "tis_cap": 2.0, "clip_cov_ratio": 0.5,
           "kl_cov_ratio": 0.5, "stare": {"gate": "always", "top_p_ratio": 1.0}}
    loss, metrics = compute_policy_loss(name, inp, cfg)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(inp.logprobs.grad, torch.zeros(2, 2))
    assert all(math.isfinite(v) for v in metrics.values())


def test_stare_loss_by_hand_and_gate():
    # Â = +1, ρ = [1, 1.5, 0.5], old log-probs [−3, −1, −2] → surprisals 3, 1, 2; P = 0.1 → k = 1 → token 0 gets
    # W = 1.1: ℓ = [−1.1, −1.28, −0.5], mean −2.88/3; d/dlogπ_0 = −1.1/3.
    cfg = LossConfig(stare=STAREConfig(top_p_ratio=0.1, reweight_w=1.1, gate="entropy", scope="microbatch"))
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]], gate_on=True)
    loss, metrics = compute_policy_loss("stare", inp, cfg)
    assert loss.item() == pytest.approx(-2.88 / 3, abs=1e-6)
    loss.backward()
    assert inp.logprobs.grad.tolist()[0] == pytest.approx([-1.1 / 3, 0.0, -0.5 / 3], abs=1e-6)
    assert metrics["stare/frac_pos_selected"] == pytest.approx(1 / 3)
    assert metrics["stare/gate_on"] == 1.0 and metrics["stare/w"] == pytest.approx(1.1)
    # per-step W from the controller overrides the config
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]], gate_on=True, reweight_w=1.5)
    loss, _ = compute_policy_loss("stare", inp, cfg)
    assert loss.item() == pytest.approx(-3.28 / 3, abs=1e-6)
    # precomputed (global) weights are used as given
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0], token_weights=torch.tensor([[1.0, 1.0, 2.0]]), gate_on=True)
    loss, _ = compute_policy_loss("stare", inp, cfg)
    assert loss.item() == pytest.approx(-3.28 / 3, abs=1e-6)  # (−1 − 1.28 − 1.0)/3
    # gate off (from the controller) → plain GRPO, bit for bit
    off = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]], gate_on=False)
    ref = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]])
    loss_off, m_off = compute_policy_loss("stare", off, cfg)
    loss_ref, _ = compute_policy_loss("grpo", ref, cfg)
    assert torch.equal(loss_off, loss_ref) and m_off["stare/gate_on"] == 0.0
    # config gate "never" wins over an inputs gate_on=True; "always" over gate_on=False
    never = LossConfig(stare=STAREConfig(gate="never"))
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]], gate_on=True)
    assert torch.equal(compute_policy_loss("stare", inp, never)[0], loss_ref)
    always = LossConfig(stare=STAREConfig(gate="always", top_p_ratio=0.1))
    inp = make_inputs([[1.0, 1.5, 0.5]], [1.0], old=[[-3.0, -1.0, -2.0]], gate_on=False)
    assert compute_policy_loss("stare", inp, always)[0].item() == pytest.approx(-2.88 / 3, abs=1e-6)


def test_kl_estimators_values_and_gradient():
    # d = log π − log π_ref = 0.5: k1 = 0.5, k2 = 0.125, k3 = e^{−0.5} + 0.5 − 1; dk3/dlogπ = 1 − e^{−0.5}
    lp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5]])
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.125)
    k3 = kl_penalty(lp, ref, "k3")
    assert k3.item() == pytest.approx(math.exp(-0.5) - 0.5, abs=1e-7)
    k3.sum().backward()
    assert lp.grad.item() == pytest.approx(1 - math.exp(-0.5), abs=1e-6)
    # k3 ≥ 0 both directions, and 0 at d = 0
    assert kl_penalty(torch.tensor([-2.0, -1.0, 0.0]), torch.tensor([-1.0, -1.0, -3.0]), "k3").min() >= 0
    with pytest.raises(ConfigError, match="kl_estimator"):
        kl_penalty(lp, ref, "k4")


def test_kl_addon_matches_finite_differences():
    # Â = 0 (no policy-gradient term): L = λ·token-mean(k3). Compare autograd with central differences.
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.3, -1.0, -0.9]])
    cfg = {"kl_coef": 0.7, "kl_estimator": "k3"}

    def value(lp):
        return compute_policy_loss("grpo", PolicyLossInputs(lp, old, torch.zeros(1), torch.ones(1, 3),
                                                            ref_logprobs=ref), cfg)[0]

    lp = old.clone().double().float().requires_grad_(True)
    value(lp).backward()
    eps = 1e-3
    for j in range(3):
        plus, minus = old.clone(), old.clone()
        plus[0, j] += eps
        minus[0, j] -= eps
        fd = (value(plus).item() - value(minus).item()) / (2 * eps)
        assert lp.grad[0, j].item() == pytest.approx(fd, rel=2e-3, abs=1e-5)
    # value: 0.7 · mean(e^{−d} + d − 1), d = old − ref
    d = (old - ref)[0].tolist()
    expected = 0.7 * sum(math.exp(-x) + x - 1 for x in d) / 3
    assert value(old).item() == pytest.approx(expected, abs=1e-6)


def test_entropy_bonus_term():
    # Â = 0: L = −β · token-mean(H) = −0.1 · (0.2 + 0.4)/2 (third token is padding); dL/dH = −β/2 on valid tokens
    ent = torch.tensor([[0.2, 0.4, 9.0]], requires_grad=True)
    inp = PolicyLossInputs(torch.zeros(1, 3, requires_grad=True), torch.zeros(1, 3), torch.zeros(1),
                           torch.tensor([[1, 1, 0]]), entropy=ent)
    loss, metrics = compute_policy_loss("grpo", inp, {"entropy_coeff": 0.1})
    assert loss.item() == pytest.approx(-0.03, abs=1e-7)
    loss.backward()
    assert ent.grad.tolist()[0] == pytest.approx([-0.05, -0.05, 0.0])
    assert metrics["loss/entropy"] == pytest.approx(0.3)
    with pytest.raises(DataError, match="entropy"):
        compute_policy_loss("grpo", make_inputs([[1.0]], [1.0]), {"entropy_coeff": 0.1})


def test_truncated_importance_sampling():
    # π_old / π_rollout = e^{ln 3} = 3; cap 2 → factor 2; cap 5 → factor 3 (on the on-policy GRPO loss −Â·1)
    old = [[-1.0, -1.0]]
    rollout = torch.tensor([[-1.0 - LN(3.0), -1.0 - LN(3.0)]])
    for cap, factor in ((2.0, 2.0), (5.0, 3.0)):
        inp = make_inputs([[1.0, 1.0]], [1.0], old=old, rollout_logprobs=rollout)
        loss, metrics = compute_policy_loss("grpo", inp, {"tis_cap": cap})
        assert loss.item() == pytest.approx(-factor, rel=1e-6)
        assert metrics["loss/tis_weight_mean"] == pytest.approx(factor, rel=1e-6)
    with pytest.raises(DataError, match="rollout_logprobs"):
        compute_policy_loss("grpo", make_inputs([[1.0]], [1.0]), {"tis_cap": 2.0})


def _cov_case():
    # On-policy (ρ = 1), log π = [[−0.1, −3], [−0.1, −3]], Â = [2, −2]: mean log π = −1.55, mean Â = 0 →
    # Cov = [[1.45·2, −1.45·2], [1.45·−2, −1.45·−2]] = [[2.9, −2.9], [−2.9, 2.9]]: eligible for Clip-Cov
    # (1 < Cov < 5): (0, 0) and (1, 1).
    lp = torch.tensor([[-0.1, -3.0], [-0.1, -3.0]])
    return PolicyLossInputs(lp.clone().requires_grad_(True), lp.clone(), torch.tensor([2.0, -2.0]),
                            torch.ones(2, 2, dtype=torch.bool), generator=torch.Generator().manual_seed(0))


def test_clip_cov_detaches_random_eligible_tokens():
    ref = _cov_case()
    ref_loss, _ = compute_policy_loss("grpo", ref, {})
    ref_loss.backward()
    # r = 0.25, N = 4 → k = max(1, ⌊1⌋) = 1 of the 2 eligible tokens
    inp = _cov_case()
    loss, metrics = compute_policy_loss("clip_cov", inp, {"clip_cov_ratio": 0.25})
    loss.backward()
    assert torch.equal(loss, ref_loss)  # value unchanged, only the gradient is removed
    zero = inp.logprobs.grad == 0
    assert int(zero.sum()) == 1 and (zero[0, 0] or zero[1, 1])
    assert torch.equal(inp.logprobs.grad[~zero], ref.logprobs.grad[~zero])
    assert metrics["loss/clip_cov_frac"] == pytest.approx(0.25)
    # same generator seed → same choice; r = 0.5 → k = 2 → both eligible tokens
    again = _cov_case()
    compute_policy_loss("clip_cov", again, {"clip_cov_ratio": 0.25})[0].backward()
    assert torch.equal(again.logprobs.grad, inp.logprobs.grad)
    both = _cov_case()
    compute_policy_loss("clip_cov", both, {"clip_cov_ratio": 0.5})[0].backward()
    assert both.logprobs.grad[0, 0] == 0 and both.logprobs.grad[1, 1] == 0
    assert both.logprobs.grad[0, 1] != 0 and both.logprobs.grad[1, 0] != 0
    # Cov bounds that exclude 2.9 → nothing detached
    none = _cov_case()
    compute_policy_loss("clip_cov", none, {"clip_cov_ratio": 0.5, "clip_cov_lb": 3.0})[0].backward()
    assert torch.equal(none.logprobs.grad, ref.logprobs.grad)


def test_kl_cov_by_hand():
    # log π = [[0, −3], [−0.5, −2]], log π_old = log π − 0.1 (ρ = e^{0.1}, inside the clip range), Â = [2, −1]:
    # mean log π = −1.375, mean Â = 0.5 → Cov = [[1.375·1.5, −1.625·1.5], [0.875·−1.5, −0.625·−1.5]]
    #                                         = [[2.0625, −2.4375], [−1.3125, 0.9375]]
    # r = 0.25, N = 4 → k = 1 → token (0, 0) gets + β·|log ρ| = 0.1 (β = 1).
    lp = torch.tensor([[0.0, -3.0], [-0.5, -2.0]])
    inp = PolicyLossInputs(lp.clone().requires_grad_(True), lp - 0.1, torch.tensor([2.0, -1.0]),
                           torch.ones(2, 2, dtype=torch.bool))
    loss, metrics = compute_policy_loss("kl_cov", inp, {"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0})
    rho = math.exp(0.1)
    assert loss.item() == pytest.approx(((-2 * rho + 0.1) - 2 * rho + rho + rho) / 4, abs=1e-6)
    loss.backward()
    # d/dlogπ: (0,0): −2ρ + 1 (|log ρ|' = 1); (0,1): −2ρ; row 1 (Â = −1): +ρ each; all over 4
    assert inp.logprobs.grad.flatten().tolist() == pytest.approx([(-2 * rho + 1) / 4, -2 * rho / 4, rho / 4,
                                                                  rho / 4], abs=1e-6)
    assert metrics["loss/kl_cov_frac"] == pytest.approx(0.25)


def test_forking_tokens_by_hand():
    # entropy [[0.1, 0.9], [0.5, 0.3]], q = 0.5 → k = 2 → threshold 0.5 → keep (0, 1), (1, 0).
    # On-policy, Â = [1, −1]: ℓ = [[−1, −1], [1, 1]] → kept: −1 + 1 = 0 over N = 4 valid tokens;
    # gradient −1/4 at (0, 1), +1/4 at (1, 0), 0 elsewhere.
    ent = torch.tensor([[0.1, 0.9], [0.5, 0.3]])
    assert forking_entropy_threshold(ent, torch.ones(2, 2), 0.5).item() == pytest.approx(0.5)
    lp = torch.full((2, 2), -1.0)
    inp = PolicyLossInputs(lp.clone().requires_grad_(True), lp, torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                           entropy=ent)
    loss, metrics = compute_policy_loss("forking_tokens", inp, {"top_entropy_quantile": 0.5})
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert inp.logprobs.grad.flatten().tolist() == pytest.approx([0.0, -0.25, 0.25, 0.0])
    assert metrics["loss/forking_frac"] == pytest.approx(0.5)
    # a global threshold from the inputs overrides the call's quantile: 0.95 keeps nothing
    inp = PolicyLossInputs(lp.clone().requires_grad_(True), lp, torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                           entropy=ent, entropy_threshold=0.95)
    assert compute_policy_loss("forking_tokens", inp, {})[0].item() == 0.0
    with pytest.raises(DataError, match="entropy"):
        compute_policy_loss("forking_tokens", make_inputs([[1.0]], [1.0]), {})


def test_input_validation_errors():
    good = make_inputs([[1.0, 1.0]], [1.0])
    with pytest.raises(DataError, match="response_mask"):
        compute_policy_loss("grpo", PolicyLossInputs(good.logprobs, good.old_logprobs, good.advantages,
                                                     torch.ones(1, 3)), {})
    with pytest.raises(DataError, match="advantages"):
        compute_policy_loss("grpo", PolicyLossInputs(good.logprobs, good.old_logprobs, torch.ones(2),
                                                     good.response_mask), {})
    with pytest.raises(DataError, match="old_logprobs"):
        compute_policy_loss("grpo", PolicyLossInputs(good.logprobs, good.old_logprobs[:, :1], good.advantages,
                                                     good.response_mask), {})
    with pytest.raises(DataError, match="logprobs"):
        compute_policy_loss("grpo", PolicyLossInputs(torch.zeros(2), torch.zeros(2), torch.ones(2),
                                                     torch.ones(2)), {})
    bad_adv = PolicyLossInputs(good.logprobs, good.old_logprobs, torch.tensor([float("nan")]), good.response_mask)
    with pytest.raises(DataError, match=r"advantages\[0\] = nan"):
        compute_policy_loss("grpo", bad_adv, {})
    bad_old = good.old_logprobs.clone()
    bad_old[0, 1] = float("inf")
    with pytest.raises(DataError, match=r"old_logprobs\[0, 1\]"):
        compute_policy_loss("grpo", PolicyLossInputs(good.logprobs, bad_old, good.advantages,
                                                     good.response_mask), {})
    with pytest.raises(ConfigError, match="unknown config key loss.clip_ratio"):
        compute_policy_loss("grpo", good, {"clip_ratio": 0.2})
    with pytest.raises(ConfigError, match="loss.clip_ratio_c=0.5"):
        compute_policy_loss("grpo", good, {"clip_ratio_c": 0.5})


def test_dict_config_equals_dataclass_and_custom_loss():
    a = make_inputs([[1.2, 0.9]], [0.5])
    b = make_inputs([[1.2, 0.9]], [0.5])
    la, _ = compute_policy_loss("grpo", a, {"loss_agg_mode": "seq-mean-token-sum", "clip_ratio_high": 0.1})
    lb, _ = compute_policy_loss("grpo", b, LossConfig(loss_agg_mode="seq-mean-token-sum", clip_ratio_high=0.1))
    assert torch.equal(la, lb)

    @register_policy_loss("test_only_reinforce", metrics=("loss/custom",))
    def reinforce(ctx, cfg):
        """REINFORCE: ℓ = −Â·log π (for the registry test only)."""
        return -ctx.adv * ctx.logprobs, {"loss/custom": 1.0}

    # ℓ = −0.5·log π over two tokens; log π = −1 + ln ρ
    inp = make_inputs([[1.2, 0.9]], [0.5])
    loss, metrics = compute_policy_loss("test_only_reinforce", inp, {})
    assert loss.item() == pytest.approx(-0.5 * ((-1 + LN(1.2)) + (-1 + LN(0.9))) / 2, abs=1e-6)
    assert metrics["loss/custom"] == 1.0 and "loss/ratio_mean" in metrics


@pytest.mark.parametrize("bad", [float("nan"), -5.0, float("inf")])
def test_tensor_normalisers_are_checked(bad):
    """A tensor global_num_tokens / global_num_sequences that is NaN, negative or infinite is a DataError from the
    loss (never a 0 loss with NaN gradients); aggregate_loss alone returns 0 with zero gradient for NaN / negative."""
    x = torch.tensor([[0.0, -0.5]], requires_grad=True)
    for name, mode in (("global_num_tokens", "token-mean"), ("global_num_sequences", "seq-mean-token-sum")):
        inp = PolicyLossInputs(x, torch.tensor([[0.0, -0.5]]), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool),
                               **{name: torch.tensor(bad)})
        with pytest.raises(DataError, match=name):
            compute_policy_loss("grpo", inp, LossConfig(loss_agg_mode=mode))
    if bad != float("inf"):
        y = torch.ones(1, 2, requires_grad=True)
        out = aggregate_loss(y, torch.ones(1, 2), "token-mean", global_num_tokens=torch.tensor(bad))
        out.backward()
        assert out.item() == 0.0 and torch.equal(y.grad, torch.zeros(1, 2))


METRIC_CONFIGS = [
    {},
    {"entropy_coeff": 0.01, "kl_coef": 0.1},
    {"tis_cap": 2.0, "tis_mode": "mask"},
    {"tis_cap": 2.0, "stare": {"variant": "C2", "gate": "always"}},
]


@pytest.mark.parametrize("loss", ALL_LOSSES)
@pytest.mark.parametrize("extra", METRIC_CONFIGS, ids=["plain", "bonus-kl", "tis-mask", "tis-c2"])
def test_declared_metric_names_are_the_keys_of_a_call(loss, extra):
    """loss_metric_names (what the trainer sums over ranks before any call) is exactly the key set a call returns,
    for every built-in loss and the add-ons that add keys (entropy bonus, KL, TIS, masked TIS)."""
    cfg = LossConfig(loss_mode=loss, **{k: v for k, v in extra.items() if k != "stare"},
                     stare=STAREConfig(**extra.get("stare", {})))
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g)
    inp = PolicyLossInputs(old.clone().requires_grad_(True), old, torch.tensor([1.0, -1.0, 0.5]),
                           torch.ones(3, 4, dtype=torch.bool), entropy=torch.rand(3, 4, generator=g),
                           rollout_logprobs=old - 0.1, ref_logprobs=old + 0.1)
    _, metrics = compute_policy_loss(loss, inp, cfg)
    assert set(metrics) == set(loss_metric_names(loss, cfg, entropy=True))
    assert set(loss_metric_names(loss, cfg)) == set(metrics) - ({"loss/entropy"} if cfg.entropy_coeff == 0 else set())


def test_an_undeclared_metric_is_an_error_and_unregister_frees_the_name():
    def core(ctx, cfg):
        return -ctx.adv * ctx.ratio, {"loss/a": 1.0, "loss/b": 2.0}

    register_policy_loss("test_only_undeclared", metrics=("loss/a",))(core)
    with pytest.raises(ConfigError, match="returned metric 'loss/b' it did not declare \\(declared: loss/a\\)"):
        compute_policy_loss("test_only_undeclared", make_inputs([[1.0]], [1.0]), {})
    unregister_policy_loss("test_only_undeclared")
    register_policy_loss("test_only_undeclared", metrics=lambda cfg: ("loss/a", "loss/b"))(core)
    _, metrics = compute_policy_loss("test_only_undeclared", make_inputs([[1.0]], [1.0]), {})
    assert (metrics["loss/a"], metrics["loss/b"]) == (1.0, 2.0)
    unregister_policy_loss("test_only_undeclared")
    with pytest.raises(ConfigError, match="metrics of policy loss 'x' must be a sequence"):
        register_policy_loss("x", metrics="loss/a")


def test_clipped_surrogate_from_a_registered_loss():
    """A loss that reuses the public clipped surrogate with its own advantages (here Â' = 2Â) gets GRPO's clip:
    Â' = +2, ρ = [1, 1.5] (ε_high 0.28): ℓ = [−2, −2·1.28] → token-mean −2.28; the clipped token has no gradient."""
    @register_policy_loss("test_only_double_adv", metrics=SURROGATE_METRICS)
    def core(ctx, cfg):
        return clipped_surrogate(ctx, cfg, advantages=2.0 * ctx.adv)

    inp = make_inputs([[1.0, 1.5]], [1.0])
    loss, metrics = compute_policy_loss("test_only_double_adv", inp, LossConfig())
    assert loss.item() == pytest.approx(-2.28, abs=1e-6)
    loss.backward()
    assert inp.logprobs.grad.tolist()[0] == pytest.approx([-1.0, 0.0], abs=1e-6)  # ∂(−2ρ/2)/∂log π at ρ = 1
    assert metrics["loss/clipfrac_high"] == pytest.approx(0.5)
    unregister_policy_loss("test_only_double_adv")
    with pytest.raises(DataError, match="clipped_surrogate: advantages must be a tensor of shape"):
        register_policy_loss("test_only_bad_adv")(lambda ctx, cfg: clipped_surrogate(ctx, cfg, torch.ones(7)))
        compute_policy_loss("test_only_bad_adv", make_inputs([[1.0]], [1.0]), {})
    unregister_policy_loss("test_only_bad_adv")


def test_a_registered_loss_that_raises_is_one_error_naming_it(monkeypatch):
    """A plugin's exception becomes a LossError naming the loss and the exception (chained); a StareLabError it
    raises passes unchanged; a built-in loss's bug is not wrapped (its traceback is the useful part)."""
    import stare_lab.loss.registry as registry
    from stare_lab.errors import LossError, StareLabError

    boom = ValueError("bad shape 3")

    def raiser(ctx, cfg):
        raise boom

    register_policy_loss("test_only_raiser")(raiser)
    try:
        with pytest.raises(LossError) as info:
            compute_policy_loss("test_only_raiser", make_inputs([[1.0]], [1.0]), {})
        assert str(info.value) == "policy loss 'test_only_raiser' raised ValueError: bad shape 3"
        assert isinstance(info.value, StareLabError) and info.value.__cause__ is boom
        with monkeypatch.context() as m:
            m.setattr(registry, "BUILTIN_LOSSES", registry.BUILTIN_LOSSES + ("test_only_raiser",))
            with pytest.raises(ValueError, match="bad shape 3") as info:
                compute_policy_loss("test_only_raiser", make_inputs([[1.0]], [1.0]), {})
            assert info.value is boom
    finally:
        unregister_policy_loss("test_only_raiser")
    register_policy_loss("test_only_data_error")(lambda ctx, cfg: (_ for _ in ()).throw(DataError("own message")))
    with pytest.raises(DataError) as info:
        compute_policy_loss("test_only_data_error", make_inputs([[1.0]], [1.0]), {})
    assert str(info.value) == "own message"
    unregister_policy_loss("test_only_data_error")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_registered_loss_returning_non_finite_is_blamed_by_name(bad):
    """Finite inputs, a plugin core whose matrix has NaN/inf on a valid token: the message names the loss, not an
    overflow of the inputs (the built-in overflow message is test_stare_loss_rejects_non_finite_weights...)."""
    register_policy_loss("test_only_nan")(lambda ctx, cfg: (torch.full_like(ctx.ratio, bad), {}))
    try:
        with pytest.raises(DataError) as info:
            compute_policy_loss("test_only_nan", make_inputs([[1.0, 1.0]], [1.0]), {})
    finally:
        unregister_policy_loss("test_only_nan")
    msg = str(info.value)
    assert msg.startswith("policy loss 'test_only_nan' returned a non-finite value (") and "overflow" not in msg
