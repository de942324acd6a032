"""Expected (mean-field) mode of the tabular simulator, batched over runs: the G → ∞ limit of the sampled update.

Â → (r − p̄)/(σ + ε) per prompt (p̄ = P(r = 1), σ = sqrt(p̄(1 − p̄)): the G → ∞ limit of the unbiased group std;
ε = 1e-6, the core's GRPO ε), and the expected update at state (p, l) is Δz_k = (lr/τ)·π_k (B_k − Σ_j π_j B_j) with
B_k = ω⁺_k A⁺_k + ω⁻_k A⁻_k, A⁺_k = E[Â·1(Â>0) | a_l = k] = P(r=1|k)(1 − p̄)/(σ + ε), A⁻_k = −P(r=0|k)·p̄/(σ + ε)
(Cui et al.'s expected PG on free logits; for GRPO, ω ≡ 1, its first-order entropy change is the covariance law
−lr·Cov_π(log π, π A), docs/theory.md §2), plus lr·β·∂H/∂z for the entropy bonus. The conditional reward law is exact
(Poisson-binomial over the other positions). STARE's top-P selection becomes a threshold on surprisal: the fraction
P of the probability mass of T+ (T−) with the highest surprisal gets W (M), the boundary token fractionally
(:func:`top_mass_fraction`). Documented approximations: finite-G effects (the sample std, all-equal groups with
Â = 0, the max(1, ·) in k = max(1, ⌈P·|T±|⌉)) are dropped. Random rewards give B ≡ 0 for GRPO: the mean-field
update is exactly zero (the near-criticality point), so collapse under random rewards is a pure sampling-noise
effect that only ``sampled`` mode shows. Methods: grpo, grpo-ds (≡ grpo in the limit: no group has zero variance),
o1, c2, o1-adaptive, entropy_bonus. The rows are those of the sampled mode, with expected counts (tokens per batch
of G responses per prompt) in the quadrant statistics.
"""

from __future__ import annotations

import numpy as np
import torch

from stare_lab.theory.critical import KEY_LPLUS_ABOVE
from stare_lab.theory.first_order import share_above_critical
from stare_lab.loss.step import step_gate

from simulators.tabular.step import Policy, StepParts, quadrant_stats

__all__ = ["success_given_token", "top_mass_selected", "top_mass_fraction", "gate_decisions", "expected_parts"]

#: ε of the GRPO advantage (the default of ``stare_lab.loss.advantages.group_advantages``; docs/theory.md §3)
GRPO_EPS = 1e-6


def success_given_token(
    config, probs: torch.Tensor, correct: torch.Tensor, rule_only: bool = False,
    noise: torch.Tensor | None = None, random_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact reward law of the factored policy ``probs [..., S, L, V]`` (leading run axes allowed): (p̄
    ``[..., S]`` = P(r = 1), P(r = 1 | a_l = k) ``[..., S, L, V]``).

    Verifiable rule: with q_l = P(a_l correct) and positions independent, the number of correct positions other
    than l is Poisson-binomial: the convolution of the count distributions of the positions before l (prefix) and
    after l (suffix), O(L) tensor steps; P(r = 1 | a_l = k) = P(count_{−l} ≥ threshold − 1[k correct]). A noisy
    verifier maps P to ε + (1 − 2ε)P. Random rewards: P(r = 1 | ·) = p. ``rule_only``: the verifiable rule without
    noise whatever ``config.reward`` (task accuracy). ``noise`` / ``random_p``: per-run ε / p of shape ``[...]``
    (default ``config.reward_noise`` / ``config.random_reward_p``).
    """
    lead = probs.shape[:-3]
    S, L, V = probs.shape[-3:]
    if config.reward == "random" and not rule_only:
        p = torch.as_tensor(config.random_reward_p if random_p is None else random_p, dtype=probs.dtype)
        p = p.reshape(p.shape + (1,) * (len(lead) + 1 - p.dim())) if p.dim() else p
        return (p * torch.ones(lead + (S,), dtype=probs.dtype),
                p.unsqueeze(-1).unsqueeze(-1) * torch.ones(probs.shape, dtype=probs.dtype))
    m = config.reward_threshold
    q = (probs * correct).sum(-1)  # [..., S, L]
    pad = torch.nn.functional.pad
    start = torch.zeros(q.shape[:-1] + (L + 1,), dtype=probs.dtype)
    start[..., 0] = 1.0

    def add(dist: torch.Tensor, ql: torch.Tensor) -> torch.Tensor:
        return dist * (1 - ql) + pad(dist[..., :-1], (1, 0)) * ql

    pre, dist = [], start
    for l in range(L):  # pre[l]: distribution of the count over positions < l
        pre.append(dist)
        dist = add(dist, q[..., l : l + 1])
    suf, dist = [None] * L, start
    for l in reversed(range(L)):  # suf[l]: distribution of the count over positions > l
        suf[l] = dist
        dist = add(dist, q[..., l : l + 1])
    pre_t, suf_t = torch.stack(pre, -2), torch.stack(suf, -2)  # [..., S, L, L+1]
    tail = pad(suf_t.flip(-1).cumsum(-1).flip(-1), (0, 1))  # tail[..., x] = P(suffix count ≥ x), x = 0..L+1
    j = torch.arange(L + 1)

    def at_least(t: int) -> torch.Tensor:
        return (pre_t * tail[..., (t - j).clamp(0, L + 1)]).sum(-1)  # P(count_{-l} ≥ t), [..., S, L]

    tc, tw = at_least(max(m - 1, 0)), at_least(m)
    given = torch.where(correct, tc.unsqueeze(-1), tw.unsqueeze(-1))
    p_bar = q[..., 0] * tc[..., 0] + (1 - q[..., 0]) * tw[..., 0]
    if rule_only:
        return p_bar, given
    eps = torch.as_tensor(config.reward_noise if noise is None else noise, dtype=probs.dtype)
    e1 = eps.reshape(eps.shape + (1,)) if eps.dim() else eps
    e3 = eps.reshape(eps.shape + (1, 1, 1)) if eps.dim() else eps
    return e1 + (1 - 2 * e1) * p_bar, e3 + (1 - 2 * e3) * given


def top_mass_selected(
    surprisal: torch.Tensor, masses: tuple[torch.Tensor, ...], frac: float | torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Mean-field top-P selection: the selected part of each entry's mass when the ``frac`` share of the total mass
    with the highest ``surprisal`` is selected (the boundary entry partly; the G → ∞ limit of k = ⌈P·|T|⌉,
    docs/theory.md §4 step 4). A float ``frac`` selects over the whole tensor; a ``[R]`` tensor per leading index (one
    run each). Every mass in ``masses`` (shape of ``surprisal``) is selected with the same ranking (one sort; ties
    in a fixed order). Returns the selected masses, each in [0, mass]."""
    per_run = isinstance(frac, torch.Tensor)
    rows = surprisal.shape[0] if per_run else 1
    s = surprisal.reshape(rows, -1)
    # descending surprisal; numpy's introsort is ~4x faster than a stable torch sort here and deterministic
    order = torch.from_numpy(np.ascontiguousarray((-s).numpy().argsort(axis=1)))
    out = []
    for m in masses:
        w = m.reshape(rows, -1)
        f = frac.reshape(rows, 1).to(w.dtype) if per_run else float(frac)
        w_sorted = w.gather(1, order)
        budget = f * w.sum(1, keepdim=True)
        before = torch.cumsum(w_sorted, 1) - w_sorted
        taken = torch.minimum((budget - before).clamp_min_(0.0), w_sorted)
        out.append(torch.empty_like(taken).scatter_(1, order, taken).reshape(surprisal.shape))
    return tuple(out)


def top_mass_fraction(surprisal: torch.Tensor, mass: torch.Tensor, frac: float | torch.Tensor) -> torch.Tensor:
    """The selected fraction (in [0, 1]; 0 for zero mass) of each entry's mass under :func:`top_mass_selected`."""
    (taken,) = top_mass_selected(surprisal, (mass,), frac)
    return torch.where(mass > 0, taken / mass.clamp_min(1e-300), torch.zeros_like(taken))


def gate_decisions(batch, h_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every run's STARE gate and W/M from the core's one gate rule (:func:`stare_lab.loss.step.step_gate`: its controller
    updated once with its gate entropy ``h_gate [R]``, nats) → (gate_on ``[R]`` bool, W ``[R]``, M ``[R]``
    float64); (False, 1, 1) for a loss without STARE. The mean-field step has no token batch to prepare (the G → ∞
    batch is the policy itself), so this is all of :func:`stare_lab.loss.step.prepare_step` that applies."""
    out = [step_gate(c.loss, ctl, h, needs=n)
           for c, ctl, n, h in zip(batch.configs, batch.controllers, batch.needs, h_gate.tolist())]
    f64 = torch.float64
    return (torch.tensor([g for g, _, _ in out]), torch.tensor([w for _, w, _ in out], dtype=f64),
            torch.tensor([m for _, _, m in out], dtype=f64))


def expected_parts(batch, pol: Policy, h_before: torch.Tensor, step: int = 1) -> StepParts:
    """The mean-field step of every run (module docstring) as :class:`~simulators.tabular.step.StepParts`; the gate
    sees the mean entropy over all states (``step`` is not used: the mean field draws nothing).

    Written in masses: with inv = 1/(σ + ε) (0 for a prompt without reward variance), f⁺ = (1 − p̄)·inv,
    f⁻ = −p̄·inv, the masses m⁺_k = π_k P(r=1|k), m⁻_k = π_k P(r=0|k) and their selected parts s±_k, π_k B_k =
    f⁺(m⁺_k + (W − 1)s⁺_k) + f⁻(m⁻_k + (M − 1)s⁻_k) and Δz = (lr/τ)(πB − π Σ_j π_j B_j).
    """
    cfg = batch.base
    R, S, L, G = batch.size, cfg.num_prompts, cfg.seq_len, cfg.group_size
    tau = cfg.temperature
    gate_on, w, m = gate_decisions(batch, h_before)
    probs = pol.pi
    p_rule, p1_rule = success_given_token(cfg, probs, batch.correct, rule_only=True)
    if cfg.reward == "random":
        p_bar, p1 = success_given_token(cfg, probs, batch.correct, random_p=batch.random_reward_p)
    else:  # the noisy verifier: P(r = 1) = ε + (1 − 2ε)·P(rule)
        eps = batch.reward_noise
        p_bar = eps.view(R, 1) + (1 - 2 * eps.view(R, 1)) * p_rule
        p1 = eps.view(R, 1, 1, 1) + (1 - 2 * eps.view(R, 1, 1, 1)) * p1_rule
    sigma = (p_bar * (1 - p_bar)).clamp_min(0).sqrt()
    inv = torch.where(sigma > 0, 1.0 / (sigma + GRPO_EPS), torch.zeros_like(sigma))  # Â ≡ 0 without variance
    f_pos, f_neg = ((1 - p_bar) * inv)[..., None, None], (-p_bar * inv)[..., None, None]
    active = (sigma > 0).to(probs.dtype)[..., None, None]
    mass_pos = active * probs * p1
    mass_neg = active * probs - mass_pos
    sel_pos, sel_neg = top_mass_selected(-pol.logp, (mass_pos, mass_neg), batch.top_p)
    view = lambda x: x.view(R, 1, 1, 1)  # noqa: E731
    apply = (gate_on & batch.is_stare).double()
    kw, km = view(apply * (w - 1)), view(apply * batch.is_c2.double() * (m - 1))
    pos, neg = f_pos * (mass_pos + kw * sel_pos), f_neg * (mass_neg + km * sel_neg)  # π·B split by the sign of Â
    pb = torch.stack([pos + neg, f_pos * mass_pos + f_neg * mass_neg, f_pos * sel_pos, f_neg * sel_neg])
    lr = view(batch.lr)
    parts = (lr / tau) * (pb - probs * pb.sum(-1, keepdim=True))
    parts[0] += view(batch.lr * batch.entropy_coeff) * pol.grad
    # quadrants of the token decomposition Δz = Σ_k c_k (e_k − π)/τ, c_k = lr·π_k·B_k, split into Â>0 and Â<0
    n_states = S * L
    quad = quadrant_stats(pol.psi > 0, torch.stack([G * mass_pos, G * mass_neg]),
                          torch.stack([lr * pos, lr * neg]) * pol.psi / n_states)
    scalars = {
        "reward": p_bar.mean(-1),
        "accuracy": p_rule.mean(-1),
        f"pass@{G}": (1 - (1 - p_rule) ** G).mean(-1),
        "gate_on": gate_on.double(),
        "stare_w": w,
        "stare_m": m,
        "skipped": torch.zeros(R, dtype=torch.float64),
        **quad,
    }
    frac_pos = apply * sel_pos.sum((1, 2, 3)) / n_states
    frac_neg = apply * batch.is_c2.double() * sel_neg.sum((1, 2, 3)) / n_states
    rows = [{} for _ in range(R)]
    # share of the L+ probability mass above s* (docs/theory.md §8): each token weighted by its selected mass
    sstar = pol.sstar.unsqueeze(-1).expand_as(probs)
    for r in range(R):
        rows[r][KEY_LPLUS_ABOVE] = share_above_critical(-pol.logp[r], sstar[r], sel_pos[r])
    for r, (fp, fn) in enumerate(zip(frac_pos.tolist(), frac_neg.tolist())):
        if batch.is_stare[r]:
            rows[r].update({"stare/frac_pos_selected": fp, "stare/frac_neg_selected": fn})
    plain = batch.entropy_coeff == 0
    return StepParts(parts, scalars, rows, gate_on & batch.is_stare, plain)
