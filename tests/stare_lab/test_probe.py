"""The cheap probe (stare_lab.theory.probe): D terms from one backward and one forward-mode pass, checked in float64 on a
tiny autoregressive model with shared parameters, against (a) central finite differences of the objective along v
and of H̄ along −P⊙g_X, and (b) the three-backward values (one gradient per objective,
adam_linear.linearised_entropy_change); the row entries by hand; Adam's second moment against torch's AdamW."""

from __future__ import annotations

import math

import pytest
import torch

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS, KEY_D_RATIO, KEY_LPLUS_ABOVE, KEY_W_STAR
from stare_lab.theory.decomposition import grpo_objective, part_objective, selected_parts
from stare_lab.errors import DataError
from stare_lab.theory.adam_linear import adam_exp_avg_sq, adam_preconditioner, linearised_entropy_change
from stare_lab.theory.first_order import (
    critical_surprisal,
    logprob_change,
    predicted_entropy_change,
    share_above_critical,
    token_first_order,
)
from stare_lab.loss.entropy import entropy_from_logits, logprobs_from_logits
from stare_lab.theory.probe import (
    LPLUS_ABOVE_SUM,
    LPLUS_MASS_SUM,
    GraphTangent,
    directional_terms,
    jvp_logits,
    lplus_mass,
    preconditioned_direction,
    probe_row,
    token_tangents,
)
from stare_lab.loss.step import StepBatch, prepare_step

F64 = torch.float64
V, D, B, T, TAU = 7, 5, 4, 6, 0.8


class TinyLM(torch.nn.Module):
    """Embedding → causal running mean (positions share parameters and see their prefix) → tanh layer → logits."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.mix = torch.nn.Linear(D, D)
        self.out = torch.nn.Linear(D, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).cumsum(1) / torch.arange(1, ids.shape[1] + 1, dtype=F64)[None, :, None]
        return self.out(torch.tanh(self.mix(h)))


def _setup(entropy_coeff: float = 0.0):
    torch.manual_seed(0)
    model = TinyLM().to(F64)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, T + 1), generator=g)
    tokens = ids[:, 1:]
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    adv = torch.tensor([1.0, -1.0, 0.5, -0.7], dtype=F64)
    loss = LossConfig(loss_mode="stare", entropy_coeff=entropy_coeff,
                      stare=STAREConfig(variant="C2", gate="always", top_p_ratio=0.4, reweight_w=1.3, reweight_m=0.8))
    params = dict(model.named_parameters())

    def forward(p):
        return torch.func.functional_call(model, p, (ids[:, :-1],))

    def per_token(p):
        z = forward(p)
        lp = torch.log_softmax(z / TAU, -1).gather(-1, tokens[..., None])[..., 0]
        ls = torch.log_softmax(z / TAU, -1)
        return lp, -(ls.exp() * ls).sum(-1)

    with torch.no_grad():
        lp0, ent0 = per_token(params)
    batch = StepBatch(mask, adv, lp0.clone(), entropy=ent0.clone())
    prep = prepare_step(batch, loss, step=1, seed=0)
    parts = selected_parts(batch, loss)
    bonus = entropy_coeff > 0
    objectives = {KEY_D_GRPO: lambda lp, ent: grpo_objective(prep.inputs(lp, entropy=ent if bonus else None), loss)}
    for key, ind in parts.items():
        objectives[key] = (lambda ind: lambda lp, ent: part_objective(
            prep.inputs(lp, entropy=ent0 if bonus else None), ind, loss))(ind)
    # a real AdamW step on the run's loss gives the preconditioner
    from stare_lab.loss.losses import compute_policy_loss

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    lp, ent = per_token(params)
    compute_policy_loss("stare", prep.inputs(lp, entropy=ent if bonus else None), loss)[0].backward()
    opt.step()
    names = list(params)
    precond = adam_preconditioner([opt.state[params[n]]["exp_avg_sq"] for n in names], lr=1e-2, beta1=0.9,
                                  beta2=0.99, eps=1e-8, step=1)
    m = mask.double()
    h_bar = lambda p: (per_token(p)[1] * m).sum() / m.sum()  # noqa: E731
    leaves = {n: t.clone().requires_grad_(True) for n, t in theta0.items()}
    grad_h = torch.autograd.grad(h_bar(leaves), [leaves[n] for n in names])
    return dict(forward=forward, per_token=per_token, theta0=theta0, names=names, precond=precond, grad_h=grad_h,
                objectives=objectives, parts=parts, tokens=tokens, h_bar=h_bar)


def _jvp_terms(s):
    tangent, scale = preconditioned_direction(s["grad_h"], s["precond"], [s["theta0"][n] for n in s["names"]])
    z, dz = jvp_logits(s["forward"], s["theta0"], dict(zip(s["names"], tangent)))
    tt = token_tangents(z, dz, s["tokens"], TAU, scale)
    return tt, directional_terms(tt, s["objectives"])


def _objective_at(s, key, p):
    lp, ent = s["per_token"](p)
    return s["objectives"][key](lp, ent)


@pytest.mark.parametrize("entropy_coeff", [0.0, 0.05])
def test_jvp_d_terms_equal_three_backward_and_finite_differences(entropy_coeff):
    """D_X = −v·∇θℓ_X with v = P⊙∇θH̄ (module docstring). Independent values: (a) the three-backward way — autograd's
    gradient of each objective at θ, dotted by adam_linear.linearised_entropy_change (float64, agreement to 1e-10
    relative); (b) finite differences of the objective along v, D_X = −dℓ_X(θ + εv)/dε (the core's losses are
    float32, so a 4th-order central stencil with ε = 1e-2 of max|v|: agreement 1e-4), and of the float64 H̄ along
    the update, D_X = dH̄(θ − εP⊙g_X)/dε (central, ε = 1e-5 of max|P⊙g_X|: 1e-6). With an entropy bonus the GRPO
    objective also depends on the per-token entropies (the ∂ℓ/∂H_t term)."""
    s = _setup(entropy_coeff)
    tt, d = _jvp_terms(s)
    assert set(d) == {KEY_D_GRPO, KEY_D_LPLUS, KEY_D_LMINUS}
    assert d[KEY_D_LPLUS] != 0 and d[KEY_D_LMINUS] != 0
    names, theta0 = s["names"], s["theta0"]
    v = [gh.double() * p for gh, p in zip(s["grad_h"], s["precond"])]
    h = 1e-2 / max(float(t.abs().max()) for t in v)
    for key, value in d.items():
        params = [theta0[n].clone().requires_grad_(True) for n in names]
        g = torch.autograd.grad(_objective_at(s, key, dict(zip(names, params))), params, allow_unused=True)
        three = linearised_entropy_change(s["grad_h"], s["precond"], g)
        assert value == pytest.approx(three, rel=1e-10, abs=1e-15), key
        with torch.no_grad():
            at = lambda k: float(_objective_at(s, key, {n: theta0[n] + k * h * x for n, x in zip(names, v)}))  # noqa
            fd_obj = -(-at(2) + 8 * at(1) - 8 * at(-1) + at(-2)) / (12 * h)
            step = [p.double() * (x if x is not None else torch.zeros_like(p)) for p, x in zip(s["precond"], g)]
            e2 = 1e-5 / max(float(t.abs().max()) for t in step)
            fd_h = float(s["h_bar"]({n: theta0[n] - e2 * x for n, x in zip(names, step)})
                         - s["h_bar"]({n: theta0[n] + e2 * x for n, x in zip(names, step)})) / (2 * e2)
        assert value == pytest.approx(fd_obj, rel=1e-4), key
        assert value == pytest.approx(fd_h, rel=1e-6), key


def test_token_tangents_match_finite_differences_per_token():
    """Every token's ∇θ log π_t·v and ∇θH_t·v from the one forward-mode pass equal central differences of that
    token's log-prob / entropy along v (ε = 1e-5 of max|v|), and the primal log-probs are the forward's."""
    s = _setup()
    tt, _ = _jvp_terms(s)
    names, theta0 = s["names"], s["theta0"]
    v = [gh.double() * p for gh, p in zip(s["grad_h"], s["precond"])]
    eps = 1e-5 / max(float(t.abs().max()) for t in v)
    with torch.no_grad():
        lp_u, ent_u = s["per_token"]({n: theta0[n] + eps * x for n, x in zip(names, v)})
        lp_d, ent_d = s["per_token"]({n: theta0[n] - eps * x for n, x in zip(names, v)})
        lp0, _ = s["per_token"](theta0)
    torch.testing.assert_close(tt.d_logprobs, (lp_u - lp_d) / (2 * eps), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(tt.d_entropy, (ent_u - ent_d) / (2 * eps), rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(tt.logprobs, lp0, rtol=0, atol=1e-12)


def test_graph_tangent_is_the_forward_mode_pass_and_the_gradient():
    """GraphTangent (one recorded backward, then one backward through it) against independent values in float64:
    its gradient is autograd's ∇θΣ_mask H_t (the probe's ∇θH̄ × N) to 1e-12; its ż along v = P⊙∇θH̄ is
    ``torch.func.jvp``'s to 1e-12 relative, so the D terms equal the jvp ones (1e-10) and hence the three-backward
    values (the test above); a second use raises."""
    s = _setup()
    names, theta0 = s["names"], s["theta0"]
    leaves = {n: theta0[n].clone().requires_grad_(True) for n in names}
    z = s["forward"](leaves)
    zd = z.detach().requires_grad_(True)
    ls = torch.log_softmax(zd / TAU, -1)
    m = torch.ones(B, T, dtype=F64)
    m[1, 4:] = 0
    m[3, 2:] = 0
    (w,) = torch.autograd.grad((-(ls.exp() * ls).sum(-1) * m).sum(), zd)
    graph = GraphTangent(z, [leaves[n] for n in names], w)
    for g, ref in zip(graph.gradient, s["grad_h"]):
        torch.testing.assert_close(g / m.sum(), ref, rtol=1e-12, atol=1e-15)
    tangent, scale = preconditioned_direction(s["grad_h"], s["precond"], [theta0[n] for n in names])
    dz = graph.logits_dot(tangent)
    z_ref, dz_ref = jvp_logits(s["forward"], theta0, dict(zip(names, tangent)))
    torch.testing.assert_close(dz, dz_ref, rtol=1e-12, atol=1e-15)
    d = directional_terms(token_tangents(z.detach(), dz, s["tokens"], TAU, scale), s["objectives"])
    _, d_ref = _jvp_terms(s)
    for key in d_ref:
        assert d[key] == pytest.approx(d_ref[key], rel=1e-10), key
    with pytest.raises(RuntimeError, match="used already"):
        graph.logits_dot(tangent)


def test_logprob_change_is_the_softmax_jacobian():
    """Δlog π_a = (Δz_a − E_π Δz)/τ against central differences of log_softmax(z/τ)_a (float64, ε = 1e-6); −inf
    logits (masked tokens) are allowed."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, 9, generator=g, dtype=F64)
    z[0, 0, 3] = -math.inf
    dz = torch.randn(3, 4, 9, generator=g, dtype=F64)
    dz[0, 0, 3] = 0.0
    tok = torch.randint(0, 9, (3, 4), generator=g)
    tok[0, 0] = 1
    eps = 1e-6
    f = lambda x: torch.log_softmax(x / 1.7, -1).gather(-1, tok[..., None])[..., 0]  # noqa: E731
    fd = (f(z + eps * dz) - f(z - eps * dz)) / (2 * eps)
    torch.testing.assert_close(logprob_change(z, dz, tok, temperature=1.7), fd, rtol=1e-7, atol=1e-9)
    with pytest.raises(DataError):
        logprob_change(z, dz[..., :5], tok)


def test_token_first_order_is_the_separate_functions_in_one_pass():
    """The fused pass gives, bit for bit up to float64 rounding, what logprobs_from_logits, entropy_from_logits,
    logprob_change, predicted_entropy_change and critical_surprisal give one by one (τ = 0.7, a chunk of 5 rows so
    that several chunks are exercised)."""
    g = torch.Generator().manual_seed(4)
    z = torch.randn(3, 7, 11, generator=g, dtype=F64) * 2
    dz = torch.randn(3, 7, 11, generator=g, dtype=F64)
    tok = torch.randint(0, 11, (3, 7), generator=g)
    lp, h, dlp, dh, s_star = token_first_order(z, dz, tok, temperature=0.7, chunk_size=5)
    for got, want in ((lp, logprobs_from_logits(z, tok, 0.7)), (h, entropy_from_logits(z, 0.7)),
                      (dlp, logprob_change(z, dz, tok, 0.7)), (dh, predicted_entropy_change(z, dz, 0.7)),
                      (s_star, critical_surprisal(z, 0.7))):
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)


def test_probe_row_by_hand():
    """D_GRPO −2, D_L+ 0.5: ratio 0.5/2 = 0.25; L+ mass 1 of 4 above s*: share 0.25; O1 W* = 1 + 2/0.5 = 5. C2 with
    D_L− −1 at M 0.8: W* = 1 − (−2 + (−0.2)(−1))/0.5 = 4.6. D_L+ ≤ 0 with a negative drift: W* = inf (no W cancels
    it). D_GRPO = 0: no ratio; no L+ mass: no share."""
    sums = {KEY_D_GRPO: -2.0, KEY_D_LPLUS: 0.5, LPLUS_ABOVE_SUM: 1.0, LPLUS_MASS_SUM: 4.0}
    row = probe_row(sums)
    assert row[KEY_D_RATIO] == 0.25 and row[KEY_LPLUS_ABOVE] == 0.25 and row[KEY_W_STAR] == 5.0
    assert KEY_D_LMINUS not in row
    c2 = probe_row({**sums, KEY_D_LMINUS: -1.0}, reweight_m=0.8)
    assert c2[KEY_W_STAR] == pytest.approx(4.6, rel=1e-12) and c2[KEY_D_LMINUS] == -1.0
    assert probe_row({KEY_D_GRPO: -1.0, KEY_D_LPLUS: -0.1})[KEY_W_STAR] == math.inf
    empty = probe_row({KEY_D_GRPO: 0.0, KEY_D_LPLUS: 0.0, LPLUS_ABOVE_SUM: 0.0, LPLUS_MASS_SUM: 0.0})
    assert empty[KEY_D_RATIO] is None and empty[KEY_LPLUS_ABOVE] is None
    with pytest.raises(DataError, match="pred/d_lplus"):
        probe_row({KEY_D_GRPO: 1.0})


@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_decomposition_of_an_auto_run_selects_the_sets_of_the_fixed_w_run(variant):
    """The D-term sets and objectives of a run with the auto schedule (o1-auto / c2-auto: adaptive, schedule auto)
    are those of the same run with W fixed: the selection does not read W, M or the schedule. (The selection's
    config once kept ``schedule="auto"`` with ``adaptive=False``, which the config refuses: every auto run of the
    transformer simulator and the trainer's prediction stopped at its first step.)"""
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(B, T, generator=g) > 0.2
    batch = StepBatch(mask, torch.tensor([1.0, -1.0, 0.5, -0.7], dtype=F64),
                      -torch.rand(B, T, generator=g, dtype=F64) * 3, entropy=torch.rand(B, T, generator=g, dtype=F64))
    fixed = LossConfig(loss_mode="stare", stare=STAREConfig(variant=variant, top_p_ratio=0.4, target_entropy=0.5))
    auto = LossConfig(loss_mode="stare", stare=STAREConfig(variant=variant, top_p_ratio=0.4, target_entropy=0.5,
                                                           adaptive=True, schedule="auto"))
    a, b = selected_parts(batch, auto), selected_parts(batch, fixed)
    assert a.keys() == b.keys() == ({KEY_D_LPLUS, KEY_D_LMINUS} if variant == "C2" else {KEY_D_LPLUS})
    assert all(torch.equal(a[k], b[k]) for k in a) and a[KEY_D_LPLUS].sum() > 0
    prep = prepare_step(batch, fixed, step=1, seed=0)
    lp = batch.old_logprobs.clone().requires_grad_(True)
    assert torch.equal(part_objective(prep.inputs(lp), a[KEY_D_LPLUS], auto),
                       part_objective(prep.inputs(lp), a[KEY_D_LPLUS], fixed))


def test_lplus_mass_combines_to_the_share_of_the_whole_batch():
    """The per-micro-batch sums of lplus_mass, added over two halves of the batch, give share_above_critical of the
    whole batch (the surprisal is −log π of the forward-mode pass's primal)."""
    s = _setup()
    tt, _ = _jvp_terms(s)
    lplus = s["parts"][KEY_D_LPLUS]
    whole = share_above_critical(-tt.logprobs, tt.s_star, lplus > 0)
    halves = [lplus_mass(type(tt)(*(x[r] for x in (tt.logprobs, tt.entropy, tt.d_logprobs, tt.d_entropy,
                                                    tt.s_star))), lplus[r]) for r in (slice(0, 2), slice(2, 4))]
    above = sum(h[LPLUS_ABOVE_SUM] for h in halves)
    total = sum(h[LPLUS_MASS_SUM] for h in halves)
    assert total > 0 and above / total == pytest.approx(whole, rel=1e-12)


def test_adam_exp_avg_sq_is_torch_adamws_second_moment():
    """v_t = β₂v_{t−1} + (1 − β₂)(c·g)² formed before the step equals torch.optim.AdamW's exp_avg_sq after it: from no
    state (first step) and from the state of an earlier step, with the gradient scaled by a clip factor c = 0.3 as
    gradient clipping does before the optimizer sees it."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=F64))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95))
    prev = [None]
    for _ in range(2):
        g = torch.randn(5, 3, dtype=F64)
        want = adam_exp_avg_sq(prev, [g], beta2=0.95, clip=0.3)[0]
        p.grad = 0.3 * g
        opt.step()
        torch.testing.assert_close(want, opt.state[p]["exp_avg_sq"], rtol=1e-14, atol=0)
        prev = [opt.state[p]["exp_avg_sq"].clone()]
    with pytest.raises(DataError):
        adam_exp_avg_sq([None], [None], beta2=0.9)


def test_preconditioned_direction_is_scaled_for_16_bit_parameters():
    """v = P⊙∇H̄ = [1e-9, −4e-9] is cast to bf16 as v / max|v| = [0.25, −1] (exact in bf16) with scale 4e-9, so a
    tiny direction keeps its digits; v = 0 gives scale 1; mismatched lengths are a DataError."""
    like = [torch.zeros(2, dtype=torch.bfloat16)]
    tangent, scale = preconditioned_direction([torch.tensor([1.0, -2.0])], [torch.tensor([1e-9, 2e-9], dtype=F64)],
                                              like)
    assert scale == pytest.approx(4e-9) and tangent[0].dtype == torch.bfloat16
    assert tangent[0].tolist() == [0.25, -1.0]
    assert preconditioned_direction([None], [torch.ones(2, dtype=F64)], like)[1] == 1.0
    with pytest.raises(DataError):
        preconditioned_direction([None, None], [torch.ones(2, dtype=F64)], like)
