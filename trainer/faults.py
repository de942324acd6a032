"""Test hooks of the training loop (environment variables, read when they fire).

``STARE_LAB_FAULT=STEP:PHASE`` (PHASE ∈ rollout, update, logged, eval) makes the process exit with code 137 at
that point, as a kill would (``STEP:eval_error`` makes the periodic evaluation of STEP raise instead);
``STARE_LAB_DUMP_PARAMS=PREFIX`` makes every rank save its gathered final parameters to ``PREFIX.rank<R>.pt``.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

__all__ = ["fault"]


def fault(step: int, phase: str) -> None:
    """Exit with code 137 if ``STARE_LAB_FAULT`` is ``f"{step}:{phase}"`` (as a kill would)."""
    spec = os.environ.get("STARE_LAB_FAULT")
    if spec and spec == f"{step}:{phase}":
        logger.error("STARE_LAB_FAULT=%s: exiting as if killed", spec)
        os._exit(137)
