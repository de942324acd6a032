"""STARE in TRL, unforked: :class:`STAREGRPOConfig` (TRL's ``GRPOConfig`` plus STARE's fields, derived from the
core's :class:`~stare_lab.config.STAREConfig`) and :class:`STAREGRPOTrainer` (a ``GRPOTrainer`` subclass overriding
the public ``compute_loss``, ``log`` and ``train``, with a ``TrainerCallback`` for checkpoints). User guide:
docs/integrations.md; the method: docs/theory.md §4. Tested with TRL 1.14.2 and 1.16.0.

Per optimizer step (every process the same, before the step's first micro-batch loss):

1. Every micro-batch of the step is measured with TRL's own forward: per completion token the log-probability (the
   surprisal source; TRL's old log-probs when it has them) and the entropy. The first micro-batch is measured by
   its own loss forward, the others by a no-grad forward when the step opens; with one micro-batch per step (TRL's
   default) there is no extra forward at all. On the steps that log the quadrants (``quadrant_every``), the
   decoder's hidden states also give the critical surprisal s* (docs/theory.md §2,
   :func:`stare_lab.theory.first_order.critical_surprisal`) through one no-grad LM-head pass, a chunk of tokens at a
   time.
2. Right after the first micro-batch's forward, before its loss, the step's micro-batches on this process form one
   :class:`~stare_lab.loss.step.StepBatch`, and :func:`stare_lab.loss.step.prepare_step` decides the gate and W/M
   from the step's token-mean entropy over all processes and, for scope ``global``, selects ω exactly over all
   processes (radix histograms summed with ``accelerator.reduce``: the same ω as one process holding the whole
   batch, concatenated in process order). No one-step lag.
3. Each micro-batch's loss is the core's ``stare`` loss (:func:`stare_lab.loss.losses.compute_policy_loss`) with
   TRL's aggregation of the configured ``loss_type`` (its normalisers and gradient-accumulation scaling); with the
   gate off it is bit-identical to TRL's own loss (CPU; on CUDA ``grpo`` may differ by one rounding, as
   ``torch.mean`` multiplies by 1/B there).
4. At the step's last micro-batch, one reduction gives the step's metrics; they go to TRL's logs (through ``log``)
   and, from the main process, to a stare_lab run directory (``config.yaml`` + ``metrics.jsonl``, docs/design.md §4).

The controller state is saved as ``stare_controller.json`` in every TRL checkpoint folder and restored with
``resume_from_checkpoint``. TRL has no public seam for three things this needs; each is one function of the "TRL
adapter" section below (tests/integrations/test_trl_adapter.py checks each against the installed TRL): TRL's
scoring forward, the micro-batches of the step being trained (gradient accumulation > 1 only), and the generation
batch's mean reward. Importing this module imports TRL (``pip install -e ".[trl]"`` in a clone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"stare_lab.integrations.trl needs TRL 1.14.2-1.16 ({err}): pip install -e \".[trl]\"") from err

from stare_lab.config import LossConfig, STAREConfig, _fmt, check_range, from_dict, to_dict
from stare_lab.errors import ConfigError, RunError
from stare_lab.loss.entropy import default_chunk_rows
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss, kl_penalty
from stare_lab.loss.stare import STAREController
from stare_lab.loss.step import PreparedStep, StepBatch, prepare_step
from stare_lab.platform.runs import RunWriter, read_run
from stare_lab.platform.summary import run_summary, summary_settings
from stare_lab.theory.first_order import critical_surprisal

logger = logging.getLogger(__name__)

__all__ = ["STAREGRPOConfig", "STAREGRPOTrainer", "STARE_FIELDS", "SUPPORTED_LOSS_TYPES", "CONTROLLER_FILE",
           "NO_DUAL_CLIP", "TRL_PRIVATE_NAMES", "critical_surprisals"]

#: The STARE fields of :class:`STAREGRPOConfig`: every field of the core's :class:`STAREConfig`, under its name.
STARE_FIELDS = tuple(f.name for f in dataclasses.fields(STAREConfig))
#: TRL ``loss_type`` → the core's aggregation; the normalisers are TRL's (:meth:`STAREGRPOTrainer._normalisers`).
_AGGREGATION = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "token-mean", "dapo": "token-mean"}
SUPPORTED_LOSS_TYPES = tuple(_AGGREGATION)
#: The controller state file written into each checkpoint folder.
CONTROLLER_FILE = "stare_controller.json"
#: The core's dual-clip constant c standing for TRL's "no dual clip": the core clamps |log ρ| at 20, so every
#: per-token loss is at most −Â·e^20 < −Â·c/2 and min(ℓ, −Â·c) is ℓ bit for bit; finite, so config.yaml keeps it.
NO_DUAL_CLIP = 1e9
#: Every private name of TRL's ``GRPOTrainer`` this module uses, each only in the adapter function named:
#: name → (kind, adapter). Nothing of TRL's is overridden except public methods (``compute_loss``, ``log``, ``train``).
TRL_PRIVATE_NAMES = {
    "_get_per_token_logps_and_entropies": ("method called", "_trl_scores"),
    "_buffered_inputs": ("attribute read", "_trl_step_micro_batches"),
    "_step": ("attribute read", "_trl_step_micro_batches"),
    "_metrics": ("attribute read", "_trl_latest_reward"),
}
_QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")
# the per-step sums reduced once at the step's last micro-batch (float64; counts are exact below 2**53)
_SUMS = ("entropy", "tokens", "clip_low", "clip_high", "loss", "kl", "pos_selected", "neg_selected",
         *(f"q_{q}" for q in _QUADRANTS))
_IDX = {name: i for i, name in enumerate(_SUMS)}


# ----------------------------------------------------------------------------------------------------------------
# the config: TRL's GRPOConfig plus the core's STAREConfig fields (derived, never copied)
# ----------------------------------------------------------------------------------------------------------------


def _field_help(doc: str | None) -> dict[str, str]:
    """name → its one-paragraph description from a Google-style ``Attributes:`` block (for ``--help``)."""
    out: dict[str, str] = {}
    block = (doc or "").split("Attributes:", 1)[-1] if "Attributes:" in (doc or "") else ""
    name = None
    for line in block.splitlines():
        m = re.match(r"^\s{8}(\w+(?:, \w+)*): (.*)$", line)
        if m:
            name = m.group(1)
            for n in name.split(", "):
                out[n] = m.group(2).strip()
        elif name and line.strip() and line.startswith(" " * 12):
            for n in name.split(", "):
                out[n] += " " + line.strip()
        elif not line.strip():
            name = None
    return out


def _with_stare_fields(cls: type) -> type:
    """Class decorator: put every field of :class:`STAREConfig` (its type, default and docstring help) before the
    class's own fields, then make the class a dataclass. A nested-dataclass field becomes a ``dict`` (None: the
    core's default). Raises TypeError at import if a STARE field name collides with one of TRL's."""
    hints = typing.get_type_hints(STAREConfig)
    helps = _field_help(STAREConfig.__doc__)
    trl_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = dict(cls.__dict__.get("__annotations__", {}))
    annotations: dict[str, Any] = {}
    for f in dataclasses.fields(STAREConfig):
        if f.name in trl_names or f.name in own:
            raise TypeError(f"STAREConfig.{f.name} collides with a field of TRL's GRPOConfig or STAREGRPOConfig")
        kind = hints[f.name]
        text = helps.get(f.name, f"STAREConfig.{f.name} (stare_lab.config).")
        if dataclasses.is_dataclass(kind):
            annotations[f.name] = dict | None
            setattr(cls, f.name, field(default=None, metadata={"help": f"{text} A mapping; None: the default."}))
            continue
        annotations[f.name] = kind
        default = (dict(default=f.default) if f.default is not dataclasses.MISSING
                   else dict(default_factory=f.default_factory))
        setattr(cls, f.name, field(**default, metadata={"help": text}))
    cls.__annotations__ = {**annotations, **own}
    return dataclass(cls)


@_with_stare_fields
class STAREGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus STARE's settings: every field of the core's :class:`STAREConfig` under its name and
    with its default (derived from the dataclass, docs/theory.md §4), and the TRL-side settings below.

    Attributes:
        variant, top_p_ratio, reweight_w, reweight_m, target_entropy, adaptive, alpha, w_max, m_min, scope, gate,
            ...: the fields of :class:`STAREConfig` (its docstring; docs/integrations.md has the table).
        quadrant_every: log the quadrant counts (docs/theory.md §2: tokens by the sign of Â and their surprisal
            above/below s*) on steps 1, 1 + N, 1 + 2N, …; 0: never. Each logged step costs one no-grad LM-head pass
            over the step's completion tokens (docs/benchmarks.md).
        stare_run_dir: where the main process writes the stare_lab run directory; None → ``<output_dir>/stare_run``,
            ``""`` → none.

    Raises:
        ConfigError: a STARE field out of range (``reweight_w=0.5 is outside [1, inf)``), or a TRL setting this
            trainer does not support (``loss_type`` other than grpo/bnpo/dr_grpo/dapo, sequence-level importance
            sampling, ``top_entropy_quantile < 1``, an entropy bonus, ``off_policy_mask_threshold``, ``delta``,
            ``beta > 0`` with ``use_bias_correction_kl``, ``steps_per_generation`` not a multiple of
            ``gradient_accumulation_steps``).
    """

    quadrant_every: int = field(default=10, metadata={"help": (
        "Log the quadrant counts on steps 1, 1+N, 1+2N, ... (one no-grad LM-head pass each); 0: never.")})
    stare_run_dir: str | None = field(default=None, metadata={"help": (
        "stare_lab run directory (config.yaml + metrics.jsonl); default <output_dir>/stare_run; '' for none.")})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.variant = self.stare_config().variant
        _check_trl_settings(self)

    def stare_config(self) -> STAREConfig:
        """The STARE fields as the core's :class:`STAREConfig`. Raises ConfigError."""
        values = {name: getattr(self, name) for name in STARE_FIELDS}
        return from_dict(STAREConfig, {k: v for k, v in values.items() if v is not None}, prefix="")

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
    if isinstance(args.quadrant_every, bool) or not isinstance(args.quadrant_every, int) or args.quadrant_every < 0:
        raise ConfigError(f"quadrant_every={_fmt(args.quadrant_every)} must be an integer >= 0 (0: never)")
    if args.stare_run_dir is not None and not isinstance(args.stare_run_dir, str):
        raise ConfigError(f"stare_run_dir={args.stare_run_dir!r} must be a path, '' or None")


# ----------------------------------------------------------------------------------------------------------------
# the TRL adapter: every private name of TRL's GRPOTrainer used here, one function each (TRL_PRIVATE_NAMES)
# ----------------------------------------------------------------------------------------------------------------


def _trl_scores(trainer: GRPOTrainer, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                logits_to_keep: int, *, batch_size: int | None, aux: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """TRL's own scoring forward ``GRPOTrainer._get_per_token_logps_and_entropies`` (private; the one its loss
    uses, with its chunking, autocast and fused LM head): log-probs and entropies ``[B, logits_to_keep]`` of the
    last ``logits_to_keep`` tokens, and the MoE aux loss when ``aux``."""
    return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                       batch_size=batch_size, compute_entropy=True,
                                                       compute_aux_loss=aux)


def _trl_step_micro_batches(trainer: GRPOTrainer, current: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The ``n`` micro-batches of the optimizer step that ``current`` opens, in training order: TRL's buffer of the
    generation batch's slices (``_buffered_inputs``, private) from its micro-step counter (``_step``, private), as
    ``GRPOTrainer._prepare_inputs`` reads them. Raises RunError when ``current`` is not the buffer's entry at the
    counter (TRL changed how it buffers: STARE would select over the wrong tokens)."""
    buffered, at = getattr(trainer, "_buffered_inputs", None), getattr(trainer, "_step", None)
    spg = trainer.args.steps_per_generation
    if buffered is None or not isinstance(at, int) or len(buffered) != spg or buffered[at % spg] is not current:
        raise RunError("TRL's GRPOTrainer no longer buffers its micro-batches as _buffered_inputs[_step % "
                       "steps_per_generation]: this TRL version is not supported by STAREGRPOTrainer with "
                       "gradient_accumulation_steps > 1")
    return [buffered[(at + i) % spg] for i in range(n)]


def _trl_latest_reward(trainer: GRPOTrainer) -> float | None:
    """The mean reward TRL logged for its latest generation batch (``_metrics["train"]["reward"][-1]``, private),
    None when it logged none since its last ``log`` (the step reuses that batch)."""
    rewards = trainer._metrics["train"].get("reward")
    return float(rewards[-1]) if rewards else None


# ----------------------------------------------------------------------------------------------------------------
# pieces of the step
# ----------------------------------------------------------------------------------------------------------------


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


def _vocab_size(head: torch.nn.Module, config: Any = None) -> int:
    """Rows of the LM head's weight, i.e. the logits' width V: DeepSpeed ZeRO-3's ``ds_shape`` of a partitioned
    weight (whose ``.shape`` is ``(0,)`` there), else the weight's shape, else the model config's ``vocab_size``.
    Raises ConfigError when none gives V > 0 (chunking would silently be off)."""
    weight = getattr(head, "weight", None)
    shape = tuple(getattr(weight, "ds_shape", None) or (weight.shape if weight is not None else ()))
    vocab = int(shape[0]) if shape else 0
    if vocab <= 0 and config is not None:
        vocab = int(getattr(config.get_text_config(), "vocab_size", 0) or 0)
    if vocab <= 0:
        raise ConfigError(f"cannot tell the LM head's vocabulary size ({type(head).__name__}, weight shape "
                          f"{shape}); STAREGRPOTrainer needs it to bound the s* pass's memory")
    return vocab


@contextlib.contextmanager
def _hidden_states(model: torch.nn.Module) -> Iterator[list[Tensor]]:
    """Collect the decoder's ``last_hidden_state`` (detached) of every forward run inside the block: a forward hook
    on ``base_model``, the module the model's forward (and TRL's fused LM head) calls."""
    backbone, _ = _backbone_and_head(model)
    store: list[Tensor] = []
    handle = backbone.register_forward_hook(lambda module, args, out: store.append(out.last_hidden_state.detach()))
    try:
        yield store
    finally:
        handle.remove()


def _gathered(head: torch.nn.Module) -> Any:
    """A context in which the LM head's weight (and bias) are whole: DeepSpeed ZeRO-3 partitions them (shape
    ``(0,)``) and gathers them only inside the module's own forward, whose hooks fire collectives; entering this
    context once per s* pass keeps every process's collectives in step whatever its token count. A null context
    when nothing is partitioned."""
    params = [p for p in (getattr(head, "weight", None), getattr(head, "bias", None)) if p is not None]
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    todo = {id(p): p for p in params if p.ds_status != ZeroParamStatus.AVAILABLE}
    return deepspeed.zero.GatheredParameters(list(todo.values())) if todo else contextlib.nullcontext()


def critical_surprisals(head: torch.nn.Module, hidden: Tensor, mask: Tensor, temperature: float,
                        autocast: Callable[[], Any] = contextlib.nullcontext, vocab_size: int | None = None) -> Tensor:
    """s* of every completion position (docs/theory.md §2, :func:`stare_lab.theory.first_order.critical_surprisal`)
    from the decoder's hidden states ``[B, L, H]`` whose last ``T`` positions (``mask`` ``[B, T]``) predict the
    completion: ``[B, T]`` float32, 0 outside ``mask``. The logits ``lm_head(h) / temperature`` are built
    ``default_chunk_rows(V)`` tokens at a time, never as a ``[B, T, V]`` tensor; V is ``vocab_size`` (None: from the
    head, :func:`_vocab_size`, which reads ZeRO-3's ``ds_shape``). Under ZeRO-3 the head is gathered once for the
    whole pass (:func:`_gathered`), so every process must call this the same number of times. Raises ConfigError
    when V is unknown."""
    t = mask.shape[1]
    valid = mask.bool()
    h = hidden[:, -t - 1:-1][valid]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = default_chunk_rows(vocab_size if vocab_size else _vocab_size(head))
    linear = isinstance(head, torch.nn.Linear)
    parts = []
    with torch.no_grad(), _gathered(head):
        for r in range(0, h.shape[0], rows):
            with autocast():
                logits = F.linear(h[r:r + rows], head.weight, head.bias) if linear else head(h[r:r + rows])
            parts.append(critical_surprisal(logits.float(), temperature))
    if parts:
        out[valid] = torch.cat(parts).to(out.device)
    return out


def _loss_mask(inputs: dict[str, Any]) -> Tensor:
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]


def _padded(tensors: list[Tensor], width: int) -> Tensor:
    return torch.cat([F.pad(x, (0, width - x.shape[1])) for x in tensors])


class _ControllerCheckpoint(TrainerCallback):
    """Writes the STARE controller into each checkpoint folder, from the public ``on_save`` callback (it runs right
    after the trainer wrote the folder, before the callbacks the user passed)."""

    def __init__(self) -> None:
        self.trainer: STAREGRPOTrainer | None = None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is not None and args.should_save:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if not os.path.isdir(folder):
                raise RunError(f"checkpoint folder {folder} not found: STAREGRPOTrainer saves its controller "
                               "beside output_dir/checkpoint-N (hyperparameter search is not supported)")
            payload = {"global_step": state.global_step, "controller": self.trainer.stare_controller.state_dict()}
            with open(os.path.join(folder, CONTROLLER_FILE), "w", encoding="utf-8") as fh:
                json.dump(payload, fh)


class STAREGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with the core's STARE loss, gate and controller (module docstring; docs/theory.md §4).

    Construct it like ``GRPOTrainer`` with a :class:`STAREGRPOConfig`. The controller is
    :attr:`stare_controller` (:class:`~stare_lab.loss.stare.STAREController`); the step being trained is
    :attr:`stare_step` (the core's :class:`~stare_lab.loss.step.PreparedStep`). Text-only causal LMs.

    Raises:
        ConfigError: ``args`` is not a :class:`STAREGRPOConfig`, or the model is not supported
            (its logits must be ``lm_head(base_model(...).last_hidden_state)``: no softcapping or logit scaling).
    """

    def __init__(self, model: Any, reward_funcs: Any, args: STAREGRPOConfig | None = None, **kwargs: Any) -> None:
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "name_or_path", "model")
            args = STAREGRPOConfig(f"{str(name).split('/')[-1]}-STARE")
        if not isinstance(args, STAREGRPOConfig):
            raise ConfigError(f"args must be a STAREGRPOConfig (GRPOConfig plus the STARE fields), got "
                              f"{type(args).__name__}")
        saver = _ControllerCheckpoint()
        kwargs["callbacks"] = [saver, *(kwargs.get("callbacks") or [])]
        super().__init__(model, reward_funcs, args=args, **kwargs)
        saver.trainer = self
        _backbone_and_head(self.model)
        self.stare_loss_config = args.loss_config()
        self.stare_controller = STAREController(self.stare_loss_config.stare)
        self.stare_step: PreparedStep | None = None
        self._stare_collective = _AccelerateCollective(self.accelerator)
        self._stare_left = 0  # micro-batches of the current optimizer step still to come
        self._stare_pending: list[dict[str, Any]] | None = None  # the step to prepare at its first loss forward
        self._stare_quadrants = False  # whether the current step logs the quadrant counts
        self._stare_sums: Tensor | None = None
        self._stare_reward: float | None = None
        self._stare_resume_step: int | None = None
        self._stare_writer: RunWriter | None = None
        self._stare_logs: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}

    # -- the step: measurement, preparation -----------------------------------------------------------------

    def _stare_open_step(self, micro: list[dict[str, Any]]) -> None:
        """Open the optimizer step made of ``micro`` (this process's micro-batches, in training order): micro-batches
        2, 3, … are measured now by a no-grad forward; the first is measured by its own loss forward, and the step
        is prepared right after that forward, before its loss (:meth:`compute_loss`)."""
        every = self.args.quadrant_every
        self._stare_quadrants = every > 0 and self.state.global_step % every == 0
        reward = _trl_latest_reward(self)
        if reward is not None:
            self._stare_reward = reward
        for mb in micro[1:]:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                logps, entropies, _, hidden = self._stare_forward(self.model, mb, capture=self._stare_quadrants,
                                                                  batch_size=self.args.per_device_train_batch_size)
            mb.update(self._stare_measure(mb, logps, entropies, hidden))
        self._stare_pending = micro
        self._stare_left = len(micro)

    def _stare_forward(self, model: torch.nn.Module, inputs: dict[str, Any], *, capture: bool, aux: bool = False,
                       batch_size: int | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """TRL's own forward (:func:`_trl_scores`): log-probs, entropies, with ``aux`` the MoE aux loss and with
        ``capture`` the decoder's hidden states."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with (_hidden_states(self.accelerator.unwrap_model(model)) if capture else contextlib.nullcontext([])) as hs:
            logps, entropies, aux_loss = _trl_scores(self, model, input_ids, attention_mask, completion_ids.size(1),
                                                     batch_size=batch_size, aux=aux)
        return logps, entropies, aux_loss, (torch.cat(hs) if hs else None)

    def _stare_measure(self, inputs: dict[str, Any], logps: Tensor, entropies: Tensor,
                       hidden: Tensor | None) -> dict[str, Tensor]:
        """A micro-batch's surprisal source (TRL's old log-probs when it has them, else the forward's), entropy and,
        when ``hidden`` is given, s* per completion token (``[B, T]``, detached)."""
        old = inputs.get("old_per_token_logps")
        out = {"stare_logps": (logps if old is None else old).detach().float(),
               "stare_entropy": entropies.detach().float()}
        if hidden is not None:
            inner = self.accelerator.unwrap_model(self.model)
            _, head = _backbone_and_head(inner)
            out["stare_sstar"] = critical_surprisals(head, hidden, inputs["completion_mask"], self.args.temperature,
                                                     self.accelerator.autocast,
                                                     vocab_size=_vocab_size(head, getattr(inner, "config", None)))
        return out

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
        sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=mask.device)
        if self._stare_quadrants:
            adv = batch.advantages_bt()
            high = batch.old_logprobs.neg() > _padded([mb["stare_sstar"] for mb in micro], width)
            for i, (sign, side) in enumerate((s, h) for s in (adv > 0, adv < 0) for h in (high, ~high)):
                sums[_IDX["q_" + _QUADRANTS[i]]] = (mask & sign & side).sum()
        self._stare_sums, self.stare_step = sums, prep
        return prep

    # -- the loss ----------------------------------------------------------------------------------------------

    def _normalisers(self, inputs: dict[str, Any], mask: Tensor, mode: str) -> tuple[Any, Any, int]:
        """(global_num_tokens, global_num_sequences, divisor) reproducing TRL's aggregation of ``loss_type``."""
        ga = int(self.current_gradient_accumulation_steps) if mode == "train" else 1
        rows = mask.shape[0]
        loss_type = self.args.loss_type
        if loss_type == "grpo":
            return None, rows, ga
        if loss_type == "bnpo":
            return mask.sum().clamp(min=1.0), None, ga
        if loss_type == "dr_grpo":
            return rows * self.args.max_completion_length, None, ga
        normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes  # dapo
        if mode == "train":
            normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normaliser, None, 1

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Tensor:
        """The micro-batch's STARE loss (the module docstring's steps 1–3), in place of TRL's policy loss."""
        if return_outputs:
            raise ValueError("The GRPOTrainer does not support returning outputs")
        if "pixel_values" in inputs:
            raise ConfigError("STAREGRPOTrainer supports text-only models (the batch has pixel_values)")
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._stare_left == 0:  # the step's first micro-batch: open the step
            n = int(self.current_gradient_accumulation_steps)
            self._stare_open_step([inputs] if n == 1 else _trl_step_micro_batches(self, inputs, n))
        pending = self._stare_pending if mode == "train" else None
        logps, entropies, aux_loss, hidden = self._stare_forward(
            model, inputs, capture=pending is not None and self._stare_quadrants, aux=self.aux_loss_enabled)
        if pending is not None:  # prepare the whole step before this first loss
            self._stare_pending, pending[0] = None, inputs
            inputs.update(self._stare_measure(inputs, logps, entropies, hidden))
            self._stare_begin_step(pending)
        if mode == "train":
            self._stare_left -= 1
        mask = _loss_mask(inputs)
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
        use_is = self.args.use_vllm and self.args.vllm_importance_sampling_correction
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
                self._stare_logs[mode][key].append(float(value))
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
        if self._stare_quadrants:
            counts = {q: total[_IDX["q_" + q]] for q in _QUADRANTS}
            all_q = sum(counts.values())
            for q, c in counts.items():
                out[f"quadrant/{q}/count"] = c
                out[f"quadrant/{q}/share"] = c / all_q if all_q else None
        return out

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's ``log`` with this trainer's metrics (means over the logging window; ``eval_`` prefix in
        evaluation) added."""
        mode = "train" if self.model.training else "eval"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self._stare_logs[mode].items():
            valid = [v for v in values if not math.isnan(v)]
            if valid:
                logs[prefix + key] = sum(valid) / len(valid)
        self._stare_logs[mode].clear()
        super().log(logs, start_time)

    # -- the run directory ------------------------------------------------------------------------------------

    def _stare_run_config(self) -> dict[str, Any]:
        stare = self.stare_loss_config.stare
        method = "c2" if stare.variant == "C2" else ("o1-adaptive" if stare.adaptive else "o1")
        keys = ("loss_type", "learning_rate", "num_generations", "per_device_train_batch_size",
                "gradient_accumulation_steps", "steps_per_generation", "num_iterations", "max_completion_length",
                "temperature", "beta", "epsilon", "epsilon_high", "scale_rewards", "use_vllm", "quadrant_every")
        return {"source": "trl", "method": method, "seed": self.args.seed, "framework": "trl",
                "model": getattr(self.model.config, "name_or_path", None),
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
               "loss/entropy": logged["entropy"], "quadrant/every": self.args.quadrant_every}
        row.update({k: v for k, v in logged.items() if k.startswith(("stare/", "clip_ratio/", "kl"))})
        if self._stare_quadrants:
            row.update({f"quadrant/{q}/count": int(total[_IDX["q_" + q]]) for q in _QUADRANTS})
        self._stare_writer.log(row)

    # -- training, checkpoints --------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``; resuming also restores the STARE controller from the checkpoint's
        ``stare_controller.json`` (a checkpoint without it, e.g. plain TRL's, starts it fresh with a warning); the
        run directory is closed and its ``summary.json`` written at the end, also after an error."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)
        if isinstance(checkpoint, str):
            self._stare_resume(checkpoint)
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            writer, self._stare_writer = self._stare_writer, None
            if writer is not None:
                writer.close()
                rows = read_run(writer.run_dir).metrics
                writer.write_summary(run_summary(rows, **summary_settings(writer.config)))

    def _stare_resume(self, checkpoint: str) -> None:
        """Load the controller saved in ``checkpoint`` (:class:`_ControllerCheckpoint`)."""
        path = os.path.join(checkpoint, CONTROLLER_FILE)
        if not os.path.isfile(path):
            logger.warning("%s has no %s: the STARE controller starts fresh", checkpoint, CONTROLLER_FILE)
            return
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        self.stare_controller.load_state_dict(state["controller"])
        self._stare_resume_step = int(state["global_step"])
