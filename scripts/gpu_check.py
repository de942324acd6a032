"""GPU check of the trainer in one short call (``bash scripts/gpu_check.sh``; docs/trainer.md "Checks").

Sized for the GPU machine the project can be checked on: one H200, a few minutes, no network, torch (CUDA) and
transformers but no vLLM (its CUDA build cannot travel) and DeepSpeed from ``wheels/``. In one run:

1. the core on CUDA: STARE selection on the GPU equals the CPU result bit for bit (512 × 4096 batch with ties,
   O1 and C2), and the STARE/GRPO loss time ratio on the GPU (issue 2's goal ≤ 1.20×);
2. DeepSpeed ZeRO-3 in bf16 with the HF rollout engine (``rollout.engine=hf``; it sleeps — weights to host memory —
   right after generation and wakes for the sync, :mod:`trainer.engines.memory`) for 2 steps of ``trainer.run.loop.train``, on
   the tiny model and on a ~0.5B model built from a config (Qwen2.5-0.5B's architecture, random weights, vocab
   151,936 so the logits are full size); STARE C2 with the gate on plus a small entropy bonus, so every update moves
   the weights whatever the rewards of a random model;
3. the sync path: the engine's log-probs after each sync equal the trainer's (bf16: mean |Δ log p| ≤ 0.05 nats) and
   the gap does not grow from step 1 to step 2, while the update did change the policy (measured
   ``entropy_change`` ≠ 0);
4. rollout and update tokens/s, and per phase ``torch.cuda.max_memory_allocated`` (the run's ``memory/…`` metrics)
   next to ``stare-lab plan``'s prediction of what the allocator holds (its ``allocated_gib``) for this GPU; a phase
   that uses more than the prediction (+10 %, +0.25 GiB) fails the check (the planner would let an OOM through).

``--dry-run`` runs the same steps small on CPU (fp32; the CUDA-only parts are skipped): CI runs it
(tests/trainer/test_gpu_check.py). A JSON report is written to ``--out`` (default: the work directory). Exit code 0
= every check passed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the plan's phase for each phase the trainer measures
PLAN_PHASE = {"rollout": "rollout", "old_logprob": "old_logprob", "update": "update", "sync": "wake_sync"}
#: Qwen2.5-0.5B's public architecture (config.json of Qwen/Qwen2.5-0.5B), weights random
QWEN05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, head_dim=64, vocab_size=151936, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def _data(tmp: Path) -> Path:
    """Synthetic GSM8K-style records with single-digit answers (no data travels with the check)."""
    out = tmp / "synthetic.jsonl"
    out.write_text("".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                           for a in range(0, 5) for b in range(0, 5)))
    return out


def _selection_check(report: dict) -> bool:
    """STARE weights on CUDA (tensor implementation) vs on CPU, and the loss time ratio on CUDA."""
    import torch

    from stare_lab.config import LossConfig, STAREConfig
    from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss
    from stare_lab.loss.stare import stare_token_weights

    g = torch.Generator().manual_seed(0)
    old = (-torch.rand(512, 4096, generator=g).pow(3) * 6 * 8).round() / 8  # a grid: many ties
    adv = torch.randn(512, generator=g)
    mask = torch.arange(4096)[None, :] < torch.randint(1024, 4097, (512, 1), generator=g)
    ok = True
    for variant in ("O1", "C2"):
        cfg = STAREConfig(variant=variant, top_p_ratio=0.1, reweight_w=1.3, reweight_m=0.7)
        w_cpu, _ = stare_token_weights(old, adv, mask, cfg)
        w_gpu, _ = stare_token_weights(old.cuda(), adv.cuda(), mask.cuda(), cfg)
        same = torch.equal(w_gpu.cpu(), w_cpu)
        ok &= same
        report[f"selection_{variant}_gpu_equals_cpu"] = same
        print(f"core: STARE selection {variant} on the GPU equals the CPU result: {same}")
    lp, oldc, advc, maskc = (t.cuda() for t in (old + 0.01, old, adv, mask))
    lcfg = LossConfig(loss_mode="stare", stare=STAREConfig(scope="global"))

    def grpo():
        x = lp.clone().requires_grad_(True)
        compute_policy_loss("grpo", PolicyLossInputs(x, oldc, advc, maskc), lcfg)[0].backward()

    def stare():
        x = lp.clone().requires_grad_(True)
        w, st = stare_token_weights(oldc, advc, maskc, lcfg.stare)
        inputs = PolicyLossInputs(x, oldc, advc, maskc, token_weights=w, gate_on=True, stare_stats=st)
        compute_policy_loss("stare", inputs, lcfg)[0].backward()

    times: dict[str, list[float]] = {"grpo": [], "stare": []}
    for rep in range(12):
        for name, fn in (("grpo", grpo), ("stare", stare)):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if rep >= 2:
                times[name].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    report["loss_time_ratio"] = med["stare"] / med["grpo"]
    print(f"core: loss fwd+bwd on the GPU, 512 x 4096: grpo {med['grpo'] * 1e3:.2f} ms, stare incl. selection "
          f"{med['stare'] * 1e3:.2f} ms, ratio {report['loss_time_ratio']:.3f} (goal <= 1.20)")
    return ok


def _models(tmp: Path, data: Path, dry: bool) -> dict[str, Path]:
    """The tiny model (trainer.tiny) and the ~0.5B one (its tokenizer: the tiny model's)."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from trainer.tiny import build_tiny_model

    tiny = build_tiny_model(tmp / "tiny", seed=0, corpus_file=data)
    big = tmp / "qwen2.5-0.5b-arch"
    arch = dict(QWEN05B)
    if dry:  # the same code path with a CPU-sized stand-in (the full vocabulary, 2 narrow layers)
        arch.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32)
    tok = AutoTokenizer.from_pretrained(tiny)
    cfg = Qwen2Config(**arch, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(big, safe_serialization=True)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, big / f.name)
    del model
    return {"tiny": tiny, "0.5b": big}


def _train(name: str, model: Path, data: Path, tmp: Path, dry: bool, report: dict) -> bool:
    import torch

    from stare_lab.platform.runs import read_run
    from trainer.config import load_trainer_config
    from trainer.run.loop import train
    from trainer.planning.plan import Cluster, load_arch, plan

    cfg = load_trainer_config({
        "method": "c2", "seed": 0, "out_dir": str(tmp / f"run_{name}"),
        "model": {"path": str(model), "gradient_checkpointing": not dry},
        "data": {"train_files": [str(data)], "max_prompt_length": 64},
        "rollout": {"engine": "hf", "n": 4 if dry else 8, "max_response_length": 16 if dry else 128},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"loss_mode": "stare", "entropy_coeff": 0.01, "stare": {"variant": "C2", "gate": "always"}},
        "optim": {"lr": 5e-3, "train_batch_size": 2 if dry else 8, "micro_batch_max_tokens": 4096},
        # ZeRO-3 even on one GPU: the check measures its memory against the plan (deepspeed.single_process_stage)
        "deepspeed": {"zero_stage": 3, "single_process_stage": None, "precision": "fp32" if dry else "bf16"},
        "schedule": {"total_steps": 2, "save_freq": 0, "progress_bar": False, "measure_entropy_change": True},
    })
    arch = load_arch(str(model))
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    rows = read_run(cfg.out_dir).metrics
    ok = [r["step"] for r in rows] == [1, 2] and all(r["skipped"] == 0 for r in rows)
    tol = 1e-3 if dry else 0.05
    diffs = [r["rollout/logprob_diff_mean"] for r in rows]
    sync_ok = all(d is not None and d <= tol for d in diffs) and diffs[1] <= 3 * max(diffs[0], tol / 10)
    moved = rows[0]["entropy_change"] not in (None, 0.0)
    res = {"params": arch.params, "wall_s": wall, "logprob_diff_mean": diffs, "sync_ok": sync_ok,
           "entropy_change_step1": rows[0]["entropy_change"], "update_moved_weights": moved,
           "rollout_tokens_per_s": [r["time/rollout_tokens_per_s"] for r in rows],
           "update_tokens_per_s": [r["num_tokens"] / max(r["time/update_s"], 1e-9) for r in rows]}
    print(f"{name} ({arch.params / 1e6:.1f} M params, vocab {arch.vocab}): 2 steps in {wall:.0f} s; engine vs "
          f"trainer log-prob |diff| mean {diffs[0]:.2e} / {diffs[1]:.2e} (<= {tol:g}: "
          f"{'ok' if sync_ok else 'FAIL'}); entropy change of update 1 {rows[0]['entropy_change']} "
          f"({'moved' if moved else 'FAIL: did not move'})")
    print(f"  throughput: rollout {res['rollout_tokens_per_s'][-1]:.0f} tok/s, update "
          f"{res['update_tokens_per_s'][-1]:.0f} response tok/s (step 2)")
    mem_ok = True
    gpu = torch.cuda.is_available()
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if gpu else 141.0  # CPU: an H200's, nominal
    p = plan(cfg, Cluster(nodes=1, gpus_per_node=1, gpu_memory_gib=gib), arch)
    res["plan_peak_gib"], res["memory"] = p["peak_gib"], {}
    cells = []
    for phase, plan_phase in PLAN_PHASE.items():
        want = p["phases"][plan_phase]["allocated_gib"]
        got = max((r.get(f"memory/{phase}_peak_gib") or 0.0) for r in rows) if gpu else None
        under = got is not None and got > 1.10 * want + 0.25
        mem_ok &= not under
        res["memory"][phase] = {"measured_gib": got, "plan_allocated_gib": want, "plan_underestimates": under}
        cells.append(f"{phase} {'n/a' if got is None else f'{got:.2f}'} / {want:.2f}"
                     + (" UNDER-PREDICTED" if under else ""))
    print("  peak memory per phase, torch allocated / stare-lab plan (GiB): " + ", ".join(cells)
          + ("" if gpu else "  (not measured on CPU: torch.cuda.max_memory_allocated needs a GPU)"))
    report[name] = res
    return ok and sync_ok and moved and mem_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the same steps, small, on CPU (what CI runs)")
    ap.add_argument("--out", help="directory for gpu_check.json (default: the work directory)")
    ap.add_argument("--workdir", help="where models and runs go (default: a new temporary directory)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from trainer.cli import configure_output
    from trainer.engines.launch import cpu_env_defaults

    configure_output(verbose=False)
    cpu_env_defaults()
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (use --dry-run on CPU)", file=sys.stderr)
        return 2
    import deepspeed

    t0 = time.time()
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check_"))
    tmp.mkdir(parents=True, exist_ok=True)
    report: dict = {"dry_run": args.dry_run, "torch": torch.__version__, "deepspeed": deepspeed.__version__,
                    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    print(f"gpu_check: torch {torch.__version__}, deepspeed {deepspeed.__version__}, device {report['device']}")
    ok = _selection_check(report) if torch.cuda.is_available() else True
    data = _data(tmp)
    for name, model in _models(tmp, data, args.dry_run).items():
        ok &= _train(name, model, data, tmp, args.dry_run, report)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    report.update(ok=bool(ok), wall_s=time.time() - t0)
    out = Path(args.out) if args.out else tmp
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check: {'OK' if ok else 'FAILED'} in {report['wall_s']:.0f} s (report {out / 'gpu_check.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
