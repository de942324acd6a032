"""Benchmark: wall time of the default `stare-lab simulate` command end to end (interpreter start included).

Goal (issue 3): the default preset (`collapse`, methods grpo,o1,c2 × 3 seeds) finishes in ≤ 10 s wall on the 2-core
CI machine. Runs the real console script in a subprocess, `--repeats` times each with and without plots, and
prints the measured times together with the 1-minute load average (other processes on the machine inflate wall
times; compare with CPU time = user + sys of the child, also printed).

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_simulate.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 10.0


def stare_lab_command() -> list[str]:
    exe = Path(sys.executable).with_name("stare-lab")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "stare_lab.cli"]


def time_once(extra: list[str]) -> tuple[float, float]:
    """(wall s, child CPU s) of one default `stare-lab simulate` into a fresh directory."""
    out = Path(tempfile.mkdtemp(prefix="bench_simulate_")) / "out"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*stare_lab_command(), "simulate", "--out", str(out), *extra], capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out.parent, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"stare-lab simulate failed ({proc.returncode}):\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"stare-lab simulate (default preset collapse, grpo,o1,c2 x 3 seeds); {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    ok = True
    for label, extra in (("no plots", ["--no-plots"]), ("with plots (default)", [])):
        walls, cpus = [], []
        for _ in range(args.repeats):
            load = os.getloadavg()[0]
            wall, cpu = time_once(extra)
            walls.append(wall)
            cpus.append(cpu)
            print(f"  {label:<22} wall {wall:6.2f} s   cpu {cpu:6.2f} s   load(1 min) {load:.2f}")
        best = min(walls)
        print(f"{label:<24} best wall {best:.2f} s, median {statistics.median(walls):.2f} s, "
              f"median cpu {statistics.median(cpus):.2f} s  (goal <= {GOAL_S:.0f} s)")
        if label.startswith("with plots"):
            ok = best <= GOAL_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
