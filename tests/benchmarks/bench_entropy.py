"""Benchmark (issue 2b): chunked ``entropy_from_logits`` on 4096 × 151,936 float32 logits.

Goals: extra peak memory over the input ≤ 0.25× the input size; time ≤ 1.2× the unchunked version (the same
function with one chunk holding every row).

Run:  OMP_NUM_THREADS=1 python tests/benchmarks/bench_entropy.py [--rows 4096] [--vocab 151936] [--repeats 3]
      [--naive] [--backward]

Each variant runs in its own fresh subprocess. Memory is the process's resident set: after the input is allocated
(filled in place, no temporaries) the peak-RSS counter is reset (``/proc/self/clear_refs`` ← 5, Linux), the
function runs once, and extra peak = VmHWM − VmRSS before the call. Large torch CPU buffers are mmap-backed, so
what a call allocates and frees shows up in VmHWM exactly once. Time is the minimum (and median) wall time over
``--repeats`` calls after that first one; the process CPU time is printed too (with one thread it is less
sensitive to other load on the machine than wall time). ``--naive`` adds the textbook ``-(softmax * log_softmax).sum(-1)`` and
``--backward`` a forward+backward pass of the chunked version (its extra includes the unavoidable [N, V] gradient).
The needed RAM is about input × 3.5 for the unchunked variant (× 4.5 with ``--naive``); timings on a shared,
loaded machine are noisy — rerun when the load is low and compare ratios from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GIB = 1024**3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def worker(variant: str, rows: int, vocab: int, repeats: int) -> dict:
    import torch

    from stare_lab.loss.entropy import default_chunk_rows, entropy_from_logits

    torch.manual_seed(0)
    x = torch.empty(rows, vocab, dtype=torch.float32)
    x.normal_(0.0, 3.0)
    x[:, : vocab // 100] = -float("inf")  # a masked slice of the vocabulary, as in real use
    input_bytes = x.numel() * x.element_size()

    if variant == "chunked":
        def fn():
            return entropy_from_logits(x)
    elif variant == "unchunked":
        def fn():
            return entropy_from_logits(x, chunk_size=rows)
    elif variant == "naive":
        def fn():
            logp = torch.log_softmax(x, -1)
            return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    elif variant == "backward":
        x.requires_grad_()

        def fn():
            h = entropy_from_logits(x)
            h.sum().backward()
            x.grad = None
            return h.detach()
    else:
        raise ValueError(variant)

    rss_before = _status_kib("VmRSS") * 1024
    reset = _reset_peak()
    hwm_before = _status_kib("VmHWM") * 1024
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    hwm = _status_kib("VmHWM") * 1024
    extra = hwm - (rss_before if reset else hwm_before)
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {
        "variant": variant,
        "rows": rows,
        "vocab": vocab,
        "chunk_rows": default_chunk_rows(vocab) if variant in ("chunked", "backward") else rows,
        "input_bytes": input_bytes,
        "extra_peak_bytes": extra,
        "extra_ratio": extra / input_bytes,
        "peak_reset": reset,
        "first_s": first,
        "min_s": min(times) if times else first,
        "median_s": statistics.median(times) if times else first,
        "cpu_min_s": min(cpu) if cpu else float("nan"),
        "checksum": float(out.double().sum()),
        "threads": torch.get_num_threads(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive", action="store_true", help="also time the textbook unchunked formula")
    parser.add_argument("--backward", action="store_true", help="also measure forward+backward (chunked)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.vocab, args.repeats)))
        return 0

    variants = ["chunked", "unchunked"] + (["naive"] if args.naive else []) + (["backward"] if args.backward else [])
    results = {}
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for variant in variants:
        cmd = [sys.executable, __file__, "--worker", variant, "--rows", str(args.rows), "--vocab", str(args.vocab),
               "--repeats", str(args.repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"{variant}: worker failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
            return 1
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results[variant] = res
        print(
            f"{variant:>9}: input {res['input_bytes'] / GIB:.2f} GiB, chunk {res['chunk_rows']} rows, "
            f"extra peak {res['extra_peak_bytes'] / GIB:.3f} GiB = {res['extra_ratio']:.3f}x input "
            f"(peak reset: {res['peak_reset']}), time min {res['min_s']:.3f} s / median {res['median_s']:.3f} s "
            f"/ first {res['first_s']:.3f} s, CPU min {res['cpu_min_s']:.3f} s, threads {res['threads']}, checksum {res['checksum']:.6e}"
        )
    try:
        load = os.getloadavg()
        print(f"load average (1/5/15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    except OSError:
        pass

    chunked, unchunked = results["chunked"], results["unchunked"]
    mem_ok = chunked["extra_ratio"] <= 0.25
    ratio = chunked["min_s"] / unchunked["min_s"]
    time_ok = ratio <= 1.2
    same = abs(chunked["checksum"] - unchunked["checksum"]) <= 1e-6 * abs(unchunked["checksum"])
    print(f"memory: chunked extra peak {chunked['extra_ratio']:.3f}x input (goal <= 0.25x): "
          f"{'PASS' if mem_ok else 'FAIL'}")
    print(f"time:   chunked / unchunked = {ratio:.3f} (goal <= 1.2): {'PASS' if time_ok else 'FAIL'}; "
          f"CPU-time ratio {chunked['cpu_min_s'] / unchunked['cpu_min_s']:.3f} (less sensitive to machine load)")
    print(f"values: chunked and unchunked checksums agree: {'PASS' if same else 'FAIL'}")
    return 0 if (mem_ok and time_ok and same) else 1


if __name__ == "__main__":
    sys.exit(main())
