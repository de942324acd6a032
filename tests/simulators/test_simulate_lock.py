"""`stare-lab simulate` takes the sweep directory's lock before it reads, writes or deletes anything there: a second
writer is refused with one line naming the holder and leaves every byte as it was; a sweep killed with SIGKILL
leaves its lock file, and the next sweep reclaims it. (The 20-trial race of two real sweeps is
tests/benchmarks/bench_concurrent_writers.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stare_lab.platform.runlock import LOCK_FILE, read_holder

HOLD = """
import sys, time
from stare_lab.platform.runlock import lock_dir
with lock_dir(sys.argv[1], command="stare-lab simulate (test holder)"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _cli(args, cwd, **kw):
    return subprocess.run([sys.executable, "-m", "stare_lab.cli", "simulate", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600, **kw)


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_second_simulate_is_refused_and_touches_nothing(tmp_path):
    """The holder owns runs/conc with a previous sweep's files in it; simulate with --overwrite (which would delete
    runs) exits 1 with one line naming the holder's pid and command, and every file is byte-identical after."""
    out = tmp_path / "runs" / "conc"
    (out / "grpo" / "seed0").mkdir(parents=True)
    (out / "grpo" / "seed0" / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "summary.json").write_text("{}\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(out)
        t0 = time.perf_counter()
        proc = _cli(["--preset", "collapse", "--methods", "grpo", "--seeds", "1", "--out", "runs/conc", "--overwrite",
                     "steps=5"], tmp_path)
        took = time.perf_counter() - t0
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(err) == 1, proc.stderr
        assert f"is in use by pid {holder.pid}" in err[0] and "(stare-lab simulate (test holder))" in err[0], err
        assert _snapshot(out) == before
        print(f"refused in {took:.2f} s")
    finally:
        holder.kill()
        holder.wait()


def test_killed_sweep_lock_is_reclaimed(tmp_path):
    """kill -9 of a running sweep leaves its lock file (holder: the dead pid); the next sweep into the same folder
    (with --overwrite for the half-written runs) takes the lock and completes: every run has its 30 rows."""
    args = ["--preset", "collapse", "--methods", "grpo", "--seeds", "1", "--out", "runs/k", "--no-plots"]
    out = tmp_path / "runs" / "k"
    proc = subprocess.Popen([sys.executable, "-m", "stare_lab.cli", "simulate", *args, "steps=100000"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 300
    while not (out / "grpo" / "seed0" / "metrics.jsonl").is_file():  # the run is writing rows: lock held
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    assert read_holder(out).pid == proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / LOCK_FILE).is_file() and read_holder(out).alive() is False
    done = _cli([*args, "--overwrite", "steps=30"], tmp_path)
    assert done.returncode == 0, done.stderr
    rows = (out / "grpo" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 30
    assert not (out / LOCK_FILE).exists()
