"""The README's trainer tour step: after `. .venv/bin/activate` as fast as under `make` (goal: ratio <= 1.2).

Run (from the repository root, with the project's venv):

    python tests/benchmarks/bench_tour_threads.py [--pairs 3]

Each pair runs `stare-lab train --preset tiny-cpu --train-data trainer/assets/gsm8k_train_sample.jsonl --out DIR`
twice, in the two environments a user has, in alternating order:

* make: the variables the Makefile exports (OMP_NUM_THREADS=1, DS_ACCELERATOR=cpu, VLLM_CPU_KVCACHE_SPACE=1,
  VLLM_ENABLE_V1_MULTIPROCESSING=0, TORCH_EXTENSIONS_DIR=<repo>/.venv/torch_extensions, TOKENIZERS_PARALLELISM,
  HF_HUB_OFFLINE);
* activate: none of them (removed from this process's environment), only what `activate` sets (VIRTUAL_ENV and the
  venv's bin first on PATH).

The step time is the mean `time/step_s` of steps 2 and 3 (step 1 includes the engines' warm-up). Printed: per run
the step time, the command's wall time and whether the DeepSpeed op was (re)built; the median over pairs of the
paired ratio activate / make. Exit status 1 if it exceeds 1.2 or an op was (re)built after the first run (the op
cache is one folder built with one set of tools, whatever the environment).
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
MAKE_VARS = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
GOAL = 1.2


def environments() -> dict[str, dict[str, str]]:
    venv = Path(sys.prefix)
    base = {k: v for k, v in os.environ.items() if k not in MAKE_VARS and k != "TORCH_EXTENSIONS_DIR"
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "STARE_LAB_FAULT")}
    activate = {**base, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{base.get('PATH', '')}"}
    make = {**base, **MAKE_VARS, "TORCH_EXTENSIONS_DIR": str(REPO / ".venv" / "torch_extensions")}
    return {"make": make, "activate": activate}


def _ops() -> dict[str, int]:
    """mtime of every compiled op under the op caches the two environments use (the same folder, by design)."""
    roots = {REPO / ".venv" / "torch_extensions", Path(sys.prefix) / "torch_extensions"}
    return {str(p): p.stat().st_mtime_ns for root in roots if root.is_dir() for p in root.rglob("*.so")}


def one_run(env: dict[str, str], folder: Path) -> dict[str, float | bool]:
    out = folder / "tour"
    cmd = [str(Path(sys.prefix) / "bin" / "stare-lab"), "train", "--preset", "tiny-cpu", "--train-data",
           str(REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"), "--out", str(out)]
    before = _ops()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    step = statistics.mean(r["time/step_s"] for r in rows[1:])
    built = _ops() != before  # an op (re)compiled: a new or newer shared library in the cache
    return {"step_s": step, "wall_s": wall, "built": built}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    envs = environments()
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{args.pairs} pairs, alternating order")
    ratios, built_late = [], False
    for i in range(args.pairs):
        order = ["make", "activate"] if i % 2 == 0 else ["activate", "make"]
        res = {}
        for name in order:
            with tempfile.TemporaryDirectory(prefix="tour_") as tmp:
                res[name] = one_run(envs[name], Path(tmp))
            built_late |= bool(res[name]["built"]) and (i > 0 or name != order[0])
            print(f"pair {i + 1} {name:<8} step {res[name]['step_s']:.2f} s (mean of steps 2-3), command "
                  f"{res[name]['wall_s']:.0f} s{', DeepSpeed op built' if res[name]['built'] else ''}", flush=True)
        ratios.append(res["activate"]["step_s"] / res["make"]["step_s"])
    ratio = statistics.median(ratios)
    ok = ratio <= GOAL and not built_late
    print(f"paired ratios activate/make: {', '.join(f'{r:.2f}' for r in ratios)}; median {ratio:.2f} "
          f"(goal <= {GOAL}) {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
