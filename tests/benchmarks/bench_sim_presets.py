"""Benchmark: every tabular preset in the first-order regime (issue 13 item 1), and each preset's table.

For each tabular preset, runs its default methods × 3 seeds (the sweep `stare-lab simulate --preset P` runs) and
reports: the pooled fit of GRPO's measured one-step entropy change on the first-order prediction over all steps of
all seeds (goal: R² ≥ 0.95 and slope 1 ± 0.15; `theory`: R² ≥ 0.99, slope 1 ± 0.05, and its STARE runs open the
gate), the median push ratio of every method (STARE's measured one-step effect over its first-order size; ≥ 0.8 in
the regime), the end-of-sweep table and the headline.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_sim_presets.py [--only demo,collapse] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BOUNDS = {"theory": (0.99, 0.05)}
DEFAULT = (0.95, 0.15)


def main() -> int:
    from simulators.presets import PRESETS
    from simulators.run_stats import REGIME_RATIO, fit_line
    from simulators.sweep import format_table, plan_sweep, run_sweep
    from stare_lab.platform.runs import read_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated presets (default: all tabular presets)")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(PRESETS)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    ok = True
    for name in names:
        out = Path(tempfile.mkdtemp(prefix=f"bench_{name}_"))
        t0 = time.perf_counter()
        plan = plan_sweep(name, None, 3, out, workers=args.workers)
        summary = run_sweep(plan)
        wall = time.perf_counter() - t0
        pred, meas = [], []
        for s in plan.seeds:
            for row in read_run(plan.run_dirs[("grpo", s)]).metrics:
                pred.append(row["pred_entropy_change"])
                meas.append(row["entropy_change"])
        fit = fit_line(pred, meas)
        r2_min, slope_tol = BOUNDS.get(name, DEFAULT)
        good = fit["r2"] >= r2_min and abs(fit["slope"] - 1) <= slope_tol
        pushes = {k: e["mean"].get("push_ratio") for k, e in summary["methods"].items()}
        regime = all(p is None or p >= REGIME_RATIO for p in pushes.values())
        gate = True
        if name == "theory":
            gate = all((e["mean"].get("gate_on_frac") or 0) > 0 for k, e in summary["methods"].items() if k != "grpo")
        ok &= good and regime and gate
        print(f"\n===== {name} ({PRESETS[name]['overrides'].get('mode', 'sampled')}, {wall:.1f} s) =====")
        print(f"GRPO pooled over {len(pred)} (step, seed) pairs: R2 {fit['r2']:.4f}, slope {fit['slope']:.3f} "
              f"(goal R2 >= {r2_min}, slope 1 +- {slope_tol}): {'PASS' if good else 'FAIL'}")
        print("median push ratio: " + ", ".join(f"{k} {v:.3f}" for k, v in pushes.items() if v is not None)
              + f" (>= {REGIME_RATIO}: {'PASS' if regime else 'FAIL'})" + ("" if name != "theory" else
              f"; STARE gate opened: {'PASS' if gate else 'FAIL'}"))
        print(summary["headline"])
        print(format_table(summary).rsplit("\n", 1)[0])
        for note in summary["notes"]:
            print(note)
    print(f"\n{'PASS' if ok else 'FAIL'}: every preset inside its bounds")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
