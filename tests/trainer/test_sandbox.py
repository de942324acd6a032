"""Tests of trainer.tools.sandbox: each hostile program is contained, reported, and the caller goes on.

Expected values are by construction: a program's printed output is known from its source; "contained" means the
host-side effect (a file, a connection, a process) that the program attempts is checked from outside.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from pathlib import Path

import pytest

from stare_lab.errors import ConfigError
from trainer.tools import sandbox
from trainer.tools.config import SandboxConfig
from trainer.tools.sandbox import SandboxError, run_many, run_python

OK_TIMEOUT = 10.0  # generous for programs that should succeed (the machine may be busy)


@pytest.fixture(scope="module", autouse=True)
def _need_sandbox():
    ok, reason = sandbox.sandbox_available()
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"sandbox unavailable in CI: {reason} (install: {sandbox.INSTALL_HINT})")
        pytest.skip(f"sandbox unavailable: {reason}")


def test_prints_and_reads_empty_stdin():
    r = run_python("import sys\nprint(6 * 7)\nprint(repr(sys.stdin.read()))", timeout_s=OK_TIMEOUT)
    assert r.ok and not r.timed_out and not r.truncated and r.exit_code == 0 and r.error is None
    assert r.stdout == "42\n''\n"  # 6*7 by hand; stdin is empty


def test_exception_traceback_names_user_code_only():
    r = run_python("x = 1\nprint('before')\ny = x / 0\n", timeout_s=OK_TIMEOUT)
    assert not r.ok and not r.timed_out and r.exit_code == 1
    assert r.stdout == "before\n"  # output printed before the exception is kept
    assert r.error == "ZeroDivisionError: division by zero"
    assert 'File "<code>", line 3' in r.stderr and "y = x / 0" in r.stderr
    assert "exec(compile" not in r.stderr  # the bootstrap frame is not shown to the model


def test_syntax_error_and_exit_code():
    r = run_python("def f(:\n    pass\n", timeout_s=OK_TIMEOUT)
    assert not r.ok and r.error.startswith("SyntaxError")
    r = run_python("import sys; sys.exit(3)", timeout_s=OK_TIMEOUT)
    assert not r.ok and r.exit_code == 3 and r.error == "exit code 3"


def test_infinite_loop_is_killed_and_caller_goes_on():
    t0 = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.ok and r.exit_code is None and r.error == "timeout after 1 s"
    assert elapsed < 1.0 + 5.0  # killed at the limit (slack for a loaded machine), not hung
    assert run_python("print('next')", timeout_s=OK_TIMEOUT).stdout == "next\n"


def test_timeout_kills_the_whole_process_tree():
    """A child process started by the code must not survive the wall-time kill (pid namespace)."""
    marker = "12345.678"
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nwhile True:\n    pass\n"
    r = run_python(code, timeout_s=1.0)
    assert r.timed_out

    def survivors():
        found = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if marker.encode() in cmd:
                    found.append(pid)
        return found

    deadline = time.monotonic() + 5.0
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors() == []


def test_closing_pipes_then_looping_still_times_out():
    r = run_python("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass\n", timeout_s=1.0)
    assert r.timed_out and not r.ok


def test_ten_gb_allocation_is_refused():
    r = run_python("x = bytearray(10 * 1024**3)\nprint('allocated')", timeout_s=OK_TIMEOUT, memory_mb=512)
    assert not r.ok and not r.timed_out and r.error == "MemoryError" and "allocated" not in r.stdout
    # a modest allocation under the same limit works (100 MiB < 512 MiB)
    r = run_python("x = bytearray(100 * 1024**2)\nprint(len(x))", timeout_s=OK_TIMEOUT, memory_mb=512)
    assert r.ok and r.stdout == f"{100 * 1024**2}\n"


def test_fork_bomb_hits_the_process_cap():
    """pids.max = 16: starting 100 sleeping children fails with EAGAIN well before 100 (cgroup v1 pids)."""
    if not sandbox.process_limit_available():
        if os.environ.get("CI") == "true":
            pytest.fail("cgroup v1 pids controller not writable in CI")
        pytest.skip("no writable pids cgroup here")
    code = (
        "import subprocess\nprocs = []\n"
        "try:\n    for i in range(100):\n        procs.append(subprocess.Popen(['sleep', '30']))\n"
        "except OSError:\n    print(len(procs))\n    raise\n"
    )
    r = run_python(code, timeout_s=OK_TIMEOUT, max_processes=16)
    assert not r.ok and "Resource temporarily unavailable" in r.error
    assert 1 <= int(r.stdout) < 16  # bwrap's init + python + n children <= 16
    assert not [d for d in os.listdir(sandbox._pids_cgroup_base()) if d.startswith(f"stare_sandbox_{os.getpid()}_")]


def test_segfault_is_reported():
    r = run_python("import ctypes\nctypes.string_at(0)", timeout_s=OK_TIMEOUT)
    assert not r.ok and r.exit_code == 128 + 11 and r.error == "killed by signal 11"


def test_cannot_read_host_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    repo_file = Path(__file__).resolve()
    for path in (str(secret), str(repo_file), "/etc/passwd", "/root/.bashrc", str(Path.home() / ".bashrc")):
        r = run_python(f"print(open({path!r}).read())", timeout_s=OK_TIMEOUT)
        assert not r.ok and "FileNotFoundError" in r.error, (path, r)
        assert "top secret" not in r.stdout
    r = run_python(f"import os\nprint(os.path.exists({str(tmp_path)!r}), os.path.exists('/etc'))", timeout_s=OK_TIMEOUT)
    assert r.stdout == "False False\n"


def test_cannot_write_outside_workdir(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("original")
    before = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    for path in (str(target), "/etc/passwd"):
        r = run_python(f"open({path!r}, 'a').write('pwned')", timeout_s=OK_TIMEOUT)
        assert not r.ok, (path, r)
    assert target.read_text() == "original"
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == before
    # the runtime is there but read-only
    import sys

    lib = os.path.dirname(os.__file__)
    r = run_python(f"open({os.path.join(lib, 'pwned.py')!r}, 'w').write('x')", timeout_s=OK_TIMEOUT)
    assert not r.ok and "Read-only file system" in r.error
    assert not os.path.exists(os.path.join(lib, "pwned.py"))
    assert sys.executable  # the host interpreter is untouched


def test_workdir_is_fresh_and_writable():
    code = "import os\nopen('a.txt', 'w').write('hi')\nopen('/tmp/marker', 'w').write('x')\nprint(os.getcwd(), os.listdir('.'))"
    r = run_python(code, timeout_s=OK_TIMEOUT)
    assert r.ok and r.stdout == "/sandbox ['a.txt']\n"
    # nothing survives the previous call (/tmp may hold mount points of a read-only runtime that lives under /tmp)
    r = run_python("import os\nprint(os.listdir('.'), 'marker' in os.listdir('/tmp'))", timeout_s=OK_TIMEOUT)
    assert r.ok and r.stdout == "[] False\n"


def test_workdir_size_is_capped():
    r = run_python("open('big', 'wb').write(b'x' * (8 * 1024**2))", timeout_s=OK_TIMEOUT, workdir_mb=4)
    assert not r.ok and ("File too large" in r.stderr or "No space left" in r.stderr or r.exit_code == 128 + 25)


def test_no_network_not_even_host_loopback():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "s.sendall(b'hello')\nprint('connected')\n"
        )
        r = run_python(code, timeout_s=OK_TIMEOUT)
        assert not r.ok and "connected" not in r.stdout
        assert "OSError" in r.error or "Error" in r.error  # ENETUNREACH / ECONNREFUSED inside the empty netns
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever reached the host listener
    finally:
        server.close()
    r = run_python("import socket\nprint(socket.if_nameindex())", timeout_s=OK_TIMEOUT)
    assert r.ok and r.stdout.strip() == "[(1, 'lo')]"  # a fresh namespace: only its own loopback


def test_hundred_mb_print_is_truncated():
    r = run_python("import sys\nsys.stdout.write('x' * (100 * 1024**2))\nprint('done', file=sys.stderr)",
                   timeout_s=30.0, max_output_bytes=1000)
    assert r.ok and r.truncated and r.stdout == "x" * 1000 and r.stderr == "done\n"


def test_site_packages_switch():
    r = run_python("import numpy\nprint(int(numpy.arange(5).sum()))", timeout_s=OK_TIMEOUT)
    assert r.ok and r.stdout == "10\n"  # 0+1+2+3+4
    r = run_python("import numpy", timeout_s=OK_TIMEOUT, site_packages=False)
    assert not r.ok and "ModuleNotFoundError" in r.error


def test_run_many_keeps_order():
    res = run_many(["print(1)", "1/0", "while True: pass", "print(3)"], SandboxConfig(timeout_s=1.0, max_workers=2))
    assert [r.ok for r in res] == [True, False, False, True]
    assert res[0].stdout == "1\n" and res[3].stdout == "3\n" and res[2].timed_out


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"sandbox.timeout_s=0 is outside"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ConfigError, match=r"memory_mb=8 is outside \[64, inf\)"):
        run_python("print(1)", memory_mb=8)


def test_missing_bwrap_is_a_clear_error(monkeypatch):
    sandbox._probe.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxError, match="apt-get install -y bubblewrap"):
            run_python("print(1)")
    finally:
        sandbox._probe.cache_clear()
