"""Wall time of `stare-lab` printing a validation error (the goal: under 1 s), per command, median of N runs; and of
a whole `stare-lab plan` of a paper config (issue 29: 14-29 s importing torch, transformers and DeepSpeed for
arithmetic; the goal: a few seconds at most).

Run:  python tests/benchmarks/bench_cli_errors.py [--repeats 5]

Each command is run with this environment's `stare-lab` from a temporary folder of fixtures; the time includes
the interpreter's start and the front door's parser (every wing's cli). Next to the wall time the child's CPU time
(user + system) is printed: on a machine shared with other work the wall time also measures the queue. The
simulator's config keys (overrides and ``--sweep`` keys and values) are checked by its config classes, which import
no torch, and so is a used ``--out`` (a finished sweep, or a run of a stopped one); ``analyze`` refuses a missing
path before it loads matplotlib.
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
    ["simulate", "lr=1", "lr=2"],
    ["plan", "empty.yaml"],
    ["plan", str(Path(__file__).resolve().parents[2] / "papers" / "stare_2606.19236" / "configs"
                 / "short_cot_qwen2.5-math-7b_stare-o1.yaml")],  # a whole plan (exit 0)
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
        (Path(tmp) / "empty.yaml").write_text("")
        for case in CASES:
            times, cpus = [], []
            for _ in range(args.repeats):
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                proc = subprocess.run([cli, *case], cwd=tmp, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            shown = ' '.join(Path(a).name if "/" in a else a for a in case)
            print(f"{statistics.median(times):6.2f} s wall {statistics.median(cpus):5.2f} s CPU  rc={proc.returncode}  "
                  f"stare-lab {shown:<48} {lines[-1][:70] if lines else ''}")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
