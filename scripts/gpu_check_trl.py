"""GPU check of STARE inside TRL in one short call (``bash scripts/gpu_check.sh --trl``; docs/integrations.md "GPU
check").

Sized for the GPU machine the project can be checked on: one H200, ≤ 8 minutes, no network, torch (CUDA),
transformers and accelerate but no vLLM, TRL and ``datasets`` from ``wheels/`` (``bash scripts/prepare_gpu_wheels.sh``).
Model: Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B: 24 layers, hidden 896, vocabulary 151,936,
tied embeddings), random weights, built offline with the tokenizer of ``trainer.tiny``; then warm-started by a short
supervised phase on noisy additions ("What is 3 + 4?" → "7", a share of them wrong), so that the policy has a real,
finite entropy and GRPO has groups with reward variance. Reward: 1 when the completion's first number is a + b.

What each check verifies (each prints one line; the JSON report has the numbers; exit 0 = all correctness checks
passed):

1. ``gate_off_parity``: ``STAREGRPOTrainer`` with ``gate="never"`` trains the same parameters as plain
   ``GRPOTrainer`` (deterministic rollouts, ``torch.use_deterministic_algorithms``, 2 steps, ``loss_type="dapo"``):
   max |θ_STARE − θ_TRL| = 0, or no larger than between two runs of plain TRL (the floor of the GPU's own
   non-determinism).
2. ``weights``: on every step of the C2 run, ω equals the core's ``stare_token_weights`` recomputed on the CPU from
   the step's log-probs, advantages and mask (bit for bit), and |L+| = max(1, ⌈P·|T+|⌉).
3. ``entropy``: the H̄ the gate saw on step 1 and 2 equals −Σ p log p of the model's own logits computed here (float32
   log_softmax of the same forward under the same autocast), within 0.02 nats.
4. ``runs``: GRPO and C2 (gate on: ``target_entropy`` above the warm-started entropy, adaptive W/M) each complete
   ~30 steps with finite metrics rows; their entropy curves are reported side by side, and whether C2 ends above
   GRPO (the method's claim, a finding rather than a correctness check: ``c2_entropy_above_grpo``).

``--dry-run`` runs the same steps small on CPU (fp32, 2 layers of width 64 with the full vocabulary, a few steps):
CI runs it (tests/integrations/test_trl_gpu_check.py). Usage: ``python scripts/gpu_check_trl.py [--dry-run]
[--out DIR] [--workdir DIR] [--steps 30]`` (2 with ``--dry-run``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Qwen2.5-0.5B's public architecture (config.json of Qwen/Qwen2.5-0.5B), weights random
QWEN05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, head_dim=64, vocab_size=151936, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
#: a CPU-sized stand-in for --dry-run: the same code path and the full vocabulary, 2 narrow layers
DRY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
           head_dim=32)


def _problems(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(n)]


def _prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}? Answer:"


def reward(completions, answer, **kw) -> list[float]:
    """1.0 when the completion's first integer is the answer, else 0.0."""
    out = []
    for text, ans in zip(completions, answer):
        m = re.search(r"-?\d+", text if isinstance(text, str) else str(text))
        out.append(float(m is not None and m.group() == str(ans)))
    return out


def build_model(tmp: Path, dry: bool, device: str) -> tuple[Path, dict]:
    """The Qwen2.5-0.5B-shaped model with the tiny tokenizer, warm-started on noisy additions (module docstring)."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from trainer.tiny import build_tiny_model

    corpus = tmp / "corpus.jsonl"  # the tokenizer's training text, in trainer.tiny's record format
    corpus.write_text("".join(json.dumps({"problem": _prompt(a, b), "answer": str(a + b)}) + "\n"
                              for a in range(10) for b in range(10)))
    tiny = build_tiny_model(tmp / "tiny", seed=0, corpus_file=corpus)
    tok = AutoTokenizer.from_pretrained(tiny)
    arch = {**QWEN05B, **(DRY if dry else {})}
    cfg = Qwen2Config(**arch, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device)
    # warm start: next-token prediction on "What is a + b? Answer: c<eos>" with c wrong 30 % of the time
    rng = random.Random(1)
    steps, batch = (30, 16) if dry else (200, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3 if dry else 5e-4)
    t0 = time.perf_counter()
    losses = []
    for _ in range(steps):
        texts = []
        for a, b in _problems(batch, rng.randrange(10**9)):
            c = a + b if rng.random() < 0.7 else rng.randint(0, 18)
            texts.append(f"{_prompt(a, b)} {c}{tok.eos_token}")
        enc = tok(texts, return_tensors="pt", padding=True).to(device)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out = tmp / "qwen2.5-0.5b-arch"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    info = {"params": sum(p.numel() for p in model.parameters()), "vocab": arch["vocab_size"],
            "warm_start_steps": steps, "warm_start_loss": [losses[0], losses[-1]],
            "warm_start_s": time.perf_counter() - t0}
    print(f"model: {info['params'] / 1e6:.1f} M params, vocab {info['vocab']}; warm start {steps} steps in "
          f"{info['warm_start_s']:.0f} s, loss {losses[0]:.2f} -> {losses[-1]:.2f}", flush=True)
    del model, opt
    return out, info


def _parity_reward(completions, completion_ids, **kw) -> list[float]:
    """A reward of the fixed rollouts' tokens with spread inside each group (its length mod 3 and the parity of its
    first token), so that the parity runs' updates move the weights."""
    return [float(len(ids) % 3) + 0.5 * (ids[0] % 2) for ids in completion_ids]


def _dataset(n: int, seed: int):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": _prompt(a, b), "answer": str(a + b)} for a, b in _problems(n, seed)])


def _fixed_rollouts(max_len: int, vocab: int, eos: int, num_generations: int):
    """Deterministic completions (TRL's public ``rollout_func``): row j of a prompt's group depends only on the
    prompt and j, so two runs see the same tokens whatever the sampler does."""

    def rollout_func(prompts, trainer):
        tok = trainer.processing_class
        p = trainer.accelerator.process_index
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            j = (p * len(prompts) + i) % num_generations
            rng = random.Random(zlib.crc32(f"{prompt}|{j}".encode()))
            prompt_ids.append(tok(prompt)["input_ids"])
            body = [rng.randrange(3, min(vocab, len(tok))) for _ in range(rng.randint(2, max_len - 1))]
            completion_ids.append(body + [eos])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout_func


def _args(out: Path, dry: bool, device: str, steps: int, **kw):
    common = dict(output_dir=str(out), per_device_train_batch_size=16 if dry else 64, num_generations=4 if dry else 8,
                  max_completion_length=8 if dry else 16, temperature=1.0, learning_rate=1e-4 if dry else 2e-5,
                  loss_type="dapo", beta=0.0, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no",
                  seed=0, bf16=device == "cuda", use_cpu=device == "cpu", disable_dropout=True,
                  lr_scheduler_type="constant")
    return {**common, **kw}


def gate_off_parity(model: Path, tmp: Path, dry: bool, device: str, report: dict) -> bool:
    """Check 1: plain GRPOTrainer twice (the floor) and STAREGRPOTrainer with the gate off, same rollouts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    tok = AutoTokenizer.from_pretrained(model)
    final = {"init": {k: v.detach().float().cpu() for k, v in
                      AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).named_parameters()}}
    for name in ("trl", "trl_again", "stare_gate_off"):
        kw = _args(tmp / f"parity_{name}", dry, device, 2)
        if name.startswith("trl"):
            cfg, cls = GRPOConfig(**kw), GRPOTrainer
        else:
            cfg, cls = STAREGRPOConfig(**kw, gate="never", variant="C2", quadrant_every=0, stare_run_dir=""), \
                STAREGRPOTrainer
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        trainer = cls(model=m, processing_class=tok, reward_funcs=_parity_reward, args=cfg, train_dataset=_dataset(64, 5),
                      rollout_func=_fixed_rollouts(cfg.max_completion_length, len(tok), tok.eos_token_id,
                                                   cfg.num_generations))
        trainer.train()
        final[name] = {k: v.detach().float().cpu() for k, v in trainer.model.named_parameters()}
        del trainer, m
    torch.use_deterministic_algorithms(False)

    def diff(a, b):
        return max((final[a][k] - final[b][k]).abs().max().item() for k in final[a])

    floor, got = diff("trl", "trl_again"), diff("trl", "stare_gate_off")
    moved = diff("trl", "init")
    ok = moved > 0.0 and (got == 0.0 or got <= floor)
    report["gate_off_parity"] = {"max_abs_diff": got, "trl_vs_trl_floor": floor, "update_moved": moved, "ok": ok}
    print(f"1 gate-off parity: max |theta_STARE - theta_TRL| = {got:.3e} (TRL vs TRL rerun {floor:.3e}; the 2 "
          f"updates moved theta by up to {moved:.3e}): {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def runs(model: Path, tmp: Path, dry: bool, device: str, steps: int, report: dict) -> bool:
    """Checks 2-4: GRPO (plain GRPOTrainer) and C2 (STAREGRPOTrainer, gate on) for ``steps`` steps each."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from stare_lab.config import STAREConfig
    from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer
    from stare_lab.loss.stare import stare_token_weights
    from stare_lab.platform.runs import read_run

    tok = AutoTokenizer.from_pretrained(model)
    checks = {"weights": [], "entropy": []}

    class Checked(STAREGRPOTrainer):
        def _stare_begin_step(self, micro):
            prep = super()._stare_begin_step(micro)
            b = prep.batch
            stare = STAREConfig(**{k: getattr(self.args, k) for k in ("variant", "top_p_ratio", "scope")})
            core, stats = stare_token_weights(b.old_logprobs.cpu(), b.advantages.cpu(), b.response_mask.cpu(), stare,
                                              reweight_w=prep.reweight_w, reweight_m=prep.reweight_m)
            mask = b.response_mask.cpu()
            n_pos = int((mask & (b.advantages.cpu()[:, None] > 0)).sum())
            same = prep.token_weights is not None and torch.equal(
                torch.where(mask, prep.token_weights.cpu(), 1.0), core)
            k_ok = n_pos == 0 or int(stats["stare/num_pos_selected"]) == max(1, math.ceil(stare.top_p_ratio * n_pos))
            checks["weights"].append(bool(same and k_ok))
            if self.state.global_step < 2:  # entropy from the model's own logits, same forward and autocast
                mb = micro[0]
                ids = torch.cat([mb["prompt_ids"], mb["completion_ids"]], 1)
                att = torch.cat([mb["prompt_mask"], mb["completion_mask"]], 1)
                t = mb["completion_ids"].shape[1]
                with torch.no_grad(), self.accelerator.autocast():
                    logits = self.model(input_ids=ids, attention_mask=att).logits[:, -t - 1:-1]
                logp = torch.log_softmax(logits.float() / self.args.temperature, -1)
                ent = -(logp.exp() * logp).sum(-1)
                m = mb["completion_mask"].bool()
                mine = (ent[m].sum() / m.sum()).item()
                # H̄ of the step = token-mean over all its micro-batches; with one micro-batch it is this one's
                checks["entropy"].append((prep.entropy, mine))
            return prep

    rows = {}
    t0 = time.perf_counter()
    for name in ("grpo", "c2"):
        kw = _args(tmp / f"run_{name}", dry, device, steps)
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        if name == "grpo":
            cfg, cls = STAREGRPOConfig(**kw, gate="never", quadrant_every=5), STAREGRPOTrainer
        else:
            cfg, cls = STAREGRPOConfig(**kw, variant="C2", top_p_ratio=0.2, reweight_w=1.3, reweight_m=0.8,
                                       target_entropy=50.0, adaptive=True, alpha=0.02, w_max=2.0, m_min=0.5,
                                       quadrant_every=5), Checked
        trainer = cls(model=m, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=_dataset(512, 7))
        trainer.train()
        rows[name] = read_run(tmp / f"run_{name}" / "stare_run").metrics
        del trainer, m
        if device == "cuda":
            torch.cuda.empty_cache()
    wall = time.perf_counter() - t0
    finite = all(len(r) == steps and all(x["entropy"] is not None and math.isfinite(x["entropy"]) for x in r)
                 for r in rows.values())
    w_ok = len(checks["weights"]) == steps and all(checks["weights"])
    e_ok = len(checks["entropy"]) >= 1 and all(abs(a - b) <= 0.02 for a, b in checks["entropy"])
    h = {k: [x["entropy"] for x in r] for k, r in rows.items()}
    above = h["c2"][-1] > h["grpo"][-1]
    report["runs"] = {"steps": steps, "wall_s": wall, "entropy": h, "reward": {k: [x["reward"] for x in r]
                                                                                 for k, r in rows.items()},
                      "stare_w": [x["stare_w"] for x in rows["c2"]], "gate_on": [x["gate_on"] for x in rows["c2"]],
                      "c2_entropy_above_grpo": above, "finite": finite}
    report["weights"] = {"steps_checked": len(checks["weights"]), "ok": w_ok}
    report["entropy"] = {"logged_vs_recomputed": checks["entropy"], "ok": e_ok}
    print(f"2 weights: omega equals the core's on {sum(checks['weights'])}/{len(checks['weights'])} steps: "
          f"{'ok' if w_ok else 'FAIL'}")
    print("3 entropy: logged vs recomputed (nats) " + ", ".join(f"{a:.4f}/{b:.4f}" for a, b in checks["entropy"])
          + f": {'ok' if e_ok else 'FAIL'}")
    print(f"4 runs: {steps} steps each in {wall:.0f} s; entropy GRPO {h['grpo'][0]:.3f} -> {h['grpo'][-1]:.3f}, "
          f"C2 {h['c2'][0]:.3f} -> {h['c2'][-1]:.3f} (C2 ends above GRPO: {above}; a finding, not a check); "
          f"reward GRPO {report['runs']['reward']['grpo'][-1]}, C2 {report['runs']['reward']['c2'][-1]}: "
          f"{'ok' if finite else 'FAIL'}", flush=True)
    return finite and w_ok and e_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="the same steps, small, on CPU (what CI runs)")
    ap.add_argument("--out", help="directory for gpu_check_trl.json (default: the work directory)")
    ap.add_argument("--workdir", help="where the model and runs go (default: a new temporary directory)")
    ap.add_argument("--steps", type=int, default=None, help="steps of each run (default 30; 2 with --dry-run)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import transformers
    import trl

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check_trl: no CUDA device visible (use --dry-run on CPU)", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    steps = args.steps or (2 if args.dry_run else 30)
    t0 = time.time()
    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check_trl_"))
    tmp.mkdir(parents=True, exist_ok=True)
    report: dict = {"dry_run": args.dry_run, "torch": torch.__version__, "transformers": transformers.__version__,
                    "trl": trl.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    print(f"gpu_check_trl: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"device {report['device']}", flush=True)
    model, report["model"] = build_model(tmp, args.dry_run, device)
    ok = gate_off_parity(model, tmp, args.dry_run, device, report)
    ok &= runs(model, tmp, args.dry_run, device, steps, report)
    if device == "cuda":
        report["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    report.update(ok=bool(ok), wall_s=time.time() - t0)
    out = Path(args.out) if args.out else tmp
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check_trl.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check_trl: {'OK' if ok else 'FAILED'} in {report['wall_s']:.0f} s (report "
          f"{out / 'gpu_check_trl.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
