"""First-order predictions of a trainer step's entropy change (``schedule.measure_entropy_change``; docs/theory.md
§2 "Beyond one softmax" and §7; docs/trainer.md "Predicted vs measured entropy change").

Per step, on the step's batch (the tokens, masks and temperature of the pre-update H̄):

* ``pred_entropy_change`` = ∇θH̄ · Δθ: the gradient of the batch's token-mean entropy H̄ at the pre-update
  parameters, dotted with the applied update Δθ = θ_after − θ_before (fp32 master weights; Adam, momentum, clipping
  and weight decay included). It is exact to first order for any optimizer.
* the split of the step's own gradient by token sets (docs/theory.md §7), ``pred/d_grpo``, ``pred/d_lplus`` and,
  for STARE C2, ``pred/d_lminus``:

      D_X = ∇θH̄ · Δθ_X,   Δθ_X = −P ⊙ g_X,
      P = lr · (1 − β₁)/(1 − β₁ᵗ) · c / (√(v_t/(1 − β₂ᵗ)) + ε)

  where g_X is the gradient of the policy loss restricted to X — X = GRPO: the ``grpo`` loss with the run's clip,
  aggregation, TIS, KL and entropy-bonus settings (ω ≡ 1); X = L+ (L−): the same surrogate on the selected
  positive- (negative-) advantage high-surprisal tokens alone (ω = 1 on them, 0 elsewhere, global normaliser,
  no bonus/KL) — and P is the AdamW preconditioner of this step: ``v_t`` Adam's second moment after the step, t the
  step number, c the gradient-clipping factor min(1, clip/(‖g‖ + 1e-6)) (DeepSpeed's). Δθ_X is the part of this
  step's Adam update that the gradient g_X carries, with v_t held fixed (∂Δθ/∂g at this step: Adam is not linear
  in the gradient, its linearisation around this step is). So the split is exact in the sense
  D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L− = ∇θH̄ · (−P ⊙ g_applied) whenever ρ ≡ 1 (one on-policy update), and at the
  first step (no momentum, no weight decay) it equals ``pred_entropy_change`` (tested); later steps'
  ``pred_entropy_change`` also carries the momentum of earlier steps, the split does not.
  L+/L− are selected as STARE would (the run's ``stare.top_p_ratio``, scope global, exact over ranks) whatever the
  loss and the gate, so a GRPO run gives the conservative W* estimate and a STARE run the held-trajectory one
  (docs/theory.md §7). The W*(t) these give (:mod:`stare_lab.critical`, read by ``stare-lab analyze`` and in the
  run's ``summary.json``) is therefore the W at which this step's own Adam-linearised update would leave H̄
  unchanged.

Cost: one backward for ∇θH̄, one per D term, one gradient-sized float32 copy of each (this rank's part). Under
ZeRO-3 every dot product is over this rank's partition of the parameters and all-reduced (one collective for all);
under ZeRO 0–2 each rank holds the full tensors and computes the same sums. Dot products accumulate in float64;
``Σ g_H·θ_after − Σ g_H·θ_before`` gives ∇θH̄·Δθ without keeping a copy of θ.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch
from torch import Tensor

from stare_lab.config import LossConfig
from stare_lab.critical import KEY_D_GRPO
from stare_lab.decomposition import grpo_objective, part_objective, selected_parts
from stare_lab.first_order import adam_preconditioner, linearised_entropy_change, param_dot

__all__ = ["EntropyPrediction", "KEY_PRED"]

#: The row key of ∇θH̄·Δθ (docs/design.md §4); the D terms' keys are :mod:`stare_lab.critical`'s.
KEY_PRED = "pred_entropy_change"


@dataclasses.dataclass
class _Probes:
    grad_entropy: list[Tensor]
    grads: dict[str, list[Tensor]]
    before: float
    lr: float


class EntropyPrediction:
    """The probes of one step: :meth:`before_update` (gradients, collective), then the update, then
    :meth:`after_update` (the dot products; one collective under ZeRO-3). The objectives and the selection of
    L+/L− are the core's (:mod:`stare_lab.decomposition`), shared with the transformer simulator.

    Args:
        policy: the :class:`trainer.engines.policy.PolicyEngine`.
        comm: the :class:`trainer.engines.comm.Comm`.
        loss: the run's :class:`~stare_lab.config.LossConfig`.
        grad_clip: ``optim.grad_clip`` (0 = off).
    """

    def __init__(self, policy: Any, comm: Any, loss: LossConfig, grad_clip: float) -> None:
        self.policy, self.comm, self.loss, self.grad_clip = policy, comm, loss, float(grad_clip)

    def before_update(self, batch: Any, plan: Sequence[Tensor], prep: Any, step_batch: Any) -> _Probes:
        """∇θH̄ and the gradients of the GRPO, L+ (and L−) objectives, each followed by clearing the accumulated
        gradients (so the update that follows is unchanged). Collective."""
        policy, n_tok, loss = self.policy, prep.num_tokens, self.loss

        def entropy_mean(mb: Any, lp: Tensor, ent: Tensor | None) -> Tensor:
            mask = batch.response_mask.index_select(0, mb.rows)[:, : ent.shape[1]].to(ent.device)
            return torch.where(mask, ent.float(), torch.zeros((), device=ent.device)).sum() / n_tok

        grad_h = policy.gradient(batch, plan, entropy_mean, need_entropy=True, entropy_grad=True)
        parts = selected_parts(step_batch, loss, collective=self.comm.collective)
        bonus = prep.needs.entropy_grad

        def grpo(mb: Any, lp: Tensor, ent: Tensor | None) -> Tensor:
            return grpo_objective(prep.inputs(lp, mb.rows, entropy=ent if bonus else None), loss)

        grads = {KEY_D_GRPO: policy.gradient(batch, plan, grpo, need_entropy=bonus, entropy_grad=bonus)}
        for key, ind in parts.items():
            def part(mb: Any, lp: Tensor, ent: Tensor | None, ind: Tensor = ind) -> Tensor:
                cut = lambda x: x.index_select(0, mb.rows)[:, : lp.shape[1]].to(lp.device)  # noqa: E731
                # the part objectives have no bonus: the old entropies only stand in for the input the run's
                # preparation requires with entropy_coeff > 0
                inputs = prep.inputs(lp, mb.rows, entropy=cut(step_batch.entropy) if bonus else None)
                return part_objective(inputs, cut(ind), loss)

            grads[key] = policy.gradient(batch, plan, part)
        before = param_dot(grad_h, policy.local_view("param"))
        return _Probes(grad_h, grads, before, policy.adam_settings()["lr"])

    def after_update(self, probes: _Probes, grad_norm: float | None) -> dict[str, float]:
        """The row entries (nats): ``pred_entropy_change`` and the D terms of the step just taken."""
        policy = self.policy
        adam = policy.adam_settings()  # after the step: "step" = t, the number of this update
        clip = 1.0
        if self.grad_clip > 0 and grad_norm is not None and math.isfinite(grad_norm):
            clip = min(1.0, self.grad_clip / (grad_norm + 1e-6))
        precond = adam_preconditioner(policy.local_view("exp_avg_sq"), lr=probes.lr, beta1=adam["beta1"],
                                      beta2=adam["beta2"], eps=adam["eps"], step=max(adam["step"], 1.0), clip=clip)
        gh = probes.grad_entropy
        sums = {KEY_PRED: param_dot(gh, policy.local_view("param")) - probes.before}
        for key, g in probes.grads.items():
            sums[key] = linearised_entropy_change(gh, precond, g)
        return self.comm.sum(sums) if policy.partitioned else sums
