"""Evaluation split over data-parallel ranks (issue 15): each data-parallel group samples and grades a share of every
benchmark's problems, rank 0 gathers the rows, computes the metrics and writes the files, every rank returns the
same result. Two real processes under ``torch.distributed.run`` (gloo), with the driver ``_eval_dp.py``.

Expected values are independent of the split: the driver's engine answers by a fixed rule of (problem, sample), so
the 2-process result must equal the 1-process result, and the shares must partition the problems in order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.evaluation.evaluate import share

DRIVER = Path(__file__).with_name("_eval_dp.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n, dp", [(7, 2), (5, 2), (12, 5), (3, 4), (0, 3), (1, 1)])
def test_shares_partition_the_problems_in_order(n, dp):
    parts = [share(n, r, dp) for r in range(dp)]
    assert parts[0][0] == 0 and parts[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous, in order
    sizes = [b - a for a, b in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


def _run(out: Path, nproc: int, tp: int) -> dict[int, dict]:
    out.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, str(DRIVER), str(out), str(tp)]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(29600 + os.getpid() % 1000 + 7 * tp), str(DRIVER), str(out), str(tp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


def _comparable(result: dict) -> dict:
    res = json.loads(json.dumps(result))
    res["settings"].pop("wall_s")
    res["settings"].pop("dp_size")
    return res


def _rows(files_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (files_dir / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process run: its rank0.json plus the rows it wrote."""
    out = tmp_path_factory.mktemp("dp1") / "run"
    data = _run(out, 1, 1)[0]
    data["rows"] = _rows(out / "files_rank0")
    return data


def test_two_data_parallel_groups_split_the_problems_and_gather_on_rank_0(single, tmp_path):
    ranks = _run(tmp_path / "dp2", 2, 1)
    # each group generated exactly its contiguous share (aime24: 7 problems → 3 + 4, amc23: 5 → 2 + 3)
    seen0, seen1 = ranks[0]["seen"], ranks[1]["seen"]
    assert len(seen0) == 3 + 2 and len(seen1) == 4 + 3
    assert not set(seen0) & set(seen1) and seen0[:3] + seen1[:4] + seen0[3:] + seen1[4:] == single["seen"]
    # sampling seeds are per share: no two chunks of the job drew from the same seed
    assert len(set(ranks[0]["seeds"]) | set(ranks[1]["seeds"])) == len(ranks[0]["seeds"]) + len(ranks[1]["seeds"])
    # gathered metrics equal the one-process metrics, on both ranks (rank 0 broadcasts them)
    assert _comparable(ranks[0]["result"]) == _comparable(single["result"])
    assert ranks[1]["result"] == ranks[0]["result"] and ranks[0]["result"]["settings"]["dp_size"] == 2
    # only rank 0 writes the files, with every sample in problem order
    assert not (tmp_path / "dp2" / "files_rank1").exists()
    rows = _rows(tmp_path / "dp2" / "files_rank0")
    assert len(rows) == (7 + 5) * 3 and rows == single["rows"]


def test_one_tensor_parallel_group_of_two_evaluates_everything_once(single, tmp_path):
    """TP = 2 on 2 processes is one data-parallel group: both ranks generate every problem (the TP group needs
    both in each generate call), only one copy of the rows is gathered (counts not doubled)."""
    ranks = _run(tmp_path / "tp2", 2, 2)
    assert ranks[0]["seen"] == ranks[1]["seen"] == single["seen"]
    assert _comparable(ranks[0]["result"]) == _comparable(single["result"]) == _comparable(ranks[1]["result"])
    assert all(m["n_problems"] in (7, 5) for m in ranks[0]["result"]["benchmarks"].values())


@pytest.mark.slow
def test_trainer_periodic_evaluation_under_torchrun(require, tiny_model, gsm8k_digits, tmp_path):
    """The training loop's periodic evaluation with 2 data-parallel ranks (torchrun, HF engine, ZeRO-3, 1 step):
    rank 0 writes one eval.json covering all 3 problems (each rank sampled its share) and the step's row has it."""
    require("deepspeed", "math_verify", "transformers")
    import yaml

    ev = tmp_path / "eval.yaml"
    ev.write_text(yaml.safe_dump({"benchmarks": ["math500"], "limit": 3, "n": 2, "max_tokens": 8,
                                  "max_prompt_length": 200}))
    out = tmp_path / "out"
    cfg = {
        "method": "c2", "seed": 1, "out_dir": str(out), "model": {"path": str(tiny_model)},
        "data": {"train_files": [str(gsm8k_digits)], "max_prompt_length": 256},
        "rollout": {"engine": "hf", "n": 2, "max_response_length": 8},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "gate": "always"}},
        "optim": {"lr": 1e-3, "train_batch_size": 2, "micro_batch_max_tokens": 1024},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 1, "save_freq": 0, "progress_bar": False, "eval_freq": 1,
                     "eval_config": str(ev)},
    }
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "STARE_LAB_FAULT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29700 + os.getpid() % 1000), "-m", "trainer.cli", str(cfg_file)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "eval" / "step_1" / "eval.json").read_text())
    assert res["settings"]["dp_size"] == 2 and res["benchmarks"]["math500"]["n_problems"] == 3
    rows = [json.loads(x) for x in (out / "eval" / "step_1" / "samples.jsonl").read_text().splitlines()]
    assert [(r["id"], r["sample"]) for r in rows] == [(i, j) for i in [r["id"] for r in rows[::2]] for j in (0, 1)]
    assert len(rows) == 6
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["eval/failed"] == 0 and row["eval/accuracy"] == res["average"]
