"""The thread count of a ``stare-lab`` process, set by the command line itself (not left to the shell).

:func:`set_thread_defaults` runs in the front door (:func:`stare_lab.cli.main`) and in ``python -m trainer.cli``
before torch is imported: ``OMP_NUM_THREADS=1`` unless the user set it (torch reads it at import for its
intra-op pool). One thread per process is the measured best on the CPU paths: the tabular simulator spreads its
runs over worker processes, the trainer's CPU step runs vLLM and DeepSpeed in one process, and an unset
``OMP_NUM_THREADS`` (one OpenMP thread per core in each of them) made a trainer step 25x slower on a busy 2-core
machine. A user who exports ``OMP_NUM_THREADS`` keeps their value; if torch was imported before (a library caller),
its pool is set too, unless the user set the variable.
"""

from __future__ import annotations

import os
import sys

__all__ = ["THREAD_VARS", "set_thread_defaults"]

#: The variables set (when unset) to the default thread count.
THREAD_VARS = ("OMP_NUM_THREADS",)


def set_thread_defaults(threads: int = 1) -> dict[str, str]:
    """Set each of :data:`THREAD_VARS` to ``threads`` where the environment does not already have it; returns the
    variables set. Where torch is already imported and ``OMP_NUM_THREADS`` was unset, ``torch.set_num_threads``
    too."""
    done = {}
    for var in THREAD_VARS:
        if not os.environ.get(var):
            os.environ[var] = done[var] = str(int(threads))
    torch = sys.modules.get("torch")
    if "OMP_NUM_THREADS" in done and torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(int(threads))
    return done
