"""End-to-end trainer runs on CPU with the real pipeline: tiny random-init Qwen2 model, GSM8K prompts, math-verify
grading (lenient last-number GSM8K reward so a random model sometimes scores), vLLM-CPU rollouts, DeepSpeed ZeRO-3.

Each run is a subprocess (``python -m trainer.cli`` / ``torchrun``) with a timeout, so nothing can hang the suite.
Covers the issue's checks (a) one process, 3 steps, ``stare`` C2 with the gate forced on; (b) two processes with
torchrun, identical final parameters on both ranks; (c) after every sync the engine's log-probs equal the trainer's
to 1e-4 (fp32); (d) kill-and-resume gives identical metrics — on two processes, with the auto schedule
(``c2-auto``) mid-acquisition at the checkpoint, against the uninterrupted two-process run of (b); (e) the HF
engine path; plus an all-filtered batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def _config(model: Path, data: Path, out: Path, **over) -> dict:
    cfg = {
        "method": "c2",
        "seed": 1,
        "out_dir": str(out),
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)], "max_prompt_length": 256},
        "rollout": {"engine": "vllm", "n": 4, "temperature": 1.0, "max_response_length": 24, "max_num_seqs": 32},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "gate": "always", "top_p_ratio": 0.2}},
        "optim": {"lr": 1e-3, "train_batch_size": 8, "micro_batch_max_tokens": 1024},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 3, "save_freq": 2, "progress_bar": False},
    }
    for k, v in over.items():
        node = cfg
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return cfg


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def _run(cfg: dict, tmp: Path, *, launcher: list[str] | None = None, env: dict | None = None,
         expect_rc: int = 0) -> subprocess.CompletedProcess:
    path = tmp / f"cfg_{abs(hash(json.dumps(cfg, sort_keys=True)))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = (launcher or [sys.executable]) + ["-m", "trainer.cli", str(path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env or _env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != expect_rc:
        raise AssertionError(f"rc={proc.returncode} (expected {expect_rc})\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def _resumed(cfg: dict) -> dict:
    """``cfg`` continuing the run in its out_dir (``schedule.resume=auto``, what ``stare-lab train --resume`` sets;
    the default ``never`` refuses an out_dir that holds a run)."""
    return {**cfg, "schedule": {**cfg["schedule"], "resume": "auto"}}


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _stable(row: dict) -> dict:
    """Drop wall-clock dependent keys (timings and throughput, all under time/)."""
    return {k: v for k, v in row.items() if not k.startswith("time/")}


@pytest.fixture(scope="module")
def deps(require):
    require("vllm", "deepspeed", "math_verify", "transformers")


@pytest.fixture(scope="module")
def run_a(deps, tiny_model, gsm8k_digits, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run_a")
    out = tmp / "out"
    _run(_config(tiny_model, gsm8k_digits, out), tmp)
    return out


def test_one_process_stare_c2_three_steps(run_a):
    """(a) 3 steps of C2 with the gate forced on: every row has the required keys, gate_on = 1, W/M = 1.1/0.9 (the
    config's), the loss ran on every step, and the final checkpoint holds an HF export and the DeepSpeed state."""
    from stare_lab.platform.runs import REQUIRED_KEYS, read_run

    run = read_run(run_a)
    assert [r["step"] for r in run.metrics] == [1, 2, 3]
    for r in run.metrics:
        assert all(k in r for k in REQUIRED_KEYS)
        assert r["gate_on"] == 1 and r["stare_w"] == 1.1 and r["stare_m"] == 0.9 and r["skipped"] == 0
        assert r["entropy"] > 0 and "loss/total" in r and r["num_tokens"] > 0
    # with seed 1 some groups have reward variance (lenient reward on single-digit answers): STARE selects tokens
    # in L+ and L- and the update has a non-zero gradient
    assert any(r["stare/num_pos_selected"] > 0 and r["stare/num_neg_selected"] > 0 for r in run.metrics)
    assert any(r["grad_norm"] > 0 for r in run.metrics)
    assert run.config["source"] == "trainer" and run.config["loss"]["stare"]["variant"] == "C2"
    assert (run_a / "checkpoint" / "step_3" / "hf" / "config.json").is_file()
    assert run.summary is not None and run.summary["steps"] == 3
    # the final model in a stable place: the step-3 export (weights identical), tokenizer included
    assert (run_a / "final_model" / "model.safetensors").read_bytes() == \
        (run_a / "checkpoint" / "step_3" / "hf" / "model.safetensors").read_bytes()
    assert (run_a / "final_model" / "tokenizer.json").is_file()


def test_engine_logprobs_match_trainer_after_every_sync(run_a):
    """(c) rollout/logprob_diff_max = max |vLLM log-prob − trainer log-prob| over the step's sampled tokens. Step 1
    samples with the initial weights, steps 2 and 3 right after a sync: all must agree to 1e-4 in fp32."""
    from stare_lab.platform.runs import read_run

    diffs = [r["rollout/logprob_diff_max"] for r in read_run(run_a).metrics]
    assert all(d is not None and d <= 1e-4 for d in diffs), diffs


def test_hf_engine_path(deps, tiny_model, gsm8k_digits, tmp_path):
    """(e) The transformers-generate engine: one step; its processed log-probs equal the trainer's to 1e-4. The step
    also runs the periodic evaluation (2 MATH-500 problems, 1 sample each) with the synced engine."""
    out = tmp_path / "out"
    ev = tmp_path / "eval.yaml"
    # prompt budget 200 + 8 tokens: within the tiny model's 1024 positions (checked before training)
    ev.write_text(yaml.safe_dump({"benchmarks": ["math500"], "limit": 2, "n": 1, "max_tokens": 8,
                                  "max_prompt_length": 200}))
    _run(_config(tiny_model, gsm8k_digits, out, **{"rollout.engine": "hf", "schedule.total_steps": 1,
                                                   "schedule.eval_freq": 1, "schedule.eval_config": str(ev)}),
         tmp_path)
    (row,) = _rows(out)
    assert row["skipped"] == 0 and row["rollout/logprob_diff_max"] <= 1e-4
    assert row["eval/accuracy"] == 0.0  # a random-init model answers none of the 2 problems (8 tokens, no boxed)
    assert (out / "eval" / "step_1" / "eval.json").is_file()


def test_evaluation_failure_never_loses_the_step(deps, tiny_model, gsm8k_digits, tmp_path):
    """Review item 6: the step's row and checkpoint are written BEFORE the periodic evaluation.
    (1) the evaluation of step 1 raises (STARE_LAB_FAULT=1:eval_error): the run goes on; row 1 has eval/failed=1,
    eval/errors.jsonl names step 1; step 2 evaluates normally (eval/failed=0, its eval/accuracy in its row).
    (2) a kill during the evaluation of the last step (1:eval, exit 137): row 1 and the complete checkpoint of step 1
    are on disk; re-running sees a finished run, builds nothing, and publishes summary.json and final_model.
    A resume with total_steps below the steps done is refused (a resume does not shorten a run)."""
    ev = tmp_path / "eval.yaml"
    ev.write_text(yaml.safe_dump({"benchmarks": ["math500"], "limit": 1, "n": 1, "max_tokens": 4,
                                  "max_prompt_length": 200}))
    over = {"rollout.engine": "hf", "schedule.eval_freq": 1, "schedule.eval_config": str(ev)}
    out = tmp_path / "a"
    _run(_config(tiny_model, gsm8k_digits, out, **over, **{"schedule.total_steps": 2}), tmp_path,
         env=_env(STARE_LAB_FAULT="1:eval_error"))
    r1, r2 = _rows(out)
    assert r1["eval/failed"] == 1 and "eval/accuracy" not in r1
    assert r2["eval/failed"] == 0 and r2["eval/accuracy"] == 0.0
    (err,) = [json.loads(line) for line in (out / "eval" / "errors.jsonl").read_text().splitlines()]
    assert err["step"] == 1 and err["error"] == "RuntimeError"
    # a resume never shortens a finished run: total_steps=1 < its 2 steps is refused in one line, nothing touched
    rows = (out / "metrics.jsonl").read_text()
    proc = _run(_resumed(_config(tiny_model, gsm8k_digits, out, **over, **{"schedule.total_steps": 1})), tmp_path,
                expect_rc=1)
    assert (f"--resume: {str(out)!r} has 2 steps done, more than schedule.total_steps=1; a resume continues a run, "
            "it does not shorten it: give total_steps >= 2, or --overwrite") in proc.stderr
    assert "Traceback" not in proc.stderr and (out / "metrics.jsonl").read_text() == rows

    out = tmp_path / "b"
    cfg = _config(tiny_model, gsm8k_digits, out, **over, **{"schedule.total_steps": 1})
    _run(cfg, tmp_path, env=_env(STARE_LAB_FAULT="1:eval"), expect_rc=137)
    assert [r["step"] for r in _rows(out)] == [1]
    assert (out / "checkpoint" / "latest_complete").read_text() == "step_1"
    assert not (out / "summary.json").exists()
    proc = _run(_resumed(cfg), tmp_path)
    assert "nothing to do" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["final_reward"] == _rows(out)[0]["reward"]
    assert (out / "final_model" / "config.json").is_file()


def test_all_filtered_batch_is_skipped_not_hung(deps, tiny_model, gsm8k_digits, tmp_path):
    """Dynamic sampling with the strict math reward: a random model never writes a right \\boxed answer, so every
    group is filtered; after max_gen_rounds = 2 rounds the step is logged as skipped and the run finishes."""
    out = tmp_path / "out"
    cfg = _config(tiny_model, gsm8k_digits, out, **{
        "rollout.engine": "hf", "reward.kind": "math", "algorithm.dynamic_sampling": True,
        "algorithm.max_gen_rounds": 2, "schedule.total_steps": 1})
    _run(cfg, tmp_path)
    (row,) = _rows(out)
    assert row["skipped"] == 1 and row["gen_rounds"] == 2 and row["kept_group_fraction"] == 0.0
    assert row["entropy"] is None and row["reward"] == 0.0


#: the two-process runs: STARE C2 with the auto schedule, H_tgt = 20 nats above the tiny model's ~6 (ln 512), so the
#: gate is on and H̄ crosses H_tgt at step 1: W starts at the schedule's W0 there and the acquisition moves it at
#: step 2, the checkpoint (save_freq 2) holds a controller mid-acquisition; the prediction pass on (it selects the
#: STARE sets of an auto run too)
TWO_PROC = {"method": "c2-auto", "loss.stare.gate": "entropy", "loss.stare.target_entropy": 20.0,
            "schedule.measure_entropy_change": True}


def _torchrun() -> list[str]:
    import socket

    if shutil.which("torchrun") is None and not (Path(sys.prefix) / "bin" / "torchrun").exists():
        pytest.fail("torchrun not found")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]


@pytest.fixture(scope="module")
def run_two(deps, tiny_model, gsm8k_digits, tmp_path_factory):
    """(b)'s run: 2 processes, 3 steps, uninterrupted; every rank dumps its gathered final parameters."""
    tmp = tmp_path_factory.mktemp("run_two")
    out, dump = tmp / "out", tmp / "params"
    _run(_config(tiny_model, gsm8k_digits, out, **TWO_PROC), tmp, launcher=_torchrun(),
         env=_env(STARE_LAB_DUMP_PARAMS=str(dump)))
    return out, dump


def test_torchrun_two_processes_same_final_parameters(run_two, tiny_model):
    """(b) torchrun with 2 processes (gloo, vLLM external_launcher, ZeRO-3 partitions over 2 ranks), 3 steps: the
    gathered final parameters are bit-identical on both ranks and differ from the initial model."""
    import torch
    from safetensors.torch import load_file

    out, dump = run_two
    p0 = torch.load(f"{dump}.rank0.pt")
    p1 = torch.load(f"{dump}.rank1.pt")
    assert p0.keys() == p1.keys()
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
    init = load_file(str(tiny_model / "model.safetensors"))
    assert any(not torch.equal(p0[k], init[k]) for k in p0 if k in init)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]


def test_kill_and_resume_gives_identical_metrics(run_two, tiny_model, gsm8k_digits, tmp_path):
    """(d) The run of (b), killed on both processes right after step 3 is logged (checkpoint only at step 2): the row
    of step 3 is on disk but not in a checkpoint. Resuming truncates it and redoes step 3; every metric of every row
    (all but wall time), the controller state of the final checkpoint and the final parameters equal the
    uninterrupted run's, bit for bit. At the checkpoint the auto schedule is mid-acquisition: past the crossing
    (step 1), the gate on, W moved from its value at the crossing, not yet in its hold."""
    import torch

    ref, ref_dump = run_two
    out, dump = tmp_path / "out", tmp_path / "params"
    cfg = _config(tiny_model, gsm8k_digits, out, **TWO_PROC)
    _run(cfg, tmp_path, launcher=_torchrun(), env=_env(STARE_LAB_FAULT="3:logged"), expect_rc=1)
    assert len(_rows(out)) == 3 and not (out / "checkpoint" / "step_3").exists()
    saved = json.loads((out / "checkpoint" / "step_2" / "trainer_state.json").read_text())["controller"]
    before = _rows(out)[:2]
    assert saved["num_updates"] == 2 and saved["crossed_at"] == 1 and saved["auto_hold_steps"] == 0
    assert [r["gate_on"] for r in before] == [1, 1] and saved["auto_x"] is not None
    assert saved["reweight_w"] == before[1]["stare_w"] != before[0]["stare_w"]
    assert saved["reweight_m"] == before[1]["stare_m"] == 1.0 / saved["reweight_w"]
    _run(_resumed(cfg), tmp_path, launcher=_torchrun(), env=_env(STARE_LAB_DUMP_PARAMS=str(dump)))
    a, b = _rows(ref), _rows(out)
    assert [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert _stable(ra) == _stable(rb)
    assert all(r["pred_entropy_change"] is not None and r["pred/d_lplus"] is not None for r in b)
    final = [json.loads((d / "checkpoint" / "step_3" / "trainer_state.json").read_text()) for d in (ref, out)]
    assert final[0]["controller"] == final[1]["controller"] and final[0]["cursor"] == final[1]["cursor"]
    p_ref, p_res = torch.load(f"{ref_dump}.rank0.pt"), torch.load(f"{dump}.rank0.pt")
    assert p_ref.keys() == p_res.keys() and all(torch.equal(p_ref[k], p_res[k]) for k in p_ref)
