"""Checks a training run makes before it builds anything expensive (model, DeepSpeed op, vLLM engine).

Each raises one clear :class:`~stare_lab.errors.StareLabError` line naming the option, the value and what is
allowed, so ``stare-lab train`` fails in a second instead of after minutes or with a library traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError, RunError

__all__ = ["check_lengths", "load_eval_config",
           "check_resume_compatible", "check_training", "gpu_cluster", "RESUME_KEYS"]

#: Config keys (dotted) that must not change when a run directory is resumed: the data order, the sampled groups
#: and the loss would otherwise silently mix two experiments in one metrics.jsonl. ``schedule.*`` (e.g. a larger
#: ``total_steps`` to extend a run), evaluation and logging settings may change.
RESUME_KEYS = ("method", "seed", "model.path", "data.train_files", "data.prompt_key", "data.answer_key",
               "data.max_samples", "data.answer_pattern", "data.shuffle", "rollout.n", "optim.train_batch_size",
               "loss")


def check_lengths(cfg: Any, model_max: int | None, eval_cfg: Any = None) -> None:
    """Prompt + response budgets must fit the model's positions and the rollout engine.

    The rollout engine is built with ``max_model_len = data.max_prompt_length + rollout.max_response_length``
    (:func:`trainer.engines.rollout.make_engine`), and the periodic evaluation runs on that engine, so its
    ``max_prompt_length + max_tokens`` must fit too.

    Raises:
        ConfigError: a budget above ``model_max`` (the model's ``max_position_embeddings``) or, for the evaluation,
            above the engine's ``max_model_len``; the message names the keys and the numbers.
    """
    train_len = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    if model_max is not None and train_len > model_max:
        raise ConfigError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + rollout.max_response_length="
            f"{cfg.rollout.max_response_length} = {train_len} exceeds the model's max_position_embeddings="
            f"{model_max} ({cfg.model.path}); lower one of them")
    if eval_cfg is None:
        return
    eval_len = eval_cfg.max_prompt_length + eval_cfg.max_tokens
    src = cfg.schedule.eval_config
    if model_max is not None and eval_len > model_max:
        raise ConfigError(
            f"schedule.eval_config {src}: max_prompt_length={eval_cfg.max_prompt_length} + max_tokens="
            f"{eval_cfg.max_tokens} = {eval_len} exceeds the model's max_position_embeddings={model_max}; "
            "lower one of them")
    if cfg.rollout.engine == "vllm" and eval_len > train_len:
        raise ConfigError(
            f"schedule.eval_config {src}: max_prompt_length={eval_cfg.max_prompt_length} + max_tokens="
            f"{eval_cfg.max_tokens} = {eval_len} exceeds the rollout engine's max_model_len={train_len} "
            f"(data.max_prompt_length + rollout.max_response_length), which the periodic evaluation uses; "
            "lower the evaluation's lengths or raise the training ones")


def load_eval_config(cfg: Any) -> Any:
    """The periodic evaluation's :class:`trainer.evaluation.evaluate.EvalConfig` (``None`` when evaluation is off), with its
    benchmark problems loadable (checked now, so a missing benchmark file fails before training, not at step N).

    Raises:
        ConfigError: ``schedule.eval_config`` missing or invalid (keys named ``eval.…``).
        DataError: a benchmark's data cannot be read.
    """
    s = cfg.schedule
    if not (s.eval_freq and s.eval_config):
        return None
    from stare_lab.config import from_dict, load_yaml

    from trainer.evaluation.evaluate import EvalConfig, load_problems

    if not Path(s.eval_config).is_file():
        raise ConfigError(f"schedule.eval_config={s.eval_config!r} does not exist")
    ecfg = from_dict(EvalConfig, load_yaml(s.eval_config), prefix="eval")
    for name in ecfg.benchmarks:
        load_problems(ecfg, name)
    return ecfg


def _get(d: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _norm(key: str, value: Any) -> Any:
    if key == "data.train_files" and isinstance(value, list):
        return [v if str(v).startswith("hf:") else str(Path(v).resolve()) for v in value]
    if key == "model.path" and value:
        return str(Path(value).resolve())
    return value


def check_resume_compatible(out: str | Path, cfg: Any) -> None:
    """On resume, the run directory's ``config.yaml`` must agree with ``cfg`` on :data:`RESUME_KEYS` (file paths
    compared resolved).

    Raises:
        ConfigError: a key differs; the message names it, both values and what to do.
    """
    from stare_lab.platform.files import read_yaml

    path = Path(out) / "config.yaml"
    if not path.is_file():
        return
    old = read_yaml(path, "the run's config", RunError)
    new = cfg.to_dict()
    for key in RESUME_KEYS:
        diff = _first_diff(key, _norm(key, _get(old, key)), _norm(key, _get(new, key)))
        if diff is not None:
            k, a, b = diff
            raise ConfigError(
                f"{str(out)!r} holds a run with {k}={a!r}, this config has {k}={b!r}; resuming would mix two "
                "experiments: use another out_dir (or the same settings)")


def _first_diff(key: str, a: Any, b: Any) -> tuple[str, Any, Any] | None:
    """The first differing leaf ``(dotted key, a, b)`` of two config values, or None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_diff(f"{key}.{k}", a.get(k), b.get(k))
            if d is not None:
                return d
        return None
    return None if a == b else (key, a, b)


def gpu_cluster() -> Any:
    """The :class:`trainer.planning.plan.Cluster` this process runs in (GPU only): nodes and GPUs per node from the
    launcher's ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` (1 process: one GPU), memory from the device. ``None`` on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    from trainer.planning.plan import Cluster

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(min(world, torch.cuda.device_count()))))
    mem = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30
    return Cluster(nodes=max(1, world // max(local, 1)), gpus_per_node=max(local, 1), gpu_memory_gib=mem)


def check_training(cfg: Any) -> None:
    """Settings that cannot work together, checked before anything is built; on a GPU also the memory plan.

    - TIS with a filtered sampling support (:func:`trainer.step.importance.check_importance_config`);
    - ``deepspeed.offload_during_rollout`` needs DeepSpeed's FusedAdam (``optim.optimizer=deepspeed_adamw``):
      DeepSpeed offloads the optimizer states of that optimizer only;
    - on a GPU, :func:`trainer.planning.plan.check_fits` for the job's cluster (skipped with ``STARE_LAB_SKIP_PLAN=1``);
      on CPU the plan (a GPU model) is not applied.

    Raises:
        ConfigError: one of the above, with the plan's line for a run that cannot fit.
    """
    from trainer.step.importance import check_importance_config

    check_importance_config(cfg)
    if cfg.deepspeed.offload_during_rollout and cfg.optim.optimizer != "deepspeed_adamw":
        raise ConfigError("deepspeed.offload_during_rollout=true needs optim.optimizer=deepspeed_adamw (DeepSpeed "
                          f"offloads the states of its FusedAdam only), got optim.optimizer={cfg.optim.optimizer}")
    cluster = gpu_cluster()
    if cluster is not None and os.environ.get("STARE_LAB_SKIP_PLAN") != "1":
        from trainer.planning.plan import check_fits

        check_fits(cfg, cluster)
