"""The pieces every tabular step shares: the run state and the batch of runs, the policy tables, the token
decomposition of an update and the quadrant statistics (see :mod:`simulators.tabular.runner` for the logged keys).

First order. With H the entropy of a state and g = ∂H/∂z (autograd through ``stare_lab.loss.entropy.entropy_from_logits``;
docs/theory.md §2: ∂H/∂u_k = −π_k(log π_k + H), u = z/τ), a logit change Δz changes the entropy by ⟨g, Δz⟩ to first
order (= ``stare_lab.theory.first_order.predicted_entropy_change``). A token a sampled with coefficient c in
Δz = Σ c (e_a − π)/τ contributes c·Ψ(a) with Ψ(a) = ⟨g, e_a − π⟩/τ = Φ(a)/τ² (Φ the entropy sensitivity of
docs/theory.md §2), so sign Ψ(a) = sign(s_a − s*) splits the tokens into the four quadrants.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from stare_lab.loss.entropy import entropy_from_logits
from stare_lab.theory.first_order import critical_surprisal
from stare_lab.loss.losses import loss_needs

__all__ = [
    "TabularState", "TabularBatch", "stack_states", "BATCH_FIELDS", "batch_key", "Policy", "StepParts",
    "policy_tables", "scatter_parts", "quadrant_stats", "QUADRANTS",
]

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")


@dataclasses.dataclass
class TabularState:
    """The mutable state of one run: logits ``z [S, L, V]`` float64, ``correct [S, L, V]`` bool, the rollout
    ``generator`` and the STARE ``controller`` (None for a loss without STARE)."""

    logits: torch.Tensor
    correct: torch.Tensor
    generator: torch.Generator
    controller: Any


@dataclasses.dataclass
class TabularBatch:
    """R runs advanced together: ``configs`` (resolved, one per run), ``logits [R, S, L, V]`` float64,
    ``correct [R, S, L, V]`` bool, one rollout ``generators[r]`` and ``controllers[r]`` (or None) per run. Cached per
    run: ``needs[r]`` (:func:`stare_lab.loss.losses.loss_needs` of its loss), the ``[R]`` float64 tensors ``lr``,
    ``reward_noise``, ``random_reward_p``, ``top_p`` (STARE's P), ``entropy_coeff`` and the bool tensors
    ``is_stare`` (the loss uses the STARE gate and W/M) and ``is_c2`` (its variant is C2)."""

    configs: list[Any]
    logits: torch.Tensor
    correct: torch.Tensor
    generators: list[torch.Generator]
    controllers: list[Any]

    def __post_init__(self) -> None:
        f64 = lambda name: torch.tensor([float(getattr(c, name)) for c in self.configs], dtype=torch.float64)  # noqa: E731
        self.lr = f64("lr")
        self.reward_noise = f64("reward_noise")
        self.random_reward_p = f64("random_reward_p")
        self.top_p = torch.tensor([float(c.loss.stare.top_p_ratio) for c in self.configs], dtype=torch.float64)
        self.entropy_coeff = torch.tensor([float(c.loss.entropy_coeff) for c in self.configs], dtype=torch.float64)
        self.needs = [loss_needs(c.loss.loss_mode, c.loss) for c in self.configs]
        self.is_stare = torch.tensor([n.stare for n in self.needs])
        self.is_c2 = torch.tensor([n.stare and c.loss.stare.variant == "C2" for n, c in zip(self.needs, self.configs)])

    @property
    def size(self) -> int:
        """R, the number of runs."""
        return len(self.configs)

    @property
    def base(self) -> Any:
        """The first run's config (every run shares the fields of :func:`batch_key`)."""
        return self.configs[0]

    def select(self, keep: list[int]) -> "TabularBatch":
        """The batch of runs ``keep`` (indices into this batch), in that order."""
        idx = torch.tensor(keep, dtype=torch.long)
        return TabularBatch([self.configs[i] for i in keep], self.logits[idx], self.correct[idx],
                            [self.generators[i] for i in keep], [self.controllers[i] for i in keep])

    def state(self, r: int) -> TabularState:
        """Run ``r``'s current state."""
        return TabularState(self.logits[r], self.correct[r], self.generators[r], self.controllers[r])

    def push_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[R]`` float64 (W − 1, M − 1) of each run's push at its current W and M (docs/theory.md §7): the STARE
        controller's values, ``loss.stare.reweight_w`` for runs without STARE, M − 1 = 0 unless the variant is C2."""
        w, m = [], []
        for c, ctl, c2 in zip(self.configs, self.controllers, self.is_c2.tolist()):
            w.append((ctl.reweight_w if ctl is not None else c.loss.stare.reweight_w) - 1.0)
            m.append((ctl.reweight_m - 1.0) if c2 and ctl is not None else 0.0)
        return torch.tensor(w, dtype=torch.float64), torch.tensor(m, dtype=torch.float64)

    def push_efficiency(self) -> torch.Tensor:
        """``[R]`` float64 e of each run (``push_efficiency``; 1 where it is ``None``)."""
        return torch.tensor([1.0 if c.push_efficiency is None else float(c.push_efficiency) for c in self.configs],
                            dtype=torch.float64)


def stack_states(configs: list[Any], states: list[TabularState]) -> TabularBatch:
    """One :class:`TabularBatch` from per-run states (configs that share :func:`batch_key`)."""
    return TabularBatch(list(configs), torch.stack([s.logits for s in states]), torch.stack([s.correct for s in states]),
                        [s.generator for s in states], [s.controller for s in states])


#: the config fields every run of one batch must share (shapes, mode, schedule); everything else is per run
BATCH_FIELDS = (
    "mode", "task", "reward", "num_prompts", "group_size", "seq_len", "vocab_size", "threshold", "steps",
    "temperature", "checkpoint_every", "advantage_estimator", "ds_max_rounds",
)


def batch_key(config: Any) -> tuple:
    """The values of :data:`BATCH_FIELDS`: runs with equal keys can share one :class:`TabularBatch`."""
    return tuple(getattr(config, f) for f in BATCH_FIELDS)


@dataclasses.dataclass
class Policy:
    """The policy tables of a batch (all ``[R, S, L, V]`` float64 unless noted): ``logp`` = log π, ``pi`` = π,
    ``entropy`` ``[R, S, L]`` (nats), ``grad`` = ∂H/∂z, ``psi`` = Ψ (module docstring), ``sstar`` ``[R, S, L]`` the
    critical surprisal s* of each state (nats, :func:`stare_lab.theory.first_order.critical_surprisal`)."""

    logp: torch.Tensor
    pi: torch.Tensor
    entropy: torch.Tensor
    grad: torch.Tensor
    psi: torch.Tensor
    sstar: torch.Tensor


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
    core (``stare_lab.loss.entropy.entropy_from_logits`` and autograd), Ψ and s* (``stare_lab.theory.first_order``), for
    ``logits [R, S, L, V]``."""
    z = logits.detach().clone().requires_grad_(True)
    ent = entropy_from_logits(z, temperature=temperature)
    ent.sum().backward()
    grad = z.grad
    logp = torch.log_softmax(logits / temperature, dim=-1)
    pi = logp.exp()
    psi = (grad - (pi * grad).sum(-1, keepdim=True)) / temperature
    return Policy(logp, pi, ent.detach(), grad, psi, critical_surprisal(logits, temperature=temperature))


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
