"""STAREGRPOTrainer under accelerate + DeepSpeed ZeRO-3 on 2 CPU processes, launched with the recipe's own config
file (docs/trl/accelerate_zero3.yaml, docs/integrations.md "Scale out") and the deterministic rollouts of
``_trl_run.py``: 2 steps of C2 with the gate on and the quadrant counts every step, a checkpoint at step 2.

Under ZeRO-3 every parameter is partitioned (``weight.shape == (0,)``), so the s* pass must size its logits blocks
from ``ds_shape`` (before: ``head.weight.shape[0] == 0`` → one block of all tokens × V, chunking silently off), and
must gather the head once per pass (before: one head call per block fired ZeRO-3's collectives a number of times
that depended on each process's token count, and the two processes deadlocked in the next backward). Here the
blocks are bounded to 16·V elements (``DEFAULT_CHUNK_ELEMENTS`` set to 16·V in the run) and every block is recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _trl_common import GSM8K, REPO, _require, assert_weights_equal_core  # noqa: E402

pytestmark = pytest.mark.slow
RECIPE = REPO / "docs" / "trl" / "accelerate_zero3.yaml"
K = 16  # the s* pass's block bound in the run: K x V logits elements


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory) -> Path:
    _require("trl", "transformers", "datasets", "accelerate", "deepspeed")
    from trainer.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("trl_zero3")
    model = build_tiny_model(root / "model", seed=0, corpus_file=GSM8K)
    out = root / "run"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRL_EXPERIMENTAL_SILENCE="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(RECIPE), "--num_processes", "2",
           "--mixed_precision", "no", "--main_process_port", str(port), str(Path(__file__).with_name("_trl_run.py")),
           "--model", str(model), "--out", str(out), "--steps", "2", "--save-steps", "2", "--dump",
           "--quadrant-every", "1", "--sstar-chunk-vocabs", str(K)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_zero3_partitions_and_the_sstar_pass_is_chunked(zero3_run):
    """The run really is ZeRO-3 (the checkpoint holds DeepSpeed's partitioned states); each process's s* pass on
    each step is split into blocks of at most K = 16 tokens of the full vocabulary V (the tokenizer's size: the
    head was gathered), at least 2 blocks per step, covering exactly that process's valid tokens — so the pass's
    largest logits block is K·V float32 values, whatever the batch."""
    from transformers import AutoTokenizer

    assert (zero3_run / "checkpoint-2" / "global_step2").is_dir()
    vocab = len(AutoTokenizer.from_pretrained(zero3_run.parent / "model"))
    for rank in (0, 1):
        blocks = json.loads((zero3_run / f"sstar_chunks_rank{rank}.json").read_text())
        assert blocks and all(v == vocab for _, v in blocks)
        assert max(rows for rows, _ in blocks) == K
        assert max(rows * v for rows, v in blocks) * 4 <= K * vocab * 4  # bytes of the largest float32 block
        tokens = [int(torch.load(zero3_run / "dump" / f"step{s}_rank{rank}.pt", weights_only=False)["mask"].sum())
                  for s in (1, 2)]
        assert sum(rows for rows, _ in blocks) == sum(tokens)
        assert len(blocks) >= 2 * 2


def test_zero3_weights_rows_and_controller(zero3_run):
    """Under ZeRO-3 ω still equals the core's on the gathered batch, every step has its metrics row with the
    quadrant counts summing to the step's tokens of non-zero advantage, and checkpoint 2 holds the controller after 2 updates."""
    for step in (1, 2):
        assert_weights_equal_core(zero3_run / "dump", step, ranks=2)
    rows = [json.loads(line) for line in (zero3_run / "stare_run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["gate_on"] == 1 for r in rows)
    for r in rows:
        dumps = [torch.load(zero3_run / "dump" / f"step{r['step']}_rank{k}.pt", weights_only=False) for k in (0, 1)]
        signed = sum(int((d["mask"] & (d["advantages"][:, None] != 0)).sum()) for d in dumps)  # tokens with Â ≠ 0
        assert r["quadrant/every"] == 1 and r["num_sequences"] == 16
        assert sum(r[f"quadrant/{q}/count"] for q in ("pos_high", "pos_low", "neg_high", "neg_low")) == signed
    saved = json.loads((zero3_run / "checkpoint-2" / "stare_controller.json").read_text())
    assert saved["global_step"] == 2 and saved["controller"]["num_updates"] == 2
