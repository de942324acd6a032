"""Step time of ``STAREGRPOTrainer`` (stare_lab.integrations.trl) vs TRL's plain ``GRPOTrainer`` on the same run, on
this machine (CPU). Goal: STARE / plain ≤ 1.10.

Setup (both sides): the tiny random-init Qwen2 model of ``trainer.tiny`` (built once in a temp dir), 8 GSM8K prompts
per step × 4 samples, ≤ 32 new tokens (transformers ``generate``), T = 1, lr 1e-6, ``loss_type="dapo"``, no KL,
fp32, lenient GSM8K reward, one process, one micro-batch per step (TRL's default), the same seed. STARE side: C2,
scope ``global``, the gate on every step (H_tgt = 100 nats) and the adaptive schedule, so every step runs the
measurement (s* from the hidden states), the step preparation (gate, W/M, ω), the weighted loss, the metrics and
the run directory's row. A run's number is its median step time over steps 2..N (a callback around each optimizer
step: generation, scoring, loss, update); the STARE run also reports the time spent in STARE's own methods
(s* and the measurement's bookkeeping, step preparation, metrics and row), a figure that machine load barely moves;
with ``--ga G > 1`` the no-grad forward of micro-batches 2..G is in the step time, not in that figure.

Each repetition runs the two sides back to back in fresh processes, their order alternating; the verdict reads the
median of the paired ratios (the machine may be shared).

Usage: ``python tests/benchmarks/bench_trl.py [--steps 8] [--reps 3] [--ga 1]``. Prints every repetition, the
medians and a one-line verdict; exit status 0 when the median ratio is ≤ 1.10.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trl_run import SETUP  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"  # bundled GSM8K sample (trainer/assets/README.md)
PROMPTS, N, MAX_NEW, GOAL = 8, 4, 32, 1.10

RUN_SCRIPT = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer
from trainer.grading.rewards import gsm8k_lenient_reward
from trainer.config import DEFAULT_PROMPT_TEMPLATE

model_dir, data, out, steps, prompts, n, max_new, side, ga = sys.argv[1:10]
steps, prompts, n, max_new, ga = int(steps), int(prompts), int(n), int(max_new), int(ga)
""" + SETUP + r"""
common = dict(output_dir=out, use_cpu=True, per_device_train_batch_size=prompts * n // ga,
              gradient_accumulation_steps=ga, num_generations=n,
              max_completion_length=max_new, temperature=1.0, learning_rate=1e-6, loss_type="dapo", beta=0.0,
              max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", num_iterations=1, seed=0,
              bf16=False, disable_dropout=True)
own = [0.0]  # seconds spent in STARE's own additions (measurement, step preparation, metrics and row)

def timed(f):
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            own[0] += time.perf_counter() - t
    return g

if side == "stare":
    cfg = STAREGRPOConfig(**common, variant="C2", target_entropy=100.0, adaptive=True, scope="global")
    class cls(STAREGRPOTrainer):
        _stare_measure = timed(STAREGRPOTrainer._stare_measure)
        _stare_begin_step = timed(STAREGRPOTrainer._stare_begin_step)
        _stare_record = timed(STAREGRPOTrainer._stare_record)
else:
    cfg, cls = GRPOConfig(**common), GRPOTrainer
trainer = cls(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds, callbacks=[T()])
trainer.train()
print("STEP_TIMES", json.dumps(times))
lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
print("MEAN_LENGTH", sum(lengths[1:]) / max(len(lengths) - 1, 1))
print("OWN_S", own[0] / len(times))
"""


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def run(model: Path, tmp: Path, steps: int, side: str, tag: str, ga: int = 1) -> tuple[float, float, float]:
    """Median step time (s) over steps 2..N of one run of ``side`` (``stare`` or ``plain``), the mean time per step
    spent in STARE's own methods (0 for plain) and the mean completion length over steps 2..N (tokens)."""
    p = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(model), str(GSM8K), str(tmp / f"{side}_{tag}"),
                        str(steps), str(PROMPTS), str(N), str(MAX_NEW), side, str(ga)], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in p.stdout.splitlines() if " " in ln}
    return (statistics.median(json.loads(lines["STEP_TIMES"])[1:]), float(lines["OWN_S"]),
            float(lines["MEAN_LENGTH"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ga", type=int, default=1, help="micro-batches per step (the same 32 rows split; 1 = TRL's "
                    "default; with G > 1 STARE adds a no-grad forward of G - 1 of them)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from trainer.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_stare_trl_"))
    model = build_tiny_model(tmp / "model", seed=0, corpus_file=GSM8K)
    t0 = time.time()
    print(f"{PROMPTS} prompts x {N} samples x <= {MAX_NEW} tokens in {args.ga} micro-batch(es), steps 2..{args.steps}, "
          f"{args.reps} paired reps; shared machine: read the medians")
    ratios, stare_t, plain_t, loads, own = [], [], [], [], []
    for rep in range(args.reps):
        loads.append(os.getloadavg()[0])
        if rep % 2 == 0:
            s, o, ls = run(model, tmp, args.steps, "stare", str(rep), args.ga)
            p, _, lp = run(model, tmp, args.steps, "plain", str(rep), args.ga)
        else:
            p, _, lp = run(model, tmp, args.steps, "plain", str(rep), args.ga)
            s, o, ls = run(model, tmp, args.steps, "stare", str(rep), args.ga)
        stare_t.append(s)
        plain_t.append(p)
        own.append(o / s)
        ratios.append(s / p)
        print(f"  rep {rep + 1}: STARE {s:.3f} s/step, plain TRL {p:.3f} s/step, ratio {s / p:.3f}; STARE's own "
              f"methods {1000 * o:.1f} ms/step = {100 * o / s:.1f}% of its step; mean completion length {ls:.1f} vs "
              f"{lp:.1f} tokens (load {loads[-1]:.1f})", flush=True)
    med = statistics.median(ratios)
    ok = med <= GOAL
    print(f"STARE {statistics.median(stare_t):.3f} s/step vs plain TRL {statistics.median(plain_t):.3f} s/step "
          f"(medians); ratio {med:.3f} (median of {args.reps} paired ratios, range {min(ratios):.3f}-{max(ratios):.3f};"
          f" load {min(loads):.1f}-{max(loads):.1f}; wall {time.time() - t0:.0f} s)")
    print(f"verdict: STAREGRPOTrainer overhead {med:.2f}x plain GRPOTrainer (its own methods "
          f"{100 * statistics.median(own):.1f}% of a step), goal <= {GOAL:.2f}x: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
