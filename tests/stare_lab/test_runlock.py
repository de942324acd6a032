"""One writer per run directory (stare_lab.platform.runlock): a second writer is refused at once with the holder named and
touches nothing; a killed holder's lock is reclaimed; nested locks in one process count; clean-up removes only the
folders the lock created."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from stare_lab.errors import RunError
from stare_lab.platform.runlock import LOCK_FILE, RunLock, RunLockError, lock_dir, read_holder

HOLD = """
import sys, time
from stare_lab.platform.runlock import lock_dir
with lock_dir(sys.argv[1], command="holder-test"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _holder(tmp_path, d):
    """A subprocess that holds ``d``'s lock until killed; returns it once it holds the lock."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_is_refused_naming_the_holder_and_touches_nothing(tmp_path):
    """The refusal names the holder's pid (the subprocess's), this host and its command; the directory's entries
    and the lock file's bytes are unchanged afterwards."""
    d = tmp_path / "run"
    proc = _holder(tmp_path, d)
    try:
        (d / "metrics.jsonl").write_text('{"step": 1}\n')
        before = {p.name: p.read_bytes() for p in d.iterdir()}
        with pytest.raises(RunLockError) as err:
            with lock_dir(d):
                pytest.fail("the lock was taken twice")
        msg = str(err.value)
        assert "\n" not in msg
        assert f"pid {proc.pid} on host {socket.gethostname()}" in msg and "(holder-test)" in msg, msg
        assert {p.name: p.read_bytes() for p in d.iterdir()} == before
        assert read_holder(d).pid == proc.pid and read_holder(d).alive() is True
    finally:
        proc.kill()
        proc.wait()


def test_killed_holder_lock_is_reclaimed(tmp_path):
    """kill -9 leaves the lock file with the dead holder's information; the kernel has dropped the flock, so the
    next writer takes the lock, reports the previous holder as stale and writes its own pid."""
    d = tmp_path / "run"
    proc = _holder(tmp_path, d)
    dead = proc.pid
    os.kill(dead, signal.SIGKILL)
    proc.wait()
    assert (d / LOCK_FILE).is_file() and read_holder(d).pid == dead and read_holder(d).alive() is False
    with lock_dir(d) as lock:
        assert lock.previous is not None and lock.previous.pid == dead
        assert read_holder(d).pid == os.getpid()
    assert not (d / LOCK_FILE).exists()


def test_two_locks_in_one_process_conflict_but_nesting_counts(tmp_path):
    """flock belongs to an open file: a second RunLock on the same directory is refused even in the same process;
    lock_dir nested on the same directory (spelled differently) is re-entrant and releases with the outermost."""
    d = tmp_path / "run"
    d.mkdir()
    first = RunLock(d).acquire()
    with pytest.raises(RunLockError, match=f"pid {os.getpid()}"):
        RunLock(d).acquire()
    first.release()
    with lock_dir(d):
        with lock_dir(tmp_path / "run" / ".." / "run"):
            assert (d / LOCK_FILE).is_file()
        assert (d / LOCK_FILE).is_file()  # still held by the outer block
    assert not (d / LOCK_FILE).exists()


def test_created_folders_removed_only_when_empty(tmp_path):
    """lock_dir creates the directory and its missing parents; on exit it removes those that are empty and keeps
    one that holds a file (the run's output), and never the folders that existed before."""
    with lock_dir(tmp_path / "a" / "b"):
        pass
    assert not (tmp_path / "a").exists() and tmp_path.is_dir()
    with lock_dir(tmp_path / "a" / "b"):
        (tmp_path / "a" / "b" / "out.txt").write_text("x")
    assert (tmp_path / "a" / "b" / "out.txt").is_file()


def test_refused_lock_leaves_no_folder_behind(tmp_path):
    """A refused writer that created nothing new (the directory is the holder's) removes nothing."""
    d = tmp_path / "run"
    proc = _holder(tmp_path, d)
    try:
        with pytest.raises(RunLockError):
            with lock_dir(d / "sub" / ".."):
                pass
        assert (d / LOCK_FILE).is_file()
    finally:
        proc.kill()
        proc.wait()


def test_uncreatable_directory_is_one_line(tmp_path):
    """A file where the directory should be: a RunError naming both paths."""
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunError, match="is not a directory"):
        with lock_dir(tmp_path / "f" / "run"):
            pass


def test_release_race_never_gives_two_holders(tmp_path):
    """Many short-lived writers in several processes: at no time do two hold the lock (each writer appends its pid
    to a shared file on entry and exit while holding it; the entries must pair up without interleaving)."""
    d = tmp_path / "run"
    d.mkdir()
    code = """
import os, sys, time
from stare_lab.platform.runlock import lock_dir, RunLockError
log = sys.argv[2]
held = 0
t_end = time.time() + 2.0
while time.time() < t_end:
    try:
        with lock_dir(sys.argv[1]):
            with open(log, "a") as fh:
                fh.write(f"in {os.getpid()}\\n"); fh.flush()
                time.sleep(0.002)
                fh.write(f"out {os.getpid()}\\n")
            held += 1
    except RunLockError:
        pass
print(held)
"""
    log = tmp_path / "log"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d), str(log)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    total = sum(int(p.communicate(timeout=60)[0]) for p in procs)
    lines = log.read_text().splitlines()
    assert total > 0 and len(lines) == 2 * total
    for a, b in zip(lines[::2], lines[1::2]):
        assert a.startswith("in ") and b == "out " + a[3:], (a, b)
