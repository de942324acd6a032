"""The fit grid of ``stare-lab calibrate`` (:mod:`simulators.calibrate`, step 3): the ``llm`` toy's knobs, their
default values, and the checks of a grid given on the command line."""

from __future__ import annotations

from typing import Any

from stare_lab.errors import ConfigError

__all__ = ["KNOBS", "OPTIONAL_KNOBS", "DEFAULT_GRID", "HELD_DEFAULT_GRID"]

#: the knobs fitted, in order: reward-coupling fraction, fork width (forking positions of the 10, correct tokens
#: at a fork), verifier noise
KNOBS = ("reward_coupling", "forking_positions", "num_correct", "reward_noise")
#: knobs fitted only when ``--grid`` names them (absent from the default grid and, unless gridded, from
#: ``calibration.json``): ``clip_rel``, the toy's gradient-norm clip relative to its GRPO step, and
#: ``push_efficiency``, the share of the STARE push that reaches the toy's policy
#: (:class:`simulators.tabular.config.TabularSimConfig`; a value None = no clip, the whole push)
OPTIONAL_KNOBS = ("clip_rel", "push_efficiency")
#: the default fit grid (96 settings)
DEFAULT_GRID: dict[str, list] = {
    "reward_coupling": [0.4, 0.6, 0.8, 1.0],
    "forking_positions": [2, 4, 6, 8],
    "num_correct": [4, 8],
    "reward_noise": [0.0, 0.1, 0.3],
}
#: a held probe's default fit grid (240 settings): the push's efficiency added, which lets the toy match the balance
#: W with a push in its first-order regime, and, to finish within 15 minutes on a loaded 2-core machine, without
#: :data:`DEFAULT_GRID`'s 2 forks (an L+-above-s* share of at most 0.2, where probes measured 0.94–1.0) and noise
#: 0.3 (no documented fit chose it); docs/calibration.md, "How long it takes"
HELD_DEFAULT_GRID: dict[str, list] = {
    "reward_coupling": [0.4, 0.6, 0.8, 1.0],
    "forking_positions": [4, 6, 8],
    "num_correct": [4, 8],
    "reward_noise": [0.0, 0.1],
    "push_efficiency": [None, 0.7, 0.5, 0.35, 0.25],
}

def _label(knobs: dict[str, Any]) -> str:
    """A knob setting as a folder name: ``reward_coupling=0.6,push_efficiency=off``."""
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={'off' if v is None else v}"
                    for k, v in knobs.items())


def _check_grid(grid: dict[str, list], held: bool = False) -> dict[str, list]:
    """The fit grid: ``grid``'s values, for a knob it leaves out :data:`DEFAULT_GRID`'s (a ``held`` probe:
    :data:`HELD_DEFAULT_GRID`'s, push efficiency included); push efficiency 1 is read as off.

    Raises:
        ConfigError: an unknown knob, or a value listed twice.
    """
    known = KNOBS + OPTIONAL_KNOBS
    unknown = [k for k in grid if k not in known]
    if unknown:
        raise ConfigError(f"fit grid key {unknown[0]!r} is not one of {{{', '.join(known)}}}")
    defaults = HELD_DEFAULT_GRID if held else DEFAULT_GRID
    out = {k: list(grid.get(k) or defaults[k]) for k in KNOBS}
    out.update({k: list(grid.get(k) or defaults[k]) for k in OPTIONAL_KNOBS if grid.get(k) or k in defaults})
    if "push_efficiency" in out:  # 1 is the whole push: the same toy as off
        out["push_efficiency"] = [None if v == 1 else v for v in out["push_efficiency"]]
    for k, vals in out.items():
        if len(set(map(repr, vals))) != len(vals):
            shown = ",".join("off" if v is None else str(v) for v in vals)
            raise ConfigError(f"fit grid {k}={shown} lists a value twice" + (" (1 is off)" if k == "push_efficiency"
                                                                             else ""))
    return out
