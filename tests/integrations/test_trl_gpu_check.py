"""The TRL GPU check's CPU dry run (``bash scripts/gpu_check.sh --trl --dry-run``): the same checks as on the GPU
machine — the Qwen2.5-0.5B-shaped model with its full 151,936-token vocabulary (2 narrow layers here), the warm
start, gate-off parity with plain ``GRPOTrainer``, ω against the core on every step, the logged entropy against the
model's own logits, GRPO and C2 runs — small and in fp32, so that the script a lent GPU runs in one short call is
known to work before it gets there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _trl_common import REPO, _require  # noqa: E402

pytestmark = pytest.mark.slow


def test_trl_gpu_check_dry_run_on_cpu(tmp_path):
    _require("trl", "transformers", "datasets", "accelerate")
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--trl", "--dry-run", "--workdir", str(tmp_path / "work"),
                           "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    report = json.loads((tmp_path / "gpu_check_trl.json").read_text())
    assert report["ok"] is True and report["dry_run"] is True
    assert report["model"]["vocab"] == 151936
    parity = report["gate_off_parity"]
    assert parity["max_abs_diff"] == 0.0 and parity["update_moved"] > 0  # CPU: deterministic, bit for bit
    assert report["weights"]["steps_checked"] == 2 and report["weights"]["ok"]
    assert all(abs(a - b) <= 1e-4 for a, b in report["entropy"]["logged_vs_recomputed"])  # fp32 on CPU
    assert [len(v) for v in report["runs"]["entropy"].values()] == [2, 2]
    assert "gpu_check_trl: OK" in proc.stdout
