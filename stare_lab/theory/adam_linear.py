"""An update in parameter space: dot products of per-parameter tensors and the linearisation of an AdamW step, the
pieces of the D terms of docs/theory.md §7 for a parameterised policy (``P`` the step's preconditioner, ``−P ⊙ g_X``
the part of the update a gradient ``g_X`` carries). Float64 accumulation; detached.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Sequence

import torch
from torch import Tensor

from stare_lab.errors import DataError

__all__ = ["param_dot", "adam_preconditioner", "adam_exp_avg_sq", "linearised_entropy_change"]


def param_dot(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    """``Σ_j ⟨a_j, b_j⟩`` over matching tensors (e.g. ∇θH̄ and Δθ), accumulated in float64; ``None`` entries of ``a``
    (a parameter the differentiated scalar does not depend on) contribute 0.

    Raises:
        DataError: different lengths or element counts.
    """
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise DataError(f"param_dot needs sequences of the same length, got {len(a)} and {len(b)}")
    total = 0.0
    for j, (x, y) in enumerate(zip(a, b)):
        if x is None:
            continue
        if x.numel() != y.numel():
            raise DataError(f"param_dot: entry {j} has {x.numel()} and {y.numel()} elements")
        total += float(torch.dot(x.detach().reshape(-1).double(), y.detach().reshape(-1).double()))
    return total


def adam_preconditioner(
    exp_avg_sq: Sequence[Tensor], *, lr: float, beta1: float, beta2: float, eps: float, step: int | float,
    clip: float = 1.0,
) -> list[Tensor]:
    """The preconditioner P of one Adam(W) step: the derivative of the step's update Δθ with respect to its
    gradient g with the second moment held fixed, so the part of the update a gradient g_X carries is −P ⊙ g_X.

        P = lr · (1 − β₁)/(1 − β₁ᵗ) · c / (√(v_t/(1 − β₂ᵗ)) + ε)

    (Adam's m_t = β₁m_{t−1} + (1 − β₁)·c·g, Δθ = −lr·m̂_t/(√v̂_t + ε); decoupled weight decay and the momentum of
    earlier steps are not carried by g). Used for the D terms of docs/theory.md §7.

    Args:
        exp_avg_sq: v_t of each parameter tensor *after* the step (the optimizer state), any float dtype.
        lr, beta1, beta2, eps: the step's Adam settings. step: t ≥ 1, the number of this update.
        clip: the gradient-clipping factor applied to g this step, min(1, max_norm/(‖g‖ + 1e-6)); 1 = none.

    Returns:
        One float64 tensor per entry of ``exp_avg_sq`` (same shapes).

    Raises:
        DataError: t < 1, a β outside [0, 1), eps < 0 or a non-finite lr / clip.
    """
    t = float(step)
    if not t >= 1 or not (0 <= beta1 < 1 and 0 <= beta2 < 1) or not eps >= 0:
        raise DataError(f"adam_preconditioner: need step >= 1, betas in [0, 1), eps >= 0; got step={step}, "
                        f"beta1={beta1}, beta2={beta2}, eps={eps}")
    if not (math.isfinite(lr) and math.isfinite(clip)):
        raise DataError(f"adam_preconditioner: lr={lr} and clip={clip} must be finite")
    scale = lr * (1 - beta1) / (1 - beta1 ** t) * clip
    bc2 = 1 - beta2 ** t
    return [scale / ((v.detach().double() / bc2).sqrt() + eps) for v in exp_avg_sq]


def adam_exp_avg_sq(
    exp_avg_sq: Sequence[Tensor | None], grad: Sequence[Tensor | None], *, beta2: float, clip: float = 1.0
) -> list[Tensor]:
    """Adam's second moment after one more step, formed without taking it: ``v_t = β₂·v_{t−1} + (1 − β₂)·(c·g)²``
    (float64; ``v_{t−1} = 0`` for ``None`` entries: no state, the first step; ``None`` gradient: v_t = β₂·v_{t−1}),
    c the clipping factor applied to g. With it :func:`adam_preconditioner` gives the P of a step not applied.

    Raises:
        DataError: different lengths, an entry with neither, β₂ outside [0, 1), or a non-finite clip.
    """
    prev, g = list(exp_avg_sq), list(grad)
    if len(prev) != len(g):
        raise DataError(f"adam_exp_avg_sq: {len(prev)} second moments and {len(g)} gradients")
    if not 0 <= beta2 < 1 or not math.isfinite(clip):
        raise DataError(f"adam_exp_avg_sq: need beta2 in [0, 1) and a finite clip, got beta2={beta2}, clip={clip}")
    out = []
    for v, x in zip(prev, g):
        if x is None and v is None:
            raise DataError("adam_exp_avg_sq: an entry has neither a second moment nor a gradient")
        new = torch.zeros_like(x, dtype=torch.float64) if v is None else beta2 * v.detach().double()
        if x is not None:
            new = new + (1 - beta2) * (clip * x.detach().double()) ** 2
        out.append(new)
    return out


def linearised_entropy_change(
    grad_entropy: Iterable[Tensor | None], preconditioner: Iterable[Tensor], grad: Iterable[Tensor | None]
) -> float:
    """First-order entropy change of the update a gradient carries under a diagonal preconditioner:
    ``∇θH̄ · (−P ⊙ g) = −Σ_j Σ ∇θH̄_j · P_j · g_j`` (float64; ``None`` gradients contribute 0; the entries are
    consumed one at a time, so P may be a generator). With P from :func:`adam_preconditioner` and g the gradient of
    the GRPO objective or of its L+ / L− part this is the D_GRPO / D_L+ / D_L− of docs/theory.md §7 for a
    parameterised policy.

    Raises:
        DataError: sequences of different lengths.
    """
    total, missing = 0.0, object()
    for a, p, b in itertools.zip_longest(grad_entropy, preconditioner, grad, fillvalue=missing):
        if a is missing or p is missing or b is missing:
            raise DataError("linearised_entropy_change: ∇θH̄, P and g differ in length")
        if a is None or b is None:
            continue
        total -= float(torch.dot((a.detach().double() * p).reshape(-1), b.detach().reshape(-1).double()))
    return total
