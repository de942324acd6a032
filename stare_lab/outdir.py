"""The one ``--out`` policy of every command that writes a run (``simulate``, ``train``, ``evaluate``):

* an ``--out`` that already holds a run of this kind is refused unless ``--resume`` or ``--overwrite``;
* ``--resume`` continues it, and only when its config matches (each command checks its own keys);
* ``--overwrite`` removes only what a run of this kind writes (the command's list of outputs), never other files,
  and refuses a directory whose ``config.yaml`` says another kind of run (``source``) wrote it;
* ``--resume`` and ``--overwrite`` exclude each other.

The caller holds the directory's lock (:func:`stare_lab.runlock.lock_dir`) while it applies the policy and runs.
``simulate`` applies the same rules per run directory of its sweep (:mod:`simulators.sweep`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Sequence

from .errors import ConfigError, RunError

logger = logging.getLogger(__name__)

__all__ = ["existing_outputs", "claim_out"]


def existing_outputs(out: str | os.PathLike, outputs: Sequence[str]) -> list[str]:
    """The names of ``outputs`` (files or folders directly in ``out``) that exist."""
    return [name for name in outputs if (Path(out) / name).exists() or (Path(out) / name).is_symlink()]


def claim_out(out: str | os.PathLike, outputs: Sequence[str], *, source: str | None, resume: bool, overwrite: bool,
              option: str = "--out", remove: Sequence[str] = (), check_only: bool = False) -> str:
    """Apply the policy (module docstring) to ``out``; returns ``"new"`` (no run there), ``"resume"`` (a run there,
    to be continued: the caller checks its config) or ``"overwrite"`` (the previous run's outputs were removed).

    Args:
        out: the run directory.
        outputs: the names a run of this kind writes in ``out``; any of them present means "a run is there".
        source: the ``source`` a run of this kind records in ``config.yaml`` (``trainer``, …); None: not checked.
        resume, overwrite: the command's ``--resume`` / ``--overwrite``.
        option: the option's name in messages.
        remove: further names ``--overwrite`` removes that do not by themselves mean "a run is there" (e.g. a model
            the command built for the run).
        check_only: raise what the policy raises but remove nothing (a command's early check, before its lock).

    Raises:
        ConfigError: both ``resume`` and ``overwrite``.
        RunError: a run is there and neither is given (naming what is there and both options); ``overwrite`` of a
            directory whose ``config.yaml`` has another ``source``.
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume continues the run, --overwrite "
                          "replaces it")
    found = existing_outputs(out, outputs)
    if not found:
        return "new"
    if resume:
        return "resume"
    if not overwrite:
        raise RunError(f"{option} {str(out)!r} already holds a run ({', '.join(found)}); pass --resume to continue "
                       "it or --overwrite to replace it, or choose another " + option)
    cfg = Path(out) / "config.yaml"
    if source is not None and cfg.is_file():
        from .files import read_yaml

        other = read_yaml(cfg, "the run's config", RunError).get("source")
        if other is not None and other != source:
            raise RunError(f"{option} {str(out)!r} holds a run of source {other!r} (its config.yaml), not a "
                           f"{source} run: --overwrite does not remove it; choose another {option}")
    if check_only:
        return "overwrite"
    for name in [*found, *existing_outputs(out, remove)]:
        p = Path(out) / name
        logger.info("--overwrite: removing %s", p)
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as err:
            raise RunError(f"--overwrite: cannot remove {str(p)!r}: {err.strerror or err}") from None
    return "overwrite"
