"""Stress test: `stare-lab simulate` with figures exits promptly after it has written its results, run after run.

Issue 29: one run in about 14 wrote `summary.json` and its figures and then never exited (the figure pool's
`terminate()` signalled a worker that had inherited the command's Python-level SIGTERM handler; the signal was taken
by the C handler while the worker was about to block on the pool's queue lock, so the Python handler never ran and
the parent waited for the worker for ever). This script runs N consecutive `stare-lab simulate` commands with
figures (a small preset and few steps, so that a run takes seconds), `--busy` of them while a second process keeps
one core busy, each with its stderr on a pseudo-terminal (as in a shell: the progress bar draws, and tqdm starts its
monitor thread), and checks that every process exits within `--limit` seconds (default 60) of writing its
`OUT/summary.json`. A process that does not is reported with the state of its threads and children, then killed.

    OMP_NUM_THREADS=1 python tests/benchmarks/bench_simulate_exit.py [--runs 100] [--busy 20] [--limit 60]

Prints one line per run that is slow or hangs, then the counts, the seconds from `summary.json` to the exit
(median, max) and the load average; exits 1 when a run hung or failed.
"""

from __future__ import annotations

import argparse
import os
import pty
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: the command of every run (a small, fast sweep that still draws the report's three figures)
DEFAULT_ARGS = ["simulate", "--preset", "demo", "--methods", "grpo,o1", "--seeds", "2", "--steps", "40"]


def stare_lab_command() -> list[str]:
    """This environment's console script (what a user runs), else ``python -m stare_lab.cli``."""
    exe = Path(sys.executable).with_name("stare-lab")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "stare_lab.cli"]


@dataclass
class Result:
    """One run: its exit code (None: killed), seconds from ``summary.json`` to the exit (None: no summary), total
    seconds, whether a busy process ran beside it, and what was seen of a process that hung."""

    index: int
    returncode: int | None
    after_summary_s: float | None
    wall_s: float
    busy: bool
    hang: str = ""


def _drain(fd: int) -> None:
    """Read a pseudo-terminal's output until it closes (a full terminal buffer would block the writer)."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:  # the slave side closed: EIO
        pass


def _proc_state(pid: int) -> str:
    """The kernel's view of a process and its threads and children (what each waits on), for a hang report."""
    parts = []
    try:
        tasks = sorted(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return f"pid {pid}: gone"
    for tid in tasks:
        try:
            wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip() or "-"
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        parts.append(f"{tid}:{name}@{wchan}")
    children = []
    for tid in tasks:
        try:
            children += Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            pass
    out = f"pid {pid} threads [{', '.join(parts)}]"
    for child in children:
        out += f"; child {_proc_state(int(child))}"
    return out


def run_once(index: int, out: Path, args: list[str], limit: float, busy: bool, tty: bool,
             max_wall: float) -> Result:
    """One ``stare-lab simulate`` into ``out``; polls for ``out/summary.json`` and the exit every 50 ms."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    busy_proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    master = slave = None
    if tty:
        master, slave = pty.openpty()
    log = open(out.parent / f"run{index}.log", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen([*stare_lab_command(), *args, "--out", str(out)], stdout=log,
                            stderr=slave if tty else log, env=env, start_new_session=True)
    drain = None
    if tty:
        os.close(slave)
        drain = threading.Thread(target=_drain, args=(master,), daemon=True)
        drain.start()
    summary_at = None
    hang = ""
    try:
        while True:
            now = time.monotonic()
            if summary_at is None and (out / "summary.json").is_file():
                summary_at = now
            if proc.poll() is not None:
                break
            waited = now - summary_at if summary_at is not None else None
            if (waited is not None and waited > limit) or now - t0 > max_wall:
                hang = _proc_state(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)  # the command and every process it started
                proc.wait()
                break
            time.sleep(0.05)
    finally:
        end = time.monotonic()
        if busy_proc is not None:
            busy_proc.kill()
            busy_proc.wait()
        log.close()
        if drain is not None:
            drain.join(timeout=5)
            os.close(master)
    return Result(index, None if hang else proc.returncode, None if summary_at is None else end - summary_at,
                  end - t0, busy, hang)


def stress(runs: int, busy: int, limit: float = 60.0, args: list[str] | None = None, tty: bool = True,
           max_wall: float = 900.0, keep: bool = False, echo: bool = True) -> list[Result]:
    """Run ``runs`` consecutive commands (``busy`` of them, spread evenly, beside a busy process); returns their
    results. ``args``: the command after ``stare-lab`` (default :data:`DEFAULT_ARGS`); ``--out`` is added."""
    args = list(DEFAULT_ARGS if args is None else args)
    busy_every = runs / busy if busy else None
    busy_at = {int(i * busy_every) for i in range(busy)} if busy_every else set()
    tmp = Path(tempfile.mkdtemp(prefix="bench_simulate_exit_"))
    results = []
    try:
        for i in range(runs):
            out = tmp / f"out{i}"
            r = run_once(i, out, args, limit, i in busy_at, tty, max_wall)
            results.append(r)
            if echo and (r.hang or r.returncode != 0 or (r.after_summary_s or 0) > 5):
                what = "HANG" if r.hang else f"rc={r.returncode}"
                after = "-" if r.after_summary_s is None else f"{r.after_summary_s:.1f}"
                print(f"run {i}{' (busy)' if r.busy else ''}: {what}, {after} s after summary.json, {r.wall_s:.1f} s"
                      + (f"\n  {r.hang}" if r.hang else "")
                      + (f"\n  log: {(tmp / f'run{i}.log').read_text(errors='replace')[-2000:]}"
                         if r.returncode not in (0, None) else ""), flush=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--busy", type=int, default=20, help="runs beside a busy process (default 20)")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds allowed from summary.json to the exit")
    parser.add_argument("--no-tty", action="store_true", help="stderr to a file instead of a pseudo-terminal")
    args = parser.parse_args()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"`stare-lab {' '.join(DEFAULT_ARGS)} --out DIR` x {args.runs} ({args.busy} beside a busy process), "
          f"stderr on a {'file' if args.no_tty else 'pseudo-terminal'}; {os.cpu_count()} CPUs; uptime: {uptime}",
          flush=True)
    t0 = time.monotonic()
    results = stress(args.runs, args.busy, args.limit, tty=not args.no_tty)
    hangs = [r for r in results if r.hang]
    failed = [r for r in results if not r.hang and r.returncode != 0]
    after = [r.after_summary_s for r in results if r.after_summary_s is not None and not r.hang]
    walls = [r.wall_s for r in results if not r.hang]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{len(results)} runs in {time.monotonic() - t0:.0f} s: {len(hangs)} hung (> {args.limit:g} s after "
          f"summary.json), {len(failed)} failed; exit after summary.json: median "
          f"{statistics.median(after) if after else float('nan'):.2f} s, max {max(after, default=float('nan')):.2f} s; "
          f"run wall median {statistics.median(walls) if walls else float('nan'):.1f} s; uptime: {uptime}")
    return 1 if hangs or failed else 0


if __name__ == "__main__":
    sys.exit(main())
