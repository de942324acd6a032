"""STARE inside unmodified verl 0.9: the plugin verl finds through its ``verl.plugins`` entry points
(docs/integrations-verl.md).

verl imports this module in every process that imports verl (driver, task runner, Ray workers): stare_lab declares
it as the ``verl.plugins`` entry point ``stare`` (verl's plugin discovery, ``VERL_USE_EXTERNAL_PLUGINS``, default
``auto``; listing it in ``VERL_USE_EXTERNAL_MODULES`` works too). ``import stare_lab`` never imports it. It provides

* :class:`STAREPolicyLossConfig`: verl's ``PolicyLossConfig`` plus every field of the core's
  :class:`~stare_lab.config.STAREConfig` (derived from its fields: variant, top_p_ratio, reweight_w, … under the
  reference's names), chosen with ``actor_rollout_ref.actor.policy_loss._target_``;
* the policy loss ``stare`` (:func:`compute_policy_loss_stare`, registered with verl's ``@register_policy_loss``):
  verl's arguments mapped onto :class:`~stare_lab.loss.losses.PolicyLossInputs` and the loss from the core's registry,
  ``compute_policy_loss("stare", …)``; ω from the core's :func:`~stare_lab.loss.stare.stare_token_weights` over the
  micro-batch (scope ``microbatch``) or, for scope ``global``, the ω the trainer selected over the whole step;
* :func:`stare_ppo_loss`: the worker loss, verl's own ``ppo_loss`` with the step's gate, W, M and ω in scope
  (:func:`stare_step`); the STARE trainer installs it with ``actor_rollout_wg.set_loss_fn``;
* :class:`STAREStep`: the trainer's once-per-step logic on a :class:`verl.DataProto` — the token-mean entropy H̄, the
  :class:`~stare_lab.loss.stare.STAREController` update, ω and the step's metrics, all from the core's
  :func:`~stare_lab.loss.step.prepare_step`;
and the second entry point ``stare_trainer`` registers the v1 trainer ``stare`` (``trainer.v1.trainer_mode=stare``,
:mod:`stare_lab.integrations.verl_trainer`; it needs verl's v1 stack, TransferQueue and Ray, the loss does not).

Loss (docs/theory.md §4 step 5): verl's clipped surrogate (clip-higher, dual clip for Â < 0) times ω, aggregated
with verl's global normalisers: ``token-mean`` = Σ m·ω·ℓ / (batch_num_tokens / dp_size), as verl's ``agg_loss``
(``token-sum`` is not supported: ConfigError). Gate off: ω is never applied, the loss equals verl's ``vanilla``.
verl's rollout-correction weights w ≥ 0 (``rollout_is_weights``) multiply each token's loss like in ``vanilla``;
they are folded into the advantages (ℓ is positively homogeneous in Â: ℓ(Â)·w = ℓ(Â·w)), while ω is still selected
with the unweighted Â.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import typing
from typing import Any, Iterator

from torch import Tensor
from verl import DataProto
from verl.trainer.ppo.core_algos import register_policy_loss
from verl.utils import tensordict_utils as tu
from verl.workers.config import PolicyLossConfig
from verl.workers.utils.losses import ppo_loss

from stare_lab.config import LossConfig, STAREConfig, from_dict, to_dict
from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss
from stare_lab.loss.stare import STAREController, stare_token_weights
from stare_lab.loss.step import PreparedStep, StepBatch, prepare_step

logger = logging.getLogger(__name__)

__all__ = [
    "STAREPolicyLossConfig",
    "StepContext",
    "stare_step",
    "current_step",
    "loss_config_from_actor",
    "compute_policy_loss_stare",
    "stare_ppo_loss",
    "STAREStep",
    "STARE_KEYS",
    "POLICY_LOSS_KEY",
    "GATE_KEY",
    "W_KEY",
    "M_KEY",
    "WEIGHTS_KEY",
]

#: Where the STARE keys live in verl's config (errors name ``<this>.<key>``).
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
#: Batch keys (``KVBatchMeta.extra_info`` / TransferQueue field) that carry the step's decision to the workers.
GATE_KEY, W_KEY, M_KEY, WEIGHTS_KEY = "stare_gate_on", "stare_reweight_w", "stare_reweight_m", "stare_token_weights"
_QUALNAME = f"{__name__}.STAREPolicyLossConfig"
#: The STARE keys: the fields of the core's STAREConfig (the reference's names, hp-luo/STARE), in its order.
STARE_KEYS = tuple(f.name for f in dataclasses.fields(STAREConfig))


def _stare_fields() -> list[tuple[str, Any, Any]]:
    """``make_dataclass`` fields for every field of the core's :class:`~stare_lab.config.STAREConfig`: same name,
    resolved type and default. Derived, not copied, so a field added to the core reaches verl's config.

    Raises:
        TypeError: a STARE field has no default, or its name is already a field of verl's ``PolicyLossConfig``.
    """
    hints = typing.get_type_hints(STAREConfig)
    taken = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    out = []
    for f in dataclasses.fields(STAREConfig):
        if f.name in taken:
            raise TypeError(f"STAREConfig.{f.name} clashes with verl's PolicyLossConfig.{f.name}")
        if f.default is not dataclasses.MISSING:
            spec = dataclasses.field(default=f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec = dataclasses.field(default_factory=f.default_factory)
        else:
            raise TypeError(f"STAREConfig.{f.name} has no default; verl's config needs one")
        out.append((f.name, hints[f.name], spec))
    return out


def _post_init(self: Any) -> None:
    parent = getattr(PolicyLossConfig, "__post_init__", None)
    if parent is not None:
        parent(self)
    self.stare_config()


def _stare_config(self: Any) -> STAREConfig:
    """The core's :class:`~stare_lab.config.STAREConfig` of these keys (validated)."""
    return from_dict(STAREConfig, {k: getattr(self, k) for k in STARE_KEYS}, prefix=POLICY_LOSS_KEY)


_STARE_POLICY_LOSS_DOC = """verl's ``PolicyLossConfig`` plus every field of the core's
:class:`stare_lab.config.STAREConfig` under the same name and default (derived from its ``dataclasses.fields``;
docs/theory.md §4). Selected with
``actor_rollout_ref.actor.policy_loss._target_=stare_lab.integrations.verl.STAREPolicyLossConfig``; keys that verl's
YAML does not have are added with ``+``, e.g. ``+actor_rollout_ref.actor.policy_loss.variant=C2``.

Raises:
    ConfigError: a bad STARE value (one line naming ``actor_rollout_ref.actor.policy_loss.<key>``).
"""

STAREPolicyLossConfig = dataclasses.make_dataclass(
    "STAREPolicyLossConfig", _stare_fields(), bases=(PolicyLossConfig,),
    namespace={"__module__": __name__, "__doc__": _STARE_POLICY_LOSS_DOC, "__post_init__": _post_init,
               "stare_config": _stare_config})


def loss_config_from_actor(config: Any, loss_agg_mode: str | None = None) -> LossConfig:
    """The core's :class:`~stare_lab.config.LossConfig` of verl's actor config (``ActorConfig`` or its OmegaConf
    node): loss_mode ``stare``; clip_ratio_low/high (each defaulting to ``clip_ratio``), clip_ratio_c (verl's default
    3.0), loss_agg_mode, loss_scale_factor; the STARE settings of ``policy_loss``. Entropy bonus and KL stay with
    verl's ``ppo_loss``.

    Raises:
        ConfigError: ``policy_loss`` is not a :class:`STAREPolicyLossConfig` (the ``_target_`` override is missing),
            or a value the core refuses (the message names verl's key).
    """
    policy_loss = None if config is None else config.get("policy_loss")
    if isinstance(policy_loss, STAREPolicyLossConfig):
        stare = policy_loss.stare_config()
    elif policy_loss is not None and hasattr(policy_loss, "keys") and policy_loss.get("_target_") == _QUALNAME:
        stare = from_dict(STAREConfig, {k: policy_loss[k] for k in STARE_KEYS if k in policy_loss},
                          prefix=POLICY_LOSS_KEY)
    else:
        got = type(policy_loss).__name__ if policy_loss is None or not hasattr(policy_loss, "get") \
            else policy_loss.get("_target_", type(policy_loss).__name__)
        raise ConfigError(f"{POLICY_LOSS_KEY}._target_={got!r}: the loss 'stare' needs {_QUALNAME!r} "
                          f"(the STARE settings)")
    clip = config.get("clip_ratio")
    low, high = config.get("clip_ratio_low"), config.get("clip_ratio_high")
    return from_dict(LossConfig, {
        "loss_mode": "stare",
        "clip_ratio_low": clip if low is None else low,
        "clip_ratio_high": clip if high is None else high,
        "clip_ratio_c": config.get("clip_ratio_c", 3.0),
        "loss_agg_mode": loss_agg_mode if loss_agg_mode is not None else config.get("loss_agg_mode"),
        "loss_scale_factor": config.get("loss_scale_factor"),
        "stare": stare,
    }, prefix="actor_rollout_ref.actor")


# ------------------------------------------------------------------------------------------------------------
# the step's decision, as the policy loss sees it
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepContext:
    """The STARE decision of the current step, for the policy loss (made once per step by :class:`STAREStep`).

    Attributes:
        gate_on: the controller's gate for this step.
        reweight_w, reweight_m: the step's W and M.
        token_weights: ``[b, t]`` ω of this micro-batch's rows (scope ``global``, gate on), or None.
    """

    gate_on: bool
    reweight_w: float
    reweight_m: float
    token_weights: Tensor | None = None


_STEP: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("stare_verl_step", default=None)


@contextlib.contextmanager
def stare_step(context: StepContext | None) -> Iterator[None]:
    """Make ``context`` the step decision seen by :func:`compute_policy_loss_stare` inside the block (None: none)."""
    token = _STEP.set(context)
    try:
        yield
    finally:
        _STEP.reset(token)


def current_step() -> StepContext | None:
    """The step decision in scope (:func:`stare_step`), or None."""
    return _STEP.get()


def _step_gate(ctx: StepContext | None, stare: STAREConfig) -> tuple[bool, float, float]:
    """(gate_on, W, M) for this call: the step's, or — without the STARE trainer — the config's, which is only
    defined for a forced gate and a fixed W/M."""
    if ctx is not None:
        return bool(ctx.gate_on), float(ctx.reweight_w), float(ctx.reweight_m)
    if stare.gate == "entropy" or stare.adaptive:
        key = "gate" if stare.gate == "entropy" else "adaptive"
        raise ConfigError(f"{POLICY_LOSS_KEY}.{key}={getattr(stare, key)!r} needs the STARE trainer "
                          "(trainer.v1.trainer_mode=stare): the gate and W/M are decided once per step from the "
                          "batch entropy; without it use gate=always or gate=never and adaptive=False")
    return stare.gate == "always", float(stare.reweight_w), float(stare.reweight_m)


# ------------------------------------------------------------------------------------------------------------
# the policy loss and the worker loss
# ------------------------------------------------------------------------------------------------------------


def _normaliser(info: dict, key: str) -> float | None:
    """verl's global count divided by dp_size: verl's ``agg_loss`` multiplies by dp_size what it divides by the
    count, the core divides by the count alone."""
    value = info.get(key)
    if value is None:
        if int(info.get("dp_size", 1) or 1) > 1:
            raise DataError(f"config.global_batch_info[{key!r}] is required when dp_size > 1")
        return None
    return float(value) / float(info.get("dp_size", 1) or 1)


@register_policy_loss("stare")  # type: ignore[arg-type]
def compute_policy_loss_stare(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """verl's policy loss ``stare``: the core's ``stare`` loss on verl's arguments (docs/theory.md §4 step 5).

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[b, t]`` as verl passes them (log-probs in nats).
        loss_agg_mode: verl's aggregation mode (``token-sum`` is refused).
        config: verl's ``ActorConfig`` with a :class:`STAREPolicyLossConfig` as ``policy_loss``; its
            ``global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor) gives the
            normalisers.
        rollout_is_weights: ``[b, t]`` verl's rollout-correction weights (≥ 0), or None.

    Returns:
        ``(loss, metrics)``: the 0-dim loss and verl-style metrics (``actor/pg_clipfrac``, ``actor/ppo_kl``,
        ``actor/pg_clipfrac_lower``) plus the core's (``actor/loss/…``, ``actor/stare/…``).

    Raises:
        ConfigError: settings (see :func:`loss_config_from_actor`; a gate or W/M that needs the trainer).
        DataError: bad tensors (the core's checks), ω of the wrong shape, negative rollout weights.
    """
    cfg = loss_config_from_actor(config, loss_agg_mode)
    ctx = current_step()
    gate_on, w, m = _step_gate(ctx, cfg.stare)
    if cfg.stare.gate != "entropy":  # a forced gate wins, as in the core's loss
        gate_on = cfg.stare.gate == "always"
    weights, stats = None, None
    if gate_on and cfg.stare.scope == "global":
        weights = None if ctx is None else ctx.token_weights
        if weights is None:
            raise ConfigError(f"{POLICY_LOSS_KEY}.scope='global' needs the STARE trainer "
                              "(trainer.v1.trainer_mode=stare), which selects ω over the whole step; without it "
                              "use scope=microbatch")
        if weights.shape != log_prob.shape:
            raise DataError(f"the step's STARE token weights have shape {tuple(weights.shape)}, the micro-batch's "
                            f"log-probs {tuple(log_prob.shape)}")
        weights = weights.to(log_prob.device)
    elif gate_on:  # scope microbatch: the reference's selection, over this call's tokens
        weights, stats = stare_token_weights(old_log_prob, advantages, response_mask, cfg.stare, gate_on=True,
                                             reweight_w=w, reweight_m=m)
    adv = advantages
    if rollout_is_weights is not None:
        is_w = rollout_is_weights.detach()
        if bool((is_w < 0).any()):
            raise DataError("rollout_is_weights has a negative entry (importance weights must be >= 0)")
        adv = advantages * is_w
    info = dict(getattr(config, "global_batch_info", None) or {})
    if info.get("loss_scale_factor") is not None:
        cfg = dataclasses.replace(cfg, loss_scale_factor=info["loss_scale_factor"])
    inputs = PolicyLossInputs(
        logprobs=log_prob, old_logprobs=old_log_prob, advantages=adv, response_mask=response_mask,
        token_weights=weights, global_num_tokens=_normaliser(info, "batch_num_tokens"),
        global_num_sequences=_normaliser(info, "global_batch_size"), gate_on=gate_on, reweight_w=w, reweight_m=m,
        stare_stats=stats,
    )
    loss, core = compute_policy_loss("stare", inputs, cfg)
    metrics = {
        "actor/pg_clipfrac": core["loss/clipfrac_high"] + core["loss/clipfrac_low"],
        "actor/ppo_kl": core["loss/approx_kl"],
        "actor/pg_clipfrac_lower": core["loss/clipfrac_dual"],
    }
    metrics.update({f"actor/{k}": v for k, v in core.items() if k.startswith("stare/")})
    return loss, metrics


def _context_from_data(data: Any) -> StepContext | None:
    """The step decision the STARE trainer attached to a micro-batch (``extra_info`` keys and the ω field)."""
    gate = tu.get_non_tensor_data(data=data, key=GATE_KEY, default=None)
    if gate is None:
        return None
    weights = None
    if WEIGHTS_KEY in data.keys():
        weights = data[WEIGHTS_KEY]
        if weights.is_nested:  # padded like ppo_loss pads response_mask (to this micro-batch's longest response)
            weights = weights.to_padded_tensor(1.0)
    w = tu.get_non_tensor_data(data=data, key=W_KEY, default=None)
    m = tu.get_non_tensor_data(data=data, key=M_KEY, default=None)
    if w is None or m is None:
        raise DataError(f"the batch has {GATE_KEY} but not {W_KEY} and {M_KEY}")
    return StepContext(bool(gate), float(w), float(m), weights)


def stare_ppo_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> tuple[Tensor, dict]:
    """The actor's loss on the workers: verl's ``ppo_loss`` (which dispatches to ``stare`` through verl's policy-loss
    registry, adds the entropy bonus and the KL loss) with the step decision the trainer attached to ``data`` in
    scope. Install it as ``actor_rollout_wg.set_loss_fn(functools.partial(stare_ppo_loss, config=actor_config))``.
    """
    with stare_step(_context_from_data(data)):
        return ppo_loss(config, model_output, data, dp_group)


# ------------------------------------------------------------------------------------------------------------
# the trainer's once-per-step logic
# ------------------------------------------------------------------------------------------------------------


class STAREStep:
    """The STARE trainer's step logic on a padded :class:`verl.DataProto` (docs/theory.md §4 steps 2–4), kept apart
    from Ray and TransferQueue.

    :meth:`prepare` runs the core's :func:`~stare_lab.loss.step.prepare_step` once per step over the whole batch: H̄ (the
    token-mean of ``entropy`` over ``response_mask``: verl's ``actor/entropy`` under ``token-mean``), the
    controller's update, and, for scope ``global`` with the gate on, ω (surprisal from ``old_log_probs``).

    Args:
        loss_config: the core's config (:func:`loss_config_from_actor`).
    """

    FIELDS = ("response_mask", "old_log_probs", "advantages", "entropy")

    def __init__(self, loss_config: LossConfig) -> None:
        self.loss_config = loss_config
        self.controller = STAREController(loss_config.stare)

    def prepare(self, data: DataProto, step: int) -> PreparedStep:
        """The step's decision over ``data.batch`` (``[B, T]`` fields :attr:`FIELDS`).

        Raises:
            DataError: a field missing or malformed (the message names it).
        """
        b = data.batch
        missing = [k for k in self.FIELDS if b is None or k not in b.keys()]
        if missing:
            raise DataError(f"the STARE step needs batch fields {list(self.FIELDS)}; missing: {missing}")
        batch = StepBatch(response_mask=b["response_mask"], advantages=b["advantages"].float(),
                          old_logprobs=b["old_log_probs"].float(), entropy=b["entropy"].float())
        return prepare_step(batch, self.loss_config, controller=self.controller, step=step)

    @staticmethod
    def extra_info(prepared: PreparedStep) -> dict[str, Any]:
        """The gate and W/M for the workers (``KVBatchMeta.extra_info``; read by :func:`stare_ppo_loss`)."""
        return {GATE_KEY: bool(prepared.gate_on), W_KEY: float(prepared.reweight_w),
                M_KEY: float(prepared.reweight_m)}

    @staticmethod
    def verl_metrics(prepared: PreparedStep) -> dict[str, float]:
        """The step's STARE metrics for verl's logger, all under ``stare/``: entropy (H̄), gate_on, w, m, token and
        sequence counts, ``num_{pos,neg}_selected`` (|L±|), ``num_{pos,neg}_candidates`` (|T±|) and
        ``frac_{pos,neg}_selected``."""
        rename = {"entropy": "stare/entropy", "gate_on": "stare/gate_on", "stare_w": "stare/w", "stare_m": "stare/m",
                  "num_tokens": "stare/num_tokens", "num_sequences": "stare/num_sequences"}
        out = {}
        for key, value in prepared.metrics().items():
            if value is not None:
                out[rename.get(key, key)] = float(value)
        return out

    @staticmethod
    def row(prepared: PreparedStep, step: int, reward: float | None, extra: dict[str, Any] | None = None) -> dict:
        """The run-directory row of the step (docs/design.md §4 keys; verl measures no one-step entropy change and
        makes no first-order prediction, so those two are null)."""
        row = {"step": int(step), "reward": reward, "pred_entropy_change": None, "entropy_change": None}
        row.update(prepared.metrics())
        row.update(extra or {})
        return row

    def run_config(self, verl_config: dict[str, Any], seed: Any) -> dict[str, Any]:
        """``config.yaml`` of the run directory: source ``verl``, the method (``o1``/``c2``, ``grpo`` with the gate
        forced off), the seed, the core's loss config and verl's resolved config."""
        stare = self.loss_config.stare
        method = "grpo" if stare.gate == "never" else stare.variant.lower()
        return {"source": "verl", "method": method, "seed": seed, "loss": to_dict(self.loss_config),
                "verl": verl_config}

    def state_dict(self) -> dict[str, Any]:
        """The controller's resumable state."""
        return {"controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (DataError on a malformed state)."""
        if not isinstance(state, dict) or "controller" not in state:
            raise DataError("STARE trainer state: expected a mapping with key 'controller'")
        self.controller.load_state_dict(state["controller"])
