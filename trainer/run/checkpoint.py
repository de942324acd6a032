"""Checkpoint and resume: ``OUT/checkpoint/step_<N>/`` holds the DeepSpeed state (model partitions, optimizer,
LR scheduler), an HF export (``hf/``: consolidated on rank 0 only, streamed shard by shard from bucketed ZeRO-3
gathers, :meth:`trainer.engines.policy.PolicyEngine.save_hf` / :func:`trainer.engines.weights.write_hf_shards`) and ``trainer_state.json`` (step,
data cursor, STARE controller); each rank's RNG states go to ``rng_rank<R>.pt``. ``OUT/checkpoint/latest_complete``
names the last *complete* checkpoint (written after a barrier once every rank has saved), so a kill mid-save
resumes from the previous one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stare_lab.errors import RunError


logger = logging.getLogger(__name__)

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "rng_state", "set_rng_state",
           "load_rng"]

LATEST = "latest_complete"
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and, if present, CUDA) RNG states of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_checkpoint(ckpt_root: str | Path, step: int, policy: Any, trainer_state: dict[str, Any],
                    tokenizer: Any = None, keep: int = 2) -> Path:
    """Save everything needed to resume after ``step`` (collective: every rank calls it).

    Raises:
        RunError: if the directory cannot be written.
    """
    root = Path(ckpt_root)
    tag = f"step_{step}"
    path = root / tag
    rank = policy.dist.rank
    try:
        root.mkdir(parents=True, exist_ok=True)
        policy.engine.save_checkpoint(str(root), tag=tag, client_state={"step": step})
        policy.save_hf(path / "hf", tokenizer)
        torch.save(rng_state(), path / f"rng_rank{rank}.pt")
        if policy.dist.is_main:
            tmp = path / "trainer_state.json.tmp"
            tmp.write_text(json.dumps(trainer_state, indent=1))
            os.replace(tmp, path / "trainer_state.json")
        _barrier()
        if policy.dist.is_main:
            tmp = root / (LATEST + ".tmp")
            tmp.write_text(tag)
            os.replace(tmp, root / LATEST)
            steps = sorted(int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit())
            for old in steps[:-keep] if keep > 0 else []:
                shutil.rmtree(root / f"step_{old}", ignore_errors=True)
        _barrier()
    except OSError as err:
        raise RunError(f"cannot write checkpoint {str(path)!r}: {err}") from None
    logger.info("checkpoint saved: %s", path)
    return path


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    """The last complete checkpoint directory under ``ckpt_root``, or None."""
    marker = Path(ckpt_root) / LATEST
    if not marker.is_file():
        return None
    path = Path(ckpt_root) / marker.read_text().strip()
    return path if (path / "trainer_state.json").is_file() else None


def load_checkpoint(path: str | Path, policy: Any) -> dict[str, Any]:
    """Load the DeepSpeed state (model, optimizer, scheduler) and this rank's RNG; return ``trainer_state``.

    Raises:
        RunError: if the checkpoint is incomplete or DeepSpeed cannot load it.
    """
    path = Path(path)
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        raise RunError(f"checkpoint {str(path)!r} has no trainer_state.json (incomplete save?)")
    loaded, _ = policy.engine.load_checkpoint(str(path.parent), tag=path.name, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
    if loaded is None:
        raise RunError(f"DeepSpeed could not load checkpoint {str(path)!r}")
    load_rng(path, policy.dist.rank)
    return json.loads(state_file.read_text())


def load_rng(path: str | Path, rank: int) -> None:
    """Restore this rank's RNG states saved in checkpoint ``path`` (no-op if the file is absent)."""
    rng_file = Path(path) / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
