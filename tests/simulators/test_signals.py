"""Stopping `stare-lab simulate` from outside: SIGTERM (kill, timeout, a scheduler) cleans up as Ctrl-C does (exit
143, one line, the worker processes stopped, the lock released: the directory takes the next command), and the worker
processes of a
parent killed with SIGKILL end with it (Linux's parent-death signal), so they neither keep computing nor keep the
directory's lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")


def _start(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stare_lab.cli", "simulate", "--preset", "demo", "--methods", "grpo,o1", "--seeds",
           "2", "--steps", "20000", "--workers", "2", "--no-plots", "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _wait_for_rows(out: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if any(p.stat().st_size > 0 for p in out.glob("*/seed*/metrics.jsonl")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    pytest.fail("no metrics row within the timeout")


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _gone(pids: list[int], timeout: float = 20.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        alive = []
        for p in pids:
            try:
                state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(p)
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_sigterm_stops_the_workers_and_frees_the_directory(tmp_path):
    out = tmp_path / "term"
    proc = _start(out)
    _wait_for_rows(out, proc)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers  # the two forked workers (the queue's feeder is a thread)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == (
        "stare-lab simulate: terminated (continue it with the same command and --resume)"), err
    assert _gone(workers), "workers still running after SIGTERM"
    assert not (out / ".stare_lab.lock").exists()
    done = subprocess.run([sys.executable, "-m", "stare_lab.cli", "simulate", "--preset", "demo", "--methods",
                           "grpo,o1", "--seeds", "2", "--steps", "60", "--no-plots", "--out", str(out), "--overwrite"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_workers_end_with_a_killed_parent(tmp_path):
    out = tmp_path / "kill"
    proc = _start(out)
    _wait_for_rows(out, proc)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone(workers), "workers outlived their killed parent"


def test_a_forked_child_keeps_the_default_sigterm():
    """The CLI's SIGTERM handler raises only in the process that installed it: a forked child (a figure Pool's
    worker, terminated by Pool.__exit__) dies of the signal instead of raising Terminated and printing a traceback
    on a run that succeeded. Before: the child raised, ran its clean-up and exited 0."""
    from stare_lab import cli
    previous = signal.signal(signal.SIGTERM, cli._raise_terminated)
    cli._HANDLER_PID.append(os.getpid())
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        time.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    finally:
        cli._HANDLER_PID.pop()
        signal.signal(signal.SIGTERM, previous)
