"""Benchmark: wall time of the `transformer` preset sweep (GRPO, O1, C2; one seed) and the numbers it shows.

Run:  OMP_NUM_THREADS=1 python tests/benchmarks/bench_transformer.py [--preset transformer] [--out DIR] [--direct]

Times the whole ``stare-lab simulate --preset transformer`` command (a fresh process: imports, warm start — trained
once per seed and cached in the sweep dir, then reused by the other methods — and the three RL runs); the target
is ≤ 90 s on the 2-core CI machine. ``--direct`` calls :func:`simulators.transformer.run` in-process instead (when
the CLI is unavailable). Then prints, per run: post-warm-start entropy/accuracy, GRPO collapse (first step below
10 % of the initial entropy), R² and slope of each ΔH predictor, held-out accuracy and pass@k. Wall times taken
while other processes load the machine are not comparable: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="transformer")
    ap.add_argument("--out", default=None, help="sweep directory (default: a fresh temporary one)")
    ap.add_argument("--direct", action="store_true", help="call simulators.transformer.run in-process")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_transformer_"))
    if out.exists():
        shutil.rmtree(out)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    if args.direct:
        from simulators.transformer import PRESET_SWEEPS, config_from_preset, run

        sweep = PRESET_SWEEPS[args.preset]
        for seed in sweep["seeds"]:
            for method in sweep["methods"]:
                run(config_from_preset(args.preset, method=method, seed=seed), out / f"{method}_seed{seed}")
    else:
        cmd = [sys.executable, "-m", "stare_lab.cli", "simulate", "--preset", args.preset, "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:], sep="\n")
            print(f"command failed ({proc.returncode}): {' '.join(cmd)}")
            return proc.returncode
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    print(f"preset {args.preset}: wall {wall:.1f} s (target <= 90 s for 'transformer'); "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f} on {os.cpu_count()} cores")

    from stare_lab.runs import find_runs, read_run

    for path in find_runs([out]):
        r = read_run(path)
        s = r.summary or {}
        k = r.config.get("eval_samples")
        ws = f"warm start H={s.get('warm_start/entropy', float('nan')):.3f} acc={s.get('warm_start/accuracy', float('nan')):.3f}"
        print(f"\n{path.relative_to(out)}  ({len(r.metrics)} steps, {s.get('time/total_s', 0):.1f} s RL)  {ws}")
        print(f"  entropy {s.get('entropy_initial'):.3f} -> {s.get('entropy_final'):.3f} "
              f"(ratio {s.get('entropy_final_ratio'):.3f}; first step < 10 %: {s.get('steps_to_10pct_entropy')}); "
              f"gate on {s.get('gate_on_frac', 0):.2f} of steps")
        print(f"  sampled accuracy {r.metrics[0]['accuracy']:.3f} -> {s.get('accuracy_final'):.3f}; held-out "
              f"accuracy {s.get('eval/accuracy')}, pass@{k} {s.get(f'eval/pass@{k}')}")
        for name in ("grad_dot", "logit_first_order", "phi_tokens"):
            r2, slope = s.get(f"fit/{name}/r2"), s.get(f"fit/{name}/slope")
            fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
            print(f"  predictor {name:18s} R2 {fmt(r2)}  slope {fmt(slope)}  R2(identity) "
                  f"{fmt(s.get(f'fit/{name}/r2_identity'))}")
    print(f"\nrun directories: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
