"""Tabular runs over worker processes (simulators.parallel) and their memory estimate (simulators.tabular.memory):
a request the machine cannot hold is refused up front in one line; a worker that dies is one line naming how."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import simulators.parallel as parallel
from simulators.presets import PRESETS
from simulators.sweep import plan_sweep
from simulators.tabular.runner import config_from_overrides
from simulators.tabular.memory import available_memory
from stare_lab.cli import main
from stare_lab.errors import ConfigError, RunError

GIB = 2**30
TINY = {"num_prompts": 4, "group_size": 4, "seq_len": 3, "vocab_size": 5, "num_correct": 2, "threshold": 2,
        "reward_noise": 0.0, "steps": 2}


def test_estimate_is_above_the_measured_peak_but_not_far(tmp_path):
    """The estimate is conservative: at least the peak memory that a process running the batch really adds
    (measured: the peak resident size VmHWM after two steps minus the resident size before, in a fresh interpreter;
    not ru_maxrss, which Linux carries over from the forking parent across exec, so a large pytest process would
    inflate it), and at most 2.5x it, so it does not refuse requests that fit. Two runs (grpo, c2) of 64 prompts x 2000 responses x 4 positions,
    and two of 64 prompts x 4 positions x 4096 tokens in expected mode."""
    script = textwrap.dedent("""
        import json, os, sys, tempfile
        import torch
        torch.set_num_threads(1)
        from simulators.parallel import peak_memory
        from simulators.tabular.runner import config_from_overrides, run_batch
        over = json.loads(sys.argv[1])
        cfgs = [config_from_overrides({**over, "method": m, "seed": i, "steps": 2, "checkpoint_every": 2})
                for i, m in enumerate(["grpo", "c2"])]
        before = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        run_batch(cfgs, [os.path.join(sys.argv[2], str(i)) for i in range(len(cfgs))])
        peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        print(json.dumps({"measured": peak - before, "estimate": peak_memory(cfgs, 1)}))
    """)
    for i, over in enumerate([{"num_prompts": 64, "group_size": 2000, "seq_len": 4, "vocab_size": 8},
                              {"mode": "expected", "num_prompts": 64, "seq_len": 4, "vocab_size": 4096}]):
        res = subprocess.run([sys.executable, "-c", script, json.dumps(over), str(tmp_path / str(i))],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got["measured"] <= got["estimate"] <= 2.5 * got["measured"], (over, got)


def test_every_preset_and_the_readme_sweep_fit_easily():
    """Today's presets (default methods x seeds, 2 workers) and docs/quickstart.md's W sweep are estimated below
    512 MiB, far below any machine this runs on, so the check never refuses them."""
    plans = [plan_sweep(name, None, None, "unused") for name in PRESETS]
    plans.append(plan_sweep("demo", ["grpo", "o1"], None, "unused",
                            sweep=["stare.reweight_w=1.1,1.2,1.3,1.4,1.5,1.6,1.8,2.0"]))
    for plan in plans:
        assert parallel.peak_memory(list(plan.configs.values()), 2) < 512 * 2**20, plan.preset


def test_available_memory_reads_meminfo():
    """MemAvailable of /proc/meminfo, in bytes (the kernel's number, kB × 1024)."""
    avail = available_memory()
    with open("/proc/meminfo") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
    assert avail is not None and avail[1] == "MemAvailable in /proc/meminfo"
    assert abs(avail[0] - kb * 1024) < 512 * 2**20  # read a moment apart on a shared machine


def test_too_large_a_request_is_one_line_up_front(tmp_path, capsys, monkeypatch):
    """Fresh-user review: `simulate --preset collapse group_size=100000 steps=1` (12 runs x 64 x 100000 x 4 sampled
    tokens: tens of GiB) on a 24 GiB machine → one line naming the estimate, the available memory and what to lower;
    nothing is created. (The estimate, by hand from simulators.tabular.memory: 2 worker processes of 6 runs, each
    6 x (288 B x 25.6M tokens + 288 B x 2048 states) + 128 B x 25.6M tokens (one run's loss) + 64 MiB + 6 rows of
    4 KiB = 47.58 GB; both: 95168544768 B = 88.6 GiB.)"""
    monkeypatch.setattr(parallel, "available_memory", lambda: (24 * GIB, "MemAvailable in /proc/meminfo"))
    out = tmp_path / "never"
    assert main(["simulate", "--no-plots", "--preset", "collapse", "--out", str(out), "--workers", "2",
                 "group_size=100000", "steps=1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "stare-lab simulate: error: the tabular runs would need about 88.6 GiB of memory at their peak (conservative "
        "estimate; largest batch: 12 run(s) x 64 prompts x 100000 responses x 4 positions sampled together, 8 tokens) "
        "but 24.0 GiB is available (MemAvailable in /proc/meminfo); lower group_size or num_prompts, or run fewer "
        "methods or seeds (--methods, --seeds)")
    assert not out.exists()


def test_workers_1_is_suggested_when_the_batches_one_after_the_other_fit(monkeypatch):
    """Two batch groups (a group_size grid) on two workers compute at once (their estimates add up); one worker runs
    them one after the other (the larger one counts). Available memory between the two → the message suggests
    --workers 1; the policy tables dominate a large vocabulary → it names vocab_size."""
    configs = [config_from_overrides({**TINY, "group_size": g, "vocab_size": 60000, "seed": s})
               for g in (2, 4) for s in (0, 1)]
    both, alone = parallel.peak_memory(configs, 2), parallel.peak_memory(configs, 1)
    assert alone < both
    monkeypatch.setattr(parallel, "available_memory", lambda: ((alone + both) // 2, "test"))
    with pytest.raises(ConfigError) as err:
        parallel.check_memory(configs, 2)
    msg = str(err.value)
    assert "lower vocab_size, seq_len or num_prompts" in msg and f"about {alone / GIB:.1f} GiB)" in msg
    assert msg.endswith(f"or pass --workers 1 (the batches one after the other: about {alone / GIB:.1f} GiB)")
    parallel.check_memory(configs, 1)  # fits
    monkeypatch.setattr(parallel, "available_memory", lambda: None)  # unknown: no check
    parallel.check_memory(configs, 2)


def _two_chunks(tmp_path):
    configs = [config_from_overrides({**TINY, "seed": s}) for s in (0, 1)]
    return configs, [tmp_path / f"r{s}" for s in (0, 1)]


@pytest.mark.parametrize("how, expected", [
    ("kill", "was killed by SIGKILL — likely out of memory"),
    ("exit", "exited with code 3 before reporting its results"),
])
def test_a_worker_that_dies_is_one_run_error(tmp_path, monkeypatch, how, expected):
    """Fresh-user review: a worker killed by the kernel (SIGKILL, as the out-of-memory killer does) or exiting
    without a report → a RunError naming the signal or exit code, raised as soon as it is seen: the other worker
    (here sleeping for a minute) is stopped rather than waited for."""
    def fake_run_batch(configs, run_dirs, resume=False, progress=None):  # runs in the forked worker
        if configs[0].seed == 0:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        time.sleep(60)

    monkeypatch.setattr(parallel, "run_batch", fake_run_batch)
    configs, dirs = _two_chunks(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        parallel.run_many(configs, dirs, workers=2)
    assert time.monotonic() - t0 < 30
    msg = str(err.value)
    assert msg.startswith("a simulation worker process (pid ") and "1 run(s))" in msg and expected in msg
    assert "\n" not in msg


def test_an_allocation_failure_is_one_run_error(tmp_path, monkeypatch):
    """torch's failed allocation (a RuntimeError "can't allocate memory") or a MemoryError, in this process or in
    a worker, is a RunError saying the runs ran out of memory; any other error is left as it is."""
    configs, dirs = _two_chunks(tmp_path)
    for exc in (MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate "
                                            "memory: you tried to allocate 85899345920 bytes")):
        def fake_run_batch(*args, exc=exc, **kwargs):
            raise exc

        monkeypatch.setattr(parallel, "run_batch", fake_run_batch)
        for workers in (1, 2):
            with pytest.raises(RunError, match=r"^the tabular runs ran out of memory \(an allocation failed\); lower "):
                parallel.run_many(configs, dirs, workers=workers)
    monkeypatch.setattr(parallel, "run_batch", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        parallel.run_many(configs, dirs, workers=1)
