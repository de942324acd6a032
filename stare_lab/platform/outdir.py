"""The one ``--out`` policy of every command that writes a run (``simulate``, ``train``, ``evaluate``):

* an ``--out`` that already holds a run of this kind is refused unless ``--resume`` or ``--overwrite``;
* ``--resume`` continues it, and only when its config matches (each command checks its own keys);
* ``--overwrite`` removes only what a run of this kind writes (the command's list of outputs), never other files,
  and refuses a directory whose ``config.yaml`` says another kind of run (``source``) wrote it;
* ``--resume`` and ``--overwrite`` exclude each other;
* a directory that holds another kind of output (:func:`held_kind`: a trainer run, a simulate sweep, an
  evaluation, a calibration) is refused whatever the options: no command writes over, resumes or removes another's
  output.

The caller holds the directory's lock (:func:`stare_lab.platform.runlock.lock_dir`) while it applies the policy and runs.
``simulate`` applies the same rules per run directory of its sweep (:mod:`simulators.sweep`).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Sequence

from stare_lab.errors import ConfigError, RunError

logger = logging.getLogger(__name__)

__all__ = ["existing_outputs", "claim_out", "held_kind", "check_kind", "check_outside_writers"]

#: What marks each kind of output at the top of its directory (besides ``config.yaml``'s ``source``).
SWEEP, EVALUATION, CALIBRATION, REPORT = "simulate sweep", "evaluation", "calibration", "analysis report"


def held_kind(out: str | os.PathLike) -> tuple[str, str] | None:
    """``(kind, what marks it)`` of the output ``out`` holds, or None (nothing recognised; also for a missing
    directory): a run's ``source`` from its ``config.yaml`` (``trainer``, ``simulator``, ``trl``, …), a simulate
    sweep (a ``summary.json`` with ``preset`` and ``methods``), an evaluation (``eval.json``), a calibration
    (``calibration.json``, ``stare-lab calibrate``), an analysis report (``report.json`` and ``report.md``,
    ``stare-lab analyze``). Unreadable files count
    as nothing recognised (the command's own reader reports them when it reads them)."""
    from stare_lab.platform.files import read_json, read_yaml

    out = Path(out)
    cfg = out / "config.yaml"
    if cfg.is_file():
        try:
            source = read_yaml(cfg, "config", RunError).get("source")
        except (RunError, AttributeError):
            source = None
        if isinstance(source, str):
            return f"{source} run", "config.yaml"
    summary = out / "summary.json"
    if summary.is_file():
        try:
            data = read_json(summary, "summary", RunError)
        except RunError:
            data = None
        if isinstance(data, dict) and "preset" in data and "methods" in data:
            return SWEEP, "summary.json"
    if (out / "eval.json").is_file():
        return EVALUATION, "eval.json"
    if (out / "calibration.json").is_file():
        return CALIBRATION, "calibration.json"
    if (out / "report.json").is_file() and (out / "report.md").is_file():
        return REPORT, "report.json"
    return None


def check_kind(out: str | os.PathLike, own: str, option: str = "--out") -> None:
    """Refuse ``out`` when it holds another kind of output than ``own`` (:func:`held_kind`; ``own`` as it names
    it, e.g. ``"trainer run"``, :data:`SWEEP`, :data:`EVALUATION`, :data:`CALIBRATION`).

    Raises:
        RunError: one line naming the kind found, its marker and what to do.
    """
    found = held_kind(out)
    if found is not None and found[0] != own:
        def a(noun: str) -> str:
            return ("an " if noun[:1] in "aeiou" else "a ") + noun

        raise RunError(f"{option} {str(out)!r} holds {a(found[0])} ({found[1]}), not {a(own)}: it is not written "
                       f"over, resumed or removed; choose another {option}")


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
        source: the ``source`` a run of this kind records in ``config.yaml`` (``trainer``, …); None: an evaluation.
        resume, overwrite: the command's ``--resume`` / ``--overwrite``.
        option: the option's name in messages.
        remove: further names ``--overwrite`` removes that do not by themselves mean "a run is there" (e.g. a model
            the command built for the run).
        check_only: raise what the policy raises but remove nothing (a command's early check, before its lock).

    Raises:
        ConfigError: both ``resume`` and ``overwrite``.
        RunError: a run is there and neither is given (naming what is there and both options); ``out`` holds
            another kind of output (:func:`check_kind`), whatever the options.
    """
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume continues the run, --overwrite "
                          "replaces it")
    check_kind(out, f"{source} run" if source is not None else EVALUATION, option)
    found = existing_outputs(out, outputs)
    if not found:
        return "new"
    if resume:
        return "resume"
    if not overwrite:
        raise RunError(f"{option} {str(out)!r} already holds a run ({', '.join(found)}); pass --resume to continue "
                       "it or --overwrite to replace it, or choose another " + option)
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


#: how many folders above an ``--out`` :func:`check_outside_writers` looks for another output (a sweep's run
#: directories are ``OUT/method/W=…/seed<k>``)
LEVELS_ABOVE = 4


def check_outside_writers(out: str | os.PathLike, option: str = "--out") -> None:
    """Refuse ``out`` inside a directory that another live process is writing (a sweep's method folder, a
    calibration's ``fit/``): :func:`stare_lab.platform.runlock.live_holder_above`; or inside another output (up to
    :data:`LEVELS_ABOVE` folders up: a sweep, a run, an evaluation, a calibration — :func:`held_kind`), whose
    readers would count the new runs as its own.

    Raises:
        RunError: one line naming the directory and its holder or kind.
    """
    from stare_lab.platform.runlock import live_holder_above

    for parent in list(Path(os.path.abspath(out)).parents)[:LEVELS_ABOVE]:
        kind = held_kind(parent)
        if kind is not None and kind[0] != REPORT:
            raise RunError(f"{option} {str(out)!r} is inside {str(parent)!r}, which holds a {kind[0]} ({kind[1]}); "
                           f"choose {option} outside it")

    holder = live_holder_above(out)
    if holder is not None:
        raise RunError(f"{option} {str(out)!r} is inside {str(holder[0])!r}, which {holder[1]} is writing; choose "
                       f"{option} outside it")
