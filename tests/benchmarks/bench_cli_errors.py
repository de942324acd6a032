"""Wall time of `stare-lab` printing a validation error (the goal: under 1 s), per command, median of N runs.

Run:  python tests/benchmarks/bench_cli_errors.py [--repeats 5]

Each command is run with this environment's `stare-lab` from an empty temporary folder; the time includes the
interpreter's start and the front door's parser (every wing's cli). The simulator's config keys (overrides and
``--sweep`` keys and values) are checked by its config classes, which import no torch, and so is a used ``--out``
(a finished sweep, or a run of a stopped one); ``analyze`` refuses a missing path before it loads matplotlib.
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
    ["simulate", "--sweep", "bogus=1,2"],
    ["simulate", "--out", "used"],
    ["simulate", "--methods", "grpo", "--seeds", "1", "--out", "stopped"],
    ["analyze", "used", "nope", "--out", "r"],
]


def _fixtures(tmp: Path) -> None:
    """A finished sweep (``used``) and one stopped before its summary (``stopped``): the used ``--out`` cases."""
    (tmp / "used").mkdir()
    (tmp / "used" / "summary.json").write_text('{"preset": "demo", "methods": {}}')
    (tmp / "stopped" / "grpo" / "seed0").mkdir(parents=True)
    (tmp / "stopped" / "grpo" / "seed0" / "metrics.jsonl").write_text('{"step": 1}\n')


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cli = str(Path(sys.executable).parent / "stare-lab")
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"median of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        _fixtures(Path(tmp))
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
