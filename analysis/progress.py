"""Which runs of a comparison are left out of the verdict's counts: those that are not sound evidence
(:func:`stare_lab.platform.evidence.check_run`, run when each run is read: :attr:`analysis.load.RunData.problems`) —
unfinished against their config or their sweep's ``summary.json``, not measurable, with damaged metrics or a
``summary.json`` their rows do not reproduce — and, for a sweep summary given explicitly (``analyze --summary``),
those unfinished against it. The verdict names them (``grpo: 2/3 seeds complete; seed 1 stopped at step 411 of
2000``); the report lists the whole reason under its warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare_lab.platform.completeness import run_status
from stare_lab.platform.evidence import sweep_steps

from .load import RunData

__all__ = ["left_out", "clause", "sweep_steps"]


def left_out(runs: list[RunData], planned: dict[Path, int] | None = None) -> dict[str, list[str]]:
    """``str(run.path)`` → the problems (:attr:`~analysis.load.RunData.problems`) of each run that is not sound
    evidence, plus a step count short of ``planned`` (:func:`stare_lab.platform.evidence.sweep_steps` of a sweep
    summary given explicitly)."""
    planned = planned or {}
    out: dict[str, list[str]] = {}
    for r in runs:
        problems = list(r.problems)
        want = planned.get(Path(r.path).resolve())
        if want is not None:
            last = int(r.steps[-1]) if r.n_steps else None
            status = run_status(r.config, last, r.n_steps, has_entropy=r.has("entropy"), sweep_steps=want)
            if status is not None and status not in problems:
                problems.append(status)
        if problems:
            out[str(r.path)] = problems
    return out


def clause(problems: list[str]) -> str:
    """The verdict's short form of a run's problems: the first, up to its colon (``summary.json does not match its
    metrics.jsonl``; ``stopped at step 41 of 60`` whole)."""
    return problems[0].split(": ", 1)[0]

