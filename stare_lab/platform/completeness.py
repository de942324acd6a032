"""Is a run finished and measurable? The facts the verdict states before it compares anything.

A run directory can hold an unfinished run (interrupted, still being written, or a resume that did not reach the
end) or a run that lacks a field the verdict needs. Its statistics must not be mixed silently with finished runs:
:func:`run_status` gives the reason a run is left out (None for a finished, measurable run), and
:func:`status_clause` the verdict's clause for a group, e.g. ``grpo: 2/3 seeds complete; seed 1 stopped at step
411 of 2000``.

Steps are counted as the writers number them (docs/design.md §4): rows 1 … N, row N the N-th update; the number of
steps a run was asked for is ``steps`` (simulators) or ``schedule.total_steps`` (trainer) in its ``config.yaml``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["expected_steps", "run_status", "status_clause"]


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def expected_steps(config: Mapping[str, Any] | None) -> int | None:
    """The steps a run's config asks for: ``schedule.total_steps`` (trainer), else ``steps`` (simulators); None
    when the config says neither."""
    config = config or {}
    schedule = config.get("schedule")
    if isinstance(schedule, Mapping) and _int(schedule.get("total_steps")) is not None:
        return _int(schedule["total_steps"])
    return _int(config.get("steps"))


def run_status(config: Mapping[str, Any] | None, last_step: int | None, n_steps: int, *,
               has_entropy: bool = True, sweep_steps: int | None = None) -> str | None:
    """Why a run is left out of held / collapsed, or None when it is finished and measurable.

    Args:
        config: the run's ``config.yaml``.
        last_step: the largest step it logged (None: no row).
        n_steps: how many distinct steps it logged.
        has_entropy: whether it logged any finite ``entropy`` (without it nothing about collapse or the band can be
            measured).
        sweep_steps: the steps its sweep's ``summary.json`` planned for it (None: not part of a known sweep).

    Returns:
        ``"stopped at step 411 of 2000"``, ``"has 1998 of 2000 steps"`` (rows missing), ``"ran 800 steps, its
        sweep planned 2000"``, ``"not measurable (no entropy)"``, or None.
    """
    if not has_entropy:
        return "not measurable (no entropy)"
    own = expected_steps(config)
    want = own if own is not None else sweep_steps
    if want is not None and (last_step is None or last_step < want):
        return f"stopped at step {last_step or 0} of {want}"
    if want is not None and n_steps < want:
        return f"has {n_steps} of {want} steps"
    if sweep_steps is not None and own is not None and sweep_steps != own:
        return f"ran {own} steps, its sweep planned {sweep_steps}"
    return None


def status_clause(label: str, n_total: int, left_out: Sequence[tuple[Any, str]]) -> str | None:
    """The verdict's clause for a group whose runs ``left_out`` (``(seed, reason)``, reasons of
    :func:`run_status` or of the evidence check, :mod:`stare_lab.platform.evidence`) are not counted: ``grpo: 2/3
    seeds complete; seed 1 stopped at step 411 of 2000`` (``measurable`` instead of ``complete`` when every reason is
    a missing field, ``sound`` when a reason is neither). None when nothing is left out."""
    if not left_out:
        return None
    steps = ("stopped at step", "has ", "ran ")
    if all(r.startswith("not measurable") for _, r in left_out):
        word = "measurable"
    elif all(r.startswith(steps) or r.startswith("not measurable") for _, r in left_out):
        word = "complete"
    else:
        word = "sound"
    parts = [f"{label}: {n_total - len(left_out)}/{n_total} seeds {word}"]
    parts += [f"seed {'?' if s is None else s} {reason}" for s, reason in left_out]
    return "; ".join(parts)
