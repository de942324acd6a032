"""Step time of ``STAREGRPOTrainer`` (stare_lab.integrations.trl) vs TRL's plain ``GRPOTrainer`` on the same run, on
this machine (CPU). Goals: STARE / plain ≤ 1.05 with the default settings (the quadrant counts every
``quadrant_every=10`` steps), ≤ 1.10 with the quadrant counts every step (``quadrant_every=1``).

Setup (both sides): the tiny random-init Qwen2 model of ``trainer.tiny`` (built once in a temp dir), 8 GSM8K prompts
per step × 4 samples, ≤ 32 new tokens (transformers ``generate``), T = 1, lr 1e-6, ``loss_type="dapo"``, no KL,
fp32, lenient GSM8K reward, one process, one micro-batch per step (TRL's default), the same seed. STARE sides: C2,
scope ``global``, the gate on every step (H_tgt = 100 nats) and the adaptive schedule, so every step runs the
measurement, the step preparation (gate, W/M, ω), the weighted loss, the metrics and the run directory's row; the
quadrant steps also run the s* pass (one no-grad LM-head pass over the step's tokens). A run's number is its mean
step time over steps 2..N (a callback around each optimizer step: generation, scoring, loss, update; the mean, so
that the periodic quadrant steps count at their share); the STARE runs also report the time spent in STARE's own
methods (the measurement with s*, step preparation, metrics and row), a figure that machine load barely moves;
with ``--ga G > 1`` the no-grad forward of micro-batches 2..G is in the step time, not in that figure.

Each repetition runs the three sides (plain, STARE default, STARE with quadrants every step) back to back in fresh
processes, their order rotating; the verdict reads the median of each paired ratio (the machine may be shared: the
load average is printed with each repetition; measure at load < 1).

Usage: ``python tests/benchmarks/bench_trl.py [--steps 21] [--reps 6] [--ga 1]``. Prints every repetition, the
medians with their min–max and a verdict line per goal; exit status 0 when both medians meet their goals.
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
PROMPTS, N, MAX_NEW = 8, 4, 32
#: side → (quadrant_every, goal on STARE / plain); "plain" is TRL's GRPOTrainer
SIDES = {"plain": (None, None), "stare": (10, 1.05), "stare-q1": (1, 1.10)}

RUN_SCRIPT = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer
from trainer.grading.rewards import gsm8k_lenient_reward
from trainer.config import DEFAULT_PROMPT_TEMPLATE

model_dir, data, out, steps, prompts, n, max_new, side, ga, every = sys.argv[1:11]
steps, prompts, n, max_new, ga, every = int(steps), int(prompts), int(n), int(max_new), int(ga), int(every)
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

if side != "plain":
    cfg = STAREGRPOConfig(**common, variant="C2", target_entropy=100.0, adaptive=True, scope="global",
                          quadrant_every=every)
    class cls(STAREGRPOTrainer):
        _stare_measure = timed(STAREGRPOTrainer._stare_measure)
        _stare_begin_step = timed(STAREGRPOTrainer._stare_begin_step)
        _stare_record = timed(STAREGRPOTrainer._stare_record)
else:
    cfg, cls = GRPOConfig(**common), GRPOTrainer
trainer = cls(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds, callbacks=[T()])
trainer.train()
print("STEP_TIMES", json.dumps(times))
print("CPU_TIMES", json.dumps(cpu_times))
lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
print("MEAN_LENGTH", sum(lengths[1:]) / max(len(lengths) - 1, 1))
print("OWN_S", own[0] / len(times))
"""


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def run(model: Path, tmp: Path, steps: int, side: str, tag: str, ga: int = 1) -> tuple[float, float, float, float]:
    """Mean step time (s) over steps 2..N of one run of ``side`` (a key of :data:`SIDES`), the mean time per step
    spent in STARE's own methods (0 for plain), the mean completion length over steps 2..N (tokens) and the mean
    CPU time per step (s) over steps 2..N."""
    every = SIDES[side][0] or 0
    p = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(model), str(GSM8K), str(tmp / f"{side}_{tag}"),
                        str(steps), str(PROMPTS), str(N), str(MAX_NEW), "plain" if side == "plain" else "stare",
                        str(ga), str(every)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in p.stdout.splitlines() if " " in ln}
    return (statistics.mean(json.loads(lines["STEP_TIMES"])[1:]), float(lines["OWN_S"]),
            float(lines["MEAN_LENGTH"]), statistics.mean(json.loads(lines["CPU_TIMES"])[1:]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=21)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--ga", type=int, default=1, help="micro-batches per step (the same 32 rows split; 1 = TRL's "
                    "default; with G > 1 STARE adds a no-grad forward of G - 1 of them)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from trainer.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_stare_trl_"))
    model = build_tiny_model(tmp / "model", seed=0, corpus_file=GSM8K)
    t0 = time.time()
    print(f"{PROMPTS} prompts x {N} samples x <= {MAX_NEW} tokens in {args.ga} micro-batch(es), steps 2..{args.steps} "
          f"(mean), {args.reps} paired reps of {', '.join(SIDES)}; read the medians", flush=True)
    names = list(SIDES)
    times: dict[str, list[float]] = {k: [] for k in names}
    own: dict[str, list[float]] = {k: [] for k in names}
    ratios: dict[str, list[float]] = {k: [] for k in names[1:]}
    cpu_ratios: dict[str, list[float]] = {k: [] for k in names[1:]}
    loads = []
    for rep in range(args.reps):
        loads.append(os.getloadavg()[0])
        order = names[rep % len(names):] + names[:rep % len(names)]
        got = {side: run(model, tmp, args.steps, side, str(rep), args.ga) for side in order}
        for side in names:
            times[side].append(got[side][0])
            own[side].append(got[side][1] / got[side][0])
        for side in names[1:]:
            ratios[side].append(got[side][0] / got["plain"][0])
            cpu_ratios[side].append(got[side][3] / got["plain"][3])
        print(f"  rep {rep + 1} (order {', '.join(order)}; load {loads[-1]:.2f}): plain {got['plain'][0]:.3f} s/step; "
              + "; ".join(f"{side} {got[side][0]:.3f} s/step, ratio {ratios[side][-1]:.3f} (CPU time "
                          f"{cpu_ratios[side][-1]:.3f}), own methods {1000 * got[side][1]:.1f} ms/step"
                          for side in names[1:])
              + f"; mean completion length {', '.join(f'{got[s][2]:.1f}' for s in names)} tokens", flush=True)
    ok = True
    print(f"plain TRL {statistics.median(times['plain']):.3f} s/step (median); load {min(loads):.2f}-{max(loads):.2f}; "
          f"wall {time.time() - t0:.0f} s")
    for side in names[1:]:
        every, goal = SIDES[side]
        med = statistics.median(ratios[side])
        ok &= med <= goal
        print(f"verdict: STAREGRPOTrainer quadrant_every={every}: {med:.3f}x plain GRPOTrainer (median of {args.reps} "
              f"paired ratios, min-max {min(ratios[side]):.3f}-{max(ratios[side]):.3f}; its own methods "
              f"{100 * statistics.median(own[side]):.1f}% of a step), goal <= {goal:.2f}x: "
              f"{'PASS' if med <= goal else 'FAIL'}; CPU-time ratio {statistics.median(cpu_ratios[side]):.3f} "
              f"(min-max {min(cpu_ratios[side]):.3f}-{max(cpu_ratios[side]):.3f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
