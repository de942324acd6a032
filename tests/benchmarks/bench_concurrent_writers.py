"""Two writers into one sweep directory, N times: exactly one completes whole, the other is refused at once.

Run (from anywhere; uses the ``stare-lab`` of this interpreter's environment)::

    python tests/benchmarks/bench_concurrent_writers.py [--trials 20] [--steps 800]

Each trial runs, in a fresh temporary folder, the shell line

    for X in A B; do stare-lab simulate --preset collapse --methods grpo,c2 --seeds 2 --out runs/conc steps=800 & done; wait

and checks: one command exits 0 and the other exits 1 with the one-line lock message (``… is in use by pid …``);
the refused one ends within its own start-up time (its wall time is printed); the winner's four run directories each
hold exactly ``steps`` metrics rows numbered 1 … steps, a ``config.yaml`` and a ``summary.json``, and the sweep's
``summary.json`` lists exactly those four runs; no lock file is left. Exit status 1 if any trial fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = ("grpo/seed0", "grpo/seed1", "c2/seed0", "c2/seed1")
TIMED = '( s=$(date +%s.%N); {cmd} > {x}.log 2>&1; echo "$? $s $(date +%s.%N)" > {x}.rc ) &'


def trial(cli: str, steps: int, folder: Path) -> tuple[bool, str]:
    """One trial in ``folder``; returns (passed, one line describing it)."""
    cmd = f"{cli} simulate --preset collapse --methods grpo,c2 --seeds 2 --out runs/conc steps={steps}"
    line = "for X in A B; do " + TIMED.format(cmd=cmd, x="$X") + " done; wait"
    subprocess.run(["bash", "-c", line], cwd=folder, check=True)
    res = {}
    for x in "AB":
        rc, t0, t1 = (folder / f"{x}.rc").read_text().split()
        res[x] = (int(rc), float(t1) - float(t0), (folder / f"{x}.log").read_text())
    winners = [x for x in "AB" if res[x][0] == 0]
    losers = [x for x in "AB" if res[x][0] != 0]
    if len(winners) != 1 or len(losers) != 1:
        return False, f"exit codes A={res['A'][0]} B={res['B'][0]} (want one 0 and one 1)"
    w, lo = winners[0], losers[0]
    err = [ln for ln in res[lo][2].splitlines() if ln.strip()]
    lock_line = len(err) == 1 and res[lo][0] == 1 and "is in use by pid" in err[0]
    if not lock_line:
        return False, f"{lo} (rc {res[lo][0]}) did not print the one-line lock message: {err[-3:]}"
    out = folder / "runs" / "conc"
    problems = []
    for rel in RUNS:
        d = out / rel
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] if (d / "metrics.jsonl").is_file() else []
        if [r.get("step") for r in rows] != list(range(1, steps + 1)):
            problems.append(f"{rel}: {len(rows)} rows, steps not 1..{steps}")
        if not (d / "config.yaml").is_file() or not (d / "summary.json").is_file():
            problems.append(f"{rel}: config.yaml or summary.json missing")
    summary = json.loads((out / "summary.json").read_text())
    listed = sorted(rel for g in summary["methods"].values() for rel in g["run_dirs"].values())
    if listed != sorted(RUNS):
        problems.append(f"summary.json lists {listed}")
    left = [str(p.relative_to(out)) for p in out.rglob(".stare_lab.lock")]
    if left:
        problems.append(f"lock files left: {left}")
    desc = f"winner {w} {res[w][1]:.1f} s, refused {lo} after {res[lo][1]:.2f} s"
    return not problems, desc + ("" if not problems else "; " + "; ".join(problems))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--steps", type=int, default=800)
    args = ap.parse_args()
    cli = str(Path(sys.executable).parent / "stare-lab")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"{args.trials} trials, steps={args.steps}, {os.cpu_count()} CPUs, load {load:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    failed, refused_s = 0, []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="conc_") as tmp:
            ok, desc = trial(cli, args.steps, Path(tmp))
        failed += not ok
        if ok:
            refused_s.append(float(desc.split("after ")[1].split(" s")[0]))
        print(f"trial {i + 1:2d}: {'ok  ' if ok else 'FAIL'} {desc}", flush=True)
    if refused_s:
        print(f"refused writer's wall time: median {sorted(refused_s)[len(refused_s) // 2]:.2f} s, "
              f"max {max(refused_s):.2f} s (includes its interpreter start)")
    print(f"{args.trials - failed}/{args.trials} trials passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
