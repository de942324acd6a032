"""Step time of our trainer vs TRL's ``GRPOTrainer`` on the same tiny model and batch, on this machine (CPU).

Setup (both sides): the tiny random-init Qwen2 model of ``trainer.tiny`` (built once in a temp dir), 8 GSM8K prompts
per step × 4 samples, ≤ 32 new tokens, T = 1, lr 1e-6, one on-policy update per batch, token-mean loss (TRL
``loss_type="dapo"``: normalised by the active tokens of the batch, like our ``token-mean``), no KL, fp32, lenient
GSM8K reward. TRL: ``use_vllm=False`` (HF generate), ``use_cpu=True``. Ours: one process, DeepSpeed ZeRO-3, with
the vLLM-CPU engine and with the HF engine. Step 1 (warm-up/compilation) is excluded from the means.

Usage: ``python tests/benchmarks/bench_trainer_vs_trl.py [--steps 6]``. Prints the mean step time of each, the
ratio ours/TRL (goal ≤ 1.0) and our phase breakdown. Numbers taken on a shared, busy machine are noisy: re-run.
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
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"  # bundled GSM8K sample (trainer/assets/README.md)
PROMPTS, N, MAX_NEW = 8, 4, 32


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    return env


def ours(model: Path, data: Path, tmp: Path, steps: int, engine: str) -> list[dict]:
    import yaml

    out = tmp / f"ours_{engine}"
    cfg = {"method": "grpo", "seed": 0, "out_dir": str(out), "model": {"path": str(model)},
           "data": {"train_files": [str(data)], "max_prompt_length": 256},
           "rollout": {"engine": engine, "n": N, "max_response_length": MAX_NEW},
           "reward": {"kind": "gsm8k-lenient"}, "loss": {"loss_mode": "grpo"},
           "optim": {"lr": 1e-6, "train_batch_size": PROMPTS, "micro_batch_max_tokens": 8192},
           "deepspeed": {"zero_stage": 3, "precision": "fp32"},
           "schedule": {"total_steps": steps, "save_freq": 0, "progress_bar": False}}
    path = tmp / f"ours_{engine}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "trainer.cli", str(path)], cwd=REPO, env=_env(), check=True,
                   capture_output=True, timeout=1800)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


TRL_SCRIPT = r"""
import json, sys, time
from pathlib import Path
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trainer.rewards import gsm8k_lenient_reward
from trainer.config import DEFAULT_PROMPT_TEMPLATE

model_dir, data, out, steps, prompts, n, max_new = sys.argv[1:8]
steps, prompts, n, max_new = int(steps), int(prompts), int(n), int(max_new)
recs = [json.loads(l) for l in open(data)][: prompts * steps]
ds = Dataset.from_list([{"prompt": [{"role": "user", "content": DEFAULT_PROMPT_TEMPLATE.format(problem=r["problem"])}],
                         "answer": r["answer"]} for r in recs])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

def reward(completions, answer, **kw):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return gsm8k_lenient_reward(texts, answer)

times = []
class T(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw): self.t = time.perf_counter()
    def on_step_end(self, args, state, control, **kw): times.append(time.perf_counter() - self.t)

cfg = GRPOConfig(output_dir=out, use_cpu=True, use_vllm=False, per_device_train_batch_size=prompts * n,
                 num_generations=n, max_completion_length=max_new, temperature=1.0, learning_rate=1e-6,
                 loss_type="dapo", beta=0.0, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no",
                 num_iterations=1, seed=0, bf16=False, disable_dropout=True)
GRPOTrainer(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds,
            callbacks=[T()]).train()
print("STEP_TIMES", json.dumps(times))
"""


def trl(model: Path, data: Path, tmp: Path, steps: int) -> list[float]:
    p = subprocess.run([sys.executable, "-c", TRL_SCRIPT, str(model), str(data), str(tmp / "trl"), str(steps),
                        str(PROMPTS), str(N), str(MAX_NEW)], cwd=REPO, env=_env(), capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-4000:])
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("STEP_TIMES"))
    return json.loads(line.split(" ", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from trainer.tiny import build_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_trl_"))
    model = build_tiny_model(tmp / "model", seed=0, corpus_file=GSM8K)
    load = os.getloadavg()[0]
    t0 = time.time()
    res = {}
    for engine in ("vllm", "hf"):
        rows = ours(model, GSM8K, tmp, args.steps, engine)
        res[engine] = rows
    trl_times = trl(model, GSM8K, tmp, args.steps)
    trl_mean = statistics.mean(trl_times[1:])
    print(f"load average at start {load:.1f} (2 cores; shared machine: re-run for stable numbers); "
          f"{PROMPTS} prompts x {N} samples x <= {MAX_NEW} tokens, steps 2..{args.steps}")
    print(f"TRL GRPOTrainer (HF generate)   : {trl_mean:.3f} s/step")
    for engine, rows in res.items():
        mean = statistics.mean(r["time/step_s"] for r in rows[1:])
        phases = {k[5:-2]: statistics.mean(r[k] for r in rows[1:]) for k in rows[0] if k.startswith("time/")
                  and k != "time/step_s"}
        print(f"ours ({engine:4s} engine, ZeRO-3) : {mean:.3f} s/step  ratio ours/TRL = {mean / trl_mean:.2f}  "
              + "  ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    print(f"total wall {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
