"""GPU check of the trainer, for a lent accelerator, in one short call: ``bash scripts/gpu_check.sh``.

Expects an environment that already has CUDA torch, the CUDA ``vllm`` build, ``deepspeed``, ``transformers`` and
``math-verify`` (it installs nothing). Steps:

1. build a small random-init Qwen2 model locally (``trainer.tiny.build_tiny_model``, hidden 512, 4 layers,
   head_dim 64) — or use ``--model DIR`` (e.g. a converted SmolLM2, see scripts/real_model_demo.py);
2. run 2 colocated training steps (``trainer.loop.train``): vLLM (CUDA, ``uni`` executor, sleep mode around the
   update) + DeepSpeed ZeRO-3 in bf16, GSM8K prompts, lenient GSM8K reward, ``stare`` C2 with the gate on;
3. check the weight sync: the engine's log-probs of the sequences it samples after the sync must agree with the
   trainer's (bf16 tolerance: mean |Δ log p| ≤ 0.05 nats), and must not drift from step 1 to step 2 (a missing
   sync shows up as a growing gap after a large-lr update);
4. print rollout tokens/s and the phase timings;
5. before all that, the STARE selection on the GPU (the tensor implementation, no host synchronisation) must equal
   the CPU result bit for bit on a 512 × 4096 batch with ties (O1 and C2), and the STARE/GRPO loss time ratio on the
   GPU is printed (goal of issue 2: ≤ 1.20×). Exit code 0 = all checks passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GSM8K_CANDIDATES = [REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"]  # bundled (trainer/assets/README.md)


def _gsm8k(tmp: Path) -> Path:
    for p in GSM8K_CANDIDATES:
        if p.is_file():
            return p
    # data folder missing (a partial copy): a few synthetic GSM8K-style records (the check is about the machinery)
    out = tmp / "synthetic.jsonl"
    out.write_text("".join(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                           for a in range(1, 9) for b in range(1, 9)))
    return out


def _selection_check() -> bool:
    """STARE weights on CUDA (tensor implementation) vs on CPU, and the loss time ratio on CUDA."""
    import torch

    from stare_lab.config import LossConfig, STAREConfig
    from stare_lab.losses import PolicyLossInputs, compute_policy_loss
    from stare_lab.stare import stare_token_weights

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
        print(f"selection {variant}: GPU == CPU: {same}")
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

    times = {"grpo": [], "stare": []}
    for rep in range(12):
        for name, fn in (("grpo", grpo), ("stare", stare)):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if rep >= 2:
                times[name].append(time.perf_counter() - t)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"loss fwd+bwd on GPU, 512 x 4096: grpo {med['grpo'] * 1e3:.2f} ms, stare incl. selection "
          f"{med['stare'] * 1e3:.2f} ms, ratio {med['stare'] / med['grpo']:.3f} (goal <= 1.20)")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF model directory (default: build a small random-init model)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible", file=sys.stderr)
        return 2
    selection_ok = _selection_check()
    import vllm  # noqa: F401 - fail early if the CUDA build is missing

    from stare_lab.runs import read_run
    from trainer.config import load_trainer_config
    from trainer.loop import train
    from trainer.tiny import build_tiny_model

    t0 = time.time()
    tmp = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_"))
    tmp.mkdir(parents=True, exist_ok=True)
    data = _gsm8k(tmp)
    model = Path(args.model) if args.model else build_tiny_model(tmp / "model", seed=0, vocab_size=2048,
                                                                 hidden_size=512, num_layers=4, head_dim=64,
                                                                 corpus_file=data)
    cfg = load_trainer_config({
        "method": "c2", "seed": 0, "out_dir": str(tmp / "run"),
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)], "max_prompt_length": 256, "max_samples": 512},
        "rollout": {"engine": "vllm", "n": 8, "max_response_length": 128, "gpu_memory_utilization": 0.3,
                    "enable_sleep_mode": True},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "gate": "always"}},
        "optim": {"lr": 1e-4, "train_batch_size": 16, "micro_batch_max_tokens": 16384},
        "deepspeed": {"zero_stage": 3, "precision": "bf16"},
        "schedule": {"total_steps": args.steps, "save_freq": 0, "progress_bar": False},
    })
    train(cfg)
    rows = read_run(cfg.out_dir).metrics
    ok = selection_ok
    for r in rows:
        print(f"step {r['step']}: reward {r['reward']:.3f}  entropy {r['entropy']}  "
              f"logprob |diff| mean {r['rollout/logprob_diff_mean']:.4f} max {r['rollout/logprob_diff_max']:.4f}  "
              f"rollout {r['time/rollout_tokens_per_s']:.0f} tok/s  "
              + "  ".join(f"{k[5:-2]} {v:.2f}s" for k, v in r.items()
                          if k.startswith("time/") and k.endswith("_s") and isinstance(v, (int, float))))
    means = [r["rollout/logprob_diff_mean"] for r in rows]
    if any(m is None or m > 0.05 for m in means):
        print(f"FAIL: engine vs trainer log-prob gap too large: {means}")
        ok = False
    if len(means) >= 2 and means[-1] > 3 * max(means[0], 0.005):
        print(f"FAIL: the gap grows after the sync ({means}); the weights were not synced")
        ok = False
    print(f"gpu_check: {'OK' if ok else 'FAILED'} in {time.time() - t0:.0f} s  (run dir {cfg.out_dir})")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    sys.exit(main())
