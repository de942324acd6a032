"""The objectives of the D terms of docs/theory.md §7 for a parameterised policy: the GRPO objective of a step
(ω ≡ 1) and the part of the STARE surrogate that the selected L+ (L−) tokens carry, so that

    D_X = ∇θH̄ · Δθ_X,   Δθ_X = −P ⊙ ∇θ loss_X      (X = GRPO, L+, L−)

with P the optimizer's preconditioner of the step (:func:`stare_lab.theory.adam_linear.adam_preconditioner`) and the
products summed by :func:`stare_lab.theory.adam_linear.linearised_entropy_change`. The trainer (``trainer/step/prediction.py``)
and the transformer simulator use these, so both split a step the same way; the tabular simulator computes the same
split in closed form on logits and selects its sets with :func:`stare_lab.loss.stare.select_stare_sets`.

L+ (L−) are the tokens STARE would select with the run's ``stare.top_p_ratio`` — whatever the run's loss, variant and
gate — so a GRPO run gives the conservative W* estimate and a STARE run the held-trajectory one (docs/theory.md §7).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss
from stare_lab.loss.step import StepBatch, prepare_step

__all__ = ["selection_stare", "selected_parts", "grpo_objective", "part_objective",
           "decomposition_keys", "KEY_D_GRPO", "KEY_D_LPLUS", "KEY_D_LMINUS"]


def selection_stare(stare: STAREConfig) -> STAREConfig:
    """The STARE settings that select both L+ and L− with the run's top-P ratio and surprisal rule: variant C2, gate
    always on, scope global, no adaptation (W and M are not read: the sets come back as masks; the schedule set back
    to ``paper``, since ``auto`` needs ``adaptive``)."""
    return dataclasses.replace(stare, variant="C2", gate="always", scope="global", adaptive=False, schedule="paper")


def _is_c2(loss: LossConfig) -> bool:
    return loss.loss_mode == "stare" and loss.stare.variant == "C2"


def decomposition_keys(loss: LossConfig) -> tuple[str, ...]:
    """The D-term row keys a run logs: ``pred/d_grpo``, ``pred/d_lplus`` and, for STARE C2, ``pred/d_lminus``."""
    return (KEY_D_GRPO, KEY_D_LPLUS) + ((KEY_D_LMINUS,) if _is_c2(loss) else ())


def selected_parts(step_batch: StepBatch, loss: LossConfig, collective=None) -> dict[str, Tensor]:
    """The indicator of L+ (and of L− for C2) over the step batch, as STARE with the run's settings would select
    them (exact over ranks with ``collective``; :func:`stare_lab.loss.step.prepare_step`).

    Returns:
        ``{pred/d_lplus: [B, T] float32 0/1, (pred/d_lminus: ...)}`` on the batch's device.
    """
    cfg = dataclasses.replace(loss, loss_mode="stare", entropy_coeff=0.0, kl_coef=0.0, tis_cap=None,
                              stare=selection_stare(loss.stare))
    sets = prepare_step(step_batch, cfg, collective=collective).selection  # None: no valid token in the step
    empty = torch.zeros(step_batch.shape, dtype=torch.float32, device=step_batch.response_mask.device)
    parts = {KEY_D_LPLUS: empty if sets is None else sets.lplus.float()}
    if _is_c2(loss):
        parts[KEY_D_LMINUS] = empty if sets is None else sets.lminus.float()
    return parts


def grpo_objective(inputs: PolicyLossInputs, loss: LossConfig) -> Tensor:
    """The ``grpo`` loss of the step's inputs with the run's clip, aggregation, TIS, KL and entropy-bonus settings
    (ω ≡ 1): the objective whose update gives D_GRPO. 0-dim tensor with its graph."""
    return compute_policy_loss("grpo", inputs, dataclasses.replace(loss, loss_mode="grpo"))[0]


def part_objective(inputs: PolicyLossInputs, indicator: Tensor, loss: LossConfig) -> Tensor:
    """The STARE surrogate restricted to one selected set: ω = ``indicator`` (1 on the set, 0 elsewhere), the step's
    global normaliser, no entropy bonus and no KL — the objective whose update gives D_L+ (D_L−).

    Args:
        inputs: the step's (micro-batch's) :class:`~stare_lab.loss.losses.PolicyLossInputs`.
        indicator: ``[b, t]`` 0/1 of the set on the same rows and columns as ``inputs.logprobs``.
        loss: the run's loss config.
    """
    cfg = dataclasses.replace(loss, loss_mode="stare", entropy_coeff=0.0, kl_coef=0.0,
                              stare=dataclasses.replace(loss.stare, gate="always", scope="global", adaptive=False,
                                                        schedule="paper"))
    inputs = dataclasses.replace(inputs, token_weights=indicator.to(inputs.logprobs.device), gate_on=True,
                                 reweight_w=None, reweight_m=None, stare_stats=None)
    return compute_policy_loss("stare", inputs, cfg)[0]
