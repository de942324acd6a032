"""Process setup: environment defaults, torch.distributed init (torchrun / deepspeed launcher / one process), and
the generated DeepSpeed JSON.

Launch (see ``docs/trainer.md``): one process ``stare-lab train CFG``; one node ``torchrun --nproc_per_node 8 -m
trainer.cli CFG``; N nodes ``torchrun --nnodes N --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:PORT``
(or ``deepspeed --hostfile hosts``). Nothing here assumes one node: ranks come from ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import socket
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["DistInfo", "close_distributed", "cpu_env_defaults", "extensions_dir", "init_distributed", "deepspeed_json",
           "effective_zero_stage"]


@dataclasses.dataclass
class DistInfo:
    """Rank layout: global ``rank``/``world_size``, ``local_rank``, tensor-parallel size ``tp`` and the derived
    data-parallel coordinates (``dp_rank = rank // tp``, ``dp_size = world_size // tp``; ``tp_rank = rank % tp``)."""

    rank: int
    world_size: int
    local_rank: int
    tp: int = 1

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def extensions_dir() -> Path:
    """The fixed cache of DeepSpeed's compiled ops (``TORCH_EXTENSIONS_DIR`` unless set): ``<venv>/torch_extensions``
    in a virtual environment (``sys.prefix``, the same whether or not it is activated, and what the Makefile
    exports), else ``$XDG_CACHE_HOME/stare_lab/torch_extensions`` (default ``~/.cache``). One directory per
    environment, so an op builds once and every later command — under ``make``, after ``. .venv/bin/activate`` or
    via ``.venv/bin/stare-lab`` — reuses it."""
    import sys

    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "torch_extensions"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "stare_lab" / "torch_extensions"


def _venv_tools_first() -> None:
    """Put this interpreter's ``bin`` folder first on ``PATH`` (as ``activate`` does), so that the tools the ops are
    built with — ``ninja`` above all — are the environment's own whether or not it is activated. Two ninja versions
    (the venv's and the system's) write incompatible build logs, and each run under the other one rebuilt the op
    (measured: 60-170 s per command, alternating ``make`` and activated runs)."""
    import sys

    bin_dir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *[p for p in parts if p != bin_dir]])


def cpu_env_defaults() -> None:
    """Set (``setdefault``) the environment the trainer needs (the Makefile exports the same): one OpenMP thread
    (:func:`stare_lab.platform.threads.set_thread_defaults`), a fixed op-build cache (:func:`extensions_dir`) built with the
    environment's own tools (its ``bin`` first on ``PATH``), offline hub, in-process vLLM; on CPU also DeepSpeed's
    CPU accelerator and a 1 GiB vLLM KV cache."""
    from stare_lab.platform.threads import set_thread_defaults

    set_thread_defaults()  # before torch is imported where this runs first
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    _venv_tools_first()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(tp: int = 1) -> DistInfo:
    """Initialise torch.distributed (gloo on CPU, nccl on GPU) from the launcher's env; for a plain single process
    set ``RANK=0 WORLD_SIZE=1`` and a free ``MASTER_PORT`` first (DeepSpeed needs a process group even then).

    Raises:
        ConfigError: if ``tp`` does not divide the world size.
    """
    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if world % tp:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} does not divide the world size {world}")
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local, tp=tp)


def close_distributed() -> None:
    """Destroy the process groups if any are up (a no-op otherwise). Called once a rank's work is done: a gloo
    group left to the interpreter's exit can abort the process (``terminate called without an active exception``,
    exit -6) after every result is written. vLLM's groups go first, through vLLM's own teardown (its exit hook then
    finds nothing left to destroy; destroying the default group under it would make that hook raise)."""
    import sys

    import torch.distributed as dist

    vllm_state = sys.modules.get("vllm.distributed.parallel_state")
    if vllm_state is not None:
        vllm_state.destroy_model_parallel()
        vllm_state.destroy_distributed_environment()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def effective_zero_stage(ds: Any, world_size: int) -> int:
    """The ZeRO stage a run uses: ``ds.single_process_stage`` on one process without offload (ZeRO over one rank
    partitions nothing; see :class:`trainer.config.DeepSpeedConfig`), else ``ds.zero_stage``."""
    offload = ds.offload_optimizer or ds.offload_param or ds.offload_during_rollout
    if world_size == 1 and ds.single_process_stage is not None and not offload:
        return int(ds.single_process_stage)
    return int(ds.zero_stage)


def deepspeed_json(cfg: Any, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config for a :class:`trainer.config.TrainerConfig`.

    Gradient accumulation is caller-owned (``managed_gradient_accumulation: false``, GAS 1): the trainer runs a
    variable number of packed micro-batches per step, calls ``backward`` on each and ``step`` once. The batch sizes
    below are nominal (DeepSpeed needs them; they don't drive the loop). ``deepspeed.config_file`` is the base if
    given, ``deepspeed.overrides`` are merged last.

    Raises:
        ConfigError: if ``deepspeed.config_file`` is missing or not JSON.
    """
    ds = cfg.deepspeed
    if ds.config_file:
        from stare_lab.platform.files import read_json

        p = Path(ds.config_file)
        if not p.is_file():
            raise ConfigError(f"deepspeed.config_file={ds.config_file!r} does not exist")
        base = read_json(p, "deepspeed.config_file", ConfigError)  # UTF-8 JSON, or one line with file:line
        if not isinstance(base, dict):
            raise ConfigError(f"deepspeed.config_file={ds.config_file!r} must hold a JSON object")
    else:
        stage = effective_zero_stage(ds, world_size)
        if stage != ds.zero_stage:
            logger.info("one process: ZeRO stage %d instead of deepspeed.zero_stage=%d "
                        "(deepspeed.single_process_stage)", stage, ds.zero_stage)
        zero: dict[str, Any] = {"stage": stage}
        if stage == 3:
            zero.update(
                stage3_gather_16bit_weights_on_model_save=True,
                stage3_param_persistence_threshold=0,
                overlap_comm=False,
            )
        if ds.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if ds.offload_param:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        base = {"zero_optimization": zero, "steps_per_print": 10**9, "wall_clock_breakdown": False}
        if ds.precision == "bf16":
            base["bf16"] = {"enabled": True}
        elif ds.precision == "fp16":
            base["fp16"] = {"enabled": True, "initial_scale_power": 16}
    base = copy.deepcopy(base)
    base.update(
        train_micro_batch_size_per_gpu=1,
        gradient_accumulation_steps=1,
        train_batch_size=world_size,
        managed_gradient_accumulation=False,
        gradient_clipping=float(cfg.optim.grad_clip),
    )
    return _merge(base, copy.deepcopy(dict(ds.overrides)))
