"""The policy losses (docs/design.md §1): pure functions of one inputs object and a :class:`LossConfig`.

The registry (inputs object, validation, TIS, aggregation, add-ons, metrics) is :mod:`stare_lab.loss.registry`;
this module defines the built-in losses, registers each with what it needs (:class:`LossNeeds`), and re-exports
the registry's public names, so ``from stare_lab.loss.losses import compute_policy_loss`` is the one import callers
need. With global normalisers (counts over the whole optimizer step), the sum of the losses of the micro-batches
equals the loss of the whole batch, and so do the gradients (docs/theory.md §3).

Method names used by simulators/trainer map onto the registry as: ``grpo`` → ``grpo``; ``grpo-ds`` → ``grpo``
(+ dynamic sampling upstream); ``o1`` / ``c2`` / ``o1-adaptive`` → ``stare``; ``entropy_bonus`` → ``grpo`` with
``entropy_coeff > 0``; ``clip_cov``, ``kl_cov``, ``forking_tokens`` → themselves.

Every built-in loss starts from :func:`clipped_surrogate` (PPO clip, clip-higher, dual clip), which a loss registered
outside the package calls too (docs/extending.md); each declares the metric names it returns
(:data:`SURROGATE_METRICS` plus its own).

What each built-in loss needs from the step (:func:`stare_lab.loss.step.prepare_step` computes it once per step):
``stare`` the gate and W/M, and ω for scope ``global``; ``clip_cov`` the step's mean log-prob and advantage and a
seeded generator; ``kl_cov`` the two means; ``forking_tokens`` the old entropies and the step's entropy threshold.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from stare_lab.loss.aggregation import aggregate_loss, masked_mean
from stare_lab.config import LossConfig
from stare_lab.errors import ConfigError, DataError
from stare_lab.loss import registry as loss_registry
from stare_lab.loss.registry import (  # noqa: F401 - re-exported: the registry's public names
    BUILTIN_LOSSES,
    LOG_RATIO_CLAMP,
    LossContext,
    LossNeeds,
    PolicyLossInputs,
    available_policy_losses,
    compute_policy_loss,
    get_policy_loss,
    kl_penalty,
    loss_metric_names,
    loss_needs,
    register_policy_loss,
    unregister_policy_loss,
)
from stare_lab.loss.stare import stare_token_weights

__all__ = [*loss_registry.__all__, "aggregate_loss", "masked_mean", "forking_entropy_threshold", "clipped_surrogate",
           "SURROGATE_METRICS"]

#: The metrics :func:`clipped_surrogate` returns (declare them when a registered loss passes them on).
SURROGATE_METRICS = ("loss/clipfrac_high", "loss/clipfrac_low", "loss/clipfrac_dual")
#: The metrics the ``stare`` loss adds to them.
STARE_METRICS = ("stare/gate_on", "stare/w", "stare/m", "stare/frac_pos_selected", "stare/frac_neg_selected")


def forking_entropy_threshold(entropy: Tensor, response_mask: Tensor, top_quantile: float) -> Tensor:
    """Entropy threshold of the 80/20 forking-token rule ("Beyond the 80/20 rule", arXiv 2506.01939; docs/theory.md §3).

    The threshold is the k-th largest entropy among the valid tokens, k = max(1, ⌈q·N⌉): tokens with entropy ≥ it
    keep their gradient (ties at the threshold are all kept). Compute it over the whole optimizer batch and pass it
    as ``PolicyLossInputs.entropy_threshold`` for a global quantile.

    Args:
        entropy: ``[B, T]`` per-token entropy (nats).
        response_mask: ``[B, T]`` bool or 0/1.
        top_quantile: q ∈ (0, 1].

    Returns:
        0-dim float32 tensor; +inf when there is no valid token (nothing kept).

    Raises:
        ConfigError: q outside (0, 1].
    """
    if not (0 < top_quantile <= 1):
        raise ConfigError(f"top_entropy_quantile={top_quantile!r} is outside (0, 1]")
    m = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    vals = entropy.detach().to(torch.float32)[m]
    if vals.numel() == 0:
        return torch.tensor(float("inf"), device=entropy.device)
    k = max(1, math.ceil(top_quantile * vals.numel() * (1 - 1e-12)))
    return torch.topk(vals, k).values[-1]



def clipped_surrogate(
    ctx: LossContext, cfg: LossConfig, advantages: Tensor | None = None
) -> tuple[Tensor, dict[str, Any]]:
    """Per-token PPO/GRPO clipped surrogate with clip-higher and dual clip (docs/theory.md §3), the matrix the
    built-in losses start from; call it from a loss's core (:func:`register_policy_loss`) rather than writing the
    clip again.

    ℓ = max(−Â ρ, −Â clip(ρ, 1 − ε_low, 1 + ε_high)); for Â < 0 additionally ℓ = min(ℓ, −Â c), with
    ε_low = ``clip_ratio_low``, ε_high = ``clip_ratio_high`` (clip-higher when ε_high > ε_low), c = ``clip_ratio_c``
    (dual clip) and ρ = exp(clamp(log π − log π_old, ±20)) (``ctx.ratio``).

    Args:
        ctx: the core's :class:`LossContext`.
        cfg: the :class:`LossConfig` (clip settings).
        advantages: Â to use instead of ``ctx.adv`` (e.g. reshaped advantages), float ``[B, 1]`` or ``[B, T]``,
            detached here; None → ``ctx.adv``.

    Returns:
        ``(loss, metrics)``: ``[B, T]`` float32 with the graph of ``ctx.logprobs``, and the 0-dim tensors
        :data:`SURROGATE_METRICS` — the fractions of valid tokens clipped above (Â > 0, ρ > 1 + ε_high), below
        (Â < 0, ρ < 1 − ε_low) and by the dual clip (Â < 0, ρ > c).

    Raises:
        DataError: ``advantages`` of another shape.
    """
    adv, ratio = ctx.adv, ctx.ratio
    if advantages is not None:
        if not isinstance(advantages, Tensor) or advantages.shape not in (adv.shape, ratio.shape):
            raise DataError(f"clipped_surrogate: advantages must be a tensor of shape {tuple(adv.shape)} or "
                            f"{tuple(ratio.shape)}, got {tuple(getattr(advantages, 'shape', ()))}")
        adv = advantages.detach().float()
    neg_adv = -adv
    loss1 = neg_adv * ratio
    loss2 = neg_adv * ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    # dual clip for Â < 0 only: min(ℓ, −Â c); the bound is +inf for Â ≥ 0 (computed on [B, 1] when Â is [B])
    bound = torch.where(adv < 0, neg_adv * cfg.clip_ratio_c, torch.full((), math.inf, device=adv.device))
    loss = torch.minimum(clipped, bound)
    with torch.no_grad():
        r = ratio.detach()
        neg = adv < 0
        pos = adv > 0
        metrics = {
            "loss/clipfrac_high": masked_mean(pos & (r > 1.0 + cfg.clip_ratio_high), ctx.mask),
            "loss/clipfrac_low": masked_mean(neg & (r < 1.0 - cfg.clip_ratio_low), ctx.mask),
            "loss/clipfrac_dual": masked_mean(neg & (r > cfg.clip_ratio_c), ctx.mask),
        }
    return loss, metrics



# ------------------------------------------------------------------------------------------------------------
# the losses
# ------------------------------------------------------------------------------------------------------------


@register_policy_loss("grpo", metrics=SURROGATE_METRICS)
def grpo_loss(ctx: LossContext, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """GRPO / PPO clipped surrogate (docs/theory.md §3; DAPO clip-higher, dual clip for Â < 0)."""
    return clipped_surrogate(ctx, cfg)


def _stare_gate(inputs: PolicyLossInputs, cfg: LossConfig) -> bool:
    """The gate this call applies: the step's decision passed in ``inputs.gate_on`` (made once per step by the
    STAREController in :func:`stare_lab.loss.step.prepare_step`), with the config's forced modes re-applied (the
    controller applies the same ones, so the two never disagree); None (a direct call without a decision) → on."""
    gate = cfg.stare.gate
    if gate == "never":
        return False
    if gate == "always":
        return True
    return True if inputs.gate_on is None else bool(inputs.gate_on)


def _stare_needs(cfg: LossConfig) -> LossNeeds:
    """The gate and W/M always; ω from the step only for scope ``global`` (scope ``microbatch`` selects per call)."""
    return LossNeeds(stare=True, token_weights=cfg.stare.scope == "global")


@register_policy_loss("stare", needs=_stare_needs, metrics=SURROGATE_METRICS + STARE_METRICS)
def stare_loss(ctx: LossContext, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """STARE: the GRPO surrogate times the token weights ω (docs/theory.md §4, step 5; ω is not renormalised).

    Gate (see :class:`PolicyLossInputs`): off ⇒ no multiplication at all, so the loss is bit-identical to
    ``grpo``. On ⇒ ω = ``inputs.token_weights`` when given (scope ``global``: computed once per step over the
    whole batch); otherwise ω is computed in this call from the surprisal of ``old_logprobs`` over this call's
    tokens (scope ``microbatch``: the reference behaviour; scope ``global`` without precomputed weights: this call
    is taken to be the whole batch).
    """
    inputs = ctx.inputs
    loss, metrics = clipped_surrogate(ctx, cfg)
    gate_on = _stare_gate(inputs, cfg)
    w = cfg.stare.reweight_w if inputs.reweight_w is None else float(inputs.reweight_w)
    m = cfg.stare.reweight_m if inputs.reweight_m is None else float(inputs.reweight_m)
    metrics.update({"stare/gate_on": float(gate_on), "stare/w": w, "stare/m": m})
    if not gate_on:
        metrics.update({"stare/frac_pos_selected": 0.0, "stare/frac_neg_selected": 0.0})
        return loss, metrics
    if inputs.token_weights is not None:
        weights = inputs.token_weights.detach().float()
        if inputs.stare_stats is not None:
            for key in ("stare/frac_pos_selected", "stare/frac_neg_selected"):
                metrics[key] = inputs.stare_stats[key]
        else:  # fractions of this call's valid tokens with ω > 1 (L+) and ω < 1 (L−)
            metrics["stare/frac_pos_selected"] = masked_mean(weights > 1.0, ctx.mask)
            metrics["stare/frac_neg_selected"] = masked_mean(weights < 1.0, ctx.mask)
    else:
        weights, stats = stare_token_weights(
            ctx.old_logprobs, ctx.adv if inputs.advantages.dim() == 2 else ctx.adv.squeeze(-1), ctx.mask,
            cfg.stare, gate_on=True, reweight_w=w, reweight_m=m,
        )
        metrics["stare/frac_pos_selected"] = stats["stare/frac_pos_selected"]
        metrics["stare/frac_neg_selected"] = stats["stare/frac_neg_selected"]
    ctx.token_weights = weights  # multiplied in by the aggregation: one pass with the mask, not two
    return loss, metrics


def _covariance(ctx: LossContext) -> Tensor:
    """Per-token Cov_i = (log π_i − mean log π)(Â_i − mean Â) (Cui et al. 2025, docs/theory.md §3), detached; means over
    the valid tokens of the whole step when given in the inputs, else of this call."""
    inputs = ctx.inputs
    lp = ctx.logprobs.detach()
    adv = ctx.adv.expand_as(lp)
    lp_mean = masked_mean(lp, ctx.mask) if inputs.logprob_mean is None else torch.as_tensor(
        inputs.logprob_mean, dtype=torch.float32, device=lp.device)
    adv_mean = masked_mean(adv, ctx.mask) if inputs.advantage_mean is None else torch.as_tensor(
        inputs.advantage_mean, dtype=torch.float32, device=lp.device)
    return (lp - lp_mean) * (adv - adv_mean)


def _count_for_ratio(ratio: float, n_valid: int) -> int:
    """k = max(1, ⌊r·N⌋) for r > 0 and N ≥ 1; 0 for r = 0 (the method is then off: plain GRPO)."""
    if ratio <= 0 or n_valid == 0:
        return 0
    return min(n_valid, max(1, int(ratio * n_valid)))


@register_policy_loss(
    "clip_cov", needs=LossNeeds(global_stats=("logprob_mean", "advantage_mean", "generator")),
    metrics=SURROGATE_METRICS + ("loss/clip_cov_frac",),
)
def clip_cov_loss(ctx: LossContext, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; docs/theory.md §3): the GRPO surrogate with the gradient detached on
    a random subset of k = max(1, ⌊r·N⌋) tokens (N = this call's valid tokens, r = ``clip_cov_ratio``) drawn from
    the valid tokens with ω_lo < Cov_i < ω_hi that the PPO clip does not already clip. The loss value is unchanged;
    only those tokens' gradients are removed. r = 0 ⇒ exactly ``grpo``. Random subset from ``inputs.generator``."""
    loss, metrics = clipped_surrogate(ctx, cfg)
    n_valid = int(ctx.mask.sum().item())
    k = _count_for_ratio(cfg.clip_cov_ratio, n_valid)
    if k == 0:
        metrics["loss/clip_cov_frac"] = 0.0
        return loss, metrics
    with torch.no_grad():
        cov = _covariance(ctx)
        ratio = ctx.ratio.detach()
        # tokens whose clipped term is active (−Â·clip(ρ) > −Â·ρ): Â > 0 with ρ > 1 + ε_high, Â < 0 with ρ < 1 − ε_low
        clipped_by_ppo = ((ctx.adv > 0) & (ratio > 1.0 + cfg.clip_ratio_high)) | (
            (ctx.adv < 0) & (ratio < 1.0 - cfg.clip_ratio_low)
        )
        eligible = ctx.mask & ~clipped_by_ppo & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
        n_eligible = int(eligible.sum().item())
        chosen = torch.zeros_like(eligible)
        take = min(k, n_eligible)
        if take > 0:
            gen = ctx.inputs.generator
            u = torch.rand(eligible.numel(), generator=gen, device=gen.device if gen is not None else None)
            u = torch.where(eligible.view(-1), u.to(eligible.device), torch.full((), 2.0, device=eligible.device))
            chosen.view(-1)[torch.topk(u, take, largest=False).indices] = True
    metrics["loss/clip_cov_frac"] = masked_mean(chosen, ctx.mask)
    return torch.where(chosen, loss.detach(), loss), metrics


@register_policy_loss("kl_cov", needs=LossNeeds(global_stats=("logprob_mean", "advantage_mean")),
                      metrics=SURROGATE_METRICS + ("loss/kl_cov_frac",))
def kl_cov_loss(ctx: LossContext, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """KL-Cov (Cui et al. 2025; docs/theory.md §3): the GRPO surrogate plus β·|log ρ| (β = ``ppo_kl_coef``) on the
    k = max(1, ⌊r·N⌋) valid tokens with the largest Cov_i (r = ``kl_cov_ratio``, N = this call's valid tokens; ties
    by position). Unlike Cui et al.'s code the base surrogate keeps GRPO's clipping, so r = 0 ⇒ exactly ``grpo``."""
    loss, metrics = clipped_surrogate(ctx, cfg)
    n_valid = int(ctx.mask.sum().item())
    k = _count_for_ratio(cfg.kl_cov_ratio, n_valid)
    if k == 0:
        metrics["loss/kl_cov_frac"] = 0.0
        return loss, metrics
    with torch.no_grad():
        cov = _covariance(ctx).masked_fill(~ctx.mask, float("-inf")).view(-1)
        # stable order: sort by -cov, ties by position
        order = torch.sort(-cov, stable=True).indices[:k]
        chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
        chosen[order] = True
        chosen = chosen.view_as(ctx.mask)
    metrics["loss/kl_cov_frac"] = masked_mean(chosen, ctx.mask)
    penalty = cfg.ppo_kl_coef * ctx.log_ratio.abs()
    return torch.where(chosen, loss + penalty, loss), metrics


@register_policy_loss(
    "forking_tokens", needs=LossNeeds(entropy=True, global_stats=("entropy_threshold",)),
    metrics=SURROGATE_METRICS + ("loss/forking_frac",),
)
def forking_tokens_loss(ctx: LossContext, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """80/20 forking tokens ("Beyond the 80/20 rule", arXiv 2506.01939; docs/theory.md §3): the GRPO surrogate kept only
    on tokens whose entropy ≥ the threshold of the top ``top_entropy_quantile`` (``inputs.entropy_threshold`` for a
    global quantile, else this call's, see :func:`forking_entropy_threshold`); other tokens contribute 0. The
    normalisers are unchanged (the denominator still counts every valid token)."""
    inputs = ctx.inputs
    if inputs.entropy is None:
        raise DataError("forking_tokens needs inputs.entropy (per-token entropy, nats)")
    loss, metrics = clipped_surrogate(ctx, cfg)
    ent = inputs.entropy.detach().float()
    if inputs.entropy_threshold is None:
        thr = forking_entropy_threshold(ent, ctx.mask, cfg.top_entropy_quantile)
    else:
        thr = torch.as_tensor(inputs.entropy_threshold, dtype=torch.float32, device=ent.device)
    keep = ent >= thr
    metrics["loss/forking_frac"] = masked_mean(keep, ctx.mask)
    return torch.where(keep, loss, torch.zeros_like(loss)), metrics
