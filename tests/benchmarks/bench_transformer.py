"""Benchmark: wall time of the `transformer` preset sweep (GRPO, O1, C2; one seed) and the numbers it shows.

Run:  OMP_NUM_THREADS=1 python tests/benchmarks/bench_transformer.py [--preset transformer] [--out DIR] [--direct]

Times the whole ``stare-lab simulate --preset transformer`` command (a fresh process: imports, warm start — trained
once per seed and cached in the sweep dir, then reused by the other methods — and the three RL runs); the target
is ≤ 90 s on the 2-core CI machine. ``--direct`` calls :func:`simulators.transformer.runner.run` in-process instead (when
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
    ap.add_argument("--direct", action="store_true", help="call simulators.transformer.runner.run in-process")
    ap.add_argument("--seeds", type=int, default=1, help="seeds for the CLI (the transformer preset is one seed)")
    ap.add_argument("--no-plots", action="store_true", help="pass --no-plots to the CLI")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_transformer_"))
    if out.exists():
        shutil.rmtree(out)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    if args.direct:
        from simulators.transformer.runner import PRESET_SWEEPS, config_from_preset, run

        sweep = PRESET_SWEEPS[args.preset]
        for seed in sweep["seeds"][: args.seeds]:
            for method in sweep["methods"]:
                run(config_from_preset(args.preset, method=method, seed=seed), out / method / f"seed{seed}")
    else:
        cmd = [sys.executable, "-m", "stare_lab.cli", "simulate", "--preset", args.preset, "--out", str(out),
               "--seeds", str(args.seeds)] + (["--no-plots"] if args.no_plots else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:], sep="\n")
            print(f"command failed ({proc.returncode}): {' '.join(cmd)}")
            return proc.returncode
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    print(f"preset {args.preset}: wall {wall:.1f} s (target <= 90 s for 'transformer'); "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f} on {os.cpu_count()} cores")

    from stare_lab.platform.runs import find_runs, read_run

    for path in find_runs([out]):
        r = read_run(path)
        s = r.summary or {}
        k = r.config.get("eval_samples")
        fmt = lambda v: "n/a" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
        print(f"\n{path.relative_to(out)}  ({len(r.metrics)} steps, {s.get('wall_s', 0):.1f} s RL)  warm start: "
              f"H={fmt(s.get('warm_start/entropy'))} acc={fmt(s.get('warm_start/accuracy'))} "
              f"pass@{k}={fmt(s.get(f'warm_start/pass@{k}'))}")
        print(f"  entropy {fmt(s.get('initial_entropy'))} -> {fmt(s.get('final_entropy'))} (min "
              f"{fmt(s.get('min_entropy'))}; first step < 10 %: {fmt(s.get('steps_to_collapse'))}); gate on "
              f"{fmt(s.get('gate_on_frac'))} of steps; H_tgt {fmt(s.get('target_entropy'))}, |H - H_tgt| 2nd half "
              f"{fmt(s.get('mean_abs_dev_second_half'))}")
        print(f"  sampled accuracy {fmt(s.get('initial_accuracy'))} -> {fmt(s.get('final_accuracy'))}; held-out "
              f"accuracy {fmt(s.get('eval/accuracy'))}, pass@{k} {fmt(s.get(f'eval/pass@{k}'))}")
        for name in ("grad_dot", "logit_first_order", "phi_tokens"):
            print(f"  predictor {name:18s} R2 {fmt(s.get(f'fit/{name}/r2'))}  slope {fmt(s.get(f'fit/{name}/slope'))}"
                  f"  rel. error {fmt(s.get(f'fit/{name}/rel_err'))}")
    print(f"\nrun directories: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
