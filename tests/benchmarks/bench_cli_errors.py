"""Wall time of `stare-lab` printing a validation error (the goal: under 1 s), per command, median of N runs.

Run:  python tests/benchmarks/bench_cli_errors.py [--repeats 5]

Each command is run with this environment's `stare-lab` from an empty temporary folder; the time includes the
interpreter's start and the front door's parser (every wing's cli). The last case, an unknown simulator config key,
is checked by the simulator's config classes, which import no torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    ["simulate", "--seeds", "0"],
    ["simulate", "--preset", "nope"],
    ["train", "--preset", "tiny-cpu"],
    ["train", "nope.yaml"],
    ["evaluate", "--model", "m", "--benchmarks", "xx"],
    ["analyze", "nope", "--band", "-1"],
    ["promote", "sw", "--method", "c2", "--base", "nope.yaml", "--out", "o.yaml"],
    ["plan", "nope.yaml"],
    ["simulate", "bogus=1"],
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cli = str(Path(sys.executable).parent / "stare-lab")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"median of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                proc = subprocess.run([cli, *case], cwd=tmp, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
            err = proc.stderr.strip().splitlines()[-1][:70]
            print(f"{statistics.median(times):6.2f} s  rc={proc.returncode}  stare-lab {' '.join(case):<48} {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
