"""Benchmark: wall time of `make demo`'s command as a whole process (interpreter start and plots included).

Goal (issue 13): `stare-lab simulate --preset demo --out DIR --overwrite` — the demo preset's own request (issue 28:
grpo, o1 at W 1.1/1.2/1.3/1.4/1.5 and o1-auto, × 3 seeds: 21 runs), `stare-lab analyze` figures and report —
finishes in ≤ 10 s wall on the 2-core machine (stretch: 5 s). Runs the real console script in a subprocess
`--repeats` times (default 5), with and without plots, and decides on the median of the runs with plots. Other
processes on the machine inflate wall times: the script prints the load average before each run and `uptime` at the
start, and the child's CPU time (user + sys) next to the wall time.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_simulate.py [--repeats 5]
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
STRETCH_S = 5.0
COMMAND = ["simulate", "--preset", "demo", "--overwrite"]  # the Makefile's demo target


def stare_lab_command() -> list[str]:
    exe = Path(sys.executable).with_name("stare-lab")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "stare_lab.cli"]


def time_once(extra: list[str]) -> tuple[float, float, str]:
    """(wall s, child CPU s, the headline line) of one demo command into a fresh directory."""
    out = Path(tempfile.mkdtemp(prefix="bench_simulate_")) / "out"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*stare_lab_command(), *COMMAND, "--out", str(out), *extra], capture_output=True,
                          text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out.parent, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"stare-lab simulate failed ({proc.returncode}):\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout.splitlines()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"`stare-lab {' '.join(COMMAND)}`; {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; uptime: {uptime}")
    ok = True
    for label, extra in (("no plots", ["--no-plots"]), ("with plots (make demo)", [])):
        walls, cpus = [], []
        for _ in range(args.repeats):
            load = os.getloadavg()[0]
            wall, cpu, headline = time_once(extra)
            walls.append(wall)
            cpus.append(cpu)
            print(f"  {label:<24} wall {wall:6.2f} s   cpu {cpu:6.2f} s   load(1 min) {load:.2f}")
        med = statistics.median(walls)
        print(f"{label:<26} median wall {med:.2f} s (min {min(walls):.2f}, max {max(walls):.2f}), "
              f"median cpu {statistics.median(cpus):.2f} s  (goal <= {GOAL_S:.0f} s, stretch {STRETCH_S:.0f} s)")
        if label.startswith("with plots"):
            ok = med <= GOAL_S
            print(f"headline: {headline}")
            print(f"{'PASS' if ok else 'FAIL'}: median {med:.2f} s vs {GOAL_S:.0f} s"
                  + (f" (stretch {STRETCH_S:.0f} s {'met' if med <= STRETCH_S else 'not met'})"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
