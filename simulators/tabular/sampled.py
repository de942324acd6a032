"""Sampled mode of the tabular simulator, batched over runs (see :mod:`simulators.tabular.runner` for the update and the
logged keys).

Per step and run: G responses per prompt drawn by inverse-CDF sampling from the run's own generator (uniforms
``[S, L, G]``, then the reward draws), rewards, optional dynamic sampling (the simulators' one rule,
:func:`simulators.dynamic_sampling.select_groups`: refilling up to ``ds_max_rounds`` rounds, at most S groups kept;
a step where none survives skips its update, ``skipped=1``), group advantages
(``stare_lab.loss.advantages.group_advantages``, one call for the whole batch: groups are contiguous), then the core's
step preparation per run (:func:`stare_lab.loss.step.prepare_step` on the run's kept tokens): the gate and W/M (from the
batch token-mean entropy; under dynamic sampling that of the kept batch, as in the trainer), ω (scope ``global``),
the token counts and every global statistic the loss declares. The D terms of docs/theory.md §7 need both selected
sets L+ / L− of every run: those the preparation kept when it selected both (a C2 run with its gate on), else
``stare_lab.loss.stare.select_stare_sets`` with variant C2 over the run's whole batch (runs whose gate is off, O1 runs, runs
without STARE).

Update. For the losses of :data:`CLOSED_FORMS` (token-mean aggregation, no entropy/KL/TIS term) the gradient of the
core loss at ρ = 1 is ∂loss/∂log π_a = −Â·ω/N per token, so the step is the closed form Δz = (lr/G) Σ_i Â_i ω_i
(e_{a_i} − π)/τ (tested equal to the gradient of ``stare_lab.loss.losses.compute_policy_loss`` through autograd). Every
other loss — any registered loss, also one registered outside the package — goes through ``compute_policy_loss`` per
run on leaf log-probs (and a leaf entropy when the loss differentiates through it) with the inputs the step
preparation built (``PreparedStep.inputs``), and its gradient is chained through ∂log π_a/∂z = (e_a − π)/τ and
∂H/∂z (core autograd); their rows carry the core's ``loss/*`` metrics.
"""

from __future__ import annotations

from typing import Any

import torch

from stare_lab.loss.advantages import group_advantages
from stare_lab.theory.critical import KEY_LPLUS_ABOVE
from stare_lab.theory.first_order import share_above_critical
from stare_lab.loss.losses import compute_policy_loss
from stare_lab.loss.stare import select_stare_sets
from stare_lab.loss.step import PreparedStep, StepBatch, prepare_step

from simulators.dynamic_sampling import select_groups
from simulators.tabular.step import Policy, StepParts, quadrant_stats, scatter_parts

__all__ = ["sampled_parts", "rollouts", "closed_form", "CLOSED_FORMS"]

#: Losses whose gradient the sampled step knows in closed form (module docstring): at ρ = 1 with token-mean
#: aggregation both are the surrogate −Â·ω·ρ (ω ≡ 1 for grpo; STARE's ω from the step preparation).
CLOSED_FORMS = ("grpo", "stare")


def closed_form(config, needs) -> bool:
    """True when the run's update is the closed form: a loss of :data:`CLOSED_FORMS`, token-mean aggregation and
    nothing else in the loss (no entropy bonus, KL or importance correction: ``needs`` has no entropy gradient,
    reference or rollout log-probs), ω precomputed over the whole batch when the loss uses STARE."""
    loss = config.loss
    return (loss.loss_mode in CLOSED_FORMS and loss.loss_agg_mode == "token-mean" and not needs.entropy_grad
            and not needs.ref_logprobs and not needs.rollout_logprobs and (needs.token_weights or not needs.stare))


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
    ``kept [R]``, ``rounds [R]`` and, over every group sampled in the step (all rounds, as the trainer's ``reward``),
    the mean ``reward``, ``accuracy`` (the rule's verdict without noise) and ``pass`` (groups with ≥ 1 solved
    response) ``[R]`` float64. Without dynamic sampling slot s holds prompt s; with it, the groups
    :func:`simulators.dynamic_sampling.select_groups` kept, in order (at most S; none if none survive)."""
    cfg = batch.base
    R, S, G = batch.size, cfg.num_prompts, cfg.group_size
    cdf = pi.cumsum(-1)
    tokens, rewards, solved = _draw(batch, list(range(R)), cdf)
    prompt = torch.arange(S).expand(R, S).clone()
    valid = torch.ones(R, S, dtype=torch.bool)
    rounds = [1] * R
    stats = torch.stack([rewards.double().mean((-1, -2)), solved.double().mean((-1, -2)),
                         (solved > 0).any(-1).double().mean(-1)])  # [3, R]: reward, accuracy, pass over round 1
    out = {}
    ds = [r for r, c in enumerate(batch.configs) if c.dynamic_sampling]
    if ds:
        tokens, rewards = tokens.clone(), rewards.clone()
        for r in ds:
            drawn = [(tokens[r], rewards[r], solved[r])]

            def rewards_of_round(i: int, r: int = r, drawn: list = drawn) -> torch.Tensor:
                if i == len(drawn):  # a fresh round of all S prompts from the run's generator
                    t_new, rw_new, sv_new = _draw(batch, [r], cdf)
                    drawn.append((t_new[0], rw_new[0], sv_new[0]))
                return drawn[i][1].reshape(-1)

            sel = select_groups(rewards_of_round, G, S, cfg.ds_max_rounds)
            n = sel.num_kept
            rounds[r] = sel.rounds
            picked = [(drawn[i][0][idx], drawn[i][1][idx], idx) for i, idx in sel.picks]  # copies, before zeroing
            all_rw, all_sv = torch.cat([d[1] for d in drawn]).double(), torch.cat([d[2] for d in drawn])
            stats[:, r] = torch.stack([all_rw.mean(), all_sv.double().mean(), (all_sv > 0).any(-1).double().mean()])
            tokens[r].zero_()
            rewards[r].zero_()
            prompt[r].zero_()
            valid[r] = torch.arange(S) < n
            if n:
                tokens[r, :n] = torch.cat([t for t, _, _ in picked])
                rewards[r, :n] = torch.cat([rw for _, rw, _ in picked])
                prompt[r, :n] = torch.cat([idx for _, _, idx in picked])
    out.update(tokens=tokens, rewards=rewards, prompt=prompt, valid=valid, rounds=rounds,
               kept=valid.sum(-1), ds=ds, reward=stats[0], accuracy=stats[1], pass_rate=stats[2])
    return out


def _selected_sets(batch, logp_tok: torch.Tensor, adv: torch.Tensor, kept: list[int],
                   preps: list[PreparedStep | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """L+ and L− ``[R, S, G, L]`` bool of every run: the core's sets over the run's kept tokens with the run's P,
    both sets whatever the run's variant and gate (for the D terms) — the ones ``preps[r]`` kept when its
    preparation selected both, else :func:`stare_lab.loss.stare.select_stare_sets` (variant C2)."""
    R, S, G, L = logp_tok.shape
    lplus = torch.zeros(R, S, G, L, dtype=torch.bool)
    lminus = torch.zeros(R, S, G, L, dtype=torch.bool)
    lp32 = logp_tok.float()
    mask = torch.ones(S * G, L, dtype=torch.bool)
    top_p = batch.top_p.tolist()
    for r in range(R):
        n = kept[r]
        if n == 0:
            continue
        sets = None if preps is None else preps[r].selection
        if sets is None or sets.lminus is None:
            sets = select_stare_sets(lp32[r, :n].view(n * G, L), adv[r, :n].reshape(n * G), mask[: n * G], top_p[r],
                                     variant="C2")
        lplus[r, :n] = sets.lplus.view(n, G, L)
        lminus[r, :n] = sets.lminus.view(n, G, L)
    return lplus, lminus


def _prepare(batch, r: int, roll, logp_tok, adv, pol: Policy, h_gate: float, step: int) -> PreparedStep:
    """The core's preparation of run ``r``'s step over its kept tokens (n groups × G responses × L positions, all
    valid): the gate sees ``h_gate`` (the simulator's exact token-mean entropy of that batch), the per-token entropy
    goes in only when the loss reads it."""
    cfg, needs = batch.configs[r], batch.needs[r]
    G, L = cfg.group_size, cfg.seq_len
    n = int(roll["kept"][r])
    entropy = pol.entropy[r][roll["prompt"][r, :n]].repeat_interleave(G, dim=0) if needs.entropy else None
    sb = StepBatch(torch.ones(n * G, L, dtype=torch.bool), adv[r, :n].reshape(-1).float(),
                   logp_tok[r, :n].reshape(n * G, L).float(), entropy=entropy)
    # without a kept group the step is skipped and prepare_step reads no entropy (0.0 only satisfies its check)
    return prepare_step(sb, cfg.loss, controller=batch.controllers[r], step=step, seed=cfg.seed,
                        batch_entropy=h_gate if n else 0.0)


def _core_coefficients(batch, r: int, prep: PreparedStep, roll, logp_tok, row: dict):
    """Token coefficients ``[n, G, L]`` of run ``r``'s update from the core loss (module docstring) and the
    per-state weight ``[S, L]`` of ∂H/∂z in it (entropy bonus; zeros without), filling ``row`` with the loss
    metrics."""
    cfg = batch.configs[r]
    S, G, L = cfg.num_prompts, cfg.group_size, cfg.seq_len
    n = int(roll["kept"][r])
    ent_w = torch.zeros(S, L, dtype=torch.float64)
    if prep.skip:
        return torch.zeros(0, G, L, dtype=torch.float64), ent_w
    lp = logp_tok[r, :n].reshape(n * G, L).clone().requires_grad_(True)
    ent = prep.batch.entropy.clone().requires_grad_(True) if prep.needs.entropy_grad else None
    loss, metrics = compute_policy_loss(cfg.loss.loss_mode, prep.inputs(lp, entropy=ent), cfg.loss)
    loss.backward()
    scale = cfg.lr * n * L  # token-mean over n·G·L tokens → per-state group update (simulators.tabular.runner docstring)
    for key, value in metrics.items():
        row[key if "/" in key else f"loss/{key}"] = float(value)
    if ent is not None and ent.grad is not None:
        per_tok = (-scale * ent.grad).view(n, G, L).sum(1)  # [n, L]
        ent_w.index_add_(0, roll["prompt"][r, :n], per_tok)
    return (-scale * lp.grad).view(n, G, L), ent_w


def _fast_runs(batch) -> list[bool]:
    """:func:`closed_form` of every run (cached on the batch)."""
    if getattr(batch, "_fast", None) is None or len(batch._fast) != batch.size:
        batch._fast = [closed_form(c, n) for c, n in zip(batch.configs, batch.needs)]
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


def sampled_parts(batch, pol: Policy, h_before: torch.Tensor, step: int) -> StepParts:
    """The sampled step ``step`` of every run of ``batch`` (module docstring) as
    :class:`~simulators.tabular.step.StepParts`."""
    cfg = batch.base
    R, S, L, V, G = batch.size, cfg.num_prompts, cfg.seq_len, cfg.vocab_size, cfg.group_size
    roll = rollouts(batch, pol.pi)
    kept = roll["kept"].tolist()
    h_gate = h_before.clone()
    slot_h = pol.entropy.gather(1, roll["prompt"].unsqueeze(-1).expand(R, S, L)).mean(-1)  # [R, S]
    for r in roll["ds"]:  # token-mean entropy of the kept batch (all its responses have L tokens)
        if kept[r]:
            h_gate[r] = slot_h[r, : kept[r]].mean()
    adv = group_advantages(roll["rewards"].reshape(-1), group_size=G, estimator=cfg.advantage_estimator)
    adv = adv.view(R, S, G).double()
    state = _state_index(batch, roll)
    token = roll["tokens"]
    flat = state * V + token
    logp_tok = pol.logp.reshape(-1)[flat]
    psi_tok = pol.psi.reshape(-1)[flat]
    h_list = h_gate.tolist()
    preps = [_prepare(batch, r, roll, logp_tok, adv, pol, h_list[r], step) for r in range(R)]
    lplus, lminus = _selected_sets(batch, logp_tok, adv, kept, preps)
    omega = torch.ones(R, S, G, L, dtype=torch.float32)
    for r, p in enumerate(preps):
        if p.token_weights is not None:
            omega[r, : kept[r]] = p.token_weights.view(kept[r], G, L)
    base = (batch.lr.view(R, 1, 1, 1) / G) * adv.unsqueeze(-1).expand(R, S, G, L)
    actual = base * omega.double()
    grpo = base.clone()
    rows: list[dict[str, Any]] = [{} for _ in range(R)]
    ent_w = torch.zeros(R, S, L, dtype=torch.float64)
    fast = _fast_runs(batch)
    for r, p in enumerate(preps):
        if fast[r]:
            continue
        coef, ent_w[r] = _core_coefficients(batch, r, p, roll, logp_tok, rows[r])
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
    f64 = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    gate_on = torch.tensor([p.gate_on for p in preps])
    scalars = {
        "reward": roll["reward"],
        "accuracy": roll["accuracy"],
        f"pass@{G}": roll["pass_rate"],
        "gate_on": gate_on.double(),
        "stare_w": f64([p.reweight_w for p in preps]),
        "stare_m": f64([p.reweight_m for p in preps]),
        "skipped": f64([p.skip for p in preps]),
        **quad,
    }
    # share of the L+ probability mass above s* (docs/theory.md §8), over the run's kept tokens
    surprisal, sstar_tok = -logp_tok, pol.sstar.reshape(-1)[state]
    for r in range(R):
        n = kept[r]
        rows[r][KEY_LPLUS_ABOVE] = (share_above_critical(surprisal[r, :n], sstar_tok[r, :n], lplus[r, :n])
                                    if n else None)
    for r, p in enumerate(preps):
        if p.needs.stare and p.stare_stats is not None:
            st = p.stare_stats
            rows[r]["stare/frac_pos_selected"] = float(st["stare/frac_pos_selected"])
            rows[r]["stare/frac_neg_selected"] = float(st["stare/frac_neg_selected"])
        if batch.configs[r].dynamic_sampling:
            rows[r]["ds/kept_groups"] = kept[r]
            rows[r]["ds/rounds"] = roll["rounds"][r]
            rows[r]["stare/gate_entropy"] = p.entropy
    return StepParts(parts, scalars, rows, gate_on & batch.is_stare, torch.tensor(fast))
