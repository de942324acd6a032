"""One writer per run directory: an exclusive OS file lock held for the life of a run (docs/design.md §4).

Every command that writes or deletes in a run (or sweep, or report) directory — ``simulate``, ``train``,
``evaluate``, ``calibrate``, ``analyze`` — takes :func:`lock_dir` on it BEFORE it writes or deletes anything there,
and keeps it until it ends. A second writer gets :class:`RunLockError` at once, one line naming the holder (pid,
host, start time, command), and has touched nothing.

Mechanism: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``DIR/.stare_lab.lock``. The kernel drops a flock when its holder
dies (``kill -9`` included), so a lock left by a killed process is free: the next writer takes it and the holder
information still in the file is only reported as stale (logged). The holder information (JSON: ``pid``, ``host``,
``started``, ``command``) is written right after the lock is taken; a reader that finds the file empty waits up to
one second for it. On release the file is removed while the lock is still held; a writer that opened the removed
file meanwhile sees that its file is no longer the one at the path and tries again, so two writers can never both
hold "the" lock. Locks are re-entrant within a process (the same directory locked twice by nested calls — e.g.
``stare-lab train`` and :func:`trainer.run.loop.train` — counts, and the file goes when the outermost releases).
Forked children share the lock with their parent. ``flock`` is advisory and local-filesystem semantics; on NFS
it is emulated with POSIX locks (Linux ≥ 2.6.12), which also cover several hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from stare_lab.errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["LOCK_FILE", "Holder", "RunLockError", "RunLock", "lock_dir", "read_holder", "live_holder_above"]

#: The lock file in a locked directory.
LOCK_FILE = ".stare_lab.lock"
#: Seconds a refused writer waits for a just-started holder to write its information.
_INFO_WAIT_S = 1.0

#: locks this process holds: resolved directory → [the RunLock, nesting count]
_HELD: dict[str, list] = {}


class RunLockError(RunError):
    """The directory is locked by another live writer; the message names it (pid, host, start time, command)."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a directory's lock: process id, host name, start time (ISO 8601, local time) and
    the command line."""

    pid: int
    host: str
    started: str
    command: str

    def describe(self) -> str:
        """``pid 1234 on host h since 2025-01-01T12:00:00 (stare-lab simulate --out runs/x)``."""
        return f"pid {self.pid} on host {self.host} since {self.started} ({self.command})"

    def alive(self) -> bool | None:
        """Whether the process still runs: True / False on this host, None (unknown) for another host."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else
            return True
        return True


def _parse_holder(text: str) -> Holder | None:
    try:
        data = json.loads(text)
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]), str(data.get("command", "")))
    except (ValueError, KeyError, TypeError):
        return None


def _read_fd(fd: int) -> str:
    chunks, offset = [], 0
    while True:
        data = os.pread(fd, 4096, offset)
        if not data:
            break
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks).decode("utf-8", errors="replace")


def read_holder(directory: str | os.PathLike) -> Holder | None:
    """The holder information in ``directory``'s lock file, without taking the lock (None when there is no lock
    file or it is empty/unreadable). A lock file exists only while a writer holds the lock or after that writer was
    killed: :meth:`Holder.alive` tells the two apart on the same host."""
    try:
        return _parse_holder((Path(directory) / LOCK_FILE).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None


def live_holder_above(directory: str | os.PathLike) -> tuple[Path, str] | None:
    """``(ancestor, holder description)`` of the nearest ancestor of ``directory`` (not itself) whose lock is held
    by a live process of this host or by this process's own lock (:meth:`Holder.alive`), else None: a run must not be
    written inside a directory another writer is filling (e.g. a sweep's method folder). Read only: no lock taken."""
    here = Path(directory).resolve()
    for parent in here.parents:
        if str(parent) in _HELD:
            continue  # this process's own lock (e.g. the calibration's sweep of a fit inside its --out)
        holder = read_holder(parent)
        if holder is not None and holder.alive() and holder.pid != os.getpid():
            return parent, holder.describe()
    return None


def _default_command() -> str:
    argv = [Path(sys.argv[0]).name if sys.argv else "python", *sys.argv[1:]]
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


class RunLock:
    """The exclusive lock of one directory (module docstring). Use :func:`lock_dir` unless the lock must outlive
    a ``with`` block.

    Args:
        directory: the run / sweep / report directory; must exist when :meth:`acquire` is called.
        command: what the holder runs, for the message a refused writer prints (default: this process's argv).
    """

    def __init__(self, directory: str | os.PathLike, command: str | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.command = command or _default_command()
        self.previous: Holder | None = None  # a killed holder's information found on acquire (stale)
        self._fd: int | None = None
        self._owner = 0

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        """Take the lock without waiting.

        Raises:
            RunLockError: another live process holds it (the message names the holder).
            RunError: the lock file cannot be created (directory missing or not writable).
        """
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise RunError(f"cannot lock {str(self.directory)!r}: {err.strerror or err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise RunError(f"cannot lock {str(self.directory)!r}: {err.strerror or err}") from None
                holder = self._wait_for_info(fd)
                os.close(fd)
                who = holder.describe() if holder else "another process (no holder information)"
                raise RunLockError(f"{str(self.directory)!r} is in use by {who}; wait for it to end or choose "
                                   "another output directory") from None
            try:  # the file may have been removed (and recreated) by the previous holder's release
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.previous = _parse_holder(_read_fd(fd))
        if self.previous is not None:
            logger.info("%s: took over the lock of %s, which no longer holds it (killed?)", self.directory,
                        self.previous.describe())
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": _dt.datetime.now().isoformat(timespec="seconds"), "command": self.command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        self._fd, self._owner = fd, os.getpid()
        return self

    @staticmethod
    def _wait_for_info(fd: int) -> Holder | None:
        deadline = time.monotonic() + _INFO_WAIT_S
        while True:
            holder = _parse_holder(_read_fd(fd))
            if holder is not None or time.monotonic() > deadline:
                return holder
            time.sleep(0.02)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        if os.getpid() == self._owner:  # a forked child never removes its parent's lock file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # while still holding it: see the module docstring
        os.close(self._fd)  # closing drops the flock
        self._fd = None


@contextlib.contextmanager
def lock_dir(directory: str | os.PathLike, command: str | None = None, option: str | None = None) -> Iterator[RunLock]:
    """Hold ``directory``'s lock for the ``with`` block (re-entrant within a process).

    ``directory`` is created (with parents) if missing; on exit the folders this call created are removed again
    if they are empty (nothing else is ever removed), so a command refused or failed before writing leaves nothing
    behind. ``option`` (e.g. ``--out``) names the directory in the errors.

    Raises:
        RunLockError: another live writer holds the directory (nothing was created or removed).
        RunError: the directory cannot be created or locked.
    """
    d = Path(directory)
    key = os.path.realpath(d)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield _HELD[key][0]
        finally:
            _HELD[key][1] -= 1
        return
    created: list[Path] = []
    probe = d
    while not probe.exists() and probe.parent != probe:
        created.append(probe)
        probe = probe.parent
    name = f"{option}={str(d)!r}" if option else repr(str(d))
    if probe.exists() and not probe.is_dir():
        raise RunError(f"{name} cannot be created: {str(probe)!r} is not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _remove_empty(created)
        reason = err.strerror or str(err)
        if created:  # name the existing folder that refused the new entry
            raise RunError(f"{name} cannot be created: {str(probe)!r} does not accept new entries ({reason})") from None
        raise RunError(f"{name} cannot be created: {reason}") from None
    lock = RunLock(d, command)
    try:
        lock.acquire()
    except BaseException:
        _remove_empty(created)
        raise
    _HELD[key] = [lock, 1]
    try:
        yield lock
    finally:
        del _HELD[key]
        lock.release()
        _remove_empty(created)


def _remove_empty(created: list[Path]) -> None:
    """rmdir the folders of ``created`` (deepest first) that are empty; stop at the first that is not."""
    for p in created:
        try:
            p.rmdir()
        except OSError:
            break
