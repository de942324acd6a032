"""The policy-loss registry: pure functions of one inputs object and a :class:`LossConfig` (design.md §1).

A registered loss computes the per-token policy loss matrix ℓ ``[B, T]`` (plus its own metrics); the registry
wraps it with what every loss shares, in this order:

1. validation of the inputs (shapes, dtypes, finite values — :class:`~stare_lab.errors.DataError`);
2. ℓ itself (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``, ``forking_tokens``);
3. truncated importance sampling (``tis_cap``): ℓ ← ℓ · min(exp(old − rollout), C), detached (per token, or per
   sequence with ``tis_level="sequence"``; ``tis_mode="mask"`` zeroes out-of-range ratios instead of capping);
4. aggregation (:func:`aggregate_loss`) with the global normalisers of the inputs;
5. add-ons: L ← L − β·agg(entropy) (``entropy_coeff``) + λ·agg(KL to the reference) (``kl_coef``), aggregated
   with the same mode and normalisers;
6. metrics: floats under ``loss/…`` and ``stare/…`` converted with a single host transfer.

With global normalisers (counts over the whole optimizer step), the sum of the losses of the micro-batches equals
the loss of the whole batch, and so do the gradients (science.md §3).

Method names used by simulators/trainer map onto the registry as: ``grpo`` → ``grpo``; ``grpo-ds`` → ``grpo``
(+ dynamic sampling upstream); ``o1`` / ``c2`` / ``o1-adaptive`` → ``stare``; ``entropy_bonus`` → ``grpo`` with
``entropy_coeff > 0``; ``clip_cov``, ``kl_cov``, ``forking_tokens`` → themselves.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from .config import LossConfig, from_dict
from .errors import ConfigError, DataError
from .aggregation import _safe_div, aggregate_loss, masked_mean  # noqa: F401 - aggregate_loss, masked_mean re-exported
from .stare import stare_token_weights

__all__ = [
    "PolicyLossInputs",
    "register_policy_loss",
    "get_policy_loss",
    "available_policy_losses",
    "compute_policy_loss",
    "aggregate_loss",
    "masked_mean",
    "kl_penalty",
    "forking_entropy_threshold",
]

#: |log ρ| is clamped to this before exponentiating (as in verl), so ρ stays finite.
LOG_RATIO_CLAMP = 20.0


@dataclasses.dataclass
class PolicyLossInputs:
    """Everything a policy loss may read (design.md §1). Tensors are ``[B, T]`` unless noted.

    Attributes:
        logprobs: log π_θ of the sampled tokens (nats), float, requires grad.
        old_logprobs: log π_old (the policy that the advantages refer to); detached by the losses.
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]``.
        response_mask: bool or 0/1; False/0 marks padding. Padding entries of every tensor (except
            ``token_weights``) must still be finite.
        entropy: per-token entropy (nats) of π_θ; needed by ``entropy_coeff > 0`` and ``forking_tokens``.
        rollout_logprobs: log-probs from the inference engine (for ``tis_cap``).
        token_weights: precomputed STARE weights ω (scope ``global``: computed once per step over the whole
            batch by :func:`stare_lab.stare.stare_token_weights`), used by ``stare`` when the gate is on. Only its
            valid entries are read (they must be finite); it is multiplied in by the aggregation.
        ref_logprobs: log π_ref of the reference policy (for ``kl_coef > 0``).
        global_num_tokens: valid tokens in the whole optimizer step (all micro-batches and ranks); default: this
            call's count. int, float or 0-dim tensor.
        global_num_sequences: sequences with ≥ 1 valid token in the whole step; default: this call's count.
        gate_on: the STARE gate decision for this step (``STAREController.gate_on``); ``None`` → on. Config
            ``stare.gate="never"`` forces it off and ``"always"`` on, whatever is passed here.
        reweight_w: W for this step (controller's current value); ``None`` → ``config.stare.reweight_w``.
        reweight_m: M for this step; ``None`` → ``config.stare.reweight_m``.
        logprob_mean: mean log π over the valid tokens of the whole step, for Clip-Cov / KL-Cov's covariance;
            default: this call's mean (of the detached current log-probs).
        advantage_mean: mean Â over the valid tokens of the whole step (same use); default: this call's.
        entropy_threshold: the forking-token entropy threshold of the whole step
            (:func:`forking_entropy_threshold`); default: computed over this call.
        generator: ``torch.Generator`` for Clip-Cov's random subset (determinism); default: torch's global RNG.
        stare_stats: the ``stats`` that :func:`~stare_lab.stare.stare_token_weights` returned with
            ``token_weights``; when given, ``stare`` reports their selection fractions (of the batch the weights
            were selected over) instead of recounting them from the weights.
    """

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    response_mask: Tensor
    entropy: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    token_weights: Tensor | None = None
    ref_logprobs: Tensor | None = None
    global_num_tokens: int | float | Tensor | None = None
    global_num_sequences: int | float | Tensor | None = None
    gate_on: bool | None = None
    reweight_w: float | None = None
    reweight_m: float | None = None
    logprob_mean: float | Tensor | None = None
    advantage_mean: float | Tensor | None = None
    entropy_threshold: float | Tensor | None = None
    generator: torch.Generator | None = None
    stare_stats: Mapping[str, Any] | None = None


# A core computes the per-token loss matrix [B, T] and its own metrics (0-dim tensors or floats).
CoreLoss = Callable[["_Prepared", LossConfig], "tuple[Tensor, dict[str, Any]]"]
PolicyLoss = Callable[[PolicyLossInputs, "LossConfig | Mapping[str, Any]"], "tuple[Tensor, dict[str, float]]"]

_REGISTRY: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[CoreLoss], PolicyLoss]:
    """Decorator: register a loss under ``name``.

    The decorated function ``core(prep, config) -> (loss_mat, metrics)`` receives the validated inputs
    (``prep.inputs`` plus float32 views ``prep.logprobs``, ``prep.old_logprobs``, ``prep.adv`` (``[B, 1]`` or
    ``[B, T]``), ``prep.mask`` (bool), ``prep.log_ratio``, ``prep.ratio``) and returns the per-token loss
    ``[B, T]`` and a dict of metrics (0-dim tensors or floats); a core may also set ``prep.token_weights``
    (``[B, T]``, no gradient) to have them multiplied in on valid tokens by the aggregation (STARE's ω). The registered (and returned) function is the full
    loss ``(inputs, config) -> (loss, metrics)``: validation, TIS, aggregation, entropy bonus, KL and metric
    conversion are added around the core, the same way for every loss.

    Raises:
        ConfigError: if ``name`` is already registered.
    """

    def decorator(core: CoreLoss) -> PolicyLoss:
        if name in _REGISTRY:
            raise ConfigError(f"policy loss {name!r} is already registered")

        def loss_fn(inputs: PolicyLossInputs, config: LossConfig | Mapping[str, Any] | None = None):
            return _run(core, inputs, _as_config(config))

        loss_fn.__name__ = getattr(core, "__name__", name)
        loss_fn.__doc__ = core.__doc__
        loss_fn.core = core  # type: ignore[attr-defined]
        _REGISTRY[name] = loss_fn
        return loss_fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered loss ``(inputs, config) -> (loss, metrics)`` called ``name``.

    Raises:
        ConfigError: for an unknown name (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        raise ConfigError(f"loss_mode={name!r} is not one of {{{', '.join(repr(n) for n in sorted(_REGISTRY))}}}")
    return _REGISTRY[name]


def available_policy_losses() -> list[str]:
    """Sorted names of the registered losses."""
    return sorted(_REGISTRY)


def compute_policy_loss(
    name: str, inputs: PolicyLossInputs, config: LossConfig | Mapping[str, Any] | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Compute the registered loss ``name`` on ``inputs``.

    Args:
        name: registry name (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``, ``forking_tokens``).
        inputs: :class:`PolicyLossInputs`.
        config: :class:`LossConfig`, or a plain dict with the same keys (validated), or ``None`` for defaults.

    Returns:
        ``(loss, metrics)``: a 0-dim float32 tensor (differentiable w.r.t. ``inputs.logprobs``) and floats.

    Raises:
        ConfigError: unknown loss name or bad config.
        DataError: malformed inputs (wrong shapes/dtypes, non-finite values, missing optional input a setting
            needs, e.g. ``entropy`` for ``entropy_coeff > 0``).
    """
    return get_policy_loss(name)(inputs, config)


# ------------------------------------------------------------------------------------------------------------
# aggregation
# ------------------------------------------------------------------------------------------------------------


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimator of KL(π_θ ‖ π_ref) for tokens sampled from π_θ (science.md §3; Schulman's k1/k2/k3).

    With d = log π_θ − log π_ref: k1 = d; k2 = ½ d²; k3 = exp(−d) − (−d) − 1 = exp(−d) + d − 1 ≥ 0. For k3, d is
    clamped to ±20 before exponentiating so the value stays finite.

    Args:
        logprobs, ref_logprobs: ``[B, T]`` (nats); gradients flow through ``logprobs`` only.
        estimator: ``k1``, ``k2`` or ``k3``.

    Returns:
        ``[B, T]`` per-token penalty (nats).

    Raises:
        ConfigError: unknown estimator.
    """
    d = logprobs - ref_logprobs.detach()
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.exp(-d) + d - 1.0
    raise ConfigError(f"kl_estimator={estimator!r} is not one of {{'k1', 'k2', 'k3'}}")


def forking_entropy_threshold(entropy: Tensor, response_mask: Tensor, top_quantile: float) -> Tensor:
    """Entropy threshold of the 80/20 forking-token rule ("Beyond the 80/20 rule", arXiv 2506.01939; science.md §3).

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


# ------------------------------------------------------------------------------------------------------------
# validation and the shared wrapper
# ------------------------------------------------------------------------------------------------------------


def _as_config(config: LossConfig | Mapping[str, Any] | None) -> LossConfig:
    if config is None:
        return LossConfig()
    if isinstance(config, LossConfig):
        return config
    if isinstance(config, Mapping):
        return from_dict(LossConfig, config, prefix="loss")
    raise ConfigError(f"config must be a LossConfig or a mapping, got {type(config).__name__}")


@dataclasses.dataclass
class _Prepared:
    """Validated inputs shared by every core: float32 views and the PPO ratio."""

    inputs: PolicyLossInputs
    logprobs: Tensor
    old_logprobs: Tensor
    adv: Tensor  # [B, 1] or [B, T], float32, detached
    mask: Tensor  # bool [B, T]
    log_ratio: Tensor
    ratio: Tensor
    finite_checks: list[tuple[str, Tensor]]
    # per-token weights a core asks the aggregation to multiply into its loss matrix on valid tokens (STARE's ω)
    token_weights: Tensor | None = None


_BT_FIELDS = ("old_logprobs", "entropy", "rollout_logprobs", "token_weights", "ref_logprobs")


def _prepare(inputs: PolicyLossInputs) -> _Prepared:
    if not isinstance(inputs, PolicyLossInputs):
        raise DataError(f"inputs must be a PolicyLossInputs, got {type(inputs).__name__}")
    lp = inputs.logprobs
    if not isinstance(lp, Tensor) or lp.dim() != 2 or not lp.is_floating_point():
        raise DataError(
            f"logprobs must be a float [B, T] tensor, got {getattr(lp, 'dtype', type(lp).__name__)} "
            f"of shape {tuple(getattr(lp, 'shape', ()))}"
        )
    shape = lp.shape
    mask = inputs.response_mask
    if not isinstance(mask, Tensor) or mask.shape != shape:
        raise DataError(f"response_mask has shape {tuple(getattr(mask, 'shape', ()))}, expected {tuple(shape)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
            mask = mask != 0
        else:
            raise DataError(f"response_mask must be bool or 0/1, got dtype {mask.dtype}")
    for name in _BT_FIELDS:
        value = getattr(inputs, name)
        if value is None:
            if name == "old_logprobs":
                raise DataError("old_logprobs is required")
            continue
        if not isinstance(value, Tensor) or value.shape != shape or not value.is_floating_point():
            raise DataError(
                f"{name} must be a float tensor of shape {tuple(shape)}, got "
                f"{getattr(value, 'dtype', type(value).__name__)} of shape {tuple(getattr(value, 'shape', ()))}"
            )
    adv = inputs.advantages
    if not isinstance(adv, Tensor) or adv.shape not in (shape[:1], shape) or not adv.is_floating_point():
        raise DataError(
            f"advantages must be a float tensor of shape [B]={tuple(shape[:1])} or [B, T]={tuple(shape)}, "
            f"got {getattr(adv, 'dtype', type(adv).__name__)} of shape {tuple(getattr(adv, 'shape', ()))}"
        )
    lp32 = lp.float()
    old = inputs.old_logprobs.detach().float()
    adv = adv.detach().float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    log_ratio = (lp32 - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    checks = [("logprobs", lp.detach().sum()), ("old_logprobs", old.sum()), ("advantages", adv.sum())]
    for name in _BT_FIELDS[1:]:
        value = getattr(inputs, name)
        if value is not None and name != "token_weights":  # ω is checked through the loss value (see _run)
            checks.append((name, value.detach().sum()))
    return _Prepared(inputs, lp32, old, adv, mask, log_ratio, ratio, checks)


def _raise_non_finite(prep: _Prepared, sums: list[float]) -> None:
    """Called when a finiteness sum is not finite: pinpoint the field (the sum of finite values may overflow)."""
    for (name, _), total in zip(prep.finite_checks, sums):
        if math.isfinite(total):
            continue
        if name in ("global_num_tokens", "global_num_sequences"):
            value = getattr(prep.inputs, name)
            raise DataError(f"{name}={value.detach().reshape(()).item()} must be a finite number >= 0")
        if name == "pg_loss":  # every input above is finite: ω on a valid token, or an overflow
            weights = prep.token_weights
            bad = None if weights is None else prep.mask & ~torch.isfinite(weights)
            if bad is not None and bad.any():
                idx = bad.nonzero()[0].tolist()
                raise DataError(
                    f"token_weights{idx} = {weights[tuple(idx)].item()} on a valid token is not finite"
                )
            raise DataError(
                f"the policy loss is {total} although every input is finite: advantages or token weights too large "
                "(float32 overflow)"
            )
        value = getattr(prep.inputs, name).detach()
        bad = ~torch.isfinite(value)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            raise DataError(
                f"{name}{idx} = {value[tuple(idx)].item()} is not finite (all entries, padding included, must be "
                "finite)"
            )


def _grpo_matrix(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """Per-token PPO/GRPO clipped surrogate with clip-higher and dual clip (science.md §3).

    ℓ = max(−Â ρ, −Â clip(ρ, 1 − ε_low, 1 + ε_high)); for Â < 0 additionally ℓ = min(ℓ, −Â c), c = clip_ratio_c.
    ρ = exp(clamp(log π − log π_old, ±20)).
    """
    adv, ratio = prep.adv, prep.ratio
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
            "loss/clipfrac_high": masked_mean(pos & (r > 1.0 + cfg.clip_ratio_high), prep.mask),
            "loss/clipfrac_low": masked_mean(neg & (r < 1.0 - cfg.clip_ratio_low), prep.mask),
            "loss/clipfrac_dual": masked_mean(neg & (r > cfg.clip_ratio_c), prep.mask),
        }
    return loss, metrics


def _tis_weights(prep: _Prepared, rollout_logprobs: Tensor, cfg: LossConfig) -> Tensor:
    """Importance weights of the rollout correction (detached), ``[B, T]`` or ``[B, 1]`` float32.

    ``log ρ = old − rollout`` per token (clamped to ±:data:`LOG_RATIO_CLAMP`); with ``tis_level="sequence"`` one
    ratio per sequence, ``log ρ = Σ_t log ρ_t`` over its valid tokens (clamped again), shared by its tokens.
    ``tis_mode="truncate"``: w = min(ρ, C) (truncated IS, Yao et al. 2025); ``"mask"``: w = ρ where
    1/C ≤ ρ ≤ C and 0 elsewhere (masked IS: out-of-range tokens or sequences leave the loss numerator; the
    normalisers stay the step's global counts). C = ``tis_cap``.
    """
    log_rho = (prep.old_logprobs - rollout_logprobs.detach().float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if cfg.tis_level == "sequence":
        log_rho = torch.where(prep.mask, log_rho, torch.zeros_like(log_rho)).sum(-1, keepdim=True)
        log_rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho)
    if cfg.tis_mode == "mask":
        keep = (rho <= cfg.tis_cap) & (rho >= 1.0 / cfg.tis_cap)
        rho = torch.where(keep, rho, torch.zeros_like(rho))
    else:
        rho = rho.clamp_max(cfg.tis_cap)
    return rho.expand_as(prep.old_logprobs)


def _run(core: CoreLoss, inputs: PolicyLossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, float]]:
    prep = _prepare(inputs)
    pg_mat, core_metrics = core(prep, cfg)
    if cfg.tis_cap is not None:
        if inputs.rollout_logprobs is None:
            raise DataError("tis_cap is set but rollout_logprobs is missing")
        tis = _tis_weights(prep, inputs.rollout_logprobs, cfg)
        pg_mat = pg_mat * tis
        core_metrics["loss/tis_weight_mean"] = masked_mean(tis, prep.mask)
        if cfg.tis_mode == "mask":
            core_metrics["loss/tis_masked_frac"] = masked_mean(tis == 0, prep.mask)
    agg = dict(
        mask=prep.mask,
        mode=cfg.loss_agg_mode,
        global_num_tokens=inputs.global_num_tokens,
        global_num_sequences=inputs.global_num_sequences,
        loss_scale_factor=cfg.loss_scale_factor,
    )
    pg_loss = aggregate_loss(pg_mat, **agg, token_weights=prep.token_weights)
    for name in ("global_num_tokens", "global_num_sequences"):  # a tensor must be finite and >= 0 (checked below)
        value = getattr(inputs, name)
        if isinstance(value, Tensor) and value.numel() == 1:
            v = value.detach().reshape(()).to(device=pg_loss.device, dtype=torch.float32)
            prep.finite_checks.append((name, torch.where(v >= 0, v, torch.full_like(v, math.nan))))
    prep.finite_checks.append(("pg_loss", pg_loss.detach()))
    loss = pg_loss
    metrics: dict[str, Any] = {"loss/pg_loss": pg_loss.detach()}
    if cfg.entropy_coeff > 0:
        if inputs.entropy is None:
            raise DataError(f"entropy_coeff={cfg.entropy_coeff} needs inputs.entropy")
        ent_term = aggregate_loss(inputs.entropy.float(), **agg)
        loss = loss - cfg.entropy_coeff * ent_term
        metrics["loss/entropy_term"] = ent_term.detach()
    if cfg.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise DataError(f"kl_coef={cfg.kl_coef} needs inputs.ref_logprobs")
        kl_term = aggregate_loss(kl_penalty(prep.logprobs, inputs.ref_logprobs.float(), cfg.kl_estimator), **agg)
        loss = loss + cfg.kl_coef * kl_term
        metrics["loss/kl"] = kl_term.detach()
    with torch.no_grad():
        # products with the 0/1 mask are safe here: every input was checked finite and ρ is clamped
        maskf = prep.mask.to(torch.float32)
        n_valid = maskf.sum()
        masked_ratio = prep.ratio.detach() * maskf
        metrics["loss/ratio_mean"] = _safe_div(masked_ratio.sum(), n_valid)
        metrics["loss/ratio_max"] = masked_ratio.amax() if masked_ratio.numel() else n_valid
        metrics["loss/approx_kl"] = _safe_div(-(prep.log_ratio.detach() * maskf).sum(), n_valid)
        if inputs.entropy is not None:
            metrics["loss/entropy"] = _safe_div((inputs.entropy.detach().float() * maskf).sum(), n_valid)
    metrics.update(core_metrics)
    metrics["loss/total"] = loss.detach()
    floats = _to_floats(prep, metrics)
    return loss, floats


def _to_floats(prep: _Prepared, metrics: dict[str, Any]) -> dict[str, float]:
    """One host transfer for every tensor metric and the finiteness sums; raise DataError on non-finite inputs."""
    tensor_keys = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    n_checks = len(prep.finite_checks)
    stacked = torch.stack(
        [t.detach().reshape(()).to(torch.float64) for _, t in prep.finite_checks]
        + [metrics[k].detach().reshape(()).to(torch.float64) for k in tensor_keys]
    ).tolist()
    if not all(math.isfinite(x) for x in stacked[:n_checks]):
        _raise_non_finite(prep, stacked[:n_checks])
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    out.update(zip(tensor_keys, stacked[n_checks:]))
    return out


# ------------------------------------------------------------------------------------------------------------
# the losses
# ------------------------------------------------------------------------------------------------------------


@register_policy_loss("grpo")
def grpo_loss(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """GRPO / PPO clipped surrogate (science.md §3; DAPO clip-higher, dual clip for Â < 0)."""
    return _grpo_matrix(prep, cfg)


def _stare_gate(inputs: PolicyLossInputs, cfg: LossConfig) -> bool:
    gate = cfg.stare.gate
    if gate == "never":
        return False
    if gate == "always":
        return True
    return True if inputs.gate_on is None else bool(inputs.gate_on)


@register_policy_loss("stare")
def stare_loss(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """STARE: the GRPO surrogate times the token weights ω (science.md §4, step 5; ω is not renormalised).

    Gate (see :class:`PolicyLossInputs`): off ⇒ no multiplication at all, so the loss is bit-identical to
    ``grpo``. On ⇒ ω = ``inputs.token_weights`` when given (scope ``global``: computed once per step over the
    whole batch); otherwise ω is computed in this call from the surprisal of ``old_logprobs`` over this call's
    tokens (scope ``microbatch``: the reference behaviour; scope ``global`` without precomputed weights: this call
    is taken to be the whole batch).
    """
    inputs = prep.inputs
    loss, metrics = _grpo_matrix(prep, cfg)
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
            metrics["stare/frac_pos_selected"] = masked_mean(weights > 1.0, prep.mask)
            metrics["stare/frac_neg_selected"] = masked_mean(weights < 1.0, prep.mask)
    else:
        weights, stats = stare_token_weights(
            prep.old_logprobs, prep.adv if inputs.advantages.dim() == 2 else prep.adv.squeeze(-1), prep.mask,
            cfg.stare, gate_on=True, reweight_w=w, reweight_m=m,
        )
        metrics["stare/frac_pos_selected"] = stats["stare/frac_pos_selected"]
        metrics["stare/frac_neg_selected"] = stats["stare/frac_neg_selected"]
    prep.token_weights = weights  # multiplied in by the aggregation: one pass with the mask, not two
    return loss, metrics


def _covariance(prep: _Prepared) -> Tensor:
    """Per-token Cov_i = (log π_i − mean log π)(Â_i − mean Â) (Cui et al. 2025, science.md §3), detached; means over
    the valid tokens of the whole step when given in the inputs, else of this call."""
    inputs = prep.inputs
    lp = prep.logprobs.detach()
    adv = prep.adv.expand_as(lp)
    lp_mean = masked_mean(lp, prep.mask) if inputs.logprob_mean is None else torch.as_tensor(
        inputs.logprob_mean, dtype=torch.float32, device=lp.device)
    adv_mean = masked_mean(adv, prep.mask) if inputs.advantage_mean is None else torch.as_tensor(
        inputs.advantage_mean, dtype=torch.float32, device=lp.device)
    return (lp - lp_mean) * (adv - adv_mean)


def _count_for_ratio(ratio: float, n_valid: int) -> int:
    """k = max(1, ⌊r·N⌋) for r > 0 and N ≥ 1; 0 for r = 0 (the method is then off: plain GRPO)."""
    if ratio <= 0 or n_valid == 0:
        return 0
    return min(n_valid, max(1, int(ratio * n_valid)))


@register_policy_loss("clip_cov")
def clip_cov_loss(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; science.md §3): the GRPO surrogate with the gradient detached on
    a random subset of k = max(1, ⌊r·N⌋) tokens (N = this call's valid tokens, r = ``clip_cov_ratio``) drawn from
    the valid tokens with ω_lo < Cov_i < ω_hi that the PPO clip does not already clip. The loss value is unchanged;
    only those tokens' gradients are removed. r = 0 ⇒ exactly ``grpo``. Random subset from ``inputs.generator``."""
    loss, metrics = _grpo_matrix(prep, cfg)
    n_valid = int(prep.mask.sum().item())
    k = _count_for_ratio(cfg.clip_cov_ratio, n_valid)
    if k == 0:
        metrics["loss/clip_cov_frac"] = 0.0
        return loss, metrics
    with torch.no_grad():
        cov = _covariance(prep)
        ratio = prep.ratio.detach()
        # tokens whose clipped term is active (−Â·clip(ρ) > −Â·ρ): Â > 0 with ρ > 1 + ε_high, Â < 0 with ρ < 1 − ε_low
        clipped_by_ppo = ((prep.adv > 0) & (ratio > 1.0 + cfg.clip_ratio_high)) | (
            (prep.adv < 0) & (ratio < 1.0 - cfg.clip_ratio_low)
        )
        eligible = prep.mask & ~clipped_by_ppo & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
        n_eligible = int(eligible.sum().item())
        chosen = torch.zeros_like(eligible)
        take = min(k, n_eligible)
        if take > 0:
            gen = prep.inputs.generator
            u = torch.rand(eligible.numel(), generator=gen, device=gen.device if gen is not None else None)
            u = torch.where(eligible.view(-1), u.to(eligible.device), torch.full((), 2.0, device=eligible.device))
            chosen.view(-1)[torch.topk(u, take, largest=False).indices] = True
    metrics["loss/clip_cov_frac"] = masked_mean(chosen, prep.mask)
    return torch.where(chosen, loss.detach(), loss), metrics


@register_policy_loss("kl_cov")
def kl_cov_loss(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """KL-Cov (Cui et al. 2025; science.md §3): the GRPO surrogate plus β·|log ρ| (β = ``ppo_kl_coef``) on the
    k = max(1, ⌊r·N⌋) valid tokens with the largest Cov_i (r = ``kl_cov_ratio``, N = this call's valid tokens; ties
    by position). Unlike Cui et al.'s code the base surrogate keeps GRPO's clipping, so r = 0 ⇒ exactly ``grpo``."""
    loss, metrics = _grpo_matrix(prep, cfg)
    n_valid = int(prep.mask.sum().item())
    k = _count_for_ratio(cfg.kl_cov_ratio, n_valid)
    if k == 0:
        metrics["loss/kl_cov_frac"] = 0.0
        return loss, metrics
    with torch.no_grad():
        cov = _covariance(prep).masked_fill(~prep.mask, float("-inf")).view(-1)
        # stable order: sort by -cov, ties by position
        order = torch.sort(-cov, stable=True).indices[:k]
        chosen = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
        chosen[order] = True
        chosen = chosen.view_as(prep.mask)
    metrics["loss/kl_cov_frac"] = masked_mean(chosen, prep.mask)
    penalty = cfg.ppo_kl_coef * prep.log_ratio.abs()
    return torch.where(chosen, loss + penalty, loss), metrics


@register_policy_loss("forking_tokens")
def forking_tokens_loss(prep: _Prepared, cfg: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """80/20 forking tokens ("Beyond the 80/20 rule", arXiv 2506.01939; science.md §3): the GRPO surrogate kept only
    on tokens whose entropy ≥ the threshold of the top ``top_entropy_quantile`` (``inputs.entropy_threshold`` for a
    global quantile, else this call's, see :func:`forking_entropy_threshold`); other tokens contribute 0. The
    normalisers are unchanged (the denominator still counts every valid token)."""
    inputs = prep.inputs
    if inputs.entropy is None:
        raise DataError("forking_tokens needs inputs.entropy (per-token entropy, nats)")
    loss, metrics = _grpo_matrix(prep, cfg)
    ent = inputs.entropy.detach().float()
    if inputs.entropy_threshold is None:
        thr = forking_entropy_threshold(ent, prep.mask, cfg.top_entropy_quantile)
    else:
        thr = torch.as_tensor(inputs.entropy_threshold, dtype=torch.float32, device=ent.device)
    keep = ent >= thr
    metrics["loss/forking_frac"] = masked_mean(keep, prep.mask)
    return torch.where(keep, loss, torch.zeros_like(loss)), metrics
