"""The GPU check's CPU dry run (``bash scripts/gpu_check.sh --dry-run``): the same steps as on the GPU machine —
two models (the tiny one and the full-vocabulary stand-in of the ~0.5B one), DeepSpeed ZeRO-3 with the HF engine,
2 steps each, the sync check, throughput and the plan's per-phase prediction — small and in fp32, so the script
a lent GPU runs in one short call is known to work before it gets there."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

pytestmark = [pytest.mark.slow, pytest.mark.trainer]


def test_gpu_check_dry_run_on_cpu(require, tmp_path):
    require("deepspeed", "transformers")
    proc = runs.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--workdir", str(tmp_path / "work"), "--out",
                     str(tmp_path)])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] is True and report["dry_run"] is True, proc.stdout[-3000:]
    for name in ("tiny", "0.5b"):
        r = report[name]
        assert r["sync_ok"] and r["update_moved_weights"]
        assert all(d <= 1e-3 for d in r["logprob_diff_mean"])
        assert all(v > 0 for v in r["rollout_tokens_per_s"] + r["update_tokens_per_s"])
        assert set(r["memory"]) == {"rollout", "old_logprob", "update", "sync"}
        assert all(m["plan_allocated_gib"] > 0 and m["measured_gib"] is None for m in r["memory"].values())
    assert report["0.5b"]["params"] > report["tiny"]["params"]
    assert "gpu_check: OK" in proc.stdout
