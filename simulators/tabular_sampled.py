"""Sampled mode of the tabular simulator, batched over runs (see :mod:`simulators.tabular` for the update and the
logged keys).

Per step and run: G responses per prompt drawn by inverse-CDF sampling from the run's own generator (uniforms
``[S, L, G]``, then the reward draws), rewards, optional dynamic sampling (``stare_lab.advantages.filter_groups``,
refilling up to ``ds_max_rounds`` rounds; at most S groups kept), group advantages
(``stare_lab.advantages.group_advantages``, one call for the whole batch: groups are contiguous), the gate
(``stare_lab.stare.STAREController``, from the batch token-mean entropy: under dynamic sampling that of the kept
batch, as in the trainer) and the selected sets L+ / L− (``stare_lab.stare.stare_token_weights`` over the run's
whole batch, scope ``global``). ω = W on L+, M on L− (C2) with the gate on, else 1 — exactly the weights the core
returns for the run's config (tested).

Update. For ``loss_mode`` grpo/stare with token-mean aggregation and no entropy/KL/TIS term the gradient of the core
loss at ρ = 1 is ∂loss/∂log π_a = −Â·ω/N per token, so the step is the closed form Δz = (lr/G) Σ_i Â_i ω_i
(e_{a_i} − π)/τ (tested equal to the gradient of ``stare_lab.losses.compute_policy_loss`` through autograd). Other
methods call ``compute_policy_loss`` per run on leaf log-probs (and a leaf entropy for ``entropy_coeff > 0``) and
chain its gradient through ∂log π_a/∂z = (e_a − π)/τ and ∂H/∂z (core autograd); their rows carry the core's
``loss/*`` metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from .tabular_step import Policy, StepParts, gate_decisions, quadrant_stats, scatter_parts

__all__ = ["sampled_parts", "rollouts", "fast_path"]


def fast_path(config) -> bool:
    """True when the run's update is the closed form (module docstring)."""
    loss = config.loss
    return (
        loss.loss_mode in ("grpo", "stare") and loss.loss_agg_mode == "token-mean" and loss.entropy_coeff == 0
        and loss.kl_coef == 0 and loss.tis_cap is None
    )


def _draw(batch, runs: list[int], cdf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sampling round of all S prompts for the runs ``runs`` → (tokens ``[n, S, G, L]`` long, rewards
    ``[n, S, G]`` float32, solved ``[n, S, G]`` float32 = the rule's verdict without noise). Each run draws
    S·L·G + S·G uniforms from its generator: the tokens (inverse CDF), then its reward draws (random rewards:
    r = 1[u < p]; noisy verifier: flip iff u < ε; unused otherwise)."""
    cfg = batch.base
    S, L, G, V = cfg.num_prompts, cfg.seq_len, cfg.group_size, cfg.vocab_size
    n_tok = S * L * G
    u = torch.stack([torch.rand(n_tok + S * G, generator=batch.generators[r], dtype=torch.float64) for r in runs])
    idx = torch.tensor(runs)
    tokens = torch.searchsorted(cdf[idx], u[:, :n_tok].reshape(-1, S, L, G).contiguous()).clamp_max_(V - 1)  # [n, S, L, G]
    solved = (batch.correct[idx].gather(-1, tokens).sum(-2) >= cfg.reward_threshold).float()  # [n, S, G]
    u_reward = u[:, n_tok:].view(-1, S, G)
    if cfg.reward == "random":
        rewards = (u_reward < batch.random_reward_p[idx].view(-1, 1, 1)).float()
    else:
        flip = (u_reward < batch.reward_noise[idx].view(-1, 1, 1)).float()  # ε = 0 never flips
        rewards = (solved - flip).abs()
    return tokens.permute(0, 1, 3, 2), rewards, solved


def rollouts(batch, pi: torch.Tensor) -> dict[str, Any]:
    """One step's rollout batch of every run: ``tokens [R, S, G, L]``, ``rewards [R, S, G]``, ``prompt [R, S]`` (the
    prompt of each group slot), ``valid [R, S]`` (slots holding a group; invalid ones have tokens 0 and rewards 0),
    ``kept [R]``, ``rounds [R]`` and the first round's ``first_rewards`` / ``first_solved`` ``[R, S, G]``. Without
    dynamic sampling slot s holds prompt s; with it, the groups with reward variance from up to ``ds_max_rounds``
    rounds, in order (at most S; none if none survive)."""
    from stare_lab.advantages import filter_groups

    cfg = batch.base
    R, S, G = batch.size, cfg.num_prompts, cfg.group_size
    cdf = pi.cumsum(-1)
    tokens, rewards, solved = _draw(batch, list(range(R)), cdf)
    prompt = torch.arange(S).expand(R, S).clone()
    valid = torch.ones(R, S, dtype=torch.bool)
    rounds = [1] * R
    out = {"first_rewards": rewards, "first_solved": solved}
    ds = [r for r, c in enumerate(batch.configs) if c.dynamic_sampling]
    if ds:
        tokens, rewards = tokens.clone(), rewards.clone()
        for r in ds:
            t_r, rw_r = tokens[r], rewards[r]
            kept_t, kept_r, kept_p = [], [], []
            n = 0
            while True:
                keep = filter_groups(rw_r.reshape(-1), G).view(S, G)[:, 0]
                idx = keep.nonzero().squeeze(-1)[: S - n]
                kept_t.append(t_r[idx])
                kept_r.append(rw_r[idx])
                kept_p.append(idx)
                n += idx.numel()
                if n >= S or rounds[r] >= cfg.ds_max_rounds:
                    break
                t_new, rw_new, _ = _draw(batch, [r], cdf)
                t_r, rw_r = t_new[0], rw_new[0]
                rounds[r] += 1
            tokens[r].zero_()
            rewards[r].zero_()
            prompt[r].zero_()
            valid[r] = torch.arange(S) < n
            if n:
                tokens[r, :n] = torch.cat(kept_t)
                rewards[r, :n] = torch.cat(kept_r)
                prompt[r, :n] = torch.cat(kept_p)
    out.update(tokens=tokens, rewards=rewards, prompt=prompt, valid=valid, rounds=rounds,
               kept=valid.sum(-1), ds=ds)
    return out


def _selected_sets(batch, logp_tok: torch.Tensor, adv: torch.Tensor, kept: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """L+ and L− ``[R, S, G, L]`` bool of every run (the core's selection over the run's kept tokens, with the
    run's P; both sets whatever the run's variant, for the D terms)."""
    from stare_lab.stare import stare_token_weights

    R, S, G, L = logp_tok.shape
    weights = torch.ones(R, S, G, L, dtype=torch.float32)
    lp32 = logp_tok.float()
    mask = torch.ones(S * G, L, dtype=torch.bool)
    for r in range(R):
        n = kept[r]
        if n == 0:
            continue
        w, _ = stare_token_weights(
            lp32[r, :n].view(n * G, L), adv[r, :n].view(n * G), mask[: n * G], batch.marker_stare[r],
            gate_on=True, reweight_w=2.0, reweight_m=0.5,
        )
        weights[r, :n] = w.view(n, G, L)
    return weights == 2.0, weights == 0.5


def _core_coefficients(batch, r: int, roll, logp_tok, adv, omega, gate_on, w, m, pol: Policy, row: dict):
    """Token coefficients ``[n, G, L]`` of run ``r``'s update from the core loss (module docstring) and the
    per-state weight ``[S, L]`` of ∂H/∂z in it (entropy bonus; zeros without), filling ``row`` with the loss
    metrics."""
    from stare_lab.losses import PolicyLossInputs, compute_policy_loss

    cfg = batch.configs[r]
    S, G, L = cfg.num_prompts, cfg.group_size, cfg.seq_len
    n = int(roll["kept"][r])
    ent_w = torch.zeros(S, L, dtype=torch.float64)
    if n == 0:
        return torch.zeros(0, G, L, dtype=torch.float64), ent_w
    lp = logp_tok[r, :n].reshape(n * G, L).clone().requires_grad_(True)
    prompts = roll["prompt"][r, :n]
    ent = None
    if cfg.loss.entropy_coeff > 0 or cfg.loss.loss_mode == "forking_tokens":
        ent = pol.entropy[r][prompts].repeat_interleave(G, dim=0).clone()
        if cfg.loss.entropy_coeff > 0:
            ent.requires_grad_(True)
    inputs = PolicyLossInputs(
        logprobs=lp, old_logprobs=lp.detach(), advantages=adv[r, :n].reshape(-1).float(),
        response_mask=torch.ones(n * G, L, dtype=torch.bool), entropy=ent,
        token_weights=omega[r, :n].reshape(n * G, L) if cfg.is_stare else None,
        gate_on=bool(gate_on[r]) if cfg.is_stare else None,
        reweight_w=float(w[r]) if cfg.is_stare else None, reweight_m=float(m[r]) if cfg.is_stare else None,
        generator=batch.generators[r],
    )
    loss, metrics = compute_policy_loss(cfg.loss.loss_mode, inputs, cfg.loss)
    loss.backward()
    scale = cfg.lr * n * L  # token-mean over n·G·L tokens → per-state group update (simulators.tabular docstring)
    for key, value in metrics.items():
        row[key if "/" in key else f"loss/{key}"] = float(value)
    if ent is not None and ent.grad is not None:
        per_tok = (-scale * ent.grad).view(n, G, L).sum(1)  # [n, L]
        ent_w.index_add_(0, prompts, per_tok)
    return (-scale * lp.grad).view(n, G, L), ent_w


def _fast_runs(batch) -> list[bool]:
    """:func:`fast_path` of every run (cached on the batch)."""
    if getattr(batch, "_fast", None) is None or len(batch._fast) != batch.size:
        batch._fast = [fast_path(c) for c in batch.configs]
    return batch._fast


def _state_index(batch, roll) -> torch.Tensor:
    """Flat state index ``[R, S, G, L]`` (into the ``[R·S·L]`` states) of every sampled token; without dynamic
    sampling it does not change between steps (cached on the batch)."""
    R, (S, G, L) = batch.size, (batch.base.num_prompts, batch.base.group_size, batch.base.seq_len)
    cached = getattr(batch, "_state", None)
    if not roll["ds"] and cached is not None and cached.shape[0] == R:
        return cached
    state = ((torch.arange(R).view(R, 1) * S + roll["prompt"]) * L).view(R, S, 1, 1) + torch.arange(L)
    state = state.expand(R, S, G, L).contiguous()
    if not roll["ds"]:
        batch._state = state
    return state


def sampled_parts(batch, pol: Policy, h_before: torch.Tensor) -> StepParts:
    """The sampled step of every run of ``batch`` (module docstring) as :class:`~simulators.tabular_step.StepParts`."""
    from stare_lab.advantages import group_advantages

    cfg = batch.base
    R, S, L, V, G = batch.size, cfg.num_prompts, cfg.seq_len, cfg.vocab_size, cfg.group_size
    roll = rollouts(batch, pol.pi)
    kept = roll["kept"].tolist()
    h_gate = h_before.clone()
    slot_h = pol.entropy.gather(1, roll["prompt"].unsqueeze(-1).expand(R, S, L)).mean(-1)  # [R, S]
    for r in roll["ds"]:  # token-mean entropy of the kept batch (all its responses have L tokens)
        h_gate[r] = slot_h[r, : kept[r]].mean() if kept[r] else float("nan")
    gate_on, w, m = gate_decisions(batch, h_gate)
    adv = group_advantages(roll["rewards"].reshape(-1), group_size=G, estimator=cfg.advantage_estimator)
    adv = adv.view(R, S, G).double()
    state = _state_index(batch, roll)
    token = roll["tokens"]
    flat = state * V + token
    logp_tok = pol.logp.reshape(-1)[flat]
    psi_tok = pol.psi.reshape(-1)[flat]
    lplus, lminus = _selected_sets(batch, logp_tok, adv, kept)
    apply = (gate_on & batch.is_stare).view(R, 1, 1, 1)
    w32, m32 = w.float().view(R, 1, 1, 1), m.float().view(R, 1, 1, 1)
    one = torch.ones((), dtype=torch.float32)
    omega = torch.where(lplus & apply, w32, torch.where(lminus & apply & batch.is_c2.view(R, 1, 1, 1), m32, one))
    base = (batch.lr.view(R, 1, 1, 1) / G) * adv.unsqueeze(-1).expand(R, S, G, L)
    actual = base * omega.double()
    grpo = base.clone()
    rows: list[dict[str, Any]] = [{} for _ in range(R)]
    ent_w = torch.zeros(R, S, L, dtype=torch.float64)
    fast = _fast_runs(batch)
    for r, c in enumerate(batch.configs):
        if fast[r]:
            continue
        coef, ent_w[r] = _core_coefficients(batch, r, roll, logp_tok, adv, omega, gate_on, w, m, pol, rows[r])
        n = kept[r]
        actual[r].zero_()
        grpo[r].zero_()
        actual[r, :n] = coef
        grpo[r, :n] = coef / omega[r, :n].double()
    coefs = torch.stack([actual, grpo, grpo * lplus, grpo * lminus])
    parts = scatter_parts(coefs, state, token, pol.pi, cfg.temperature)
    parts[0] += ent_w.unsqueeze(-1) * pol.grad
    n_states = S * L
    sign = torch.stack([adv > 0, adv < 0]).unsqueeze(-1).double()  # [2, R, S, G, 1]; Â = 0 (and empty slots): none
    quad = quadrant_stats(psi_tok > 0, sign.expand(2, R, S, G, L), sign * (actual * psi_tok / n_states))
    n_tok = (roll["kept"] * G * L).clamp_min(1).double()
    applied = apply.view(R)
    scalars = {
        "reward": roll["first_rewards"].double().mean((-1, -2)),
        "accuracy": roll["first_solved"].double().mean((-1, -2)),
        f"pass@{G}": (roll["first_solved"] > 0).any(-1).double().mean(-1),
        "gate_on": gate_on.double(),
        "stare_w": w,
        "stare_m": m,
        **quad,
    }
    c2 = batch.is_c2.view(R, 1, 1, 1)
    n_pos = (lplus & apply).sum((1, 2, 3)).double() / n_tok
    n_neg = (lminus & apply & c2).sum((1, 2, 3)).double() / n_tok
    for r, (fp, fn) in enumerate(zip(n_pos.tolist(), n_neg.tolist())):
        if batch.configs[r].is_stare:
            rows[r]["stare/frac_pos_selected"] = fp
            rows[r]["stare/frac_neg_selected"] = fn
        if batch.configs[r].dynamic_sampling:
            rows[r]["ds/kept_groups"] = kept[r]
            rows[r]["ds/rounds"] = roll["rounds"][r]
            rows[r]["stare/gate_entropy"] = float(h_gate[r]) if kept[r] else None
    plain = torch.tensor(fast)
    return StepParts(parts, scalars, rows, applied, plain)
