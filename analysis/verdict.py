"""The verdict at the top of every report: the core's one-line verdict (:func:`stare_lab.platform.verdict.verdict`: which
methods collapsed, which held the band, at what reward) computed from the report's own runs — each run's summary
statistics with its own settings (:func:`analysis.stats.run_summary`, the numbers of its ``summary.json``), so
``stare-lab simulate``'s headline and the report say the same thing about the same runs."""

from __future__ import annotations

from typing import Any, Mapping

from stare_lab.errors import ConfigError
from stare_lab.platform.verdict import group_outcome, verdict

from .compare import Comparison
from .grouping import experiment_slice
from .load import RunData

__all__ = ["uses_stare", "uses_m", "comparison_verdict", "reference_slices"]


def uses_stare(run: RunData) -> bool:
    """Whether the run's loss uses the STARE gate and W/M (its declared needs); a loss this process does not know
    (registered by another program) counts as a baseline."""
    mode = run.config_value("loss.loss_mode")
    if not isinstance(mode, str):
        return False
    # the losses' declared needs live in the core's loss registry, which imports torch (~2 s): imported here, not at
    # the top, so that building the command line's parser (every wing's cli, for every command) stays light
    from stare_lab.loss.losses import loss_needs

    try:
        return loss_needs(mode, run.config_value("loss") or None).stare
    except ConfigError:
        return False


def uses_m(run: RunData) -> bool:
    """Whether the run's loss applies M (×M on the negative-advantage high-surprisal set L−): STARE variant C2
    (``loss.stare.variant``, docs/theory.md §1). O1 and the baselines log ``stare_m`` but never use it."""
    return uses_stare(run) and str(run.config_value("loss.stare.variant", "")).upper() == "C2"


def comparison_verdict(cmp: Comparison, summaries: Mapping[int, dict[str, Any]], *, per_setting: bool = True) -> str:
    """The verdict of ``cmp``'s groups; ``summaries`` maps ``id(run)`` to the run's summary statistics. The reward
    of a STARE group is compared with the baseline of the same experiment (:func:`reference_slices`); none is
    named when there is no such baseline, or several that cannot be told apart. Run directories found but not
    readable (:attr:`analysis.compare.Comparison.unread`) are named first."""
    groups = []
    left = getattr(cmp, "left_out", {})
    for g in cmp.groups:
        first = g.runs[0]
        stare = (first.config_value("loss.stare") or {}) if uses_stare(first) else None
        counted = [r for r in g.runs if str(r.path) not in left]  # unfinished / not measurable: named, not counted
        groups.append({"label": g.label, "method": g.method, "stare": stare,
                       **group_outcome([summaries[id(r)] for r in counted]), "n_total": len(g.runs),
                       "left_out": [(r.seed, left[str(r.path)]) for r in g.runs if str(r.path) in left]})
    for info, sl in zip(groups, reference_slices(cmp)):
        info["slice"] = sl
    unread = getattr(cmp, "unread", [])
    head = (f"{len(unread)} run{'s' * (len(unread) != 1)} not read: {unread[0]}"
            + (f" and {len(unread) - 1} more" if len(unread) > 1 else "") + "; ") if unread else ""
    return head + verdict(groups, per_setting=per_setting)


def reference_slices(cmp: Comparison) -> list[dict[str, Any]]:
    """Per group of ``cmp``, the ``slice`` by which :func:`stare_lab.platform.verdict.verdict` finds a STARE group's
    baseline (equal slices): its experiment (:func:`analysis.grouping.experiment_slice`: source, sweep folder,
    simulator kind / preset, the non-STARE ``group_by`` values) and a target entropy. A baseline keeps its own
    target; a STARE group takes its own where a baseline of its experiment has it, else the one target that all
    baselines of its experiment share (a sweep over ``stare.target_entropy`` runs GRPO once, at the preset's
    target; a trainer GRPO config carries the default target), else its own — then no baseline matches (GRPO at
    several other targets: which one is the reference is not known)."""
    cache: dict = {}
    slices = [experiment_slice(g.runs, g.key_values, cache) for g in cmp.groups]
    baseline = [not any(uses_stare(r) for r in g.runs) for g in cmp.groups]

    def experiment(sl: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sl.items() if k != "target"}

    for i, sl in enumerate(slices):
        if baseline[i]:
            continue
        targets = {repr(b["target"]): b["target"] for b, is_b in zip(slices, baseline)
                   if is_b and experiment(b) == experiment(sl)}
        if repr(sl["target"]) not in targets and len(targets) == 1:
            sl["target"] = next(iter(targets.values()))
    return slices
