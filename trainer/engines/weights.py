"""Model weights in Hugging Face's safetensors layout, streamed shard by shard (the HF export of a checkpoint and the
final model; :meth:`trainer.engines.policy.PolicyEngine.save_hf`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import torch

__all__ = ["write_hf_shards", "SINGLE_FILE", "INDEX_FILE"]

#: Hugging Face's names of a single-file and a sharded safetensors checkpoint.
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def write_hf_shards(named_tensors: Iterable[tuple[str, torch.Tensor | None]], out_dir: str | Path, *,
                    max_shard_bytes: int = 5 * 2**30, write: bool = True) -> torch.dtype | None:
    """Stream ``(name, tensor)`` pairs into safetensors shards in ``out_dir``, Hugging Face's layout: one
    ``model.safetensors`` when everything fits one shard, else ``model-0000K-of-0000N.safetensors`` plus
    ``model.safetensors.index.json`` (``metadata.total_size`` in bytes, ``weight_map`` name → file).

    At most one shard (≤ ``max_shard_bytes``, or one tensor if it is larger) is held at a time: the iterator is
    consumed lazily and each shard is written as soon as the next tensor would overflow it. With ``write=False`` the
    iterator is still consumed to the end (its ZeRO-3 gathers are collective) but nothing is kept or written.

    Returns:
        the dtype of the first tensor written (``None`` when ``write=False`` or nothing was given).

    Raises:
        OSError: the files cannot be written (the caller turns it into a RunError).
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    if not write:
        for _ in named_tensors:
            pass
        return None
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("model*.safetensors")) + [out / INDEX_FILE]:
        old.unlink(missing_ok=True)
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = total = 0
    written: list[list[str]] = []  # names per shard, in order
    dtype = None

    def flush() -> None:
        nonlocal shard, shard_bytes
        if shard:
            save_file(shard, str(out / f"shard-{len(written):05d}.tmp"), metadata={"format": "pt"})
            written.append(list(shard))
        shard, shard_bytes = {}, 0

    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        dtype = dtype or t.dtype
        if shard and shard_bytes + nbytes > max_shard_bytes:
            flush()
        shard[name] = t.contiguous()
        shard_bytes += nbytes
        total += nbytes
    flush()
    n = len(written)
    if n == 1:
        os.replace(out / "shard-00000.tmp", out / SINGLE_FILE)
        return dtype
    weight_map = {}
    for k, names in enumerate(written):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        os.replace(out / f"shard-{k:05d}.tmp", out / fname)
        weight_map.update({name: fname for name in names})
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                             indent=2, sort_keys=True) + "\n")
    return dtype
