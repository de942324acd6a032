"""Run many tabular simulations over the machine's cores: batched per core (:func:`simulators.tabular.run_batch`).

The runs are grouped by :func:`simulators.tabular.batch_key` (runs of one group share one tensor computation), and
each group is split into up to ``workers`` contiguous chunks, one forked process per chunk (``fork``: the parent's
imports are reused, so a worker starts in milliseconds). A run's numbers do not depend on the batch it lands in
(tested), so the split never changes a result. With one worker (or one chunk) everything runs in this process.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
from pathlib import Path
from typing import Any, Callable

import torch

from stare_lab.errors import RunError

from .tabular import batch_key, run_batch

logger = logging.getLogger(__name__)

__all__ = ["run_many", "default_workers", "chunks"]


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


def _worker(q, chunk_id: int, configs, run_dirs, resume: bool) -> None:  # pragma: no cover - runs in a child
    # one core per worker; and a forked child must not enter the parent's OpenMP thread pool (it would hang when the
    # parent had run multi-threaded torch ops before the fork, e.g. without OMP_NUM_THREADS=1)
    torch.set_num_threads(1)
    try:
        summaries = run_batch(configs, run_dirs, resume=resume, progress=lambda n: q.put(("progress", n)))
        q.put(("done", chunk_id, summaries))
    except RunError as err:
        q.put(("error", chunk_id, str(err)))
    except BaseException as err:  # noqa: BLE001 - report anything else to the parent, which raises it
        q.put(("crash", chunk_id, f"{type(err).__name__}: {err}"))


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
        RunError: the first error of any run (the other runs still finish, as in :func:`run_batch`).
        RuntimeError: a worker died without reporting (e.g. killed).
    """
    workers = default_workers() if workers is None else max(1, int(workers))
    parts = chunks([batch_key(c) for c in configs], workers)
    if workers == 1 or len(parts) == 1:
        if meanwhile is not None:
            meanwhile()
        return run_batch(configs, run_dirs, resume=resume, progress=progress)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = []
    for cid, idx in enumerate(parts):
        p = ctx.Process(target=_worker, args=(q, cid, [configs[i] for i in idx], [Path(run_dirs[i]) for i in idx],
                                                resume), daemon=True)
        p.start()
        procs.append(p)
    if meanwhile is not None:
        meanwhile()  # the workers' messages wait in the queue
    results: dict[int, list[dict[str, Any]]] = {}
    errors: list[str] = []
    crashes: list[str] = []
    try:
        while len(results) + len(errors) + len(crashes) < len(parts):
            try:
                msg = q.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and q.empty():
                    raise RuntimeError("a simulation worker process died without reporting") from None
                continue
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1])
            elif msg[0] == "done":
                results[msg[1]] = msg[2]
            elif msg[0] == "error":
                errors.append(msg[2])
            else:
                crashes.append(msg[2])
    finally:
        for p in procs:
            if p.is_alive() and (errors or crashes or len(results) < len(parts)):
                p.terminate()
            p.join()
    if crashes:
        raise RuntimeError(f"a simulation worker failed: {crashes[0]}")
    if errors:
        raise RunError(errors[0])
    out: list[dict[str, Any] | None] = [None] * len(configs)
    for cid, idx in enumerate(parts):
        for i, s in zip(idx, results[cid]):
            out[i] = s
    return out  # type: ignore[return-value]
