"""Which runs may be averaged together: the setting signature of a run, ``group_by`` key checks and the labels
that tell split groups apart (used by :func:`analysis.compare.compare`).

Runs of one method are averaged over seeds only when they are the same experiment: same simulator kind / preset
(:data:`KIND_KEYS`), same ``loss.stare.*`` settings and the same target entropy (review finding: averaging a
tabular W=1.1 run with a transformer W=5 run plotted a W≈2.07 that no run used).
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

from stare_lab.errors import ConfigError

from .load import RunData

__all__ = ["KIND_KEYS", "setting_signature", "check_group_by", "split_labels", "group_key_value", "fmt_value"]


def fmt_value(v: Any) -> str:
    """A config value in a label: floats with ``%g``, anything else as ``str``."""
    return f"{v:g}" if isinstance(v, float) else str(v)


_MISSING = object()

#: Top-level config keys naming the kind of experiment (simulator kind, preset): runs that differ in one are
#: never averaged together by default.
KIND_KEYS = ("simulator", "preset")
#: Short names of the method settings in group labels.
_SHORT = {"loss.stare.reweight_w": "W", "loss.stare.reweight_m": "M", "loss.stare.target_entropy": "H_tgt",
          "target_entropy_frac": "H_tgt frac"}


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


def setting_signature(run: RunData) -> tuple[tuple[str, Any], ...]:
    """The settings that must match for runs of one method to be averaged (everything but the seed that shapes
    the experiment's kind or the method): :data:`KIND_KEYS`, every ``loss.stare.*`` value, and the target entropy
    — as ``target_entropy_frac`` where the config sets it relative to the initial entropy (then the absolute
    ``loss.stare.target_entropy`` differs by seed and is left out), else ``loss.stare.target_entropy``."""
    sig: list[tuple[str, Any]] = [(k, group_key_value(run, k)) for k in KIND_KEYS]
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
    return tuple(sig)


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
    """Label suffixes for the setting groups of one (source, method): ``[kind/preset]`` where those differ, then
    ``(W=5, …)`` for the method settings that still differ among groups of the same kind."""
    sigs = list(members)
    out = {s: "" for s in sigs}
    if len(sigs) < 2:
        return out
    kinds = {s: tuple(v for k, v in s if k in KIND_KEYS) for s in sigs}
    if len(set(kinds.values())) > 1:
        for s in sigs:
            named = [str(v) for v in kinds[s] if v is not None]
            out[s] = " [" + ("/".join(named) or "no simulator/preset key") + "]"
    for kind in set(kinds.values()):
        same = [s for s in sigs if kinds[s] == kind]
        if len(same) < 2:
            continue
        dicts = [dict(s) for s in same]
        keys = [k for k in dict.fromkeys(k for d in dicts for k in d)
                if k not in KIND_KEYS and k not in group_by and len({repr(d.get(k)) for d in dicts}) > 1]
        for s, d in zip(same, dicts):
            parts = [f"{_SHORT.get(k, k.rsplit('.', 1)[-1])}={fmt_value(d.get(k))}" for k in keys]
            if parts:
                out[s] += " (" + ", ".join(parts) + ")"
    return out
