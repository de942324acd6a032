"""Which runs of a comparison are unfinished or not measurable (:mod:`stare_lab.platform.completeness`): each run's steps
against its own config and, for the runs of a sweep, against the sweep's ``summary.json``. The verdict leaves
those runs out of held / collapsed and says so (``grpo: 2/3 seeds complete; seed 1 stopped at step 411 of 2000``);
the report lists them under its warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare_lab.platform.completeness import expected_steps, run_status

from .load import RunData

__all__ = ["left_out", "sweep_steps"]


def sweep_steps(sweep: dict[str, Any], root: str | Path) -> dict[Path, int]:
    """The steps a sweep summary (``stare-lab simulate``'s ``summary.json`` in folder ``root``) planned for each of
    its run directories (resolved paths)."""
    out: dict[Path, int] = {}
    configs = sweep.get("config") or {}
    for label, entry in (sweep.get("methods") or {}).items():
        if not isinstance(entry, dict):
            continue
        for seed_key, rel in (entry.get("run_dirs") or {}).items():
            steps = expected_steps(configs.get(f"{label}/{seed_key}"))
            if steps is not None and isinstance(rel, str):
                out[(Path(root) / rel).resolve()] = steps
    return out


def left_out(runs: list[RunData], planned: dict[Path, int] | None = None) -> dict[str, str]:
    """``str(run.path)`` → why the run is left out of the verdict's counts (:func:`stare_lab.platform.completeness.run_status`)
    for each run that is unfinished or not measurable; ``planned`` as :func:`sweep_steps`."""
    planned = planned or {}
    out = {}
    for r in runs:
        last = int(r.steps[-1]) if r.n_steps else None
        reason = run_status(r.config, last, r.n_steps, has_entropy=r.has("entropy"),
                            sweep_steps=planned.get(Path(r.path).resolve()))
        if reason is not None:
            out[str(r.path)] = reason
    return out
