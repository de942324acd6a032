"""Named simulator presets and the method table shared by every simulator.

A *preset* is a named bundle of config overrides for one simulator *kind*:

* ``kind="tabular"`` presets live here in :data:`PRESETS` (overrides for
  :class:`simulators.tabular.TabularSimConfig`);
* ``kind="transformer"`` presets live in ``simulators.transformer.PRESETS`` (overrides for its
  ``TransformerSimConfig``); :func:`get_preset` finds them there, importing that module lazily (it pulls in
  ``transformers``, which the tabular path must not pay for).

A *method* (``grpo``, ``o1``, …) is a name the simulators and analysis use for a training recipe; :data:`METHODS`
maps it to the settings of the core's loss registry (``stare_lab.losses``) and to the simulator-level switches
(dynamic sampling). :func:`method_overrides` returns those settings as config overrides, so both simulators resolve
a method the same way.

Paper defaults (docs/theory.md §4: W = 1.1, M = 0.9, P = 10 %, G = 8, 64 prompts) are the preset defaults. The paper's
H_tgt = 0.3 nats belongs to a 7B LM whose entropy starts near 0.55 nats; the tabular presets scale it to the
simulator with ``target_entropy_frac`` (H_tgt = frac × initial mean entropy, frac = 0.55 like 0.3 / 0.55). A user's
explicit ``stare.target_entropy=X`` switches that fraction off (``simulators.tabular_config.resolve_target_entropy``).

Why ``collapse`` uses a noisy verifier (reward flipped with probability 0.1): with several correct tokens per
position and an exact verifier, a solved prompt soon has zero reward variance, GRPO's advantages vanish and the
entropy stalls at the within-correct-set level (≈ 10–20 % of its start in our runs, lr 2–8) instead of collapsing;
a little verifier noise keeps the variance (and the noise-driven drift of docs/theory.md §2) alive, as hard prompts do
in real training. The presets fix the task and step size only; nothing in them is tuned for a method to look good.
"""

from __future__ import annotations

import copy
from typing import Any

from stare_lab.errors import ConfigError
from stare_lab.methods import METHODS, method_overrides  # noqa: F401 - re-exported: the shared method table

__all__ = ["PRESETS", "DEFAULT_PRESET", "METHODS", "DEFAULT_METHODS", "method_overrides", "get_preset", "preset_names"]

#: the methods ``stare-lab simulate`` runs when ``--methods`` is not given.
DEFAULT_METHODS = ("grpo", "o1", "c2")

DEFAULT_PRESET = "collapse"

#: Tabular presets: name → {"kind", "description", "overrides"} (overrides for TabularSimConfig).
PRESETS: dict[str, dict[str, Any]] = {
    "collapse": {
        "kind": "tabular",
        "description": (
            "factored sequences (64 prompts x 4 positions x 8 tokens, 2 correct tokens per position), reward 1 iff "
            ">= 3 of 4 positions are correct, verdict flipped with probability 0.1 (noisy verifier); GRPO collapses "
            "the entropy"
        ),
        "overrides": {
            "task": "sequence",
            "reward": "verifiable",
            "num_prompts": 64,
            "group_size": 8,
            "seq_len": 4,
            "vocab_size": 8,
            "num_correct": 2,
            "threshold": 3,
            "reward_noise": 0.1,
            "init_spread": 1.0,
            "lr": 6.0,
            "steps": 100,
            "target_entropy_frac": 0.55,
        },
    },
    "random-reward": {
        "kind": "tabular",
        "description": (
            "rewards Bernoulli(0.5) independent of the tokens (64 prompts x 4 positions x 8 tokens); the expected "
            "update is zero and GRPO still collapses the entropy through sampling noise (docs/theory.md §2)"
        ),
        "overrides": {
            "task": "sequence",
            "reward": "random",
            "random_reward_p": 0.5,
            "reward_noise": 0.0,
            "num_prompts": 64,
            "group_size": 8,
            "seq_len": 4,
            "vocab_size": 8,
            "init_spread": 1.0,
            "lr": 4.0,
            "steps": 200,
            "target_entropy_frac": 0.55,
        },
    },
    "theory": {
        "kind": "tabular",
        "description": (
            "the collapse task with small steps (lr 0.05, 100 steps): the first-order prediction of every step's "
            "entropy change should agree with the measured change (R^2 >= 0.99, slope 1 +- 0.05)"
        ),
        "overrides": {
            "task": "sequence",
            "reward": "verifiable",
            "num_prompts": 64,
            "group_size": 8,
            "seq_len": 4,
            "vocab_size": 8,
            "num_correct": 2,
            "threshold": 3,
            "reward_noise": 0.1,
            "init_spread": 1.0,
            "lr": 0.05,
            "steps": 100,
            "target_entropy_frac": 0.55,
        },
    },
    "bandit": {
        "kind": "tabular",
        "description": (
            "one position per prompt (64 prompts x 16 tokens, 3 correct); reward 1 iff the token is correct, "
            "flipped with probability 0.1 (noisy verifier)"
        ),
        "overrides": {
            "task": "bandit",
            "reward": "verifiable",
            "num_prompts": 64,
            "group_size": 8,
            "seq_len": 1,
            "vocab_size": 16,
            "num_correct": 3,
            "threshold": 1,
            "reward_noise": 0.1,
            "init_spread": 1.0,
            "lr": 2.0,
            "steps": 150,
            "target_entropy_frac": 0.55,
        },
    },
}


def _transformer_presets() -> dict[str, dict[str, Any]] | None:
    """``simulators.transformer.PRESETS`` or ``None`` if that module is missing or cannot be imported."""
    try:
        from simulators import transformer  # lazy: pulls in transformers
    except ImportError:
        return None
    presets = getattr(transformer, "PRESETS", None)
    return presets if isinstance(presets, dict) else None


def preset_names(include_transformer: bool = True) -> list[str]:
    """All preset names: the tabular ones, then (if importable) the transformer ones."""
    names = list(PRESETS)
    if include_transformer:
        names += [n for n in (_transformer_presets() or {}) if n not in PRESETS]
    return names


def get_preset(name: str) -> dict[str, Any]:
    """Resolve a preset name to ``{"name", "kind", "description", "overrides"}`` (a deep copy), plus the preset's
    default ``methods`` and number of ``seeds`` where it defines them (transformer presets: ``PRESET_SWEEPS``).

    Tabular presets come from :data:`PRESETS`; any other name is looked up in ``simulators.transformer.PRESETS``
    (imported only then) and gets ``kind="transformer"``.

    Raises:
        ConfigError: unknown preset (the message lists the known names).
    """
    if name in PRESETS:
        out = copy.deepcopy(PRESETS[name])
        out["name"] = name
        return out
    tp = _transformer_presets()
    if tp is not None and name in tp:
        from simulators import transformer

        sweep = getattr(transformer, "PRESET_SWEEPS", {}).get(name, {})
        out = {
            "name": name,
            "kind": "transformer",
            "description": getattr(transformer, "PRESET_DESCRIPTIONS", {}).get(
                name, "small transformer simulator (simulators.transformer)"
            ),
            "overrides": copy.deepcopy(tp[name]),
        }
        if sweep.get("methods"):
            out["methods"] = list(sweep["methods"])
        if sweep.get("seeds"):
            out["seeds"] = len(sweep["seeds"])
        return out
    known = list(PRESETS) + [n for n in (tp or {}) if n not in PRESETS]
    hint = "" if tp is not None else " (transformer presets unavailable: simulators.transformer not importable)"
    raise ConfigError(f"preset={name!r} is not one of {{{', '.join(known)}}}{hint}")
