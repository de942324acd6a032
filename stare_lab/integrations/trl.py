"""STARE in TRL, unforked: :class:`STAREGRPOConfig` (TRL's ``GRPOConfig`` plus STARE's fields) and
:class:`STAREGRPOTrainer` (a ``GRPOTrainer`` subclass overriding TRL's loss seam ``_compute_loss``, as TRL's own
GMPO and GSPO-token trainers do). User guide: docs/integrations.md; the method: docs/theory.md §4.

Per optimizer step (every process the same, before the step's first micro-batch loss):

1. Every micro-batch of the step is measured with TRL's own forward (``_get_per_token_logps_and_entropies``):
   per completion token the log-probability (the surprisal source; TRL's old log-probs when it has them), the
   entropy, and from the decoder's hidden states the critical surprisal s* (docs/theory.md §2, for the quadrant
   counts; :func:`stare_lab.theory.first_order.critical_surprisal`). The first micro-batch is measured by its own loss
   forward, the others by a no-grad forward when the step opens; with one micro-batch per step (TRL's default)
   there is no extra forward at all.
2. Right after the first micro-batch's forward, before its loss, the step's micro-batches on this process form one
   :class:`~stare_lab.loss.step.StepBatch`, and :func:`stare_lab.loss.step.prepare_step` decides the gate and W/M from the
   step's token-mean entropy over all processes and, for scope ``global``, selects ω exactly over all processes
   (radix histograms summed with ``accelerator.reduce``: the same ω as one process holding the whole batch,
   concatenated in process order). No one-step lag.
3. Each micro-batch's loss is the core's ``stare`` loss (:func:`stare_lab.loss.losses.compute_policy_loss`) with TRL's
   aggregation of the configured ``loss_type`` (its normalisers and gradient-accumulation scaling); with the gate off
   it is bit-identical to TRL's own loss (CPU; on CUDA ``grpo`` may differ by one rounding, as ``torch.mean``
   multiplies by 1/B there).
4. At the step's last micro-batch, one reduction gives the step's metrics; they go to TRL's logs (``self._metrics``)
   and, from the main process, to a stare_lab run directory (``config.yaml`` + ``metrics.jsonl``, docs/design.md §4).

The controller state is saved as ``stare_controller.json`` in every TRL checkpoint folder and restored with
``resume_from_checkpoint``. Importing this module imports TRL (``pip install -e ".[trl]"`` in a clone).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"stare_lab.integrations.trl needs TRL >= 1.16 ({err}): pip install -e '.[trl]' in a clone of "
                      "stare-lab") from err

from stare_lab.config import LossConfig, STAREConfig, _fmt, check_range, from_dict, to_dict
from stare_lab.loss.entropy import default_chunk_rows
from stare_lab.errors import ConfigError
from stare_lab.theory.first_order import critical_surprisal
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss, kl_penalty
from stare_lab.platform.runs import RunWriter, read_run
from stare_lab.loss.stare import STAREController
from stare_lab.loss.step import PreparedStep, StepBatch, prepare_step
from stare_lab.platform.summary import run_summary, summary_settings

logger = logging.getLogger(__name__)

__all__ = ["STAREGRPOConfig", "STAREGRPOTrainer", "STARE_FIELDS", "SUPPORTED_LOSS_TYPES", "CONTROLLER_FILE",
           "NO_DUAL_CLIP", "critical_surprisals"]

#: The STARE fields of :class:`STAREGRPOConfig` (the reference implementation's names, :class:`STAREConfig`).
STARE_FIELDS = ("variant", "top_p_ratio", "reweight_w", "reweight_m", "target_entropy", "adaptive", "alpha", "w_max",
                "m_min", "scope")
#: TRL ``loss_type`` → the core's aggregation; the normalisers are TRL's (:meth:`STAREGRPOTrainer._normalisers`).
_AGGREGATION = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "token-mean", "dapo": "token-mean"}
SUPPORTED_LOSS_TYPES = tuple(_AGGREGATION)
#: The controller state file written into each checkpoint folder.
CONTROLLER_FILE = "stare_controller.json"
#: The core's dual-clip constant c standing for TRL's "no dual clip": the core clamps |log ρ| at 20, so every
#: per-token loss is at most −Â·e^20 < −Â·c/2 and min(ℓ, −Â·c) is ℓ bit for bit; finite, so config.yaml keeps it.
NO_DUAL_CLIP = 1e9
_QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")
# the per-step sums reduced once at the step's last micro-batch (float64; counts are exact below 2**53)
_SUMS = ("entropy", "tokens", "clip_low", "clip_high", "loss", "kl", "pos_selected", "neg_selected",
         *(f"q_{q}" for q in _QUADRANTS))
_IDX = {name: i for i, name in enumerate(_SUMS)}
_DEFAULT = STAREConfig()


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class STAREGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus STARE's settings under the reference implementation's names (:class:`STAREConfig`,
    docs/theory.md §4). Defaults are the core's.

    Attributes:
        variant: ``"O1"`` (×W on L+) or ``"C2"`` (also ×M on L−); lower case is accepted.
        top_p_ratio: P ∈ [0, 1]; each selected set has k = max(1, ⌈P·|T±|⌉) tokens.
        reweight_w: W ≥ 1; reweight_m: M ∈ (0, 1] (C2).
        target_entropy: H_tgt ≥ 0 (nats): the gate is on while the step's token-mean entropy is below it.
        adaptive, alpha, w_max, m_min: the adaptive W/M schedule (W ± α per step, W ≤ w_max, M ≥ m_min).
        scope: ``"global"`` (selection over the whole optimizer step, all processes) or ``"microbatch"`` (per loss
            call, the reference's behaviour).
        stare_run_dir: where the main process writes the stare_lab run directory; None → ``<output_dir>/stare_run``,
            ``""`` → none.

    Raises:
        ConfigError: a STARE field out of range (``reweight_w=0.5 is outside [1, inf)``), or a TRL setting this
            trainer does not support (``loss_type`` other than grpo/bnpo/dr_grpo/dapo, sequence-level importance
            sampling, ``top_entropy_quantile < 1``, an entropy bonus, ``off_policy_mask_threshold``, ``delta``,
            ``beta > 0`` with ``use_bias_correction_kl``, ``steps_per_generation`` not a multiple of
            ``gradient_accumulation_steps``).
    """

    variant: str = field(default=_DEFAULT.variant,
                         metadata=_help("STARE variant: O1 (xW on L+) or C2 (also xM on L-)."))
    top_p_ratio: float = field(default=_DEFAULT.top_p_ratio, metadata=_help("P: share of T+ (T-) selected as L+ (L-)."))
    reweight_w: float = field(default=_DEFAULT.reweight_w, metadata=_help("W >= 1: token weight on L+."))
    reweight_m: float = field(default=_DEFAULT.reweight_m, metadata=_help("M in (0, 1]: token weight on L- (C2)."))
    target_entropy: float = field(default=_DEFAULT.target_entropy,
                                  metadata=_help("H_tgt (nats): STARE is on while the step's entropy is below it."))
    adaptive: bool = field(default=_DEFAULT.adaptive, metadata=_help("Adapt W/M by +-alpha per step toward H_tgt."))
    alpha: float = field(default=_DEFAULT.alpha, metadata=_help("Step of the adaptive W/M schedule."))
    w_max: float = field(default=_DEFAULT.w_max, metadata=_help("Upper bound of W under the adaptive schedule."))
    m_min: float = field(default=_DEFAULT.m_min, metadata=_help("Lower bound of M under the adaptive schedule."))
    scope: str = field(default=_DEFAULT.scope,
                       metadata=_help("global: select over the whole optimizer step; microbatch: per loss call."))
    stare_run_dir: str | None = field(default=None, metadata=_help(
        "stare_lab run directory (config.yaml + metrics.jsonl); default <output_dir>/stare_run; '' for none."))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.variant = self.stare_config().variant
        _check_trl_settings(self)

    def stare_config(self) -> STAREConfig:
        """The STARE fields as the core's :class:`STAREConfig` (gate ``entropy``). Raises ConfigError."""
        return from_dict(STAREConfig, {name: getattr(self, name) for name in STARE_FIELDS}, prefix="")

    def loss_config(self) -> LossConfig:
        """The core's :class:`LossConfig` of this run: the ``stare`` loss with TRL's clip range (ε_low = ``epsilon``,
        ε_high = ``epsilon_high`` or ``epsilon``, no dual clip: :data:`NO_DUAL_CLIP`), the aggregation of
        ``loss_type`` and the k3 KL term with coefficient ``beta``."""
        high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        return LossConfig(loss_mode="stare", clip_ratio_low=self.epsilon, clip_ratio_high=high,
                          clip_ratio_c=NO_DUAL_CLIP, loss_agg_mode=_AGGREGATION[self.loss_type], kl_coef=self.beta,
                          kl_estimator="k3", stare=self.stare_config())

    def run_dir(self) -> str | None:
        """The run directory the trainer writes (None when ``stare_run_dir=""``)."""
        if self.stare_run_dir == "":
            return None
        return self.stare_run_dir or os.path.join(self.output_dir, "stare_run")


def _check_trl_settings(args: STAREGRPOConfig) -> None:
    """One-line ConfigError for a TRL setting the STARE loss does not implement (see :class:`STAREGRPOConfig`)."""
    if args.loss_type not in _AGGREGATION:
        raise ConfigError(f"loss_type={args.loss_type!r} is not one of {{{', '.join(map(repr, _AGGREGATION))}}} "
                          "(the TRL loss types STAREGRPOTrainer supports)")
    if args.importance_sampling_level != "token":
        raise ConfigError(f"importance_sampling_level={args.importance_sampling_level!r} is not supported with STARE "
                          "(allowed: 'token')")
    unsupported = {"top_entropy_quantile": (args.top_entropy_quantile, 1.0), "entropy_coef": (args.entropy_coef, 0.0),
                   "use_adaptive_entropy": (args.use_adaptive_entropy, False),
                   "off_policy_mask_threshold": (args.off_policy_mask_threshold, None), "delta": (args.delta, None)}
    for key, (value, allowed) in unsupported.items():
        if value != allowed:
            raise ConfigError(f"{key}={_fmt(value)} is not supported with STARE (allowed: {_fmt(allowed)})")
    if args.beta != 0.0 and args.use_bias_correction_kl:
        raise ConfigError(f"use_bias_correction_kl=True with beta={_fmt(args.beta)} is not supported with STARE (the "
                          "core's KL term is the plain k3 estimator): set use_bias_correction_kl=False")
    check_range("epsilon", args.epsilon, 0, 1)
    if args.epsilon_high is not None:
        check_range("epsilon_high", args.epsilon_high, 0, None)
    if args.steps_per_generation % args.gradient_accumulation_steps:
        raise ConfigError(f"steps_per_generation={args.steps_per_generation} must be a multiple of "
                          f"gradient_accumulation_steps={args.gradient_accumulation_steps} with STARE (a step's tokens "
                          "must all be generated before its first micro-batch)")
    if args.stare_run_dir is not None and not isinstance(args.stare_run_dir, str):
        raise ConfigError(f"stare_run_dir={args.stare_run_dir!r} must be a path, '' or None")


class _AccelerateCollective:
    """The core's :class:`~stare_lab.collective.Collective` over accelerate's processes (``accelerator.reduce``)."""

    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator
        self.rank = int(accelerator.process_index)
        self.world_size = int(accelerator.num_processes)

    def all_reduce(self, tensor: Tensor) -> Tensor:
        return tensor if self.world_size == 1 else self._accelerator.reduce(tensor, reduction="sum")


def _backbone_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The decoder (``base_model``, returns ``last_hidden_state``) and the LM head of a transformers causal LM
    (through a PEFT wrapper). Raises ConfigError for a model whose logits are not ``lm_head(hidden_state)``."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    backbone = getattr(inner, "base_model", inner)
    head = inner.get_output_embeddings() if callable(getattr(inner, "get_output_embeddings", None)) else None
    text = inner.config.get_text_config() if hasattr(inner, "config") else None
    scaled = [k for k in ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                          "logits_scaling") if getattr(text, k, None) not in (None, 1.0)]
    if backbone is inner or head is None or scaled:
        sets = f" (it sets {', '.join(scaled)})" if scaled else ""
        raise ConfigError(f"model {type(inner).__name__}: STAREGRPOTrainer needs a causal LM whose logits are "
                          f"lm_head(base_model(...).last_hidden_state){sets}")
    return backbone, head


@contextlib.contextmanager
def _hidden_states(model: torch.nn.Module) -> Iterator[list[Tensor]]:
    """Collect the decoder's ``last_hidden_state`` (detached) of every forward run inside the block: a forward hook
    on ``base_model``, the module TRL's fused LM head calls."""
    backbone, _ = _backbone_and_head(model)
    store: list[Tensor] = []
    handle = backbone.register_forward_hook(lambda module, args, out: store.append(out.last_hidden_state.detach()))
    try:
        yield store
    finally:
        handle.remove()


def critical_surprisals(head: torch.nn.Module, hidden: Tensor, mask: Tensor, temperature: float,
                        autocast: Callable[[], Any] = contextlib.nullcontext) -> Tensor:
    """s* of every completion position (docs/theory.md §2, :func:`stare_lab.theory.first_order.critical_surprisal`) from the
    decoder's hidden states ``[B, L, H]`` whose last ``T`` positions (``mask`` ``[B, T]``) predict the completion:
    ``[B, T]`` float32, 0 outside ``mask``. The logits ``lm_head(h) / temperature`` are built
    ``default_chunk_rows(V)`` tokens at a time, never as a ``[B, T, V]`` tensor."""
    t = mask.shape[1]
    valid = mask.bool()
    h = hidden[:, -t - 1:-1][valid]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = default_chunk_rows(int(head.weight.shape[0]))
    parts = []
    with torch.no_grad():
        for r in range(0, h.shape[0], rows):
            with autocast():
                logits = head(h[r:r + rows])
            parts.append(critical_surprisal(logits.float(), temperature))
    if parts:
        out[valid] = torch.cat(parts).to(out.device)
    return out


def _loss_mask(inputs: dict[str, Any]) -> Tensor:
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]


def _padded(tensors: list[Tensor], width: int) -> Tensor:
    return torch.cat([F.pad(x, (0, width - x.shape[1])) for x in tensors])


class STAREGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the core's STARE loss, gate and controller (module docstring; docs/theory.md §4).

    Construct it like ``GRPOTrainer`` with a :class:`STAREGRPOConfig`. The controller is
    :attr:`stare_controller` (:class:`~stare_lab.loss.stare.STAREController`); the step being trained is
    :attr:`stare_step` (the core's :class:`~stare_lab.loss.step.PreparedStep`). Text-only causal LMs.

    Raises:
        ConfigError: ``args`` is not a :class:`STAREGRPOConfig`, or the model is not supported
            (its logits must be ``lm_head(base_model(...).last_hidden_state)``: no softcapping or logit scaling).
    """

    _tag_names = ["trl", "grpo", "stare"]

    def __init__(self, model: Any, reward_funcs: Any, args: STAREGRPOConfig | None = None, **kwargs: Any) -> None:
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = STAREGRPOConfig(f"{str(name).split('/')[-1]}-STARE")
        if not isinstance(args, STAREGRPOConfig):
            raise ConfigError(f"args must be a STAREGRPOConfig (GRPOConfig plus the STARE fields), got "
                              f"{type(args).__name__}")
        super().__init__(model, reward_funcs, args=args, **kwargs)
        _backbone_and_head(self.model)
        self.stare_loss_config = args.loss_config()
        self.stare_controller = STAREController(self.stare_loss_config.stare)
        self.stare_step: PreparedStep | None = None
        self._stare_collective = _AccelerateCollective(self.accelerator)
        self._stare_left = 0  # micro-batches of the current optimizer step still to come
        self._stare_pending: list[dict[str, Any]] | None = None  # the step to prepare at its first loss forward
        self._stare_sums: Tensor | None = None
        self._stare_reward: float | None = None
        self._stare_resume_step: int | None = None
        self._stare_writer: RunWriter | None = None

    # -- the step: measurement, preparation -----------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            if "pixel_values" in out:
                raise ConfigError("STAREGRPOTrainer supports text-only models (the batch has pixel_values)")
            rewards = self._metrics["train"].get("reward")
            self._stare_reward = float(rewards[-1]) if rewards else None
        return out

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training:
            if self._stare_left == 0:
                n = int(self.current_gradient_accumulation_steps)
                spg = self.args.steps_per_generation
                self._stare_start_step([self._buffered_inputs[(self._step + i) % spg] for i in range(n)])
                self._stare_left = n
            self._stare_left -= 1
        return inputs

    def _stare_start_step(self, micro: list[dict[str, Any]]) -> None:
        """Open the optimizer step made of ``micro`` (this process's micro-batches, in training order): micro-batches
        2, 3, … are measured now by a no-grad forward; the first is measured by its own loss forward, and the step
        is prepared right after that forward, before its loss (:meth:`_compute_loss`)."""
        for mb in micro[1:]:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logps, entropies, _, hidden = self._stare_forward(self.model, mb, capture=True,
                                                                  batch_size=self.args.per_device_train_batch_size)
            mb.update(self._stare_measure(mb, logps, entropies, hidden))
        self._stare_pending = micro

    def _stare_forward(self, model: torch.nn.Module, inputs: dict[str, Any], *, capture: bool, aux: bool = False,
                       batch_size: int | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """TRL's own forward (``_get_per_token_logps_and_entropies``): log-probs, entropies, with ``aux`` the MoE aux
        loss and with ``capture`` the decoder's hidden states."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with (_hidden_states(self.accelerator.unwrap_model(model)) if capture else contextlib.nullcontext([])) as hs:
            logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1), batch_size=batch_size, compute_entropy=True,
                compute_aux_loss=aux)
        return logps, entropies, aux_loss, (torch.cat(hs) if hs else None)

    def _stare_measure(self, inputs: dict[str, Any], logps: Tensor, entropies: Tensor, hidden: Tensor) -> dict:
        """A micro-batch's surprisal source (TRL's old log-probs when it has them, else the forward's), entropy and
        s* per completion token (``[B, T]``, detached)."""
        old = inputs.get("old_per_token_logps")
        _, head = _backbone_and_head(self.accelerator.unwrap_model(self.model))
        return {"stare_logps": (logps if old is None else old).detach().float(),
                "stare_entropy": entropies.detach().float(),
                "stare_sstar": critical_surprisals(head, hidden, inputs["completion_mask"], self.temperature,
                                                   self.accelerator.autocast)}

    def _stare_begin_step(self, micro: list[dict[str, Any]]) -> PreparedStep:
        """Gate, W/M and (scope ``global``) ω of the optimizer step made of ``micro`` (this process's micro-batches,
        in the order they will be trained), over all processes; ω rows go to ``mb["stare_weights"]``."""
        width = max(mb["completion_ids"].shape[1] for mb in micro)
        mask = _padded([_loss_mask(mb) for mb in micro], width).bool()
        batch = StepBatch(response_mask=mask, advantages=torch.cat([mb["advantages"] for mb in micro]),
                          old_logprobs=_padded([mb["stare_logps"] for mb in micro], width),
                          entropy=_padded([mb["stare_entropy"] for mb in micro], width))
        prep = prepare_step(batch, self.stare_loss_config, controller=self.stare_controller,
                            collective=self._stare_collective, step=self.state.global_step + 1, seed=self.args.seed)
        weights = [None] * len(micro) if prep.token_weights is None else prep.token_weights.split(
            [mb["completion_ids"].shape[0] for mb in micro])
        for mb, w in zip(micro, weights):
            mb["stare_weights"] = None if w is None else w[:, : mb["completion_ids"].shape[1]]
        adv = batch.advantages_bt()
        high = batch.old_logprobs.neg() > _padded([mb["stare_sstar"] for mb in micro], width)
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=mask.device)
        for i, (sign, side) in enumerate((s, h) for s in (adv > 0, adv < 0) for h in (high, ~high)):
            sums[_IDX["q_" + _QUADRANTS[i]]] = (mask & sign & side).sum()
        self._stare_sums, self.stare_step = sums, prep
        return prep

    # -- the loss ----------------------------------------------------------------------------------------------

    def _normalisers(self, inputs: dict[str, Any], mask: Tensor, mode: str) -> tuple[Any, Any, int]:
        """(global_num_tokens, global_num_sequences, divisor) reproducing TRL's aggregation of ``loss_type``."""
        ga = int(self.current_gradient_accumulation_steps) if mode == "train" else 1
        rows = mask.shape[0]
        if self.loss_type == "grpo":
            return None, rows, ga
        if self.loss_type == "bnpo":
            return mask.sum().clamp(min=1.0), None, ga
        if self.loss_type == "dr_grpo":
            return rows * self.max_completion_length, None, ga
        normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes  # dapo
        if mode == "train":
            normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normaliser, None, 1

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> Tensor:
        mode = "train" if self.model.training else "eval"
        mask = _loss_mask(inputs)
        pending = self._stare_pending if mode == "train" else None
        logps, entropies, aux_loss, hidden = self._stare_forward(model, inputs, capture=pending is not None,
                                                                 aux=self.aux_loss_enabled)
        if pending is not None:  # the step's first micro-batch: prepare the whole step before this loss
            self._stare_pending, pending[0] = None, inputs
            inputs.update(self._stare_measure(inputs, logps, entropies, hidden))
            self._stare_begin_step(pending)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        if mode == "train":
            step = self.stare_step
            gate, w, m, weights, stats = step.gate_on, step.reweight_w, step.reweight_m, inputs.get(
                "stare_weights"), step.stare_stats
        else:  # evaluation: the current decision, ω over this batch, no controller update
            c = self.stare_controller
            gate, w, m, weights, stats = c.gate_on, c.reweight_w, c.reweight_m, None, None
        num_tokens, num_sequences, divisor = self._normalisers(inputs, mask, mode)
        use_is = self.use_vllm and self.vllm_importance_sampling_correction
        loss_inputs = PolicyLossInputs(
            logprobs=logps, old_logprobs=old, advantages=inputs["advantages"], response_mask=mask,
            token_weights=weights if gate else None, ref_logprobs=inputs.get("ref_per_token_logps"),
            global_num_tokens=num_tokens, global_num_sequences=num_sequences, gate_on=gate, reweight_w=w,
            reweight_m=m, stare_stats=stats if weights is not None else None,
            importance_weights=inputs.get("importance_sampling_ratio") if use_is else None)
        loss, metrics = compute_policy_loss("stare", loss_inputs, self.stare_loss_config)
        loss = loss / divisor
        if self.aux_loss_enabled:  # the model's MoE load-balancing term, scaled like TRL's
            ga = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / ga
        self._stare_record(mode, loss, metrics, entropies, mask, logps, inputs.get("ref_per_token_logps"))
        return loss

    # -- metrics ---------------------------------------------------------------------------------------------

    def _stare_record(self, mode: str, loss: Tensor, metrics: dict[str, float], entropies: Tensor, mask: Tensor,
                      logps: Tensor, ref: Tensor | None) -> None:
        """Add this micro-batch to the step's sums; at the step's last micro-batch reduce them once and log."""
        m = mask.to(torch.float64)
        n = m.sum()
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=mask.device) if mode == "eval" or (
            self._stare_sums is None) else self._stare_sums
        sums[_IDX["entropy"]] += (entropies.detach().double() * m).sum()
        sums[_IDX["tokens"]] += n
        sums[_IDX["clip_low"]] += metrics["loss/clipfrac_low"] * n
        sums[_IDX["clip_high"]] += metrics["loss/clipfrac_high"] * n
        sums[_IDX["loss"]] += loss.detach().double()
        if ref is not None:
            sums[_IDX["kl"]] += (kl_penalty(logps.detach(), ref, "k3").double() * m).sum()
        sums[_IDX["pos_selected"]] += metrics["stare/frac_pos_selected"] * n
        sums[_IDX["neg_selected"]] += metrics["stare/frac_neg_selected"] * n
        if mode == "train" and self._stare_left > 0:
            self._stare_sums = sums
            return
        total = self._stare_collective.all_reduce(sums).tolist()
        self._stare_sums = None
        tokens = max(total[_IDX["tokens"]], 1.0)
        logged = {"entropy": total[_IDX["entropy"]] / tokens, "clip_ratio/low_mean": total[_IDX["clip_low"]] / tokens,
                  "clip_ratio/high_mean": total[_IDX["clip_high"]] / tokens,
                  "clip_ratio/region_mean": (total[_IDX["clip_low"]] + total[_IDX["clip_high"]]) / tokens}
        if ref is not None:
            logged["kl"] = total[_IDX["kl"]] / tokens
        if mode == "train":
            logged.update(self._stare_step_metrics(total))
        for key, value in logged.items():
            if value is not None:
                self._metrics[mode][key].append(float(value))
        if mode == "train" and self.accelerator.is_main_process:
            self._stare_write_row(total, logged)

    def _stare_step_metrics(self, total: list[float]) -> dict[str, float | None]:
        step = self.stare_step
        row = step.metrics()
        out: dict[str, float | None] = {"stare/gate_on": float(step.gate_on), "stare/w": step.reweight_w,
                                        "stare/m": step.reweight_m, "stare/entropy": step.entropy}
        if self.stare_loss_config.stare.scope == "global":
            for k in ("num_pos_selected", "num_neg_selected", "frac_pos_selected", "frac_neg_selected"):
                out[f"stare/{k}"] = row.get(f"stare/{k}", 0.0)
        else:  # microbatch scope: the selections made in the loss calls, summed over the step
            tokens = max(total[_IDX["tokens"]], 1.0)
            for sign in ("pos", "neg"):
                count = round(total[_IDX[f"{sign}_selected"]])
                out[f"stare/num_{sign}_selected"], out[f"stare/frac_{sign}_selected"] = count, count / tokens
        counts = {q: total[_IDX["q_" + q]] for q in _QUADRANTS}
        all_q = sum(counts.values())
        for q, c in counts.items():
            out[f"quadrant/{q}/count"] = c
            out[f"quadrant/{q}/share"] = c / all_q if all_q else None
        return out

    # -- the run directory ------------------------------------------------------------------------------------

    def _stare_run_config(self) -> dict[str, Any]:
        stare = self.stare_loss_config.stare
        method = "c2" if stare.variant == "C2" else ("o1-adaptive" if stare.adaptive else "o1")
        keys = ("loss_type", "learning_rate", "num_generations", "per_device_train_batch_size",
                "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_completion_length",
                "temperature", "beta", "epsilon", "epsilon_high", "scale_rewards", "use_vllm")
        return {"source": "trl", "method": method, "seed": self.args.seed, "framework": "trl",
                "model": getattr(self.model.config, "_name_or_path", None),
                "num_processes": self.accelerator.num_processes, "loss": to_dict(self.stare_loss_config),
                "trl": {k: getattr(self.args, k) for k in keys}}

    def _stare_write_row(self, total: list[float], logged: dict[str, Any]) -> None:
        run_dir = self.args.run_dir()
        if run_dir is None:
            return
        if self._stare_writer is None:
            cfg = self._stare_run_config()
            if self._stare_resume_step is not None:
                self._stare_writer = RunWriter(run_dir, cfg, resume=True)
                self._stare_writer.truncate_after(self._stare_resume_step)
            else:
                if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                    logger.warning("%s holds a run and training starts afresh: it is overwritten", run_dir)
                self._stare_writer = RunWriter(run_dir, cfg, overwrite=True)
        step = self.stare_step
        row = {"step": self.state.global_step + 1, "entropy": step.entropy, "reward": self._stare_reward,
               "gate_on": int(step.gate_on), "stare_w": step.reweight_w, "stare_m": step.reweight_m,
               "pred_entropy_change": None, "entropy_change": None, "num_tokens": step.num_tokens,
               "num_sequences": step.num_sequences,
               "loss/total": total[_IDX["loss"]] / self.accelerator.num_processes,
               "loss/entropy": logged["entropy"]}
        row.update({k: v for k, v in logged.items() if k.startswith(("stare/", "clip_ratio/", "kl"))})
        row.update({f"quadrant/{q}/count": int(total[_IDX["q_" + q]]) for q in _QUADRANTS})
        self._stare_writer.log(row)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            writer, self._stare_writer = self._stare_writer, None
            if writer is not None:
                writer.close()
                rows = read_run(writer.run_dir).metrics
                writer.write_summary(run_summary(rows, **summary_settings(writer.config)))

    # -- checkpoints ------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder = os.path.join(self._get_output_dir(trial=trial), name)
            state = {"global_step": self.state.global_step, "controller": self.stare_controller.state_dict()}
            with open(os.path.join(folder, CONTROLLER_FILE), "w", encoding="utf-8") as fh:
                json.dump(state, fh)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, CONTROLLER_FILE)
        if not os.path.isfile(path):
            logger.warning("%s has no %s: the STARE controller starts fresh", checkpoint, CONTROLLER_FILE)
            return
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        self.stare_controller.load_state_dict(state["controller"])
        self._stare_resume_step = int(state["global_step"])
