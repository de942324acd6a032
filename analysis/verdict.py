"""The verdict at the top of every report: the core's one-line verdict (:func:`stare_lab.verdict.verdict`: which
methods collapsed, which held the band, at what reward) computed from the report's own runs — each run's summary
statistics with its own settings (:func:`analysis.stats.run_summary`, the numbers of its ``summary.json``), so
``stare-lab simulate``'s headline and the report say the same thing about the same runs."""

from __future__ import annotations

from typing import Any, Mapping

from stare_lab.errors import ConfigError
from stare_lab.verdict import group_outcome, verdict

from .compare import Comparison
from .grouping import experiment_slice
from .load import RunData

__all__ = ["uses_stare", "uses_m", "comparison_verdict"]


def uses_stare(run: RunData) -> bool:
    """Whether the run's loss uses the STARE gate and W/M (its declared needs); a loss this process does not know
    (registered by another program) counts as a baseline."""
    mode = run.config_value("loss.loss_mode")
    if not isinstance(mode, str):
        return False
    # the losses' declared needs live in the core's loss registry, which imports torch (~2 s): imported here, not at
    # the top, so that building the command line's parser (every wing's cli, for every command) stays light
    from stare_lab.losses import loss_needs

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
    of a STARE group is compared with the baseline of the same experiment (:func:`analysis.grouping.experiment_slice`:
    source, sweep folder, simulator kind / preset, target entropy and the non-STARE ``group_by`` values); none is
    named when no baseline shares all of them."""
    groups = []
    cache: dict = {}
    for g in cmp.groups:
        first = g.runs[0]
        stare = (first.config_value("loss.stare") or {}) if uses_stare(first) else None
        groups.append({"label": g.label, "method": g.method, "stare": stare,
                       "slice": experiment_slice(g.runs, g.key_values, cache),
                       **group_outcome([summaries[id(r)] for r in g.runs])})
    return verdict(groups, per_setting=per_setting)
