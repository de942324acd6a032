"""One batched step of the tabular simulator: the policy tables, the mode's update and the diagnostics every mode
shares (first order, D terms, push ratio, quadrants), see :mod:`simulators.tabular` for the logged keys.

First order. With H the entropy of a state and g = ∂H/∂z (autograd through ``stare_lab.entropy.entropy_from_logits``;
docs/theory.md §2: ∂H/∂u_k = −π_k(log π_k + H), u = z/τ), a logit change Δz changes the entropy by ⟨g, Δz⟩ to first
order (= ``stare_lab.entropy.predicted_entropy_change``). A token a sampled with coefficient c in
Δz = Σ c (e_a − π)/τ contributes c·Ψ(a) with Ψ(a) = ⟨g, e_a − π⟩/τ = Φ(a)/τ² (Φ the entropy sensitivity of
docs/theory.md §2), so sign Ψ(a) = sign(s_a − s*) splits the tokens into the four quadrants.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

__all__ = [
    "Policy", "StepParts", "Pending", "policy_tables", "batch_step", "finish_rows", "quadrant_stats",
    "gate_decisions", "scatter_parts",
    "QUADRANTS",
]

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")


@dataclasses.dataclass
class Policy:
    """The policy tables of a batch (all ``[R, S, L, V]`` float64 unless noted): ``logp`` = log π, ``pi`` = π,
    ``entropy`` ``[R, S, L]`` (nats), ``grad`` = ∂H/∂z, ``psi`` = Ψ (module docstring)."""

    logp: torch.Tensor
    pi: torch.Tensor
    entropy: torch.Tensor
    grad: torch.Tensor
    psi: torch.Tensor


@dataclasses.dataclass
class StepParts:
    """What a mode's step returns: ``parts [4, R, S, L, V]`` = Δz of the step, of the same rollouts with ω ≡ 1, and
    of their L+ / L− tokens alone (ω ≡ 1 there, 0 elsewhere; the entropy-bonus term is only in the first);
    ``scalars`` name → ``[R]`` tensor (row keys); ``rows`` per-run dicts of further keys; ``applied`` ``[R]`` bool:
    the run's step carries the STARE push (a STARE run with the gate on); ``plain`` ``[R]`` bool: the run's step
    is exactly Δz_GRPO, or Δz_GRPO + push where applied (no entropy-bonus or other term)."""

    parts: torch.Tensor
    scalars: dict[str, torch.Tensor]
    rows: list[dict[str, Any]]
    applied: torch.Tensor
    plain: torch.Tensor


def policy_tables(logits: torch.Tensor, temperature: float) -> Policy:
    """π, log π = log_softmax(z/τ) (the policy's definition, docs/theory.md §1), the entropy and its gradient from the
    core (``stare_lab.entropy.entropy_from_logits`` and autograd), and Ψ, for ``logits [R, S, L, V]``."""
    from stare_lab.entropy import entropy_from_logits

    z = logits.detach().clone().requires_grad_(True)
    ent = entropy_from_logits(z, temperature=temperature)
    ent.sum().backward()
    grad = z.grad
    logp = torch.log_softmax(logits / temperature, dim=-1)
    pi = logp.exp()
    psi = (grad - (pi * grad).sum(-1, keepdim=True)) / temperature
    return Policy(logp, pi, ent.detach(), grad, psi)


def gate_decisions(batch, h_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Update every run's STARE controller once with its gate entropy ``h_gate [R]`` (nats; docs/theory.md §4 step 3)
    → (gate_on ``[R]`` bool, W ``[R]``, M ``[R]`` float64); (False, 1, 1) for runs without STARE."""
    gates, ws, ms = [], [], []
    for ctl, h in zip(batch.controllers, h_gate.tolist()):
        if ctl is None:
            gates.append(False)
            ws.append(1.0)
            ms.append(1.0)
            continue
        gates.append(bool(ctl.update(h)))
        ws.append(float(ctl.reweight_w))
        ms.append(float(ctl.reweight_m))
    f64 = torch.float64
    return torch.tensor(gates), torch.tensor(ws, dtype=f64), torch.tensor(ms, dtype=f64)


def scatter_parts(
    coef: torch.Tensor, state: torch.Tensor, token: torch.Tensor, pi: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Δz = Σ c (e_a − π)/τ for several coefficient sets at once: ``coef [P, R, ...]`` float64 (one coefficient per
    sampled token and set), ``state`` / ``token`` ``[R, ...]`` long (the token's flat state index into the
    ``[R·S·L]`` states and its token id), ``pi [R, S, L, V]`` → ``[P, R, S, L, V]``. Tokens of one state are summed
    in their order (deterministic)."""
    P = coef.shape[0]
    R, S, L, V = pi.shape
    n_states = R * S * L
    sets = torch.arange(P).view(P, *([1] * state.dim()))
    dest = (sets * (n_states * V) + state * V + token).reshape(-1)
    flat = coef.reshape(-1)
    out = torch.zeros(P * n_states * V, dtype=coef.dtype).index_add_(0, dest, flat)
    csum = torch.zeros(P * n_states, dtype=coef.dtype).index_add_(0, (sets * n_states + state).reshape(-1), flat)
    return (out.view(P, R, S, L, V) - pi * csum.view(P, R, S, L, 1)) / temperature


def quadrant_stats(high: torch.Tensor, count: torch.Tensor, contrib: torch.Tensor) -> dict[str, torch.Tensor]:
    """Quadrant statistics (docs/theory.md §2, STARE Fig. 2) per run: tokens with Â > 0 / Â < 0 (``count`` and
    ``contrib`` stacked as ``[2, R, ...]``: the Â>0 and the Â<0 entries, zero where a token is not in that half) ×
    Ψ > 0 (``high`` ``[R, ...]``: surprisal above s*) → ``quadrant/<q>/count`` (``count`` summed: 1 per sampled
    token, the expected count in expected mode) and ``quadrant/<q>/dH`` (``contrib`` summed: first-order ΔH in
    nats, on the scale of ``entropy_change``), each ``[R]``."""
    x = torch.cat([count, contrib]).flatten(2)  # [4, R, N]: counts (Â>0, Â<0), then contributions
    hi = (x * high.flatten(1).to(x.dtype)).sum(-1)
    lo = x.sum(-1) - hi
    out = {}
    for i, sign in enumerate(("pos", "neg")):
        out[f"quadrant/{sign}_high/count"], out[f"quadrant/{sign}_low/count"] = hi[i], lo[i]
        out[f"quadrant/{sign}_high/dH"], out[f"quadrant/{sign}_low/dH"] = hi[2 + i], lo[2 + i]
    return out


@dataclasses.dataclass
class Pending:
    """What a step's rows still need from the entropy after the update (:func:`finish_rows`): per run ``[R]``
    float64 the entropy before, H(z + the variant that is not the step) (``h_other``; for a run whose step is not
    plain also ``h_push`` = H(z + Δz_GRPO + push)), and the ``plain`` / ``applied`` flags."""

    h_before: torch.Tensor
    h_other: torch.Tensor
    h_push: torch.Tensor
    plain: torch.Tensor
    applied: torch.Tensor

    def select(self, keep: list[int]) -> "Pending":
        idx = torch.tensor(keep, dtype=torch.long)
        return Pending(*(getattr(self, f.name)[idx] for f in dataclasses.fields(self)))


def batch_step(batch, pol: Policy | None = None) -> tuple[torch.Tensor, list[dict[str, Any]], Pending]:
    """One step of every run of ``batch`` (:class:`simulators.tabular.TabularBatch`) from its policy tables ``pol``
    (:func:`policy_tables` of ``batch.logits``; computed if not given): returns (Δz ``[R, S, L, V]`` float64, one
    metrics row per run without ``step`` / ``time/step_s`` and without the keys that need the entropy after the
    update, the :class:`Pending` values that :func:`finish_rows` completes them with), nothing applied. The
    controllers are updated (once) and the generators advanced."""
    from stare_lab.entropy import entropy_from_logits

    t0 = time.perf_counter()
    tau = batch.base.temperature
    pol = policy_tables(batch.logits, tau) if pol is None else pol
    h_before = pol.entropy.mean((-1, -2))
    if batch.base.mode == "sampled":
        from .tabular_sampled import sampled_parts as mode_parts
    else:
        from .tabular_expected import expected_parts as mode_parts
    out = mode_parts(batch, pol, h_before)
    parts = out.parts
    first = (pol.grad.unsqueeze(0) * parts).sum(-1).mean((-1, -2))  # [4, R] nats
    wp, mp = batch.push_weights()
    push_fo = wp * first[2] + mp * first[3]
    # the push's measured effect: H(z + Δz_GRPO + push) − H(z + Δz_GRPO). When the step is plain (it is Δz_GRPO, or
    # Δz_GRPO + push for a STARE run with the gate on: no other term), one of the two is the step itself, whose
    # entropy the next step's policy tables give; otherwise both are measured.
    with_push = parts[1] + wp.view(-1, 1, 1, 1) * parts[2] + mp.view(-1, 1, 1, 1) * parts[3]
    plain, applied = out.plain, out.applied
    other = torch.where((applied | ~plain).view(-1, 1, 1, 1), parts[1], with_push)
    variants = [other] + ([with_push] if not bool(plain.all()) else [])
    after = batch.logits.unsqueeze(0) + torch.stack(variants)
    ok = torch.isfinite(after).flatten(2).all(2)  # [n, R]: a diverging run is refused by the caller (check_update)
    after = torch.where(ok.view(*ok.shape, 1, 1, 1), after, batch.logits.unsqueeze(0))
    h_var = entropy_from_logits(after, temperature=tau).mean((-1, -2))
    h_var = torch.where(ok, h_var, torch.full_like(h_var, float("nan")))  # NaN → null in the row
    pending = Pending(h_before, h_var[0], h_var[-1], plain, applied)
    scalars = {
        "entropy": h_before,
        "pred_entropy_change": first[0],
        "pred/d_grpo": first[1],
        "pred/d_lplus": first[2],
        "pred/d_lminus": first[3],
        "stare/push_first_order": push_fo,
        **out.scalars,
    }
    names = list(scalars)
    values = torch.stack([scalars[k].double() for k in names], dim=1).tolist()  # one host transfer
    elapsed = time.perf_counter() - t0
    rows = []
    for r, vals in enumerate(values):
        row = dict(zip(names, vals))
        row["gate_on"] = int(row["gate_on"])
        row.update(out.rows[r])
        row["time/update_s"] = elapsed / batch.size
        rows.append(row)
    return parts[0], rows, pending


def finish_rows(rows: list[dict[str, Any]], pending: Pending, h_after: torch.Tensor) -> None:
    """Complete the rows of a step with the mean entropy after the update ``h_after [R]`` (the next step's
    ``entropy``): ``entropy_change``, ``stare/push_measured``, ``stare/push_ratio``, ``stare/grpo_measured``."""
    p = pending
    push = torch.where(p.plain, torch.where(p.applied, h_after - p.h_other, p.h_other - h_after), p.h_push - p.h_other)
    h_grpo = torch.where(p.plain & ~p.applied, h_after, p.h_other)
    values = torch.stack([h_after - p.h_before, push, h_grpo - p.h_before], dim=1).tolist()
    for row, (dh, pm, gm) in zip(rows, values):
        fo = row["stare/push_first_order"]
        row["entropy_change"] = dh
        row["stare/push_measured"] = pm
        row["stare/push_ratio"] = pm / fo if fo != 0 and pm == pm else None
        row["stare/grpo_measured"] = gm
