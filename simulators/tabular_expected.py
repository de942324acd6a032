"""Expected (mean-field) mode of the tabular simulator: the G → ∞ limit of the sampled GRPO / STARE update.

See :mod:`simulators.tabular` (module docstring) for what is computed and which finite-G effects are dropped. The
step here returns the same metrics row as :func:`simulators.tabular.sampled_step`, with expected counts in the
quadrant statistics (tokens per batch of G responses per prompt).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .tabular import (
    TabularSimConfig, TabularState, _gate, _quadrants, check_update, mean_entropy, predicted_entropy_change_mean,
)

__all__ = ["success_given_token", "top_mass_fraction", "expected_step"]




def success_given_token(
    config: TabularSimConfig, probs: torch.Tensor, correct: torch.Tensor, rule_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact reward law of the factored policy: (p̄ ``[S]`` = P(r = 1), P(r = 1 | a_l = k) ``[S, L, V]``).

    Verifiable rule: with q_l = P(a_l correct) = Σ_{k ∈ C_l} π_lk and positions independent, the number of correct
    positions other than l is Poisson-binomial; P(r = 1 | a_l = k) = P(count_{−l} ≥ threshold − 1[k ∈ C_l]),
    computed by the O(L²) dynamic programme over the other positions; a noisy verifier maps P to ε + (1 − 2ε)P.
    Random rewards: P(r = 1 | ·) = p. ``rule_only``: the verifiable rule without noise whatever ``config.reward``
    (task accuracy).
    """
    S, L, V = probs.shape
    if config.reward == "random" and not rule_only:
        p = float(config.random_reward_p)
        return torch.full((S,), p, dtype=probs.dtype), torch.full((S, L, V), p, dtype=probs.dtype)
    m = config.reward_threshold
    q = (probs * correct).sum(-1)  # [S, L]
    tail_correct, tail_wrong = [], []
    for l in range(L):
        dist = torch.zeros(S, L, dtype=probs.dtype)  # count of correct positions among the others, 0..L-1
        dist[:, 0] = 1.0
        for j in range(L):
            if j != l:
                qj = q[:, j : j + 1]
                dist = dist * (1 - qj) + torch.nn.functional.pad(dist[:, :-1], (1, 0)) * qj
        tail = dist.flip(-1).cumsum(-1).flip(-1)  # tail[:, t] = P(count ≥ t)
        tail = torch.cat([tail, torch.zeros(S, 1, dtype=probs.dtype)], dim=-1)  # P(count ≥ L) = 0
        tail_correct.append(tail[:, max(m - 1, 0)])
        tail_wrong.append(tail[:, m])
    tc = torch.stack(tail_correct, dim=1)  # [S, L]
    tw = torch.stack(tail_wrong, dim=1)
    given = torch.where(correct, tc.unsqueeze(-1), tw.unsqueeze(-1))
    p_bar = q[:, 0] * tc[:, 0] + (1 - q[:, 0]) * tw[:, 0]
    eps = 0.0 if rule_only else float(config.reward_noise)  # noisy verifier: P(r=1) = ε + (1 − 2ε)·P(rule satisfied)
    return eps + (1 - 2 * eps) * p_bar, eps + (1 - 2 * eps) * given


def top_mass_fraction(surprisal: torch.Tensor, mass: torch.Tensor, frac: float) -> torch.Tensor:
    """Mean-field top-P selection: the fraction of each entry's mass selected when the ``frac`` share of the total
    ``mass`` with the highest ``surprisal`` is selected (the boundary entry is selected fractionally). Returns a
    tensor of ``surprisal``'s shape with values in [0, 1]; the G → ∞ limit of k = ⌈P·|T|⌉ (docs/theory.md §4 step 4)."""
    s, w = surprisal.reshape(-1), mass.reshape(-1)
    order = torch.argsort(s, descending=True, stable=True)
    w_sorted = w[order]
    budget = frac * float(w.sum())
    before = torch.cumsum(w_sorted, 0) - w_sorted
    sel = ((budget - before) / w_sorted.clamp_min(1e-300)).clamp(0.0, 1.0)
    sel = torch.where(w_sorted > 0, sel, torch.zeros_like(sel))
    out = torch.empty_like(sel)
    out[order] = sel
    return out.reshape(surprisal.shape)


def expected_step(
    config: TabularSimConfig, state: TabularState, h_before: float | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The mean-field expected update (module docstring) → (Δz ``[S, L, V]`` float64, metrics row), not applied.

    Δz_k = (lr/τ)·π_k (B_k − Σ_j π_j B_j), B_k = ω⁺_k A⁺_k + ω⁻_k A⁻_k with A⁺_k = E[Â·1(Â>0) | a_l = k] =
    P(r=1|k)(1 − p̄)/(σ + ε), A⁻_k = −P(r=0|k)·p̄/(σ + ε), σ = sqrt(p̄(1 − p̄)), ε = 1e-6 (the core's GRPO ε). For
    GRPO (ω ≡ 1) this is Cui et al.'s expected PG, Δz_k = lr·π_k A_k with E_π A = 0, whose first-order entropy
    change is −lr·Cov_π(log π, π A) (docs/theory.md §2). Plus lr·β·∂H/∂z for the entropy bonus.
    """
    from stare_lab.entropy import entropy_from_logits, entropy_sensitivity, logprobs_from_logits

    S, G, L, V = config.num_prompts, config.group_size, config.seq_len, config.vocab_size
    tau, eps = config.temperature, 1e-6
    t0 = time.perf_counter()
    z = state.logits
    h_before = mean_entropy(z, tau) if h_before is None else h_before
    gate_on, w, m = _gate(state, h_before)
    vocab_ids = torch.arange(V).expand(S, L, V)
    z_all = z.unsqueeze(-2).expand(S, L, V, V)
    logp = logprobs_from_logits(z_all, vocab_ids, temperature=tau).detach()  # [S, L, V]
    probs = logp.exp()
    p_bar, p1 = success_given_token(config, probs, state.correct)
    p_rule = success_given_token(config, probs, state.correct, rule_only=True)[0]
    sigma = (p_bar * (1 - p_bar)).clamp_min(0).sqrt()
    active = (sigma > 0).to(z.dtype)[:, None, None]  # Â ≡ 0 for a prompt that always / never succeeds
    a_pos = active * p1 * (1 - p_bar)[:, None, None] / (sigma[:, None, None] + eps)
    a_neg = -active * (1 - p1) * p_bar[:, None, None] / (sigma[:, None, None] + eps)
    mass_pos, mass_neg = active * probs * p1, active * probs * (1 - p1)
    w_pos, w_neg = torch.ones_like(probs), torch.ones_like(probs)
    row: dict[str, Any] = {}
    if config.is_stare:
        surprisal = -logp
        frac = float(config.loss.stare.top_p_ratio)
        sel_pos = top_mass_fraction(surprisal, mass_pos, frac)
        sel_neg = top_mass_fraction(surprisal, mass_neg, frac)
        row["stare/frac_pos_selected"] = float((sel_pos * mass_pos).sum()) / (S * L)
        row["stare/frac_neg_selected"] = float((sel_neg * mass_neg).sum()) / (S * L)
        if gate_on:
            w_pos = 1 + (w - 1) * sel_pos
            if config.loss.stare.variant == "C2":
                w_neg = 1 + (m - 1) * sel_neg
    b = w_pos * a_pos + w_neg * a_neg
    delta = (config.lr / tau) * probs * (b - (probs * b).sum(-1, keepdim=True))  # ∂log π/∂z = (e − π)/τ
    if config.loss.entropy_coeff > 0:
        zg = z.detach().clone().requires_grad_(True)
        entropy_from_logits(zg, temperature=tau).sum().backward()
        delta = delta + config.lr * config.loss.entropy_coeff * zg.grad
    check_update(config, state, delta)
    row.update(
        {
            "entropy": h_before,
            "reward": float(p_bar.mean()),
            "gate_on": int(gate_on),
            "stare_w": w,
            "stare_m": m,
            "accuracy": float(p_rule.mean()),
            f"pass@{G}": float((1 - (1 - p_rule) ** G).mean()),
            "pred_entropy_change": predicted_entropy_change_mean(z, delta, tau),
        }
    )
    # token-level decomposition Δz = Σ_k c_k (e_k − π)/τ with c_k = lr·π_k B_k, split into the Â>0 and Â<0 parts
    phi = entropy_sensitivity(z_all, vocab_ids, temperature=tau).detach() / tau**2
    high = phi > 0  # ⇔ surprisal > s* (critical_surprisal's docstring: sign Φ(a) = sign(s_a − s*))
    c_pos, c_neg = config.lr * probs * w_pos * a_pos, config.lr * probs * w_neg * a_neg
    row["pred/phi_tokens"] = float(((c_pos + c_neg) * phi).sum()) / (S * L)
    ones = torch.ones_like(phi)
    row.update(
        _quadrants(
            torch.cat([c_pos, c_neg]),
            torch.cat([ones * active, -ones * active]),
            torch.cat([phi, phi]),
            torch.cat([high, high]),
            S * L,
            count_weight=G * torch.cat([mass_pos, mass_neg]),
        )
    )
    row["time/update_s"] = time.perf_counter() - t0
    return delta, row
