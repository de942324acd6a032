"""A bad command line is one error line printed before the heavy libraries are imported (torch, vLLM,
transformers, DeepSpeed, matplotlib), so it comes in about the interpreter's start-up time instead of 2-4 s
(measured: tests/benchmarks/bench_cli_errors.py). The simulator's config keys and values are checked before the losses
and the simulators are imported (simulators.sweep.plan_sweep), as are the trainer's (trainer.config)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "vllm", "transformers", "deepspeed", "matplotlib")
PROBE = ("import sys\nfrom stare_lab.cli import main\nrc = main(sys.argv[1:])\n"
         f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\nsys.exit(rc)\n")

CASES = [
    (["simulate", "--seeds", "0"], "--seeds=0 must be a count >= 1"),
    (["simulate", "--preset", "nope"], "preset='nope' is not one of"),
    (["simulate", "--methods", "grpo,xx"], "method 'xx' is not one of"),
    (["simulate", "--resume", "--overwrite"], "--resume and --overwrite exclude each other"),
    (["simulate", "bogus=1"], "unknown config key bogus"),
    (["simulate", "--preset", "transformer", "task.num_digits=20"], "task.num_digits=20 is outside [2, 9]"),
    (["simulate", "--methods", "o1-adaptive", "stare.reweight_w=2"], "method 'o1-adaptive' (which sets"),
    (["simulate", "lr=-1"], "lr=-1"),
    # issue 29: a bad --sweep key or value and a used --out were refused after torch was imported (5-43 s)
    (["simulate", "--sweep", "bogus=1,2"], "--sweep bogus: unknown config key bogus"),
    (["simulate", "--sweep", "stare.reweight_w=1.1,x"], "loss.stare.reweight_w='x' must be a number"),
    (["simulate", "--out", "used"], "--out 'used' already holds a sweep (summary.json, 1 run(s)); pass --resume"),
    (["simulate", "--methods", "grpo", "--seeds", "1", "--out", "stopped"],
     "'stopped/grpo/seed0' already holds a run; pass --resume"),
    (["analyze", "used", "nope", "--out", "r"], "'nope' does not exist: nothing analysed"),
    (["train"], "give a CONFIG file or --preset tiny-cpu"),
    (["train", "nope.yaml"], "config file 'nope.yaml' does not exist"),
    (["train", "--preset", "tiny-cpu", "--train-data", "d.jsonl", "--out", "o", "bogus.key=1"], "bogus"),
    (["train", "--preset", "tiny-cpu", "--train-data", "d.jsonl", "--out", "o", "--resume", "--overwrite"],
     "--resume and --overwrite exclude each other"),
    (["evaluate", "--model", "m", "--benchmarks", "xx"], "unknown benchmark 'xx'"),
    (["evaluate", "--model", "m", "--n", "0"], "eval.n=0 is outside"),
    (["analyze", "nope", "--band", "-1"], "--band=-1 is not allowed"),
    (["promote", "sw", "--method", "c2", "--base", "nope.yaml", "--out", "o.yaml"], "'nope.yaml' does not exist"),
    (["plan", "nope.yaml"], "config file 'nope.yaml' does not exist"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_error_before_heavy_imports(tmp_path, argv, message):
    (tmp_path / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    (tmp_path / "used").mkdir()  # a finished sweep, and one stopped before its summary
    (tmp_path / "used" / "summary.json").write_text('{"preset": "demo", "methods": {"grpo": {"run_dirs": '
                                                    '{"seed0": "grpo/seed0"}}}}')
    (tmp_path / "stopped" / "grpo" / "seed0").mkdir(parents=True)
    (tmp_path / "stopped" / "grpo" / "seed0" / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    heavy = [x for x in lines if x.startswith("HEAVY")]
    err = [x for x in lines if not x.startswith("HEAVY")]
    assert proc.returncode == 1 and len(err) == 1 and message in err[0], proc.stderr
    assert heavy == ["HEAVY"], f"imported before the error: {heavy}"
