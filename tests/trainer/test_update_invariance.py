"""The update is invariant to the micro-batch size and to the number of ranks (docs/theory.md §3: normalisers are global
over the optimizer step; DeepSpeed's rank-averaging of gradients is undone in PolicyEngine.update).

Reference: the same fixed batch of 8 sequences updated (a) in one process with one micro-batch per sequence, (b) in
one process with a budget that packs everything into one or two micro-batches, (c) with torchrun over 2 ranks.
Each must give the same parameters after one AdamW step (to float32 rounding, 1e-6). The old log-probs are shifted
by 0.05 so that ρ ≠ 1 and the clipping path is exercised, and ω ≠ 1 on a third of the tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
HELPER = Path(__file__).with_name("_update_invariance.py")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-5000:]


def test_update_independent_of_micro_batch_and_world_size(require, tiny_model, tmp_path):
    require("deepspeed", "transformers")
    import torch

    outs = {}
    for name, budget, procs in (("mb_small", 1, 1), ("mb_large", 4096, 1), ("two_ranks", 16, 2)):
        out = tmp_path / f"{name}.pt"
        launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--nproc_per_node", str(procs), "--master_port",
                                                         str(29700 + os.getpid() % 200)]
        _run(launcher + [str(HELPER), str(tiny_model), str(out), str(budget)])
        outs[name] = torch.load(out)
    ref = outs["mb_small"]
    for name in ("mb_large", "two_ranks"):
        for k, v in ref.items():
            torch.testing.assert_close(outs[name][k], v, rtol=0, atol=1e-6, msg=f"{name}: {k}")
    from safetensors.torch import load_file

    init = load_file(str(tiny_model / "model.safetensors"))
    assert any((ref[k] - init[k]).abs().max() > 1e-4 for k in ref if k in init)  # the step did move the weights
