"""Run untrusted Python (tool calls of the policy) in a bubblewrap sandbox: one process per call.

The security boundary is the kernel, not Python: every call starts ``bwrap`` (bubblewrap, Debian package
``bubblewrap``; install with ``apt-get install -y bubblewrap``) which puts the interpreter into fresh namespaces:

* **network**: ``--unshare-net`` — a new network namespace whose only interface is a *down* loopback, so no
  connection can be made anywhere, not even to a server listening on the host's ``localhost``;
* **files**: a new mount namespace that holds only ``/usr`` and the Python runtime (the interpreter's prefix and,
  optionally, the site-packages of the running environment), all **read-only**, plus a fresh ``/proc``, a minimal
  ``/dev`` and two size-capped tmpfs: ``/sandbox`` (the working directory) and ``/tmp``. They exist only inside the
  sandbox and vanish with it, so nothing a call writes survives it and nothing outside (``/root``, ``/etc``, the
  repository, the data) is visible at all;
* **users / pids / ipc / uts**: the code runs as uid 65534 in a new user namespace with every capability dropped,
  as process 2 of a new pid namespace (``--die-with-parent``: if bwrap dies, everything inside dies);
* **resources**: ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_FSIZE``, ``RLIMIT_CPU`` and ``RLIMIT_CORE=0`` are set
  (soft = hard, which the unprivileged process cannot raise) before the first line of user code runs;
* **processes**: where the cgroup-v1 ``pids`` controller is writable (as root on this machine kind), each call
  runs in its own child cgroup with ``pids.max = max_processes`` (threads count), so a fork bomb hits a wall; the
  cgroup is removed afterwards. Without it (logged once), processes are bounded only by the wall-time kill
  (RLIMIT_NPROC cannot help: the sandbox uid maps to host root, which the kernel exempts);
* **wall time**: the parent kills bwrap's whole process group with SIGKILL at ``timeout_s``; the pid namespace
  takes every descendant with it;
* **output**: the parent reads stdout and stderr incrementally, keeps at most ``max_output_bytes`` of each and
  discards the rest (a 100 MB print costs the trainer no memory).

A crash, timeout, infinite loop or memory blow-up of the code is reported in the :class:`SandboxResult`
(``ok=False``, ``timed_out``, ``error``); the caller always gets a result back. Only a sandbox that cannot start
at all (bwrap missing, namespaces forbidden) raises :class:`SandboxError` — a setup problem, reported once.

Known limit: memory is capped per process (RLIMIT_AS), not for the sandbox as a whole; with the pids cap the
total is at most ``max_processes × memory_mb``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Sequence

from stare_lab.errors import RunError

from trainer.tools.config import SandboxConfig

logger = logging.getLogger(__name__)

__all__ = [
    "SandboxConfig",
    "SandboxResult",
    "SandboxError",
    "INSTALL_HINT",
    "sandbox_available",
    "check_sandbox",
    "process_limit_available",
    "run_python",
    "run_many",
]

#: How to install the isolation tool (Debian/Ubuntu, as root).
INSTALL_HINT = "apt-get update && apt-get install -y bubblewrap"

#: Working directory of the code inside the sandbox (a tmpfs, fresh per call).
SANDBOX_CWD = "/sandbox"

#: Unprivileged uid/gid of the code inside the sandbox's user namespace ("nobody").
SANDBOX_UID = 65534


class SandboxError(RunError):
    """The sandbox itself cannot run (bwrap missing, namespaces not permitted, interpreter not found)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_python` call.

    Attributes:
        ok: the code ran to completion with exit status 0 within the time limit.
        stdout, stderr: decoded (UTF-8, invalid bytes replaced) first ``max_output_bytes`` bytes of each stream.
        timed_out: the wall-time limit was reached and the process tree was killed.
        truncated: stdout or stderr was longer than ``max_output_bytes`` (the excess was discarded).
        exit_code: exit status of the sandbox (128 + N when the code died of signal N; ``None`` if it was killed
            by the wall-time limit).
        error: ``None`` when ``ok``; else a one-line reason: ``"timeout after 2 s"``, the last line of the
            traceback (``"MemoryError"``, ``"ZeroDivisionError: division by zero"``) or ``"exit code N"``.
        wall_s: seconds from start to the end of the process (sandbox start-up included).
    """

    ok: bool
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    exit_code: int | None
    error: str | None
    wall_s: float


# ----------------------------------------------------------------------------------------------------------------
# the sandbox command line
# ----------------------------------------------------------------------------------------------------------------

_BOOTSTRAP = r"""
import linecache, os, resource, site, sys, traceback
def _limit(res, value):
    resource.setrlimit(res, (value, value))
try:
    _limit(resource.RLIMIT_AS, {mem})
    _limit(resource.RLIMIT_FSIZE, {fsize})
    _limit(resource.RLIMIT_CPU, {cpu})
    _limit(resource.RLIMIT_CORE, 0)
except (OSError, ValueError) as err:
    sys.stderr.write("sandbox: cannot set resource limits: %s\n" % err)
    os._exit(97)
for _d in {sites!r}:
    site.addsitedir(_d)
_src = sys.stdin.read()
sys.stdin.close()
sys.stdin = open(os.devnull)
linecache.cache["<code>"] = (len(_src), None, _src.splitlines(True), "<code>")
sys.argv = ["<code>"]
try:
    exec(compile(_src, "<code>", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as _err:
    for _stream in (sys.stdout, sys.stderr):
        try:
            _stream.flush()
        except BaseException:
            pass
    traceback.print_exception(type(_err), _err, _err.__traceback__.tb_next)
    sys.stderr.flush()
    os._exit(1)
"""


def _python_runtime() -> tuple[str, list[str], list[str]]:
    """(interpreter binary, read-only directories to bind, site-packages dirs) of the running Python."""
    exe = os.path.realpath(sys.executable)
    binds: list[str] = []
    for d in (os.path.realpath(sys.base_prefix), os.path.dirname(exe)):
        if not d.startswith("/usr/") and d != "/usr":
            binds.append(d)
    # exactly the site-packages directories on the running interpreter's path (a venv's, not the base's)
    sites: list[str] = []
    for d in sys.path:
        if os.path.basename(d) in ("site-packages", "dist-packages") and os.path.isdir(d):
            real = os.path.realpath(d)
            if real not in sites:
                sites.append(real)
    return exe, binds, sites


def _covered(path: str, dirs: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _bwrap_argv(memory_mb: int, workdir_mb: int, cpu_s: int, site_packages: bool) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError(f"bubblewrap (bwrap) is not installed; the tool-use sandbox needs it: {INSTALL_HINT}")
    exe, runtime_dirs, sites = _python_runtime()
    sites = sites if site_packages else []
    argv = [
        bwrap,
        "--unshare-all",  # net, pid, ipc, uts, cgroup (and user, below)
        "--unshare-user",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", SANDBOX_CWD,
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONIOENCODING", "utf-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "MPLBACKEND", "Agg",
        "--ro-bind", "/usr", "/usr",
    ]  # fmt: skip
    for thread_var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        argv += ["--setenv", thread_var, "1"]
    size = str(workdir_mb * 1024 * 1024)
    # the fresh /tmp first: bwrap applies mounts in order, so a runtime that lives under /tmp (a venv in a
    # checkout below /tmp) is bound read-only on top of it instead of being hidden by it
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/tmp"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):  # merged /usr: /lib -> usr/lib
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    bound = ["/usr"]
    for d in runtime_dirs + sites:
        if not _covered(d, bound):
            argv += ["--ro-bind", d, d]
            bound.append(d)
    argv += [
        "--size", size, "--tmpfs", SANDBOX_CWD,
        "--chdir", SANDBOX_CWD,
        "--",
    ]  # fmt: skip
    boot = _BOOTSTRAP.format(mem=memory_mb * 1024 * 1024, fsize=workdir_mb * 1024 * 1024, cpu=cpu_s, sites=sites)
    # -I: isolated mode (ignore PYTHON* variables, user site, and the cwd on sys.path); -S: no automatic
    # site-packages (the bootstrap adds exactly ``sites``); -B: no .pyc writes.
    return argv + [exe, "-I", "-S", "-B", "-c", boot]


@functools.lru_cache(maxsize=4)
def _probe(site_packages: bool) -> str | None:
    """Start one trivial sandbox; ``None`` if it works, else the reason."""
    try:
        argv = _bwrap_argv(256, 1, 10, site_packages)
    except SandboxError as err:
        return str(err)
    try:
        proc = subprocess.run(argv, input=b"print(6 * 7)", capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap could not start: {err}"
    if proc.returncode != 0 or proc.stdout.strip() != b"42":
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap sandbox failed (exit {proc.returncode}): {err[-1] if err else 'no output'}"
    return None


def sandbox_available(site_packages: bool = True) -> tuple[bool, str]:
    """``(True, "")`` if a sandbox can be started here, else ``(False, reason)``; the probe runs once per process."""
    reason = _probe(bool(site_packages))
    return (reason is None, reason or "")


def check_sandbox(site_packages: bool = True) -> None:
    """Raise :class:`SandboxError` (with the install command) unless a sandbox can be started here."""
    ok, reason = sandbox_available(site_packages)
    if not ok:
        raise SandboxError(f"tool-use sandbox unavailable: {reason} (install: {INSTALL_HINT})")


# ----------------------------------------------------------------------------------------------------------------
# process cap: a child cgroup (v1 pids controller) per call
# ----------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _pids_cgroup_base() -> str | None:
    """Our own cgroup directory in the v1 ``pids`` hierarchy if we may create children in it, else ``None``."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "pids" in parts[1].split(","):
            base = os.path.join("/sys/fs/cgroup/pids", parts[2].lstrip("/"))
            probe = os.path.join(base, f"stare_sandbox_probe_{os.getpid()}_{uuid.uuid4().hex[:8]}")
            try:
                os.mkdir(probe)
                ok = os.path.exists(os.path.join(probe, "pids.max"))
                os.rmdir(probe)
            except OSError:
                ok = False
            if ok:
                return base
    logger.warning("cgroup v1 'pids' controller not writable: sandboxed code has no process cap (wall-time only)")
    return None


def process_limit_available() -> bool:
    """Whether :func:`run_python` can cap the processes of each call (a writable cgroup-v1 ``pids`` hierarchy)."""
    return _pids_cgroup_base() is not None


def _make_pids_cgroup(max_processes: int) -> str | None:
    base = _pids_cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, f"stare_sandbox_{os.getpid()}_{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w", encoding="ascii") as fh:
            fh.write(str(max_processes))
    except OSError as err:
        logger.warning("cannot create the sandbox's pids cgroup %s: %s", path, err)
        _remove_cgroup(path)
        return None
    return path


def _remove_cgroup(path: str | None) -> None:
    if path is None:
        return
    for _ in range(50):  # the killed processes leave the cgroup within milliseconds
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    logger.warning("could not remove the sandbox cgroup %s (still busy)", path)


# ----------------------------------------------------------------------------------------------------------------
# running code
# ----------------------------------------------------------------------------------------------------------------


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap leads its own process group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def _error_line(stderr: str, exit_code: int | None) -> str:
    for line in reversed(stderr.strip().splitlines()):
        line = line.strip()
        if line:
            return line[:300]
    if exit_code is not None and exit_code > 128:
        return f"killed by signal {exit_code - 128}"
    return f"exit code {exit_code}"


def run_python(
    code: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    *,
    max_output_bytes: int = 8192,
    workdir_mb: int = 64,
    site_packages: bool = True,
    max_processes: int = 64,
) -> SandboxResult:
    """Run ``code`` as the ``__main__`` script of a fresh, isolated Python process (see the module docstring).

    Args:
        code: Python source. It reads an empty stdin; its cwd is an empty tmpfs ``/sandbox``.
        timeout_s: wall-time limit, seconds (> 0), sandbox start-up included.
        memory_mb: ``RLIMIT_AS`` of the interpreter, MiB (≥ 64). A larger allocation raises ``MemoryError``.
        max_output_bytes: bytes kept of stdout and of stderr each; the excess is discarded (``truncated``).
        workdir_mb: size of the ``/sandbox`` and ``/tmp`` tmpfs and largest writable file, MiB.
        site_packages: make the current environment's site-packages importable (read-only).
        max_processes: processes + threads inside the sandbox (cgroup ``pids.max``; where available).

    Returns:
        A :class:`SandboxResult`; never raises because of what ``code`` does.

    Raises:
        SandboxError: the sandbox cannot start here (bwrap missing or namespaces not permitted).
        ConfigError: a limit is out of range (same checks as :class:`SandboxConfig`).
    """
    SandboxConfig(  # validates the limits
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, workdir_mb=workdir_mb,
        site_packages=site_packages, max_processes=max_processes,
    )
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    check_sandbox(site_packages)
    argv = _bwrap_argv(memory_mb, workdir_mb, max(1, math.ceil(timeout_s)) + 1, site_packages)

    cgroup = _make_pids_cgroup(max_processes)
    if cgroup is not None:  # join the cgroup first, then become bwrap: everything inside is counted
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', os.path.join(cgroup, "cgroup.procs")] + argv

    start = time.monotonic()
    deadline = start + timeout_s
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except BaseException:
        _remove_cgroup(cgroup)
        raise
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    truncated = False
    timed_out = False
    pending = memoryview(code.encode("utf-8"))
    stdin_fd = proc.stdin.fileno()
    sel = selectors.DefaultSelector()
    try:
        os.set_blocking(stdin_fd, False)
        sel.register(stdin_fd, selectors.EVENT_WRITE)
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 1.0)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        n = os.write(fd, pending[:65536])
                        pending = pending[n:]
                    except (BrokenPipeError, BlockingIOError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = kept[fd]
                room = max_output_bytes - len(buf)
                if len(chunk) > room:
                    truncated = True
                buf += chunk[: max(room, 0)]
        if not timed_out:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.05))
            except subprocess.TimeoutExpired:  # closed its pipes but kept running
                timed_out = True
    finally:
        sel.close()
        if timed_out or proc.poll() is None:
            _kill_tree(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        _remove_cgroup(cgroup)
    wall_s = time.monotonic() - start

    out_b, err_b = (bytes(b) for b in kept.values())
    stdout = out_b.decode("utf-8", "replace")
    stderr = err_b.decode("utf-8", "replace")
    exit_code = None if timed_out else proc.returncode
    ok = not timed_out and exit_code == 0
    if ok:
        error = None
    elif timed_out:
        error = f"timeout after {timeout_s:g} s"
    else:
        error = _error_line(stderr, exit_code)
    if not ok:
        logger.debug("sandbox call failed: %s", error)
    return SandboxResult(ok, stdout, stderr, timed_out, truncated, exit_code, error, wall_s)


def run_many(codes: Sequence[str], config: SandboxConfig | None = None) -> list[SandboxResult]:
    """Run several code strings, each in its own sandbox, ``config.max_workers`` at a time; results in order.

    Raises:
        SandboxError: the sandbox cannot start here.
    """
    config = config or SandboxConfig()
    if not codes:
        return []
    check_sandbox(config.site_packages)

    def one(code: str) -> SandboxResult:
        return run_python(
            code,
            config.timeout_s,
            config.memory_mb,
            max_output_bytes=config.max_output_bytes,
            workdir_mb=config.workdir_mb,
            site_packages=config.site_packages,
            max_processes=config.max_processes,
        )

    if config.max_workers == 1 or len(codes) == 1:
        return [one(c) for c in codes]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(config.max_workers, len(codes))) as pool:
        return list(pool.map(one, codes))
