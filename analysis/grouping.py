"""Which runs may be averaged together: the setting signature of a run, ``group_by`` key checks and the labels
that tell split groups apart (used by :func:`analysis.compare.compare`).

Runs of one method are averaged over seeds only when they are the same experiment: same sweep folder (the
``stare-lab simulate`` output they belong to, :func:`sweep_root`), same simulator kind / preset (:data:`KIND_KEYS`),
same ``loss.stare.*`` settings and the same target entropy (review findings: averaging a tabular W=1.1 run with a
transformer W=5 run plotted a W≈2.07 that no run used; the ``demo`` and ``collapse`` presets, which differ in lr and
steps but write the same ``loss.stare`` block, were averaged into one group).
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any, Sequence

from stare_lab.errors import ConfigError

from .load import RunData

__all__ = ["KIND_KEYS", "SWEEP_KEY", "setting_signature", "experiment_slice", "sweep_root", "check_group_by",
           "split_labels", "group_key_value", "fmt_value", "short_name"]


def fmt_value(v: Any) -> str:
    """A config value in a label: floats with ``%g``, anything else as ``str``."""
    return f"{v:g}" if isinstance(v, float) else str(v)


_MISSING = object()

#: Top-level config keys naming the kind of experiment (simulator kind, preset): runs that differ in one are
#: never averaged together by default.
KIND_KEYS = ("simulator", "preset")
#: The pseudo-key of a run's sweep folder (:func:`sweep_root`; the folder's path, None outside a sweep) in
#: :func:`setting_signature`: runs of two sweeps are two experiments (``--merge`` averages them).
SWEEP_KEY = "sweep folder"
#: Short names of the method settings in group labels.
_SHORT = {"loss.stare.reweight_w": "W", "loss.stare.reweight_m": "M", "loss.stare.target_entropy": "H_tgt",
          "target_entropy_frac": "H_tgt frac"}


def short_name(key: str) -> str:
    """The short name of a dotted config key in labels: ``W`` for ``loss.stare.reweight_w``, ``M``, ``H_tgt``, else
    the last part (``lr`` for ``optim.lr``)."""
    return _SHORT.get(key, key.rsplit(".", 1)[-1])


def group_key_value(run: RunData, key: str) -> Any:
    """The run's config value at the dotted ``key`` (None if absent; mappings/lists as their ``str``)."""
    v = run.config_value(key, _MISSING)
    if v is _MISSING:
        return None
    if isinstance(v, (dict, list)):
        return str(v)
    return v


def _leaf_keys(node: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted keys of the non-mapping values of a nested config (depth ≤ 6)."""
    if not isinstance(node, dict) or depth > 6:
        return []
    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        out += _leaf_keys(v, key + ".", depth + 1) if isinstance(v, dict) and v else [key]
    return out


#: top-level keys of a simulator run's config that do not make it another experiment (its seed, its length, what
#: the run format adds), left out of :func:`setting_signature`
_NOT_SETTINGS = frozenset({"seed", "init_seed", "steps", "checkpoint_every", "method", "source", "simulator",
                           "preset", "initial_entropy", "reward_optimal_entropy", "target_entropy_frac"})


def setting_signature(run: RunData, cache: dict[Path, bool] | None = None) -> tuple[tuple[str, Any], ...]:
    """The settings that must match for runs of one method to be averaged (everything but the seed that shapes
    the experiment's kind or the method): the sweep folder (:data:`SWEEP_KEY`, :func:`sweep_root`; ``cache`` as
    there), :data:`KIND_KEYS`, every ``loss.stare.*`` value, and the target entropy — as ``target_entropy_frac``
    where the config sets it relative to the initial entropy (then the absolute ``loss.stare.target_entropy``
    differs by seed and is left out), else ``loss.stare.target_entropy``; for a simulator run also its other
    top-level config values (the task knobs: ``reward_coupling``, ``lr``, ``push_efficiency``, … but not
    :data:`_NOT_SETTINGS`), so that runs of two toys are never averaged as seeds of one."""
    root = sweep_root(run.path, cache=cache)
    sig: list[tuple[str, Any]] = [(SWEEP_KEY, None if root is None else str(root))]
    sig += [(k, group_key_value(run, k)) for k in KIND_KEYS]
    stare = run.config_value("loss.stare")
    relative = run.config_value("target_entropy_frac", _MISSING) is not _MISSING
    if relative:
        sig.append(("target_entropy_frac", group_key_value(run, "target_entropy_frac")))
    if isinstance(stare, dict):
        for k in sorted(stare):
            if relative and k == "target_entropy":
                continue
            v = stare[k]
            sig.append((f"loss.stare.{k}", str(v) if isinstance(v, (dict, list)) else v))
    if run.source == "simulator":  # a simulator's config is its experiment: every task knob counts (not the seed)
        sig += [(k, v) for k, v in sorted(run.config.items())
                if k not in _NOT_SETTINGS and not isinstance(v, (dict, list))]
    return tuple(sig)


def sweep_root(run_dir: Path, levels: int = 4, cache: dict[Path, bool] | None = None) -> Path | None:
    """The folder of the sweep ``run_dir`` belongs to: its nearest ancestor (at most ``levels`` up) holding a sweep
    ``summary.json`` (one with a ``methods`` mapping, as ``stare-lab simulate`` writes: ``OUT/<method>/seed<k>`` or
    ``OUT/<method>/<grid point>/seed<k>``), as an absolute path; None if there is none (e.g. a trainer run).
    ``cache`` maps folders already looked at to whether they hold one."""
    cache = {} if cache is None else cache
    for parent in list(Path(os.path.abspath(run_dir)).parents)[:levels]:  # one folder, however it was named
        if parent not in cache:
            try:
                data = json.loads((parent / "summary.json").read_text(encoding="utf-8"))
                cache[parent] = isinstance(data, dict) and isinstance(data.get("methods"), dict)
            except (OSError, ValueError):
                cache[parent] = False
        if cache[parent]:
            return parent
    return None


def _one(values: list[Any]) -> Any:
    """The common value of ``values``, or the sorted tuple of their distinct ``repr``s when they differ (a group
    averaged over several settings, ``--merge``)."""
    distinct = {repr(v): v for v in values}
    return next(iter(distinct.values())) if len(distinct) == 1 else tuple(sorted(distinct))


def experiment_slice(runs: Sequence[RunData], key_values: Sequence[tuple[str, Any]] = (),
                     cache: dict[Path, bool] | None = None) -> dict[str, Any]:
    """The experiment of a group of runs, whatever the method (the verdict's ``slice`` by which a STARE group finds
    its baseline, :func:`analysis.verdict.reference_slices`): the run source, the sweep folder
    (:func:`sweep_root`), the simulator kind / preset (:data:`KIND_KEYS`), the ``group_by`` values of keys outside
    ``loss.stare.*`` (a sweep's grid slice) and, under ``"target"``, the target entropy (``target_entropy_frac``
    where the config sets it relative, else ``loss.stare.target_entropy`` in nats, rounded to 1e-6). Each value is
    the runs' common one, or the tuple of the distinct ones when they differ.

    Review finding: two preset sweeps analysed together (H_tgt 0.4 and 0.6) compared the H_tgt=0.6 STARE group
    with the H_tgt=0.4 GRPO group, the first GRPO group listed."""
    out: dict[str, Any] = {"source": _one([r.source for r in runs]),
                           "sweep": _one([str(sweep_root(r.path, cache=cache)) for r in runs])}
    for k in KIND_KEYS:
        out[k] = _one([group_key_value(r, k) for r in runs])
    targets = []
    for r in runs:
        frac = r.config_value("target_entropy_frac", _MISSING)
        if frac is not _MISSING:
            targets.append(("target_entropy_frac", frac))
        else:
            targets.append(("target_entropy", None if r.target_entropy is None else round(r.target_entropy, 6)))
    out["target"] = _one(targets)
    out.update((k, v) for k, v in key_values if not k.startswith("loss.stare."))
    return out


def check_group_by(runs: list[RunData], group_by: Sequence[str], warnings: list[str]) -> None:
    """A ``group_by`` key that no run has is an error (listing similar keys); one that only some runs have is a
    warning (the others get the value None)."""
    for key in group_by:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"group_by key {key!r} must be a non-empty dotted config key")
        have = sum(r.config_value(key, _MISSING) is not _MISSING for r in runs)
        if have == 0:
            avail = sorted({k for r in runs for k in _leaf_keys(r.config)})
            close = difflib.get_close_matches(key, avail, n=5, cutoff=0.5)
            shown = close or [k for k in avail if k.startswith("loss.stare.")][:5] or avail[:5]
            raise ConfigError(
                f"group_by key {key!r} is in no run's config.yaml; "
                f"{'similar' if close else 'available'} keys include: {', '.join(shown)}"
            )
        if have < len(runs):
            warnings.append(f"group_by key {key!r} is missing in {len(runs) - have} of {len(runs)} runs (grouped as None)")


def split_labels(members: dict[tuple, list[RunData]], group_by: Sequence[str]) -> dict[tuple, str]:
    """Label suffixes for the setting groups of one (source, method): ``[sweep folder name/kind/preset]`` where
    those differ (only the parts that differ), then ``(W=5, …)`` for the method settings that still differ among
    groups of the same kind."""
    sigs = list(members)
    out = {s: "" for s in sigs}
    if len(sigs) < 2:
        return out
    kind_keys = (SWEEP_KEY, *KIND_KEYS)
    kinds = {s: tuple(dict(s).get(k) for k in kind_keys) for s in sigs}
    if len(set(kinds.values())) > 1:
        differ = [i for i in range(len(kind_keys)) if len({kinds[s][i] for s in sigs}) > 1]
        for s in sigs:
            named = [(Path(v).name if v is not None else "outside a sweep folder") if i == 0 else str(v)
                     for i, v in enumerate(kinds[s]) if i in differ and (i == 0 or v is not None)]
            out[s] = " [" + ("/".join(named) or "no simulator/preset key") + "]"
    for kind in set(kinds.values()):
        same = [s for s in sigs if kinds[s] == kind]
        if len(same) < 2:
            continue
        dicts = [dict(s) for s in same]
        keys = [k for k in dict.fromkeys(k for d in dicts for k in d)
                if k not in kind_keys and k not in group_by and len({repr(d.get(k)) for d in dicts}) > 1]
        for s, d in zip(same, dicts):
            parts = [f"{short_name(k)}={fmt_value(d.get(k))}" for k in keys]
            if parts:
                out[s] += " (" + ", ".join(parts) + ")"
    return out
