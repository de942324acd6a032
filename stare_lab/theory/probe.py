"""The cheap probe of a step's near-criticality (docs/theory.md §7, §8): the D terms of a parameterised policy from
ONE backward pass (∇θH̄) and ONE forward-mode pass (or one backward through the first's graph:
:class:`GraphTangent`), and the two calibration targets.

With P the AdamW preconditioner of the step (:func:`stare_lab.theory.adam_linear.adam_preconditioner`) and
v = P ⊙ ∇θH̄, the D term of an objective ℓ_X (X = GRPO, L+, L−; :mod:`stare_lab.theory.decomposition`) is

    D_X = ∇θH̄ · (−P ⊙ ∇θℓ_X) = −v · ∇θℓ_X
        = −Σ_t [ ∂ℓ_X/∂log π_t · (∇θ log π_t · v) + ∂ℓ_X/∂H_t · (∇θ H_t · v) ]

by the chain rule: ℓ_X depends on θ only through the per-token log-probs (and, with an entropy bonus, the
per-token entropies). One forward-mode pass (``torch.func.jvp``) along v gives the logits' directional derivative
ż at every response position, hence every token's ∇θ log π_t · v = (ż_a − E_π ż)/τ
(:func:`~stare_lab.theory.first_order.logprob_change`) and ∇θ H_t · v = −Cov_π(log π, ż/τ)
(:func:`~stare_lab.theory.first_order.predicted_entropy_change`). The ∂ℓ_X/∂log π_t, ∂ℓ_X/∂H_t are elementwise
derivatives of the core's objectives at the step's tokens (autograd on ``[b, t]`` tensors, no model pass). So
D_GRPO, D_L+ and D_L− are weighted sums over the same per-token numbers, and equal the three-backward values
(one gradient per objective, :func:`~stare_lab.theory.adam_linear.linearised_entropy_change`) to float rounding.

Per step the probe also gives (:func:`probe_row`): D_L+/|D_GRPO| (:data:`~stare_lab.theory.critical.KEY_D_RATIO`), the
share of the L+ probability mass above each token's critical surprisal s*
(:data:`~stare_lab.theory.critical.KEY_LPLUS_ABOVE`; :func:`~stare_lab.theory.first_order.share_above_critical`) and W*(t)
(:data:`~stare_lab.theory.critical.KEY_W_STAR`; :func:`~stare_lab.theory.critical.w_star`).

Forward-mode AD: PyTorch's fused attention kernels (flash / memory-efficient ``scaled_dot_product_attention``) have
no forward-mode derivative, so :func:`jvp_logits` runs the model with the math backend of
``scaled_dot_product_attention`` (the same attention written with matmul and softmax). The direction is scaled to
max |v| = 1 before it is cast to the parameters' dtype (16-bit tangents keep their precision) and the results are
scaled back. Dot products and sums accumulate in float64.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS, KEY_D_RATIO, KEY_LPLUS_ABOVE, KEY_W_STAR, w_star
from stare_lab.errors import DataError
from stare_lab.theory.first_order import mass_above_critical, token_first_order

__all__ = ["TokenTangents", "preconditioned_direction", "jvp_logits", "GraphTangent", "token_tangents",
           "objective_derivatives",
           "directional_terms", "lplus_mass", "probe_row", "LPLUS_ABOVE_SUM", "LPLUS_MASS_SUM"]

#: Keys of the two L+ mass sums in a per-rank sum dict (combined over micro-batches and ranks before the share).
LPLUS_ABOVE_SUM, LPLUS_MASS_SUM = "probe/lplus_mass_above", "probe/lplus_mass"

#: ``objective(logprobs [b, t], entropy [b, t]) -> 0-dim loss``: one objective ℓ_X of a micro-batch (its part of the
#: step objective, already divided by the step's global normaliser).
Objective = Callable[[Tensor, Tensor], Tensor]


@dataclasses.dataclass
class TokenTangents:
    """Per-token values of one micro-batch at the probe's parameters (all ``[b, t]``, detached, nats).

    Attributes:
        logprobs: log π of the sampled tokens (the jvp's primal).
        entropy: entropy of each position's distribution.
        d_logprobs: ∇θ log π_t · v.
        d_entropy: ∇θ H_t · v.
        s_star: the critical surprisal of each position (:func:`~stare_lab.theory.first_order.critical_surprisal`).
    """

    logprobs: Tensor
    entropy: Tensor
    d_logprobs: Tensor
    d_entropy: Tensor
    s_star: Tensor


def preconditioned_direction(
    grad_entropy: Iterable[Tensor | None], preconditioner: Iterable[Tensor], like: Sequence[Tensor]
) -> tuple[list[Tensor], float]:
    """The probe's direction v = P ⊙ ∇θH̄, scaled to max |v| = 1 and cast to the dtype / device of ``like`` (the
    parameters the forward-mode pass runs at). The entries are consumed one by one (``preconditioner`` may be a
    generator: the float64 P of one tensor at a time); v of 16-bit parameters is kept in float32 until the scale is
    known.

    Args:
        grad_entropy: ∇θH̄ per parameter tensor (``None``: H̄ does not depend on it, v = 0 there).
        preconditioner: P per parameter tensor (:func:`~stare_lab.theory.adam_linear.adam_preconditioner`).
        like: the parameters, same order and element counts.

    Returns:
        ``(tangents, scale)`` with v = scale · tangents (scale = max |v|, or 1 when v = 0).

    Raises:
        DataError: sequences of different lengths or element counts, or a non-finite v.
    """
    ps = list(like)
    v, scale, missing = [], 0.0, object()
    for j, (g, p) in enumerate(itertools.zip_longest(grad_entropy, preconditioner, fillvalue=missing)):
        if j >= len(ps) or g is missing or p is missing:
            raise DataError(f"preconditioned_direction: ∇θH̄, P and the {len(ps)} parameters differ in length")
        x = ps[j]
        if p.numel() != x.numel() or (g is not None and g.numel() != x.numel()):
            raise DataError(f"preconditioned_direction: entry {j} has {None if g is None else g.numel()}, "
                            f"{p.numel()} and {x.numel()} elements")
        keep = torch.promote_types(x.dtype, torch.float32)  # 16-bit parameters: float32 until the scale is known
        t = (torch.zeros(x.shape, dtype=keep, device=p.device) if g is None
             else (g.detach().double().reshape(x.shape).to(p.device) * p.reshape(x.shape)).to(keep))
        if t.numel():
            scale = max(scale, float(t.abs().max()))
        v.append(t)
    if len(v) != len(ps):
        raise DataError(f"preconditioned_direction: {len(v)} entries for {len(ps)} parameters")
    if not math.isfinite(scale):
        raise DataError("preconditioned_direction: P ⊙ ∇θH̄ is not finite")
    scale = scale if scale > 0 else 1.0
    return [(t.div_(scale)).to(dtype=x.dtype, device=x.device) for t, x in zip(v, ps)], scale


def jvp_logits(
    forward: Callable[[dict[str, Tensor]], Tensor], primals: Mapping[str, Tensor], tangents: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """One forward-mode pass: ``forward(primals)`` and its directional derivative along ``tangents``
    (``torch.func.jvp``), without autograd graphs and with ``scaled_dot_product_attention``'s math backend (the
    fused kernels have no forward-mode derivative).

    Args:
        forward: maps a ``{name: tensor}`` parameter dict to the response logits ``[b, t, V]`` (e.g. through
            ``torch.func.functional_call``).
        primals, tangents: the parameters and the direction, same keys, shapes and dtypes.

    Returns:
        ``(logits, logits_dot)``, both ``[b, t, V]``.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    primals, tangents = dict(primals), dict(tangents)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        return torch.func.jvp(forward, (primals,), (tangents,))


class GraphTangent:
    """The logits' directional derivative ż = J·v (J = ∂z/∂θ) from the graph of a backward pass instead of a
    forward-mode pass, so that the forward the step runs anyway is its primal.

    With u a zero cotangent leaf, the backward g(u) = Jᵀ(w + u) is recorded (``create_graph``): g(0) = Jᵀw is the
    gradient the caller wants (the probe: w = ∂ΣH_t/∂z, g = ∇θΣH_t) and ∂⟨g(u), v⟩/∂u = J·v for any v given later
    (P is known only after the update). Cost: the recorded backward, then one backward through it (about the
    tangent half of a forward-mode pass). The forward's graph and the recorded backward are kept until
    :meth:`logits_dot`; every op of the forward needs a double backward (run ``scaled_dot_product_attention`` with
    its math backend: the fused CPU/CUDA kernels have none).

    Args:
        logits: ``[..., V]`` with the graph of ``params``.
        params: the leaves the gradient is taken for.
        cotangent: w, the shape of ``logits`` (detached).

    Raises:
        RuntimeError: (autograd) an op of the forward has no double backward.
    """

    def __init__(self, logits: Tensor, params: Sequence[Tensor], cotangent: Tensor) -> None:
        self._u: Tensor | None = torch.zeros_like(logits, requires_grad=True)
        self._grads: tuple[Tensor | None, ...] | None = torch.autograd.grad(
            logits, list(params), grad_outputs=cotangent.detach().to(logits.dtype) + self._u, create_graph=True,
            allow_unused=True)
        #: g(0) = Jᵀw per parameter (detached; ``None`` where the logits do not depend on it)
        self.gradient = [None if g is None else g.detach() for g in self._grads]

    def logits_dot(self, tangents: Sequence[Tensor]) -> Tensor:
        """ż = J·v for v = ``tangents`` (one per parameter, same shapes); frees the kept graphs (one use).

        Raises:
            RuntimeError: called a second time.
        """
        if self._grads is None or self._u is None:
            raise RuntimeError("GraphTangent.logits_dot: the graph was used already")
        grads, u = self._grads, self._u
        self._grads = self._u = None
        terms = [(g * t).sum().float() for g, t in zip(grads, tangents) if g is not None and g.requires_grad]
        if not terms:  # the gradient does not depend on the logits' cotangent: J·v = 0
            return torch.zeros_like(u)
        (dot,) = torch.autograd.grad(torch.stack(terms).sum(), u, allow_unused=True)
        return torch.zeros_like(u) if dot is None else dot


def token_tangents(logits: Tensor, logits_dot: Tensor, tokens: Tensor, temperature: float = 1.0,
                   scale: float = 1.0) -> TokenTangents:
    """The per-token values of :class:`TokenTangents` from a forward-mode pass's response logits and their
    directional derivative along v / ``scale``; the derivatives are multiplied by ``scale`` (so they are along v).

    Args:
        logits: ``[b, t, V]``. logits_dot: ``[b, t, V]``. tokens: ``[b, t]`` sampled ids (padding: any valid id).
        temperature: τ of sampling (the log-probs and entropies are those of softmax(z/τ)).
        scale: the ``scale`` of :func:`preconditioned_direction`.

    Raises:
        DataError / ConfigError: as :func:`~stare_lab.theory.first_order.token_first_order` (one pass over the vocabulary).

    Source: docs/theory.md §2 (∂log π_a/∂z = (e_a − π)/τ, ∂H/∂z_k = −π_k(log π_k + H)/τ).
    """
    lp, h, dlp, dh, s_star = token_first_order(logits.detach(), logits_dot.detach(), tokens, temperature)
    return TokenTangents(logprobs=lp, entropy=h, d_logprobs=dlp * scale, d_entropy=dh * scale, s_star=s_star)


def objective_derivatives(objective: Objective, logprobs: Tensor, entropy: Tensor) -> tuple[Tensor, Tensor | None]:
    """∂ℓ/∂log π_t and ∂ℓ/∂H_t of one objective at the given per-token values (autograd on ``[b, t]`` leaves; no
    model pass). ``None`` for the entropy when ℓ does not depend on it (no entropy bonus).

    Raises:
        DataError: the objective is not a scalar or does not depend on the log-probs.
    """
    lp = logprobs.detach().clone().requires_grad_(True)
    ent = entropy.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = objective(lp, ent)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise DataError("objective_derivatives: the objective must return a 0-dim tensor")
        if not loss.requires_grad:  # no token selected (an empty L+): the objective is a constant
            return torch.zeros_like(lp), None
        d_lp, d_ent = torch.autograd.grad(loss.reshape(()), (lp, ent), allow_unused=True)
    return (torch.zeros_like(lp) if d_lp is None else d_lp), d_ent


def directional_terms(tangents: TokenTangents, objectives: Mapping[str, Objective]) -> dict[str, float]:
    """This micro-batch's part of D_X = −Σ_t [∂ℓ_X/∂log π_t·(∇θ log π_t·v) + ∂ℓ_X/∂H_t·(∇θH_t·v)] for each
    objective (float64 sums; add the micro-batches' and ranks' parts). Source: the module docstring."""
    out = {}
    for key, objective in objectives.items():
        d_lp, d_ent = objective_derivatives(objective, tangents.logprobs, tangents.entropy)
        total = (d_lp.double() * tangents.d_logprobs.double()).sum()
        if d_ent is not None:
            total = total + (d_ent.double() * tangents.d_entropy.double()).sum()
        out[key] = -float(total)
    return out


def lplus_mass(tangents: TokenTangents, lplus: Tensor) -> dict[str, float]:
    """This micro-batch's two sums of the L+ share above s*: ``{LPLUS_ABOVE_SUM: Σ_{L+, s > s*} π_a,
    LPLUS_MASS_SUM: Σ_{L+} π_a}`` (:func:`~stare_lab.theory.first_order.mass_above_critical`; ``lplus``: ``[b, t]``
    0/1 indicator of L+ on the micro-batch's rows)."""
    above, total = mass_above_critical(-tangents.logprobs, tangents.s_star, lplus.to(tangents.logprobs.device) > 0)
    return {LPLUS_ABOVE_SUM: above, LPLUS_MASS_SUM: total}


def probe_row(sums: Mapping[str, float], reweight_m: float = 1.0) -> dict[str, float | None]:
    """The probe's row entries from the summed D terms (and, if present, the L+ mass sums): the D terms (nats),
    :data:`~stare_lab.theory.critical.KEY_D_RATIO` = D_L+/|D_GRPO| (``None`` when D_GRPO = 0),
    :data:`~stare_lab.theory.critical.KEY_LPLUS_ABOVE` (``None`` without the sums or when L+ is empty) and
    :data:`~stare_lab.theory.critical.KEY_W_STAR` = :func:`~stare_lab.theory.critical.w_star` with M = ``reweight_m`` (1 for O1
    and GRPO; ``inf`` — written as null — when no W cancels the drift).

    Raises:
        DataError: ``sums`` lacks D_GRPO or D_L+.
    """
    if KEY_D_GRPO not in sums or KEY_D_LPLUS not in sums:
        raise DataError(f"probe_row: the sums need {KEY_D_GRPO!r} and {KEY_D_LPLUS!r}, got {sorted(sums)}")
    dg, dl = float(sums[KEY_D_GRPO]), float(sums[KEY_D_LPLUS])
    dm = sums.get(KEY_D_LMINUS)
    row: dict[str, float | None] = {KEY_D_GRPO: dg, KEY_D_LPLUS: dl}
    if dm is not None:
        row[KEY_D_LMINUS] = float(dm)
    row[KEY_D_RATIO] = dl / abs(dg) if dg != 0 else None
    total = sums.get(LPLUS_MASS_SUM)
    row[KEY_LPLUS_ABOVE] = float(sums[LPLUS_ABOVE_SUM]) / total if total else None
    row[KEY_W_STAR] = w_star(dg, dl, float(dm) if dm is not None else 0.0, float(reweight_m))
    return row
