"""Benchmark: a fresh clone to the demo's table with `make demo` (install included), phase by phase.

Goal: `git clone REPO DIR && cd DIR && make demo` prints the demo's table within 60 s wall on the 2-core machine —
the venv, torch 2.13.0, the project with the `sim` extra and the demo itself (docs/install.md). The clone has no
sibling folders and its own `.venv`; the child's environment drops this interpreter's virtual environment, so
`python3` is the system's. Make echoes each recipe line before running it; the script timestamps those lines to
split the wall time into phases, and prints the load average before and after (other processes on 2 cores inflate
wall times) and the CPU time of `make demo` with all its children, which a busy machine inflates
much less. The clone is of the committed HEAD: uncommitted changes are not measured (a warning says so).

    python tests/benchmarks/bench_fresh_clone.py [--repo PATH] [--keep]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 60.0
REPO = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """os.environ without the calling virtual environment (its bin folder off PATH, VIRTUAL_ENV unset)."""
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None)
    bins = {str(Path(sys.prefix) / "bin")} | ({str(Path(venv) / "bin")} if venv else set())
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p not in bins)
    env.pop("PYTHONPATH", None)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="repository to clone (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the clone (printed) instead of deleting it")
    args = parser.parse_args()

    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=args.repo,
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        print("warning: the repository has uncommitted changes; the clone measures the committed HEAD")
    tmp = Path(tempfile.mkdtemp(prefix="bench_fresh_clone_"))
    clone = tmp / "stare_lab"
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.perf_counter()
    subprocess.run(["git", "clone", "-q", str(args.repo), str(clone)], check=True)
    marks = [("git clone", time.perf_counter() - t0)]
    t_table = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(["make", "demo"], cwd=clone, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        now = time.perf_counter() - t0
        tail = (tail + [line.rstrip()])[-40:]
        if line.startswith((".venv/", "test -x", "touch ")):  # a recipe line echoed by make
            marks.append((line.strip()[:90], now))
        elif t_table is None and line.startswith("method "):
            t_table = now
    rc = proc.wait()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if rc != 0:
        print("\n".join(tail))
        print(f"FAIL: make demo exited {rc}")
        return 1
    print("phase (starts with the echoed recipe line)                                                      s")
    ends = [t for _, t in marks[1:]] + [wall]
    start = 0.0
    for (label, _), end in zip(marks, ends):
        print(f"  {label:<90} {end - start:6.1f}")
        start = end
    shown = t_table if t_table is not None else wall
    print(f"clone to the demo's table: {shown:.1f} s (whole command {wall:.1f} s); goal <= {GOAL_S:.0f} s")
    print(f"CPU time of make demo and its children (user + sys): {cpu:.1f} s")
    du = subprocess.run(["du", "-sh", str(clone / ".venv")], capture_output=True, text=True).stdout.split()
    print(f".venv size: {du[0] if du else '?'}")
    if args.keep:
        print(f"kept: {clone}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    ok = t_table is not None and t_table <= GOAL_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
