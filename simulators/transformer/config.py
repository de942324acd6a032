"""Configuration and presets of the small-transformer simulator (:mod:`simulators.transformer.runner`).

:class:`TransformerSimConfig` (one method × one seed) with its sub-configs :class:`ModelConfig` and
:class:`WarmStartConfig` (the task's is :class:`simulators.transformer.tasks.TaskConfig`, the loss's the core
:class:`~stare_lab.config.LossConfig`), built with the :mod:`stare_lab.config` machinery so every error names the
full dotted key; :func:`config_from_preset`. The presets themselves (:data:`PRESETS`: preset name → overrides,
:data:`PRESET_SWEEPS`: the methods × seeds a preset runs) are plain data in :mod:`simulators.presets`, re-exported
here and by :mod:`simulators.transformer.runner`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from stare_lab.config import (
    LossConfig,
    apply_overrides,
    check_choice,
    check_positive,
    check_range,
    config_prefix,
    from_dict,
    join_key,
)
from stare_lab.errors import ConfigError
from stare_lab.loss.methods import METHODS

from simulators.presets import SEED_MAX
from simulators.presets import TRANSFORMER_DESCRIPTIONS as PRESET_DESCRIPTIONS
from simulators.presets import TRANSFORMER_PRESETS as PRESETS
from simulators.presets import TRANSFORMER_SWEEPS as PRESET_SWEEPS
from simulators.transformer.tasks import TaskConfig

__all__ = [
    "PRESETS",
    "PRESET_DESCRIPTIONS",
    "PRESET_SWEEPS",
    "ModelConfig",
    "WarmStartConfig",
    "TransformerSimConfig",
    "config_from_preset",
]


@dataclasses.dataclass
class ModelConfig:
    """The tiny causal LM (a ``transformers`` config; random init, fp32).

    Attributes:
        arch: ``qwen2`` or ``llama``.
        hidden_size: width (≥ 8, divisible by ``num_heads``).
        intermediate_size: FFN width (≥ 1).
        num_layers: transformer blocks (≥ 1).
        num_heads: attention heads (≥ 1).
        num_kv_heads: key/value heads (≥ 1, divides ``num_heads``).
        init_std: standard deviation of the random init (``initializer_range``, > 0). 0.1 rather than Qwen2's 0.02:
            at width 64 an AdamW step of 1e-3 on weights of std 0.02 is a ~5 % relative change, and the first-order
            prediction of ΔH degraded (one 80-step GRPO run: R² 0.87 at 0.02 vs 0.96 at 0.1).
    """

    arch: str = "qwen2"
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    init_std: float = 0.1

    def __post_init__(self) -> None:
        p = config_prefix("model")
        check_choice(join_key(p, "arch"), self.arch, ["qwen2", "llama"])
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            check_positive(join_key(p, name), getattr(self, name), integer=True)
        check_range(join_key(p, "hidden_size"), self.hidden_size, 8, 4096)
        check_range(join_key(p, "init_std"), self.init_std, 0, 10, lo_open=True)
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"{join_key(p, 'hidden_size')}={self.hidden_size} is not divisible by "
                f"{join_key(p, 'num_heads')}={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"{join_key(p, 'num_heads')}={self.num_heads} is not divisible by "
                f"{join_key(p, 'num_kv_heads')}={self.num_kv_heads}"
            )


@dataclasses.dataclass
class WarmStartConfig:
    """The supervised warm start on noisy demonstrations (noise level: ``task.demo_noise``).

    Attributes:
        steps: AdamW steps (≥ 0; 0 = RL from the random init).
        batch_size: demonstrations per step (≥ 1).
        lr: AdamW learning rate (> 0).
        cache: reuse / store the warm-started weights in ``cache_dir``.
        cache_dir: where; ``None`` = ``<run_dir>/../../warm_start_cache`` (``OUT/`` of the CLI layout
            ``OUT/<method>/seed<k>``: shared by the runs of one sweep; files are keyed by a hash of what they
            depend on).
    """

    steps: int = 200
    batch_size: int = 128
    lr: float = 3e-3
    cache: bool = True
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        p = config_prefix("warm_start")
        check_positive(join_key(p, "steps"), self.steps, integer=True, allow_zero=True)
        check_positive(join_key(p, "batch_size"), self.batch_size, integer=True)
        check_range(join_key(p, "lr"), self.lr, 0, 1, lo_open=True)


@dataclasses.dataclass
class TransformerSimConfig:
    """One small-transformer run: one method, one seed. Every default is here and lands in ``config.yaml``.

    Attributes:
        method: one of :data:`stare_lab.loss.methods.METHODS` (grpo, grpo-ds, o1, c2, o1-adaptive, clip_cov, …, and
            methods registered with :func:`stare_lab.loss.methods.register_method`).
        seed: integer in [0, 2**31 − 1]; seeds model init, prompts, sampling, everything (same seed ⇒ same numbers).
        steps: RL steps (≥ 1).
        prompts_per_step: prompts per RL batch (≥ 1).
        group_size: G responses per prompt (≥ 2).
        temperature: sampling temperature τ > 0 (log-probs and entropy use the same τ).
        lr: AdamW learning rate of the RL phase (> 0); the presets use 1e-3 (see their comment for why).
        weight_decay: AdamW decoupled weight decay (≥ 0).
        adam_beta1, adam_beta2: AdamW moment decay rates in [0, 1).
        adam_eps: AdamW denominator constant ε (> 0; torch default 1e-8).
        lr_warmup_steps: linear learning-rate warm-up of the RL phase (≥ 0): step t uses lr·min(1, t / warmup);
            0 = constant lr.
        grad_clip: max gradient norm (> 0; paper 1.0).
        updates_per_batch: optimizer updates per rollout batch (≥ 1; paper 1 = on-policy, clipping inert).
        adv_estimator: ``grpo``, ``dr_grpo``, ``rloo`` or ``qae`` (:func:`stare_lab.loss.advantages.group_advantages`).
        dynamic_sampling: DAPO dynamic sampling (set by method ``grpo-ds``): keep groups with non-zero reward
            variance until ``prompts_per_step`` groups are collected or ``ds_max_rounds`` (≥ 1) rollout rounds are
            spent (the simulators' one rule, :mod:`simulators.dynamic_sampling`); then train on what was kept (if
            nothing, the step skips its update: ``skipped=1``).
        ds_max_rounds: ≥ 1 rollout rounds per step under dynamic sampling.
        entropy_bonus_coeff: β > 0 used by method ``entropy_bonus`` when ``loss.entropy_coeff`` is 0.
        eval_every: held-out evaluation period in steps (≥ 1; the last step always evaluates).
        eval_samples: samples per held-out prompt k (≥ 1): ``eval/accuracy`` = mean reward, ``eval/pass@k``.
        checkpoint_every: checkpoint period in steps (≥ 1; the last step always checkpoints).
        measure_decomposition: log the D terms of docs/theory.md §7 per step (``pred/d_grpo``, ``pred/d_lplus``,
            ``pred/d_lminus`` for C2: the first update's Adam-linearised split, :mod:`stare_lab.theory.decomposition`), from
            which ``summary.json`` and ``analyze`` give W*(t) and the predicted critical W. Two (C2: three) extra
            backward passes per step.
        task, model, warm_start: sub-configs.
        loss: the core :class:`~stare_lab.config.LossConfig`; ``loss_mode``, ``stare.variant`` / ``stare.adaptive``
            (and ``entropy_coeff`` for ``entropy_bonus``) are set from ``method`` by the shared method table
            :data:`simulators.presets.METHODS`, as the tabular simulator does.
    """

    method: str = "grpo"
    seed: int = 0
    steps: int = 80
    prompts_per_step: int = 32
    group_size: int = 8
    temperature: float = 1.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    lr_warmup_steps: int = 0
    grad_clip: float = 1.0
    updates_per_batch: int = 1
    adv_estimator: str = "grpo"
    dynamic_sampling: bool = False
    ds_max_rounds: int = 3
    entropy_bonus_coeff: float = 0.01
    eval_every: int = 20
    eval_samples: int = 8
    checkpoint_every: int = 20
    measure_decomposition: bool = True
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        p = config_prefix("")
        check_choice(join_key(p, "method"), self.method, list(METHODS))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"{join_key(p, 'seed')}={self.seed!r} must be an integer in [0, {SEED_MAX}] (2**31 - 1)")
        for name in ("steps", "prompts_per_step", "updates_per_batch", "ds_max_rounds", "eval_every",
                     "eval_samples", "checkpoint_every"):
            check_positive(join_key(p, name), getattr(self, name), integer=True)
        check_positive(join_key(p, "group_size"), self.group_size, integer=True)
        check_range(join_key(p, "group_size"), self.group_size, 2, None)
        check_range(join_key(p, "temperature"), self.temperature, 0, None, lo_open=True)
        check_range(join_key(p, "lr"), self.lr, 0, 1, lo_open=True)
        check_range(join_key(p, "weight_decay"), self.weight_decay, 0, None)
        check_range(join_key(p, "adam_beta1"), self.adam_beta1, 0, 1, hi_open=True)
        check_range(join_key(p, "adam_beta2"), self.adam_beta2, 0, 1, hi_open=True)
        check_range(join_key(p, "adam_eps"), self.adam_eps, 0, 1, lo_open=True)
        check_positive(join_key(p, "lr_warmup_steps"), self.lr_warmup_steps, integer=True, allow_zero=True)
        check_range(join_key(p, "grad_clip"), self.grad_clip, 0, None, lo_open=True, allow_inf=True)
        check_choice(join_key(p, "adv_estimator"), self.adv_estimator, ["grpo", "dr_grpo", "rloo", "qae"])
        check_range(join_key(p, "entropy_bonus_coeff"), self.entropy_bonus_coeff, 0, None, lo_open=True)
        for name in ("dynamic_sampling", "measure_decomposition"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{join_key(p, name)}={getattr(self, name)!r} must be true or false")
        spec = METHODS[self.method]  # what the method implies (docs/theory.md §3–4), shared with the tabular simulator
        self.loss.loss_mode = spec["loss"]["loss_mode"]
        for key, value in spec["loss"].get("stare", {}).items():
            setattr(self.loss.stare, key, value)
        self.dynamic_sampling = self.dynamic_sampling or bool(spec["dynamic_sampling"])
        if spec.get("entropy_bonus") and self.loss.entropy_coeff == 0:
            self.loss.entropy_coeff = self.entropy_bonus_coeff
        self.loss.validate(join_key(p, "loss"))


def config_from_preset(
    preset: str | None = None, overrides: list[str] | tuple[str, ...] = (), **fields: Any
) -> TransformerSimConfig:
    """Build a config: preset overrides, then dotted ``key=value`` strings, then keyword fields (e.g. ``method``,
    ``seed``).

    Raises:
        ConfigError: unknown preset (lists the allowed ones), unknown key, bad value.
    """
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not one of {{{', '.join(repr(p) for p in PRESETS)}}}")
    data = copy.deepcopy(PRESETS[preset]) if preset else {}
    apply_overrides(data, list(overrides))
    data.update(fields)
    return from_dict(TransformerSimConfig, data)
