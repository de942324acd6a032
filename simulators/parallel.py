"""Run many tabular simulations over the machine's cores: batched per core (:func:`simulators.tabular.runner.run_batch`).

The runs are grouped by :func:`simulators.tabular.runner.batch_key` (runs of one group share one tensor computation), and
each group is split into up to ``workers`` contiguous chunks, one forked process per chunk (``fork``: the parent's
imports are reused, so a worker starts in milliseconds). A run's numbers do not depend on the batch it lands in
(tested), so the split never changes a result. With one worker (or one chunk) everything runs in this process.

Memory: all chunks compute at once, so their batched tensors add up (with one process the batches run one after
the other). :func:`check_memory` compares a conservative estimate of that peak
(:mod:`simulators.tabular.memory`) with the memory the machine has and refuses a request that does not fit before
anything starts; a worker that dies anyway (e.g. killed by the kernel when memory ran out) is a one-line
:class:`~stare_lab.errors.RunError` naming its exit code or signal.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue
import signal
from pathlib import Path
from typing import Any, Callable

import torch

from stare_lab.errors import ConfigError, RunError, StareLabError

from simulators.tabular.runner import batch_key, run_batch
from simulators.tabular.memory import PROCESS_BYTES, available_memory, batch_peak_bytes, rows_bytes

logger = logging.getLogger(__name__)

__all__ = ["run_many", "default_workers", "chunks", "peak_memory", "check_memory"]

_GIB = 2**30
#: seconds a worker process gets to exit (after reporting, or after SIGTERM) before it is killed (SIGKILL)
JOIN_S = 30.0


def default_workers() -> int:
    """The number of cores this process may use (``os.sched_getaffinity``, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def chunks(keys: list[tuple], workers: int) -> list[list[int]]:
    """Indices of runs grouped by batch key (``keys[i]``), each group split into at most ``workers`` contiguous
    chunks of near-equal size; returns the chunks (every index exactly once)."""
    groups: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    n_groups = len(groups)
    out = []
    for idx in groups.values():
        parts = max(1, min(len(idx), workers // n_groups if workers >= n_groups else 1))
        size, extra = divmod(len(idx), parts)
        start = 0
        for p in range(parts):
            stop = start + size + (p < extra)
            out.append(idx[start:stop])
            start = stop
    return out


def _groups(configs: list[Any]) -> list[list[int]]:
    """Indices of the runs of each batch key (:func:`chunks` with one worker: one chunk per key)."""
    return chunks([batch_key(c) for c in configs], 1)


def peak_memory(configs: list[Any], workers: int | None = None) -> int:
    """Estimated peak bytes of :func:`run_many` of ``configs`` over ``workers`` processes (default
    :func:`default_workers`), conservative: with several chunks every worker process computes at once (its own
    :data:`~simulators.tabular.memory.PROCESS_BYTES`, batch and metrics rows); in this process (one worker or one
    chunk) the batches run one after the other, the rows of every run kept until the end."""
    if not configs:
        return 0
    workers = default_workers() if workers is None else max(1, int(workers))
    parts = chunks([batch_key(c) for c in configs], workers)
    if workers == 1 or len(parts) == 1:
        biggest = max(batch_peak_bytes([configs[i] for i in idx]) for idx in _groups(configs))
        return PROCESS_BYTES + biggest + rows_bytes(configs)
    return sum(PROCESS_BYTES + batch_peak_bytes([configs[i] for i in idx]) + rows_bytes([configs[i] for i in idx])
               for idx in parts)


def check_memory(configs: list[Any], workers: int | None = None) -> None:
    """Refuse tabular runs whose estimated peak memory (:func:`peak_memory`) exceeds what the machine has now
    (:func:`simulators.tabular.memory.available_memory`; no check when that cannot be read).

    Raises:
        ConfigError: one line with the estimate, the largest batch's sizes, the available memory and what to lower
            (group_size / num_prompts when the sampled tokens dominate, vocab_size / seq_len / num_prompts when the
            policy tables do; fewer methods or seeds; ``--workers 1`` when running the batches one after the other
            would fit).
    """
    if not configs:
        return
    workers = default_workers() if workers is None else max(1, int(workers))
    need = peak_memory(configs, workers)
    avail = available_memory()
    if avail is None or need <= avail[0]:
        return
    have, source = avail
    big = max(_groups(configs), key=lambda idx: batch_peak_bytes([configs[i] for i in idx]))
    c = configs[big[0]]
    S, G, L, V = c.num_prompts, c.group_size, c.seq_len, c.vocab_size
    if c.mode == "sampled":
        sizes = f"{len(big)} run(s) x {S} prompts x {G} responses x {L} positions sampled together, {V} tokens"
        tokens = S * G * L > S * L * V
        lower = "group_size or num_prompts" if tokens else "vocab_size, seq_len or num_prompts"
    else:
        sizes = f"{len(big)} run(s) x {S} prompts x {L} positions x {V} tokens (mode=expected)"
        lower = "vocab_size, seq_len or num_prompts"
    hint = ""
    alone = peak_memory(configs, 1)  # one process: the batches one after the other
    if alone < need and alone <= have:
        hint = f", or pass --workers 1 (the batches one after the other: about {alone / _GIB:.1f} GiB)"
    raise ConfigError(
        f"the tabular runs would need about {need / _GIB:.1f} GiB of memory at their peak (conservative estimate; "
        f"largest batch: {sizes}) but {have / _GIB:.1f} GiB is available ({source}); lower {lower}, or run fewer "
        f"methods or seeds (--methods, --seeds){hint}"
    )


def _died(proc, n_runs: int) -> RunError:
    """The error for a worker process that exited without reporting: its exit code, or the signal that killed it
    (SIGKILL: most likely the kernel's out-of-memory killer)."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"was killed by {name}"
        if -code == signal.SIGKILL:
            how += (" — likely out of memory (the kernel kills a process when memory runs out, e.g. when other "
                    "processes took what the estimate before the start counted on); lower group_size or num_prompts, "
                    "or run fewer methods or seeds")
    else:
        how = f"exited with code {code}"
    return RunError(f"a simulation worker process (pid {proc.pid}, {n_runs} run(s)) {how} before reporting its "
                    "results; --resume continues its runs from their last checkpoints")


def _oom_error(err: BaseException) -> RunError | None:
    """A one-line RunError for an allocation that failed (``MemoryError``, torch's ``can't allocate memory``),
    else None."""
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and "can't allocate memory" in str(err)):
        return RunError("the tabular runs ran out of memory (an allocation failed); lower group_size or num_prompts, "
                        "or run fewer methods or seeds")
    return None


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in a child
    """A worker ends when its parent does (``kill -9`` of the parent included): Linux's parent-death signal. SIGTERM
    gets its default action back (the parent's handler, inherited by the fork, would turn it into an exception)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the workers finish their chunk on their own
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _worker(q, chunk_id: int, configs, run_dirs, resume: bool, parent: int) -> None:  # pragma: no cover - child
    _die_with_parent(parent)
    # one core per worker; and a forked child must not enter the parent's OpenMP thread pool (it would hang when the
    # parent had run multi-threaded torch ops before the fork, e.g. without OMP_NUM_THREADS=1)
    torch.set_num_threads(1)
    try:
        summaries = run_batch(configs, run_dirs, resume=resume, progress=lambda n: q.put(("progress", n)))
        q.put(("done", chunk_id, summaries))
    except StareLabError as err:  # e.g. a plugin loss's LossError: the parent raises it as it is (one line)
        try:
            pickle.dumps(err)
        except Exception:  # noqa: BLE001 - a plugin's own error class that does not pickle: its message
            err = RunError(str(err))
        q.put(("error", chunk_id, err))
    except BaseException as err:  # noqa: BLE001 - report anything else to the parent, which raises it
        oom = _oom_error(err)
        q.put(("error", chunk_id, oom) if oom else ("crash", chunk_id, f"{type(err).__name__}: {err}"))


def run_many(
    configs: list[Any],
    run_dirs: list[str | os.PathLike],
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Run tabular configs into their directories over ``workers`` processes (default :func:`default_workers`);
    returns the summaries in order. ``progress(n)`` receives the number of run-steps done. ``meanwhile()`` is
    called once in this process while the worker processes compute (after they started: no thread is running
    when they fork), e.g. to load what the caller needs afterwards; with one process it is called first.

    Raises:
        ConfigError: the estimated peak memory exceeds the available memory (:func:`check_memory`), before anything
            starts.
        RunError: the first error of any run (the other runs still finish, as in :func:`run_batch`), or a worker
            process that died without reporting (its exit code or signal; SIGKILL: likely out of memory) — the other
            workers are then stopped.
        RuntimeError: a worker failed with an unexpected exception (its type and message).
    """
    workers = default_workers() if workers is None else max(1, int(workers))
    check_memory(list(configs), workers)
    parts = chunks([batch_key(c) for c in configs], workers)
    if workers == 1 or len(parts) == 1:
        if meanwhile is not None:
            meanwhile()
        try:
            return run_batch(configs, run_dirs, resume=resume, progress=progress)
        except (MemoryError, RuntimeError) as err:
            oom = _oom_error(err)
            if oom is None:
                raise
            raise oom from None
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = []
    for cid, idx in enumerate(parts):
        p = ctx.Process(target=_worker, args=(q, cid, [configs[i] for i in idx], [Path(run_dirs[i]) for i in idx],
                                                resume, os.getpid()), daemon=True)
        p.start()
        procs.append(p)
    if meanwhile is not None:
        meanwhile()  # the workers' messages wait in the queue
    results: dict[int, list[dict[str, Any]]] = {}
    errors: list[StareLabError] = []
    crashes: list[str] = []
    reported: set[int] = set()
    try:
        while len(reported) < len(parts):
            try:
                msg = q.get(timeout=1.0)
            except queue.Empty:
                # a worker that exited has flushed its messages into the queue's pipe, so an empty queue means that
                # a dead worker without a report will never send one
                dead = [cid for cid, p in enumerate(procs) if cid not in reported and not p.is_alive()]
                if dead and q.empty():
                    raise _died(procs[dead[0]], len(parts[dead[0]])) from None
                continue
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1])
                continue
            reported.add(msg[1])
            if msg[0] == "done":
                results[msg[1]] = msg[2]
            elif msg[0] == "error":
                errors.append(msg[2])
            else:
                crashes.append(msg[2])
    finally:
        stop = bool(errors or crashes or len(results) < len(parts))
        for p in procs:
            if stop and p.is_alive():
                p.terminate()
            p.join(timeout=JOIN_S)
            if p.is_alive():  # a worker that does not exit (a signal it lost, say) is not waited for for ever
                p.kill()
                p.join()
    if crashes:
        raise RuntimeError(f"a simulation worker failed: {crashes[0]}")
    if errors:
        raise errors[0]
    out: list[dict[str, Any] | None] = [None] * len(configs)
    for cid, idx in enumerate(parts):
        for i, s in zip(idx, results[cid]):
            out[i] = s
    return out  # type: ignore[return-value]
