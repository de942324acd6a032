"""The policy-loss registry: the inputs object, registration (with each loss's declared needs), validation and the
wrapper every registered loss shares (docs/design.md §1). The losses themselves live in :mod:`stare_lab.loss.losses`, which
re-exports the public names of this module; import :mod:`stare_lab.loss.losses` (it registers the built-in losses).

A registered loss computes the per-token policy loss matrix ℓ ``[B, T]`` (plus its own metrics); the registry
wraps it with what every loss shares, in this order:

1. validation of the inputs (shapes, dtypes, finite values — :class:`~stare_lab.errors.DataError`);
2. ℓ itself (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``, ``forking_tokens``, or any loss registered later);
3. truncated importance sampling (``tis_cap``): ℓ ← ℓ · min(exp(old − rollout), C), detached (per token, or per
   sequence with ``tis_level="sequence"``; ``tis_mode="mask"`` zeroes out-of-range ratios instead of capping);
   then a caller's own importance weights (``inputs.importance_weights``, e.g. TRL's vLLM correction): ℓ ← ℓ · w;
4. aggregation (:func:`~stare_lab.loss.aggregation.aggregate_loss`) with the global normalisers of the inputs;
5. add-ons: L ← L − β·agg(entropy) (``entropy_coeff``) + λ·agg(KL to the reference) (``kl_coef``), aggregated
   with the same mode and normalisers;
6. metrics: floats under ``loss/…`` and ``stare/…`` converted with a single host transfer.

Each registration declares what the loss reads beyond the always-present tensors (:class:`LossNeeds`: entropy,
the STARE gate and ω, global statistics of the whole step) and the names of the metrics it returns, each possibly as
a function of the :class:`LossConfig`; :func:`loss_needs` adds what the shared add-ons need (entropy for
``entropy_coeff > 0``, …) and :func:`loss_metric_names` the add-ons' metrics. The step preparation
(:func:`stare_lab.loss.step.prepare_step`) and the trainer read these declarations, so a new loss is one registration plus
its config; :func:`unregister_policy_loss` removes one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from stare_lab.loss.aggregation import _safe_div, aggregate_loss, masked_mean
from stare_lab.config import LossConfig, from_dict
from stare_lab.errors import ConfigError, DataError, LossError, StareLabError

__all__ = ["PolicyLossInputs", "LossContext", "LossNeeds", "register_policy_loss", "unregister_policy_loss",
           "get_policy_loss", "available_policy_losses", "compute_policy_loss", "loss_needs", "loss_metric_names",
           "kl_penalty", "LOG_RATIO_CLAMP", "BUILTIN_LOSSES"]

#: |log ρ| is clamped to this before exponentiating (as in verl), so ρ stays finite.
LOG_RATIO_CLAMP = 20.0


@dataclasses.dataclass
class PolicyLossInputs:
    """Everything a policy loss may read (docs/design.md §1). Tensors are ``[B, T]`` unless noted.

    Attributes:
        logprobs: log π_θ of the sampled tokens (nats), float, requires grad.
        old_logprobs: log π_old (the policy that the advantages refer to); detached by the losses.
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]``.
        response_mask: bool or 0/1; False/0 marks padding. Padding entries of every tensor (except
            ``token_weights``) must still be finite.
        entropy: per-token entropy (nats) of π_θ; needed by ``entropy_coeff > 0`` and ``forking_tokens``.
        rollout_logprobs: log-probs from the inference engine (for ``tis_cap``).
        token_weights: precomputed STARE weights ω (scope ``global``: computed once per step over the whole
            batch by :func:`stare_lab.loss.stare.stare_token_weights`), used by ``stare`` when the gate is on. Only its
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
        stare_stats: the ``stats`` that :func:`~stare_lab.loss.stare.stare_token_weights` returned with
            ``token_weights``; when given, ``stare`` reports their selection fractions (of the batch the weights
            were selected over) instead of recounting them from the weights.
        global_stats: every global statistic of the step by name (:data:`stare_lab.loss.step.GLOBAL_STATS`), as
            :func:`stare_lab.loss.step.prepare_step` computed them for the loss's declared ``LossNeeds.global_stats``;
            the way a loss registered outside the package reads a statistic that has no field of its own.
        importance_weights: ``[B, T]`` or ``[B, 1]`` (one per sequence) detached weights the per-token loss ℓ is
            multiplied by before aggregation: an importance correction the caller computed itself (e.g. TRL's
            truncated or masked vLLM ratio), applied after ``tis_cap``'s. Every entry must be finite.
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
    global_stats: Mapping[str, Any] | None = None
    importance_weights: Tensor | None = None


@dataclasses.dataclass(frozen=True)
class LossNeeds:
    """What a loss reads beyond ``logprobs``, ``old_logprobs``, ``advantages`` and ``response_mask``.

    Declared at registration (:func:`register_policy_loss`), as a constant or as a function of the
    :class:`LossConfig`; :func:`stare_lab.loss.step.prepare_step` reads it to decide what to compute once per step.

    Attributes:
        entropy: reads ``inputs.entropy`` (per-token entropy, nats); the old policy's entropies (detached) suffice.
        entropy_grad: differentiates through ``inputs.entropy``: the caller passes the current policy's entropy,
            with its graph, to :meth:`stare_lab.loss.step.PreparedStep.inputs` (implies ``entropy``).
        stare: uses the STARE gate and W/M of the step (decided once per step by the controller).
        token_weights: reads precomputed STARE weights ω (scope ``global``: selected once over the whole step).
        rollout_logprobs: reads ``inputs.rollout_logprobs``.
        ref_logprobs: reads ``inputs.ref_logprobs``.
        global_stats: names of statistics of the whole step (:data:`stare_lab.loss.step.GLOBAL_STATS`, e.g.
            ``logprob_mean``, ``entropy_threshold``, ``generator``) the loss reads.
    """

    entropy: bool = False
    entropy_grad: bool = False
    stare: bool = False
    token_weights: bool = False
    rollout_logprobs: bool = False
    ref_logprobs: bool = False
    global_stats: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.global_stats, str) or not all(isinstance(n, str) for n in self.global_stats):
            raise ConfigError(f"LossNeeds.global_stats={self.global_stats!r} must be a tuple of statistic names")
        object.__setattr__(self, "global_stats", tuple(dict.fromkeys(self.global_stats)))
        if self.entropy_grad and not self.entropy:
            object.__setattr__(self, "entropy", True)

    def union(self, other: "LossNeeds") -> "LossNeeds":
        """Both sets of needs: flags or-ed, statistics in order of first mention."""
        flags = {f.name: getattr(self, f.name) or getattr(other, f.name)
                 for f in dataclasses.fields(self) if f.name != "global_stats"}
        return LossNeeds(**flags, global_stats=self.global_stats + other.global_stats)


# A core computes the per-token loss matrix [B, T] and its own metrics (0-dim tensors or floats).
CoreLoss = Callable[["LossContext", LossConfig], "tuple[Tensor, dict[str, Any]]"]
PolicyLoss = Callable[[PolicyLossInputs, "LossConfig | Mapping[str, Any]"], "tuple[Tensor, dict[str, float]]"]

_REGISTRY: dict[str, PolicyLoss] = {}
_NEEDS: dict[str, Any] = {}
_METRICS: dict[str, Any] = {}
#: the losses this package registers (:mod:`stare_lab.loss.losses`); they cannot be unregistered
BUILTIN_LOSSES = ("grpo", "stare", "clip_cov", "kl_cov", "forking_tokens")


def register_policy_loss(
    name: str,
    needs: LossNeeds | Callable[[LossConfig], LossNeeds] | None = None,
    metrics: Sequence[str] | Callable[[LossConfig], Sequence[str]] = (),
) -> Callable[[CoreLoss], PolicyLoss]:
    """Decorator: register a loss under ``name``, with what it needs and the metrics it returns.

    The decorated function ``core(ctx, config) -> (loss_mat, metrics)`` receives a :class:`LossContext` (the
    validated inputs ``ctx.inputs`` plus float32 views ``ctx.logprobs``, ``ctx.old_logprobs``, ``ctx.adv``
    (``[B, 1]`` or ``[B, T]``), ``ctx.mask`` (bool), ``ctx.log_ratio``, ``ctx.ratio``) and returns the per-token loss
    ``[B, T]`` and a dict of metrics (0-dim tensors or floats) whose names it declared in ``metrics``; a core may
    also set ``ctx.token_weights`` (``[B, T]``, no gradient) to have them multiplied in on valid tokens by the
    aggregation (STARE's ω). :func:`stare_lab.loss.losses.clipped_surrogate` is the PPO/GRPO clipped surrogate a core
    usually starts from. The registered (and returned) function is the full loss ``(inputs, config) -> (loss,
    metrics)``: validation, TIS, aggregation, entropy bonus, KL and metric conversion are added around the core, the
    same way for every loss.

    Args:
        name: the registry name (``LossConfig.loss_mode``).
        needs: what the loss reads beyond the four required tensors (:class:`LossNeeds`), or a function
            ``config -> LossNeeds`` when it depends on the settings (e.g. ω only for scope ``global``);
            ``None`` → nothing. What the shared add-ons need is added by :func:`loss_needs`.
        metrics: the names of the metrics the core returns (e.g. ``stare_lab.loss.losses.SURROGATE_METRICS`` plus its
            own), or a function ``config -> names``. Callers learn a step's metric keys from them
            (:func:`loss_metric_names`) before any call; a core that returns an undeclared name is an error.

    Raises:
        ConfigError: if ``name`` is already registered or not a non-empty string, ``needs`` is neither a LossNeeds
            nor callable, or ``metrics`` is neither a sequence of names nor callable.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"policy loss name {name!r} must be a non-empty string")
    if needs is not None and not isinstance(needs, LossNeeds) and not callable(needs):
        raise ConfigError(f"needs for policy loss {name!r} must be a LossNeeds or a function of the LossConfig, "
                          f"got {type(needs).__name__}")
    if not callable(metrics):
        metrics = _metric_tuple(name, metrics)

    def decorator(core: CoreLoss) -> PolicyLoss:
        if name in _REGISTRY:
            raise ConfigError(f"policy loss {name!r} is already registered (unregister_policy_loss removes it)")

        def loss_fn(inputs: PolicyLossInputs, config: LossConfig | Mapping[str, Any] | None = None):
            return _run(name, core, inputs, _as_config(config))

        loss_fn.__name__ = getattr(core, "__name__", name)
        loss_fn.__doc__ = core.__doc__
        loss_fn.core = core  # type: ignore[attr-defined]
        _REGISTRY[name] = loss_fn
        _NEEDS[name] = needs
        _METRICS[name] = metrics
        return loss_fn

    return decorator


def unregister_policy_loss(name: str) -> None:
    """Remove the loss ``name`` registered outside the package (e.g. to register a new version of it). A method that
    selects it (``stare_lab.loss.methods``) stays defined and fails with the unknown loss name when used: unregister it
    too (``stare_lab.loss.methods.unregister_method``).

    Raises:
        ConfigError: ``name`` is not registered, or is a built-in loss (:data:`BUILTIN_LOSSES`).
    """
    get_policy_loss(name)
    if name in BUILTIN_LOSSES:
        raise ConfigError(f"policy loss {name!r} is built in and cannot be unregistered")
    del _REGISTRY[name], _NEEDS[name], _METRICS[name]


def _metric_tuple(name: str, names: Any) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, (Sequence, set, frozenset)) or not all(
            isinstance(n, str) and n for n in names):
        raise ConfigError(f"metrics of policy loss {name!r} must be a sequence of non-empty metric names (or a "
                          f"function of the LossConfig returning one), got {names!r}")
    return tuple(dict.fromkeys(names))


def loss_metric_names(
    name: str, config: LossConfig | Mapping[str, Any] | None = None, *, entropy: bool = False
) -> tuple[str, ...]:
    """Every metric name the registered loss ``name`` returns under ``config``: ``loss/pg_loss``, the core's
    declared names, the add-ons' (``loss/tis_weight_mean`` and for ``tis_mode="mask"`` ``loss/tis_masked_frac``
    with ``tis_cap``, ``loss/entropy_term`` with ``entropy_coeff > 0``, ``loss/kl`` with ``kl_coef > 0``), the
    ratio statistics ``loss/ratio_mean``, ``loss/ratio_max``, ``loss/approx_kl``, ``loss/entropy`` when the inputs
    carry per-token entropy (``entropy``), and ``loss/total`` — the keys of the metrics dict of every call.

    Raises:
        ConfigError: unknown loss name, bad config, or a ``metrics`` function that returns something else.
    """
    get_policy_loss(name)
    cfg = _as_config(config)
    out = ["loss/pg_loss", *_declared_metrics(name, cfg)]
    if cfg.tis_cap is not None:
        out += ["loss/tis_weight_mean"] + (["loss/tis_masked_frac"] if cfg.tis_mode == "mask" else [])
    if cfg.entropy_coeff > 0:
        out.append("loss/entropy_term")
    if cfg.kl_coef > 0:
        out.append("loss/kl")
    out += ["loss/ratio_mean", "loss/ratio_max", "loss/approx_kl"]
    if entropy or cfg.entropy_coeff > 0:
        out.append("loss/entropy")
    out.append("loss/total")
    return tuple(dict.fromkeys(out))


def _declared_metrics(name: str, cfg: LossConfig) -> tuple[str, ...]:
    declared = _METRICS[name]
    return _metric_tuple(name, declared(cfg)) if callable(declared) else declared


def loss_needs(name: str, config: LossConfig | Mapping[str, Any] | None = None) -> LossNeeds:
    """Everything the registered loss ``name`` reads under ``config``: its declared :class:`LossNeeds` plus those
    of the add-ons every loss shares — ``entropy_coeff > 0`` → the current policy's entropy with its graph
    (``entropy_grad``), ``kl_coef > 0`` → ``ref_logprobs``, ``tis_cap`` set → ``rollout_logprobs``.

    Raises:
        ConfigError: unknown loss name, bad config, or a ``needs`` function that returns something else.
    """
    get_policy_loss(name)
    cfg = _as_config(config)
    declared = _NEEDS[name]
    own = declared(cfg) if callable(declared) else (declared or LossNeeds())
    if not isinstance(own, LossNeeds):
        raise ConfigError(f"the needs function of policy loss {name!r} returned {type(own).__name__}, "
                          "expected a LossNeeds")
    shared = LossNeeds(entropy_grad=cfg.entropy_coeff > 0, ref_logprobs=cfg.kl_coef > 0,
                       rollout_logprobs=cfg.tis_cap is not None)
    return own.union(shared)


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
        name: registry name (``grpo``, ``stare``, ``clip_cov``, ``kl_cov``, ``forking_tokens``, or one registered
            later).
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


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimator of KL(π_θ ‖ π_ref) for tokens sampled from π_θ (docs/theory.md §3; Schulman's k1/k2/k3).

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


# ----------------------------------------------------------------------------------- validation and the shared wrapper


def _as_config(config: LossConfig | Mapping[str, Any] | None) -> LossConfig:
    if config is None:
        return LossConfig()
    if isinstance(config, LossConfig):
        return config
    if isinstance(config, Mapping):
        return from_dict(LossConfig, config, prefix="loss")
    raise ConfigError(f"config must be a LossConfig or a mapping, got {type(config).__name__}")


@dataclasses.dataclass
class LossContext:
    """What a registered loss's core receives (:func:`register_policy_loss`): the validated inputs and the float32
    views every loss shares. Tensors are ``[B, T]`` unless noted.

    Attributes:
        inputs: the :class:`PolicyLossInputs` of the call (entropy, global statistics, W/M, … as given).
        logprobs: log π_θ (nats), float32, with its graph.
        old_logprobs: log π_old, float32, detached.
        adv: advantages, float32, detached: ``[B, 1]`` (one per sequence) or ``[B, T]``.
        mask: the response mask as bool.
        log_ratio: log ρ = log π_θ − log π_old, clamped to ±:data:`LOG_RATIO_CLAMP` (with its graph).
        ratio: ρ = exp(log_ratio).
        finite_checks: (field, 0-dim sum) pairs the wrapper checks for finiteness in one host transfer (internal).
        token_weights: per-token weights (``[B, T]``, no gradient) a core may set for the aggregation to multiply
            into its loss matrix on valid tokens (STARE's ω); None = 1.
    """

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


def _prepare(inputs: PolicyLossInputs) -> LossContext:
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
    iw = inputs.importance_weights
    if iw is not None and (not isinstance(iw, Tensor) or iw.shape not in ((shape[0], 1), shape)
                           or not iw.is_floating_point()):
        raise DataError(
            f"importance_weights must be a float tensor of shape [B, 1]={(shape[0], 1)} or [B, T]={tuple(shape)}, "
            f"got {getattr(iw, 'dtype', type(iw).__name__)} of shape {tuple(getattr(iw, 'shape', ()))}"
        )
    lp32 = lp.float()
    old = inputs.old_logprobs.detach().float()
    adv = adv.detach().float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    log_ratio = (lp32 - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    checks = [("logprobs", lp.detach().sum()), ("old_logprobs", old.sum()), ("advantages", adv.sum())]
    for name in (*_BT_FIELDS[1:], "importance_weights"):
        value = getattr(inputs, name)
        if value is not None and name != "token_weights":  # ω is checked through the loss value (see _run)
            checks.append((name, value.detach().sum()))
    return LossContext(inputs, lp32, old, adv, mask, log_ratio, ratio, checks)


def _raise_non_finite(ctx: LossContext, sums: list[float], loss_name: str) -> None:
    """Called when a finiteness sum is not finite: pinpoint the field (the sum of finite values may overflow)."""
    for (name, _), total in zip(ctx.finite_checks, sums):
        if math.isfinite(total):
            continue
        if name in ("global_num_tokens", "global_num_sequences"):
            value = getattr(ctx.inputs, name)
            raise DataError(f"{name}={value.detach().reshape(()).item()} must be a finite number >= 0")
        if name == "pg_loss":  # every input above is finite: ω on a valid token, or an overflow
            weights = ctx.token_weights
            bad = None if weights is None else ctx.mask & ~torch.isfinite(weights)
            if bad is not None and bad.any():
                idx = bad.nonzero()[0].tolist()
                raise DataError(
                    f"token_weights{idx} = {weights[tuple(idx)].item()} on a valid token is not finite"
                )
            if loss_name not in BUILTIN_LOSSES:
                raise DataError(f"policy loss {loss_name!r} returned a non-finite value ({total}) although every "
                                "input is finite: the loss function is the likely source")
            raise DataError(f"the policy loss is {total} although every input is finite: advantages or token "
                            "weights too large (float32 overflow)")
        value = getattr(ctx.inputs, name).detach()
        bad = ~torch.isfinite(value)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            raise DataError(
                f"{name}{idx} = {value[tuple(idx)].item()} is not finite (all entries, padding included, must be "
                "finite)"
            )


def _tis_weights(ctx: LossContext, rollout_logprobs: Tensor, cfg: LossConfig) -> Tensor:
    """Importance weights of the rollout correction (detached), ``[B, T]`` float32.

    ``log ρ = old − rollout`` per token (clamped to ±:data:`LOG_RATIO_CLAMP`); with ``tis_level="sequence"`` one
    ratio per sequence, ``log ρ = Σ_t log ρ_t`` over its valid tokens (clamped again), shared by its tokens.
    ``tis_mode="truncate"``: w = min(ρ, C) (truncated IS, Yao et al. 2025); ``"mask"``: w = ρ where
    1/C ≤ ρ ≤ C and 0 elsewhere (masked IS: out-of-range tokens or sequences leave the loss numerator; the
    normalisers stay the step's global counts). C = ``tis_cap``.
    """
    log_rho = (ctx.old_logprobs - rollout_logprobs.detach().float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if cfg.tis_level == "sequence":
        log_rho = torch.where(ctx.mask, log_rho, torch.zeros_like(log_rho)).sum(-1, keepdim=True)
        log_rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho)
    if cfg.tis_mode == "mask":
        keep = (rho <= cfg.tis_cap) & (rho >= 1.0 / cfg.tis_cap)
        rho = torch.where(keep, rho, torch.zeros_like(rho))
    else:
        rho = rho.clamp_max(cfg.tis_cap)
    return rho.expand_as(ctx.old_logprobs)


def _run(name: str, core: CoreLoss, inputs: PolicyLossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, float]]:
    ctx = _prepare(inputs)
    try:
        pg_mat, core_metrics = core(ctx, cfg)
    except StareLabError:
        raise
    except Exception as err:  # a plugin's bug is one line naming it; a built-in loss's keeps its traceback
        if name in BUILTIN_LOSSES:
            raise
        raise LossError(f"policy loss {name!r} raised {type(err).__name__}: {err}") from err
    if not isinstance(pg_mat, Tensor) or pg_mat.shape != ctx.mask.shape or not isinstance(core_metrics, Mapping):
        raise DataError(f"policy loss {name!r} must return (a [B, T]={tuple(ctx.mask.shape)} loss tensor, a dict of "
                        f"metrics), got ({type(pg_mat).__name__} of shape {tuple(getattr(pg_mat, 'shape', ()))}, "
                        f"{type(core_metrics).__name__})")
    declared = _declared_metrics(name, cfg)
    undeclared = [k for k in core_metrics if k not in declared]
    if undeclared:
        raise ConfigError(f"policy loss {name!r} returned metric {undeclared[0]!r} it did not declare (declared: "
                          f"{', '.join(declared) or 'none'}); add it to register_policy_loss({name!r}, metrics=...)")
    core_metrics = dict(core_metrics)
    if cfg.tis_cap is not None:
        if inputs.rollout_logprobs is None:
            raise DataError("tis_cap is set but rollout_logprobs is missing")
        tis = _tis_weights(ctx, inputs.rollout_logprobs, cfg)
        pg_mat = pg_mat * tis
        core_metrics["loss/tis_weight_mean"] = masked_mean(tis, ctx.mask)
        if cfg.tis_mode == "mask":
            core_metrics["loss/tis_masked_frac"] = masked_mean(tis == 0, ctx.mask)
    if inputs.importance_weights is not None:
        pg_mat = pg_mat * inputs.importance_weights.detach().to(pg_mat.dtype)
    agg = dict(
        mask=ctx.mask,
        mode=cfg.loss_agg_mode,
        global_num_tokens=inputs.global_num_tokens,
        global_num_sequences=inputs.global_num_sequences,
        loss_scale_factor=cfg.loss_scale_factor,
    )
    pg_loss = aggregate_loss(pg_mat, **agg, token_weights=ctx.token_weights)
    for key in ("global_num_tokens", "global_num_sequences"):  # a tensor must be finite and >= 0 (checked below)
        value = getattr(inputs, key)
        if isinstance(value, Tensor) and value.numel() == 1:
            v = value.detach().reshape(()).to(device=pg_loss.device, dtype=torch.float32)
            ctx.finite_checks.append((key, torch.where(v >= 0, v, torch.full_like(v, math.nan))))
    ctx.finite_checks.append(("pg_loss", pg_loss.detach()))
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
        kl_term = aggregate_loss(kl_penalty(ctx.logprobs, inputs.ref_logprobs.float(), cfg.kl_estimator), **agg)
        loss = loss + cfg.kl_coef * kl_term
        metrics["loss/kl"] = kl_term.detach()
    with torch.no_grad():
        # products with the 0/1 mask are safe here: every input was checked finite and ρ is clamped
        maskf = ctx.mask.to(torch.float32)
        n_valid = maskf.sum()
        masked_ratio = ctx.ratio.detach() * maskf
        metrics["loss/ratio_mean"] = _safe_div(masked_ratio.sum(), n_valid)
        metrics["loss/ratio_max"] = masked_ratio.amax() if masked_ratio.numel() else n_valid
        metrics["loss/approx_kl"] = _safe_div(-(ctx.log_ratio.detach() * maskf).sum(), n_valid)
        if inputs.entropy is not None:
            metrics["loss/entropy"] = _safe_div((inputs.entropy.detach().float() * maskf).sum(), n_valid)
    metrics.update(core_metrics)
    metrics["loss/total"] = loss.detach()
    return loss, _to_floats(ctx, metrics, name)


def _to_floats(ctx: LossContext, metrics: dict[str, Any], loss_name: str) -> dict[str, float]:
    """One host transfer for every tensor metric and the finiteness sums; raise DataError on non-finite inputs."""
    tensor_keys = [k for k, v in metrics.items() if isinstance(v, Tensor)]
    n_checks = len(ctx.finite_checks)
    stacked = torch.stack(
        [t.detach().reshape(()).to(torch.float64) for _, t in ctx.finite_checks]
        + [metrics[k].detach().reshape(()).to(torch.float64) for k in tensor_keys]
    ).tolist()
    if not all(math.isfinite(x) for x in stacked[:n_checks]):
        _raise_non_finite(ctx, stacked[:n_checks], loss_name)
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, Tensor)}
    out.update(zip(tensor_keys, stacked[n_checks:]))
    return out


