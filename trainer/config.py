"""The trainer's config tree: dataclasses in the core's config system (:mod:`stare_lab.config`).

One YAML file (plus dotted ``key=value`` overrides) builds a :class:`TrainerConfig`::

    method: o1                  # selects the loss (and its STARE variant) unless loss.* says otherwise; see below
    plugins: [my_pkg.my_loss]   # optional: modules / .py files that register losses and methods (docs/extending.md)
    seed: 0
    out_dir: runs/o1
    model:     {path: ..., dtype: bfloat16, gradient_checkpointing: true}
    data:      {train_files: [...], prompt_key: problem, answer_key: answer, max_prompt_length: 1024}
    rollout:   {engine: vllm, n: 8, temperature: 1.0, top_p: 1.0, max_response_length: 3072}
    algorithm: {advantage_estimator: grpo, dynamic_sampling: true, max_gen_rounds: 3, overlong: keep}
    reward:    {kind: math}
    loss:      {loss_mode: stare, stare: {variant: O1, top_p_ratio: 0.1}}     # stare_lab.config.LossConfig
    optim:     {lr: 1.0e-6, train_batch_size: 64, micro_batch_max_tokens: 16384, grad_clip: 1.0}
    deepspeed: {zero_stage: 3, precision: bf16}
    schedule:  {total_steps: 500, save_freq: 20, eval_freq: 10}
    tool:      {max_tool_calls: 4, code_open: "<code>", code_close: "</code>"}   # optional: tool-use rollouts

Every default lives here and is printed into the run's ``config.yaml``. Errors are
:class:`~stare_lab.errors.ConfigError` naming the dotted key (``rollout.n=0 is outside (0, inf)``).

``method`` alone selects the loss, as in the simulators: :func:`load_trainer_config` fills in what the method
implies (``loss.loss_mode``, the ``loss.stare`` settings it fixes, ``algorithm.dynamic_sampling: true`` for
``grpo-ds``) wherever the config does not set them; a setting the config does give must agree with the method.
``plugins`` are imported (:func:`stare_lab.platform.plugins.load_plugins`, with the installed entry-point plugins) before
the method is looked up, by every process that loads the config — so every torchrun rank has the plugin's loss.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Mapping

from stare_lab.config import (
    LossConfig,
    apply_overrides,
    check_choice,
    check_positive,
    check_range,
    config_data,
    config_prefix,
    from_dict,
    to_dict,
)
from stare_lab.errors import ConfigError
from stare_lab.loss.methods import METHODS as _METHODS, check_method, method_overrides
from stare_lab.platform.plugins import load_plugins

from trainer.tools.config import ToolUseConfig

__all__ = [
    "ModelConfig",
    "DataConfig",
    "RolloutConfig",
    "AlgorithmConfig",
    "RewardConfig",
    "OptimConfig",
    "DeepSpeedConfig",
    "ScheduleConfig",
    "TrainerConfig",
    "METHODS",
    "derive_method",
    "fill_method",
    "load_trainer_config",
    "DEFAULT_PROMPT_TEMPLATE",
]

#: Default user-message template for math prompts (the paper's instruction, docs/theory.md §4).
DEFAULT_PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

#: Method labels (docs/design.md / analysis) and what they imply: the core's shared table.
METHODS = _METHODS


def _p(prefix: str) -> str:
    return prefix + "." if prefix else ""


@dataclasses.dataclass
class ModelConfig:
    """The policy model.

    Attributes:
        path: local directory of a Hugging Face checkpoint (never downloaded: runs are offline).
        tokenizer: tokenizer directory; ``None`` = ``path``.
        chat_template: a Jinja chat template overriding the tokenizer's; ``None`` keeps the tokenizer's.
        dtype: weights dtype of the trainer's master copy when not using mixed precision (``float32``), and of
            the rollout engine (``rollout.dtype=auto`` follows ``deepspeed.precision``).
        gradient_checkpointing: recompute activations in the backward pass (saves memory, ~30% slower).
        attn_implementation: transformers attention backend (``sdpa``, ``eager``, ``flash_attention_2``).
    """

    path: str = ""
    tokenizer: str | None = None
    chat_template: str | None = None
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        p = _p(config_prefix("model"))
        check_choice(f"{p}dtype", self.dtype, ["float32", "bfloat16", "float16"])
        check_choice(f"{p}attn_implementation", self.attn_implementation, ["sdpa", "eager", "flash_attention_2"])


@dataclasses.dataclass
class DataConfig:
    """Training prompts.

    Attributes:
        train_files: JSONL / Parquet files (or ``hf:NAME:SPLIT`` for a locally cached ``datasets`` dataset),
            each record holding ``prompt_key`` and ``answer_key``.
        prompt_key: record field with the problem text.
        answer_key: record field with the gold answer (graded by ``trainer.grading.rewards``).
        prompt_template: ``str.format`` template of the user message; ``{problem}`` is the record's prompt.
        use_chat_template: wrap the message with the tokenizer's chat template (add generation prompt).
        max_prompt_length: tokens; longer prompts are handled per ``truncation``.
        truncation: ``left`` (keep the end of the prompt, logged), ``right`` (keep the start, logged), or
            ``error`` (raise :class:`~stare_lab.errors.DataError`).
        shuffle: reshuffle the prompts every epoch (seeded by ``seed`` and the epoch number).
        max_samples: use only the first N records (``None`` = all; counted after ``answer_pattern``).
        answer_pattern: a regular expression; only records whose gold answer (stripped) fully matches it are used
            (``None`` = all). E.g. ``"[0-9]"`` keeps single-digit answers (the ``tiny-cpu`` preset: a random-init
            model then sometimes hits the answer, so groups have reward variance and gradients are non-zero).
    """

    train_files: list[str] = dataclasses.field(default_factory=list)
    prompt_key: str = "problem"
    answer_key: str = "answer"
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    use_chat_template: bool = True
    max_prompt_length: int = 1024
    truncation: str = "left"
    shuffle: bool = True
    max_samples: int | None = None
    answer_pattern: str | None = None

    def __post_init__(self) -> None:
        p = _p(config_prefix("data"))
        if self.answer_pattern is not None:
            import re

            try:
                re.compile(str(self.answer_pattern))
            except re.error as err:
                raise ConfigError(f"{p}answer_pattern={self.answer_pattern!r} is not a valid regular expression "
                                  f"({err})") from None
        check_positive(f"{p}max_prompt_length", self.max_prompt_length, integer=True)
        check_choice(f"{p}truncation", self.truncation, ["left", "right", "error"])
        if self.max_samples is not None:
            check_positive(f"{p}max_samples", self.max_samples, integer=True)
        if "{problem}" not in self.prompt_template:
            raise ConfigError(f"{p}prompt_template={self.prompt_template!r} must contain {{problem}}")


@dataclasses.dataclass
class RolloutConfig:
    """Sampling and the rollout engine.

    Attributes:
        engine: ``vllm`` (colocated vLLM ``LLM`` per rank) or ``hf`` (transformers ``generate``, for debugging).
        n: responses per prompt (the group size G), at least 2: group-relative advantages compare a response with
            the others of its group (a group of one gets advantage 0, so nothing would be learned).
        temperature: sampling temperature (> 0); the trainer's log-probs and entropies use the same value.
        top_p, top_k: nucleus / top-k filtering (top_k = -1 disables it).
        max_response_length: max new tokens per response.
        dtype: engine dtype; ``auto`` = bf16 if ``deepspeed.precision`` is bf16 else float32.
        gpu_memory_utilization: vLLM's fraction of GPU memory (ignored on CPU; the KV cache size there comes from
            ``VLLM_CPU_KVCACHE_SPACE`` GiB).
        tensor_parallel_size: vLLM tensor-parallel group size (inside one node; divides the world size).
        enforce_eager: disable CUDA graphs / compilation (always on for CPU).
        enable_sleep_mode: free vLLM's memory from the end of generation to the next weight sync (GPU only;
            ignored on CPU; order in :mod:`trainer.engines.memory`).
        sleep_level: vLLM sleep level: 1 backs the engine's weights up in host memory (``weights / tp`` pinned
            per rank), 2 drops them (the sync reloads every weight; less host memory).
        max_num_seqs: vLLM's max concurrent sequences.
        sync_bucket_mb: size of the buckets in which ZeRO-3 parameters are gathered for the weight sync (MiB).
        stop: extra stop strings.
    """

    engine: str = "vllm"
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_length: int = 3072
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    enable_sleep_mode: bool = True
    sleep_level: int = 1
    max_num_seqs: int = 256
    sync_bucket_mb: float = 512.0
    stop: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        p = _p(config_prefix("rollout"))
        check_choice(f"{p}engine", self.engine, ["vllm", "hf"])
        check_positive(f"{p}n", self.n, integer=True)
        if self.n < 2:
            raise ConfigError(f"{p}n={self.n} is below 2: group-relative advantages need at least 2 responses per "
                              f"prompt (a group of one gets advantage 0 and no gradient)")
        check_range(f"{p}temperature", self.temperature, 0, None, lo_open=True)
        check_range(f"{p}top_p", self.top_p, 0, 1, lo_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise ConfigError(f"{p}top_k={self.top_k} must be -1 (off) or a positive integer")
        check_positive(f"{p}max_response_length", self.max_response_length, integer=True)
        check_choice(f"{p}dtype", self.dtype, ["auto", "float32", "bfloat16", "float16"])
        check_range(f"{p}gpu_memory_utilization", self.gpu_memory_utilization, 0, 1, lo_open=True)
        check_positive(f"{p}tensor_parallel_size", self.tensor_parallel_size, integer=True)
        check_positive(f"{p}max_num_seqs", self.max_num_seqs, integer=True)
        check_choice(f"{p}sleep_level", self.sleep_level, [1, 2])
        check_range(f"{p}sync_bucket_mb", self.sync_bucket_mb, 0, None, lo_open=True)


@dataclasses.dataclass
class AlgorithmConfig:
    """Advantages, dynamic sampling, truncation handling (docs/theory.md §3).

    Attributes:
        advantage_estimator: ``grpo``, ``dr_grpo``, ``rloo`` or ``qae`` (``stare_lab.loss.advantages``).
        adv_eps: ε of the GRPO std normalisation.
        quantile_k: K of QAE.
        dynamic_sampling: keep only groups with non-zero reward variance (DAPO), regenerating up to
            ``max_gen_rounds`` rounds to fill the batch; then continue with what was kept (logged).
        max_gen_rounds: bound on generation rounds per step (≥ 1). Never an endless loop.
        overlong: responses cut by ``max_response_length`` (finish reason ``length``): ``keep`` them with their
            reward, or ``mask`` them out of the loss (their tokens get response_mask 0).
        overlong_buffer_len: DAPO soft overlong penalty: responses longer than ``max_response_length −
            overlong_buffer_len`` lose reward linearly up to ``overlong_penalty_factor`` (0 = off).
        overlong_penalty_factor: maximal soft overlong penalty (reward units).
    """

    advantage_estimator: str = "grpo"
    adv_eps: float = 1e-6
    quantile_k: float = 0.4
    dynamic_sampling: bool = False
    max_gen_rounds: int = 3
    overlong: str = "keep"
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 0.0

    def __post_init__(self) -> None:
        p = _p(config_prefix("algorithm"))
        check_choice(f"{p}advantage_estimator", self.advantage_estimator, ["grpo", "dr_grpo", "rloo", "qae"])
        check_range(f"{p}adv_eps", self.adv_eps, 0, None)
        check_range(f"{p}quantile_k", self.quantile_k, 0, 1)
        check_positive(f"{p}max_gen_rounds", self.max_gen_rounds, integer=True)
        check_choice(f"{p}overlong", self.overlong, ["keep", "mask"])
        check_positive(f"{p}overlong_buffer_len", self.overlong_buffer_len, integer=True, allow_zero=True)
        check_range(f"{p}overlong_penalty_factor", self.overlong_penalty_factor, 0, None)


@dataclasses.dataclass
class RewardConfig:
    """Reward function of the rollouts.

    Attributes:
        kind: ``math`` (math-verify on the last ``\\boxed{}``: 1 if right else 0; the default for the math
            benchmarks) or ``gsm8k-lenient`` (also accepts the last number in the response — for demos with
            weak models; never the default).
        format_reward: added when the response contains a ``\\boxed{}`` (0 = off; demos only).
        timeout_s: grading timeout per response, seconds (enforced in the main thread).
        on_error: a grader that raises: ``zero`` (reward 0, logged and counted) or ``raise``.
    """

    kind: str = "math"
    format_reward: float = 0.0
    timeout_s: float = 5.0
    on_error: str = "zero"

    def __post_init__(self) -> None:
        p = _p(config_prefix("reward"))
        check_choice(f"{p}kind", self.kind, ["math", "gsm8k-lenient"])
        check_range(f"{p}format_reward", self.format_reward, 0, None)
        check_range(f"{p}timeout_s", self.timeout_s, 0, None, lo_open=True)
        check_choice(f"{p}on_error", self.on_error, ["zero", "raise"])


@dataclasses.dataclass
class OptimConfig:
    """Optimisation.

    Attributes:
        lr: learning rate (paper: 1e-6 constant).
        schedule: ``constant``, ``linear`` (decay to 0 at ``schedule.total_steps``) or ``cosine``.
        warmup_steps: linear warm-up steps.
        weight_decay, betas, eps: AdamW settings.
        grad_clip: global grad-norm clip (0 = off).
        train_batch_size: prompts per step, global over all ranks (each gives ``rollout.n`` responses).
        micro_batch_max_tokens: token budget of one packed micro-batch (prompt + response tokens, per rank).
        optimizer: ``torch_adamw`` (client ``torch.optim.AdamW``; no op build) or ``deepspeed_adamw``
            (DeepSpeed's fused/CPU Adam; builds an op on first use).
        fuse_old_logprob: when every rank's step batch fits ONE micro-batch (and the model has no dropout), the
            old-log-prob forward keeps its graph and the update backpropagates through it instead of a second
            forward of the same rows: the same numbers (the parameters have not moved yet; tested bit for bit), one
            forward less per step. Off: two forwards, as with several micro-batches.
    """

    lr: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    grad_clip: float = 1.0
    train_batch_size: int = 64
    micro_batch_max_tokens: int = 16384
    optimizer: str = "torch_adamw"
    fuse_old_logprob: bool = True

    def __post_init__(self) -> None:
        p = _p(config_prefix("optim"))
        check_range(f"{p}lr", self.lr, 0, None)
        check_choice(f"{p}schedule", self.schedule, ["constant", "linear", "cosine"])
        check_positive(f"{p}warmup_steps", self.warmup_steps, integer=True, allow_zero=True)
        check_range(f"{p}weight_decay", self.weight_decay, 0, None)
        if len(self.betas) != 2:
            raise ConfigError(f"{p}betas={self.betas} must be two numbers")
        for i, b in enumerate(self.betas):
            check_range(f"{p}betas[{i}]", b, 0, 1, hi_open=True)
        check_range(f"{p}eps", self.eps, 0, None, lo_open=True)
        check_range(f"{p}grad_clip", self.grad_clip, 0, None)
        check_positive(f"{p}train_batch_size", self.train_batch_size, integer=True)
        check_positive(f"{p}micro_batch_max_tokens", self.micro_batch_max_tokens, integer=True)
        check_choice(f"{p}optimizer", self.optimizer, ["torch_adamw", "deepspeed_adamw"])


@dataclasses.dataclass
class DeepSpeedConfig:
    """DeepSpeed settings; :func:`trainer.engines.launch.deepspeed_json` turns them into the DeepSpeed JSON.

    Attributes:
        zero_stage: 0, 1, 2 or 3.
        single_process_stage: the ZeRO stage used instead of ``zero_stage`` when the run has ONE process (world
            size 1), no offload is set and no ``config_file`` is given (:func:`trainer.engines.launch.effective_zero_stage`):
            ZeRO over one rank partitions nothing — the memory is the same — while ZeRO-3's parameter hooks cost
            time in every forward and backward (docs/benchmarks.md, trainer step). ``null``: always ``zero_stage``.
        precision: ``bf16``, ``fp16`` or ``fp32``.
        offload_optimizer, offload_param: ZeRO-Offload of optimizer states / parameters (ZeRO-3) to CPU.
        offload_during_rollout: GPU only: move the optimizer states, fp32 master weights and gradient buffers to
            host memory while the rollout engine generates, and back for the update (DeepSpeed
            ``offload_states``/``reload_states``; needs ZeRO-3 and ``optim.optimizer=deepspeed_adamw``, whose
            FusedAdam is the optimizer DeepSpeed can offload; :mod:`trainer.engines.memory`).
        config_file: a DeepSpeed JSON to start from instead of the generated one (the trainer still sets batch
            sizes and gradient clipping).
        overrides: mapping merged (recursively) into the generated JSON last, e.g.
            ``{"zero_optimization": {"reduce_bucket_size": 5e7}}``.
    """

    zero_stage: int = 3
    single_process_stage: int | None = 0
    precision: str = "bf16"
    offload_optimizer: bool = False
    offload_param: bool = False
    offload_during_rollout: bool = False
    config_file: str | None = None
    overrides: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        p = _p(config_prefix("deepspeed"))
        check_choice(f"{p}zero_stage", self.zero_stage, [0, 1, 2, 3])
        if self.single_process_stage is not None:
            check_choice(f"{p}single_process_stage", self.single_process_stage, [0, 1, 2, 3])
        check_choice(f"{p}precision", self.precision, ["bf16", "fp16", "fp32"])
        if self.offload_param and self.zero_stage != 3:
            raise ConfigError(f"{p}offload_param=true needs {p}zero_stage=3, got {self.zero_stage}")
        if self.offload_during_rollout and (self.zero_stage != 3 or self.offload_optimizer or self.offload_param):
            raise ConfigError(f"{p}offload_during_rollout=true needs {p}zero_stage=3 without {p}offload_optimizer / "
                              f"{p}offload_param (those keep the states on the host already)")


@dataclasses.dataclass
class ScheduleConfig:
    """Run length and periodic actions (all in steps; 0 = never).

    Attributes:
        total_steps: optimizer steps to run.
        save_freq: checkpoint every N steps (and at the end).
        keep_checkpoints: how many checkpoints to keep (oldest deleted).
        eval_freq: evaluate every N steps and at the last step (needs ``eval_config``), with the rollout engine
            right after the sync (``trainer.evaluation.evaluate.evaluate_engine``); metrics ``eval/...`` in the same row.
        eval_config: YAML of :class:`trainer.evaluation.evaluate.EvalConfig` (``None`` = no periodic evaluation).
        resume: ``never`` (default: refuse an ``out_dir`` that holds a run — ``stare-lab train --resume`` /
            ``--overwrite`` choose), ``auto`` (continue the run there if any, from its latest complete checkpoint or,
            interrupted before the first one, from step 0; e.g. a job that is requeued) or ``must`` (as ``auto``,
            but fail if there is no run to continue). A continued run's config must agree with its ``config.yaml``
            on :data:`trainer.run.preflight.RESUME_KEYS`.
        tensorboard: also log scalars to ``out_dir/tensorboard``.
        wandb_project: log to Weights & Biases under this project (``None`` = off).
        progress_bar: tqdm progress bar on rank 0.
        measure_entropy_change: log the measured ``entropy_change`` = token-mean entropy (nats) on the step's batch
            after the update minus before (same tokens, masks and temperature; docs/design.md §4; one extra no-grad
            forward, ``time/entropy_after_s``), and the first-order predictions of :mod:`trainer.step.prediction`:
            ``pred_entropy_change`` (∇θH̄·Δθ) and ``pred/d_grpo``, ``pred/d_lplus`` (``pred/d_lminus`` for C2) —
            one extra backward and one forward-mode pass per step on ZeRO 0–2, one backward per term on ZeRO-3
            (``time/predict_s``), plus the probe's ``pred/d_ratio``, ``pred/lplus_above_sstar`` and ``pred/w_star``.
            Off: all of them are null.
        probe_only: run the steps WITHOUT applying updates: each step samples a batch at the (unchanged) weights
            and logs the probe's entries (those of ``measure_entropy_change`` except the measured
            ``entropy_change``), with P of the first Adam step the batch's gradient would make (the run starts from
            ``model.path`` with a fresh optimizer; :mod:`trainer.step.prediction`) — to measure a checkpoint near a
            target entropy. No checkpoint and no ``final_model`` are written; ``out_dir`` must not hold a run. The
            run directory is read by ``stare-lab calibrate``.
        probe_tangent: how the probe (ZeRO 0–2) gets the logits' derivative along its direction (docs/trainer.md):
            ``graph`` = one backward through the ∇θH̄ backward's kept graph (one micro-batch per rank; cheaper, but
            the kept graph holds about 4× the micro-batch's activation memory through the update), ``jvp`` = a
            forward-mode pass, ``auto`` (default) = ``graph`` for models of at most
            :data:`trainer.step.prediction.GRAPH_TANGENT_MAX_PARAMS` parameters, else ``jvp``.
    """

    total_steps: int = 100
    save_freq: int = 20
    keep_checkpoints: int = 2
    eval_freq: int = 0
    eval_config: str | None = None
    resume: str = "never"
    tensorboard: bool = False
    wandb_project: str | None = None
    progress_bar: bool = True
    measure_entropy_change: bool = False
    probe_only: bool = False
    probe_tangent: str = "auto"

    def __post_init__(self) -> None:
        p = _p(config_prefix("schedule"))
        check_choice(f"{p}probe_tangent", self.probe_tangent, ["auto", "graph", "jvp"])
        check_positive(f"{p}total_steps", self.total_steps, integer=True)
        check_positive(f"{p}save_freq", self.save_freq, integer=True, allow_zero=True)
        check_positive(f"{p}keep_checkpoints", self.keep_checkpoints, integer=True)
        check_positive(f"{p}eval_freq", self.eval_freq, integer=True, allow_zero=True)
        check_choice(f"{p}resume", self.resume, ["auto", "never", "must"])


@dataclasses.dataclass
class TrainerConfig:
    """The whole trainer config (written resolved into the run's ``config.yaml``).

    Attributes:
        method: label of the method, written into the run's ``config.yaml`` and used by every report. ``None``
            (default): derived from the loss config and ``algorithm.dynamic_sampling`` (:func:`derive_method`). A
            given label must be a key of :data:`METHODS` that the config matches (e.g. ``o1`` needs
            ``loss.loss_mode=stare``, variant O1), so a typo cannot mislabel a run; ``custom:NAME`` is a free label
            for a setup outside the table. A method given in the YAML or as an override also fills in the loss settings
            it implies that the config leaves out (:func:`load_trainer_config`).
        plugins: modules (names, or paths to ``.py`` files) imported before the method and the loss are resolved
            (:mod:`stare_lab.platform.plugins`): a loss and method registered outside the package, on every rank.
        seed: the run's seed: data order, sampling and initialisation of everything random derive from it.
        out_dir: run directory (``metrics.jsonl``, ``config.yaml``, ``checkpoint/``).
        source: always ``trainer`` (run-directory convention).
        tool: multi-turn tool use (:class:`trainer.tools.tool_rollout.ToolUseConfig`; a mapping is converted on
            construction); ``None`` (default) = plain single-turn rollouts. When set, the rollout engine is wrapped
            in :class:`trainer.tools.tool_rollout.ToolUseEngine`: the policy's code blocks run in the sandbox and their
            output is appended as interpreter turns, which are masked out of the loss, the entropy statistics and
            the STARE selection; ``rollout.max_response_length`` is the budget of model + interpreter tokens.
    """

    method: str | None = None
    plugins: list[str] = dataclasses.field(default_factory=list)
    seed: int = 0
    out_dir: str = "runs/train"
    source: str = "trainer"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = dataclasses.field(default_factory=DeepSpeedConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    # a ToolUseConfig or None; typed ``Any`` and converted in __post_init__ (trainer.tools.config is imported here)
    tool: Any = None

    def __post_init__(self) -> None:
        p = _p(config_prefix(""))
        if isinstance(self.tool, Mapping):
            self.tool = from_dict(ToolUseConfig, self.tool, prefix=f"{p}tool")
        elif self.tool is not None and not isinstance(self.tool, ToolUseConfig):
            raise ConfigError(f"{p}tool={self.tool!r} must be a mapping of ToolUseConfig fields or null")
        check_choice(f"{p}source", self.source, ["trainer"])
        _load_config_plugins(self.plugins, f"{p}plugins")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"{p}seed={self.seed} must be a non-negative integer")
        derived = derive_method(self.loss, self.algorithm.dynamic_sampling)
        if self.method is None:
            self.method = derived
        elif not isinstance(self.method, str) or not (self.method in _METHODS or self.method.startswith("custom:")
                                                        and len(self.method) > len("custom:")):
            raise ConfigError(
                f"{p}method={self.method!r} is not a known method ({', '.join(_METHODS)}); the loss settings amount to "
                f"{derived!r}: omit {p}method to use that, or write custom:NAME for a setup of your own")
        check_method(self.method, self.loss, dynamic_sampling=self.algorithm.dynamic_sampling,
                     prefix=config_prefix(""))

    def require_model_and_data(self) -> None:
        """Check what a real run needs (not needed to build a config): a model directory and data files.

        Raises:
            ConfigError: if ``model.path`` is empty or not a directory, or ``data.train_files`` is empty or names a
                missing file.
        """
        if not self.model.path:
            raise ConfigError("model.path is empty; set it to a local Hugging Face model directory")
        if not Path(self.model.path).is_dir():
            raise ConfigError(f"model.path={self.model.path!r} is not a directory")
        if not self.data.train_files:
            raise ConfigError("data.train_files is empty; give at least one JSONL/Parquet file")
        for i, f in enumerate(self.data.train_files):
            if not f.startswith("hf:") and not Path(f).is_file():
                raise ConfigError(f"data.train_files[{i}]={f!r} does not exist")

    def to_dict(self) -> dict[str, Any]:
        """The config as plain dicts (what goes into ``config.yaml``)."""
        return to_dict(self)


def derive_method(loss: LossConfig, dynamic_sampling: bool) -> str:
    """The method label a loss config and the dynamic-sampling switch amount to: the most specific entry of
    :data:`METHODS` they satisfy (``grpo`` + dynamic sampling → ``grpo-ds``; ``grpo`` with
    ``entropy_coeff > 0`` → ``entropy_bonus``; ``stare`` O1 adaptive → ``o1-adaptive``), or ``custom:<loss_mode>`` for a
    loss outside the table."""
    best, best_score = None, -1
    for name, spec in _METHODS.items():
        want = spec["loss"]
        if loss.loss_mode != want["loss_mode"]:
            continue
        if any(getattr(loss.stare, k) != v for k, v in want.get("stare", {}).items()):
            continue
        if spec["dynamic_sampling"] and not dynamic_sampling:
            continue
        if spec.get("entropy_bonus") and loss.entropy_coeff <= 0:
            continue
        score = len(want.get("stare", {})) + int(spec["dynamic_sampling"]) + int(bool(spec.get("entropy_bonus")))
        if score > best_score:
            best, best_score = name, score
    return best if best is not None else f"custom:{loss.loss_mode}"


def _load_config_plugins(plugins: Any, key: str) -> None:
    if not isinstance(plugins, list) or not all(isinstance(n, str) and n.strip() for n in plugins):
        raise ConfigError(f"{key}={plugins!r} must be a list of module names or .py paths, e.g. {key}=[my_loss.py]")
    load_plugins(plugins)


def fill_method(data: dict[str, Any]) -> dict[str, Any]:
    """What ``data["method"]`` implies, filled into the raw config mapping where it says nothing: ``loss.loss_mode``,
    the ``loss.stare`` keys the method fixes and, for a method that needs it, ``algorithm.dynamic_sampling: true``
    (:data:`METHODS`). Keys the mapping gives are kept (:class:`TrainerConfig` then checks they agree); no method,
    an unknown one or a ``custom:`` label changes nothing. Returns ``data`` (changed in place)."""
    method = data.get("method")
    if not isinstance(method, str) or method not in _METHODS:
        return data
    spec = method_overrides(method)
    loss = data.setdefault("loss", {})
    if not isinstance(loss, dict):
        return data  # not a mapping: from_dict names the error
    loss.setdefault("loss_mode", spec["loss"]["loss_mode"])
    if spec["loss"].get("stare"):
        stare = loss.setdefault("stare", {})
        if isinstance(stare, dict):
            for key, value in spec["loss"]["stare"].items():
                stare.setdefault(key, value)
    algorithm = data.setdefault("algorithm", {})
    if spec["dynamic_sampling"] and isinstance(algorithm, dict):
        algorithm.setdefault("dynamic_sampling", True)
    return data


def load_trainer_config(
    path: str | Path | Mapping[str, Any] | None, overrides: Iterable[str] = ()
) -> TrainerConfig:
    """Load a :class:`TrainerConfig` from YAML (or a mapping / ``None`` for defaults) plus dotted overrides: the
    ``plugins`` are imported first, then what ``method`` implies is filled in (:func:`fill_method`), then the whole
    config is built and validated. A ``versions`` block in the file (what a run's ``config.yaml`` records) is
    ignored, so a run's config is reusable as is.

    Raises:
        ConfigError: missing/invalid file, unknown key, wrong type or out-of-range value (naming the dotted key), a
            method the loss settings contradict; :class:`~stare_lab.platform.plugins.PluginError` for a plugin that fails to
            import.
    """
    data = config_data(path)
    # a run's config.yaml carries the provenance block RunWriter adds (stare_lab.platform.runs.versions); it is no setting,
    # so the file loads back as the run's config (an override of it is still an unknown key)
    data.pop("versions", None)
    data = apply_overrides(data, overrides)
    if "plugins" in data:
        _load_config_plugins(data["plugins"], "plugins")
    return from_dict(TrainerConfig, fill_method(data))

