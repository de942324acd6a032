"""Benchmark: `stare-lab analyze` on a 3 methods × 3 seeds × 1,000 steps sweep must take ≤ 10 s wall, end to end
(process start, reading, statistics, figures, report.md and report.html).

Run: ``OMP_NUM_THREADS=1 python tests/benchmarks/bench_analyze.py [--steps 1000] [--repeats 3]``. Prints the wall
and CPU seconds of each repeat (CPU time is less sensitive to other load on the machine), the 1-minute load
average, and PASS/FAIL on the best wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from analysis.synthetic import write_synthetic_sweep

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        t0 = time.perf_counter()
        write_synthetic_sweep(sweep, methods=("grpo", "o1", "c2"), seeds=(0, 1, 2), steps=args.steps)
        print(f"generated 3 methods x 3 seeds x {args.steps} steps in {time.perf_counter() - t0:.2f} s")
        walls, cpus = [], []
        for i in range(args.repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "stare_lab.cli", "analyze", str(sweep), "--out", str(sweep / "figures")],
                env=env, capture_output=True, text=True,
            )
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr)
                print("FAIL: stare-lab analyze exited with", proc.returncode)
                return 1
            walls.append(wall)
            cpus.append(cpu)
            print(f"repeat {i}: wall {wall:.2f} s, cpu {cpu:.2f} s, load average {os.getloadavg()[0]:.2f}")
        figs = sorted(p.name for p in (sweep / "figures").glob("*.png"))
        print(f"figures: {', '.join(figs)}")
    best = min(walls)
    print(
        f"analyze 3x3x{args.steps}: best wall {best:.2f} s, median wall {statistics.median(walls):.2f} s, "
        f"median cpu {statistics.median(cpus):.2f} s (limit {LIMIT_S:.0f} s wall)"
    )
    ok = best <= LIMIT_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
