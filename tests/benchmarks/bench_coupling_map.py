"""Benchmark: the ``llm`` preset's critical W over the reward-coupling fraction, and where W 1.1 suffices.

Runs ``stare-lab simulate --preset llm --methods grpo,o1 --seeds 3 --sweep reward_coupling=C1,… --sweep
stare.reweight_w=W1,…`` (the preset's other knobs: its calibrated defaults) and prints one table row per coupling:
GRPO's final entropy and mean |H − H_tgt| over the second half (a GRPO run that stays in the band, or never reaches
it, leaves no drift to cancel at H_tgt: there the critical W says nothing), D_L+/|D_GRPO| and the L+-above-s* share where GRPO crosses H_tgt
(pooled over the GRPO seeds, :func:`simulators.calibrate.toy_observables`), the measured critical W of O1 (the
smallest grid W held on every seed) and whether W 1.1 holds. No pass/fail goal: the map is reported whatever it is
(docs/calibration.md).

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_coupling_map.py [--couplings 0.2,0.4,...] [--w 1.1,1.2,...]
        [--seeds 3] [--workers 2] [--out DIR] [key=value ...]
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

from simulators.calibrate import toy_observables

COUPLINGS = "0.2,0.4,0.6,0.8,1.0"
W_GRID = "1.1,1.2,1.5,2,3,5,8"


def _f(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--couplings", default=COUPLINGS)
    parser.add_argument("--w", default=W_GRID)
    parser.add_argument("--seeds", default="3")
    parser.add_argument("--workers", default="2")
    parser.add_argument("--out", default=None, help="keep the sweep here (default: a temporary directory)")
    parser.add_argument("extra", nargs="*", help="more key=value overrides of the llm preset")
    args = parser.parse_args()
    exe = Path(sys.executable).with_name("stare-lab")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "stare_lab.cli"]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_coupling_")) / "out"
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    argv = [*cmd, "simulate", "--preset", "llm", "--methods", "grpo,o1", "--seeds", args.seeds, "--out", str(out),
            "--workers", args.workers, "--no-plots", "--overwrite", "--sweep", f"reward_coupling={args.couplings}",
            "--sweep", f"stare.reweight_w={args.w}", *args.extra]
    print("stare-lab " + " ".join(argv[len(cmd):]))
    print(f"uptime: {uptime}")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({proc.returncode}):\n{proc.stderr}")
    summary = json.loads((out / "summary.json").read_text())
    band = summary["band"]
    by_slice = summary["critical"]["o1"]["by_slice"]
    print(f"wall {wall:.0f} s; band ±{band} nats; W grid {args.w}")
    print("| reward coupling | H_tgt | GRPO: H_end, mean abs(H − H_tgt) 2nd half | D_L+/abs(D_GRPO) at the crossing | "
          "L+ above s* | measured critical W (O1) | W 1.1 holds |")
    print("|---|---|---|---|---|---|---|")
    for c in args.couplings.split(","):
        label = f"grpo [reward_coupling={float(c):g}]"
        g = summary["methods"][label]
        runs = [out / d for d in g["run_dirs"].values()]
        target = g["mean"]["target_entropy"]
        obs = toy_observables(runs, target)
        crit = by_slice.get(f"reward_coupling={float(c):g}", {})
        dev11 = crit.get("deviation_by_w", {}).get("1.1")
        holds11 = "-" if dev11 is None else ("yes" if all(d is not None and d < band for d in dev11) else "no")
        grpo_dev, h_min = g["mean"]["mean_abs_dev_second_half"], g["mean"]["min_entropy"]
        note = ""
        if h_min is not None and h_min > target + band:
            note = " (GRPO never reaches H_tgt: nothing to hold)"
        elif grpo_dev is not None and grpo_dev < band:
            note = " (GRPO itself stays in the band)"
        print(f"| {float(c):g} | {_f(target)} | {_f(g['mean']['final_entropy'])}, {_f(grpo_dev)}{note} | "
              f"{_f(obs['d_ratio'])} | {_f(obs['lplus_above_sstar'])} | {_f(crit.get('measured_w'))} | {holds11} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
