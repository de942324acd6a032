"""Benchmark: the step preparation (``stare_lab.loss.step.prepare_step``) at the paper's 7B batch shape.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_step.py [--batch 512] [--length 3072] [--reps 9]

A STARE (O1, scope global, gate on) step of ``--batch`` responses with lengths uniform in [256, ``--length``]:

1. Time on one rank: ``prepare_step`` (counts, H̄ and the sums in one collective, the controller, ω) against the
   trainer's former preparation of the same numbers from its per-sequence lists (H̄ and the counts summed row by
   row, the lists re-padded with ``trainer.engines.policy.pad_2d``, ``stare_token_weights``, ω cut back into rows),
   interleaved, median process CPU time of ``--reps`` repetitions. Goal: ratio ≤ 1. For reference it also prints
   ``stare_token_weights`` alone (the selection both must do).
2. Bytes each rank sends for the global selection over 2 ranks (threads with an exact sum): the tensors given to
   the collective (named sums, two radix histograms, tie counts), against what the trainer's former
   ``all_gather_object`` of per-token Python lists (log-probs, advantages, masks of the rank's rows) pickled.
   Goal: at most a tenth. The 2-rank ω is checked equal to the 1-rank ω.

Exit status 0 when both goals are met. Timings on a shared machine are noisy; the paired medians are what counts.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from stare_lab.config import LossConfig, STAREConfig  # noqa: E402
from stare_lab.loss.stare import STAREController, stare_token_weights  # noqa: E402
from stare_lab.loss.step import StepBatch, prepare_step  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stare_lab"))
from _ranks import run_ranks  # noqa: E402


def make_batch(b: int, t: int, seed: int = 0) -> StepBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(256, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    lp = torch.log(torch.rand(b, t, generator=g).clamp_min(1e-6)) * 0.3
    ent = torch.rand(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    return StepBatch(mask, adv, lp, entropy=ent)


def former_preparation(batch: StepBatch, cfg: LossConfig) -> list[torch.Tensor]:
    """What trainer/run/loop.py did before prepare_step, on one rank: per-sequence tensors and list masks in, ω rows
    out (the all_gather_object of one rank returns its own lists)."""
    def pad_2d(rows, value, dtype, width):  # the former trainer.engines.policy.pad_2d, kept here as the baseline
        out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
        for i, r in enumerate(rows):
            if len(r):
                out[i, : len(r)] = torch.as_tensor(list(r), dtype=dtype)
        return out

    lens = batch.response_mask.sum(1).tolist()
    old_lp = [batch.old_logprobs[i, :n] for i, n in enumerate(lens)]
    old_ent = [batch.entropy[i, :n] for i, n in enumerate(lens)]
    masks = [[1.0] * n for n in lens]
    advs = batch.advantages.tolist()
    ent_sum = sum(float((e * torch.tensor(m)).sum()) for e, m in zip(old_ent, masks))
    n_tok = sum(sum(m) for m in masks)
    h_bar = ent_sum / n_tok
    ctrl = STAREController(cfg.stare)
    ctrl.update(h_bar)
    lps, width = [lp.tolist() for lp in old_lp], max(lens)
    w, stats = stare_token_weights(pad_2d(lps, 0.0, torch.float32, width), torch.tensor(advs),
                                   pad_2d(masks, 0.0, torch.float32, width), cfg.stare, gate_on=ctrl.gate_on,
                                   reweight_w=ctrl.reweight_w, reweight_m=ctrl.reweight_m)
    {k: float(v) for k, v in stats.items()}
    return [w[i, :n].clone() for i, n in enumerate(lens)]


def cpu_time(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--length", type=int, default=3072)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    batch = make_batch(args.batch, args.length)
    cfg = LossConfig(loss_mode="stare", stare=STAREConfig(gate="always"))
    n_tok = int(batch.response_mask.sum())
    print(f"batch {args.batch} x {args.length} ({n_tok} valid tokens), STARE O1 scope global, gate on")

    prep = lambda: prepare_step(batch, cfg, controller=STAREController(cfg.stare))  # noqa: E731
    def sel():
        return stare_token_weights(batch.old_logprobs, batch.advantages, batch.response_mask, cfg.stare)

    former = lambda: former_preparation(batch, cfg)  # noqa: E731
    prep(), sel(), former()  # warm up (the native kernel is built on first use)
    ratios, t_prep, t_sel, t_former = [], [], [], []
    for _ in range(args.reps):
        a, b, c = cpu_time(former), cpu_time(prep), cpu_time(sel)
        t_former.append(a)
        t_prep.append(b)
        t_sel.append(c)
        ratios.append(b / a)
    ratio = statistics.median(ratios)
    print(f"1 rank: prepare_step {statistics.median(t_prep) * 1e3:.1f} ms CPU, the former list path "
          f"{statistics.median(t_former) * 1e3:.1f} ms; paired median ratio {ratio:.3f} (goal <= 1.00); "
          f"stare_token_weights alone {statistics.median(t_sel) * 1e3:.1f} ms")
    assert torch.equal(torch.cat(former()), prep().token_weights[batch.response_mask])

    ref = prep().token_weights
    half = args.batch // 2
    parts = [StepBatch(batch.response_mask[r], batch.advantages[r], batch.old_logprobs[r], entropy=batch.entropy[r])
             for r in (slice(0, half), slice(half, None))]
    sent = [0, 0]

    def rank_fn(coll):
        inner = coll.all_reduce

        def counting(t):
            sent[coll.rank] += t.numel() * t.element_size()
            return inner(t)

        coll.all_reduce = counting
        return prepare_step(parts[coll.rank], cfg, controller=STAREController(cfg.stare), collective=coll)

    t0 = time.perf_counter()
    res, group = run_ranks(2, rank_fn)
    wall = time.perf_counter() - t0
    same = torch.equal(torch.cat([r.token_weights for r in res]), ref)
    rows = [(batch.old_logprobs[i][batch.response_mask[i]].tolist(), float(batch.advantages[i]),
             batch.response_mask[i][: int(batch.response_mask[i].sum())].float().tolist()) for i in range(half)]
    old_bytes = len(pickle.dumps(([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])))
    frac = sent[0] / old_bytes
    print(f"2 ranks (threads): {group.calls[0]} collectives, {sent[0] / 2**20:.2f} MiB sent per rank; the former "
          f"pickled all_gather_object of rank 0's lists: {old_bytes / 2**20:.1f} MiB; ratio {frac:.3f} (goal <= 0.1); "
          f"wall {wall:.2f} s for both; omega equal to 1 rank: {same}")
    ok = ratio <= 1.0 and frac <= 0.1 and same
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
