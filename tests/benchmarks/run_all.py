"""Run every benchmark script of tests/benchmarks/ in sequence and summarise PASS/FAIL.

    python tests/benchmarks/run_all.py [--only NAME ...] [--skip NAME ...]

Each script is run in its own process (``OMP_NUM_THREADS=1``) and prints its own numbers; a script's exit status
0 means its goal was met. Run it on an otherwise idle machine: the goals are ratios/limits measured in one run on
the same machine, and a busy second core distorts wall times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# cheap first; the trainer-vs-TRL benchmark builds DeepSpeed ops and runs TRL, so it goes last
ORDER = ["bench_loss", "bench_entropy", "bench_simulate", "bench_analyze", "bench_grading", "bench_transformer",
         "bench_trl", "bench_trainer_vs_trl"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these benchmarks (names without .py)")
    parser.add_argument("--skip", nargs="*", default=[], help="skip these benchmarks")
    args = parser.parse_args()
    scripts = sorted(p.stem for p in HERE.glob("bench_*.py"))
    names = [n for n in ORDER if n in scripts] + [n for n in scripts if n not in ORDER]
    if args.only:
        unknown = sorted(set(args.only) - set(scripts))
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(scripts)}")
        names = [n for n in names if n in args.only]
    names = [n for n in names if n not in args.skip]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = []
    for name in names:
        print(f"===== {name} =====", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / f"{name}.py")], env=env)
        results.append((name, rc, time.perf_counter() - t0))
    print("\n===== summary =====")
    for name, rc, wall in results:
        print(f"{name:<24} {'PASS' if rc == 0 else f'FAIL (exit {rc})':<16} {wall:7.1f} s")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
