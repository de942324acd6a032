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

Paper defaults (docs/theory.md §4: W = 1.1, M = 0.9, P = 10 %, G = 8, 64 prompts) are the preset defaults. Every
tabular preset steps in the first-order regime of docs/theory.md §7: the first-order prediction explains GRPO's
measured one-step entropy change (pooled R² ≥ 0.95, slope 1 ± 0.15; ``theory`` ≥ 0.99 / 1 ± 0.05; measured in
BENCHMARKS.md) and STARE's push acts at more than 80 % of its first-order size. Targets come from the task, never
from the random initial policy: absolute (``stare.target_entropy``) or relative to the reward-optimal entropy
(``target_entropy_rel``: × the mean ln K of the K correct tokens per position), below it unless said otherwise.

``demo`` (the default, ``make demo``) is the ``collapse`` task in the mean-field limit (``mode=expected``, G → ∞:
the exact expected update, deterministic given the seed's initial policy) with 16 prompts and lr 2 (300 steps; lr 1
and 600 steps, as in issue 13, give the same picture at twice the cost): GRPO's collapse, what each STARE method
does about it and the critical W of docs/theory.md §7 without sampling noise. ``collapse`` is the same task with
G = 8 sampled responses per prompt, where sampling noise adds a second-order (noise-driven) drift at H_tgt on top
of the first-order one (BENCHMARKS.md: it raises the measured critical W).

Why ``collapse`` uses a noisy verifier (reward flipped with probability 0.1): with several correct tokens per
position and an exact verifier, a solved prompt soon has zero reward variance, GRPO's advantages vanish and the
entropy stalls at the within-correct-set level instead of collapsing; a little verifier noise keeps the variance
(and the noise-driven drift of docs/theory.md §2) alive, as hard prompts do in real training. The presets fix the task
and step size only; nothing in them is tuned for a method to look good.
"""

from __future__ import annotations

import copy
from typing import Any

from stare_lab.errors import ConfigError
from stare_lab.methods import METHODS, method_overrides  # noqa: F401 - re-exported: the shared method table

__all__ = [
    "PRESETS", "DEFAULT_PRESET", "METHODS", "DEFAULT_METHODS", "STORY_METHODS", "method_overrides", "get_preset",
    "preset_names",
]

#: the methods ``stare-lab simulate`` runs when ``--methods`` is not given.
DEFAULT_METHODS = ("grpo", "o1", "c2")

DEFAULT_PRESET = "demo"

_COLLAPSE_TASK = {
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
}

#: the methods ``make demo`` shows: GRPO, the paper's O1 and C2 at their defaults, and the adaptive schedule
STORY_METHODS = ["grpo", "o1", "c2", "o1-adaptive"]

#: Tabular presets: name → {"kind", "description", "overrides"} (overrides for TabularSimConfig), optionally the
#: default ``methods`` and ``seeds`` of ``stare-lab simulate``.
PRESETS: dict[str, dict[str, Any]] = {
    "demo": {
        "kind": "tabular",
        "description": (
            "the collapse task (16 prompts) in the mean-field limit (mode=expected: the exact expected GRPO/STARE "
            "update, G -> infinity), lr 2, 300 steps, H_tgt 0.4 nats (below ln 2, the reward-optimal entropy): GRPO "
            "collapses, the paper's O1/C2 and the adaptive schedule try to hold the band; with --sweep "
            "stare.reweight_w=... it measures and predicts the critical W"
        ),
        "overrides": {**_COLLAPSE_TASK, "mode": "expected", "num_prompts": 16, "lr": 2.0, "steps": 300,
                      "checkpoint_every": 300, "loss": {"stare": {"target_entropy": 0.4}}},
        "methods": STORY_METHODS,
    },
    "collapse": {
        "kind": "tabular",
        "description": (
            "factored sequences (64 prompts x 4 positions x 8 tokens, 2 correct tokens per position), reward 1 iff "
            ">= 3 of 4 positions are correct, verdict flipped with probability 0.1 (noisy verifier), G = 8 sampled "
            "responses, lr 1, 600 steps, H_tgt 0.4 nats: GRPO collapses the entropy"
        ),
        "overrides": {**_COLLAPSE_TASK, "lr": 1.0, "steps": 600, "loss": {"stare": {"target_entropy": 0.4}}},
        "methods": STORY_METHODS,
    },
    "random-reward": {
        "kind": "tabular",
        "description": (
            "rewards Bernoulli(0.5) independent of the tokens (8 prompts x 4 positions x 8 tokens, G = 8), lr 0.8, "
            "3500 steps, H_tgt 0.8 nats: the expected update is zero and GRPO still collapses the entropy through "
            "sampling noise (docs/theory.md §2); the paper's W 1.1 / M 0.9 can hold this noise-driven drift"
        ),
        "overrides": {
            "task": "sequence", "reward": "random", "random_reward_p": 0.5, "reward_noise": 0.0, "num_prompts": 8,
            "group_size": 8, "seq_len": 4, "vocab_size": 8, "init_spread": 1.0, "lr": 0.8, "steps": 3500,
            "checkpoint_every": 500, "loss": {"stare": {"target_entropy": 0.8}},
        },
    },
    "theory": {
        "kind": "tabular",
        "description": (
            "the collapse task with a peaked start (init_spread 3) and small steps (lr 0.2, 400 steps): the "
            "first-order prediction of every step's entropy change should agree with the measured change "
            "(R^2 >= 0.99, slope 1 +- 0.05); H_tgt 0.6 nats is crossed, so the STARE runs open the gate"
        ),
        "overrides": {**_COLLAPSE_TASK, "init_spread": 3.0, "lr": 0.2, "steps": 400,
                      "loss": {"stare": {"target_entropy": 0.6}}},
    },
    "forking": {
        "kind": "tabular",
        "description": (
            "an LLM-like token-entropy structure (16 prompts x 10 positions x 32 tokens): 2 of 10 positions fork "
            "between 6 correct tokens with Zipf-like initial probabilities (2.9 nats), the other 8 start nearly "
            "deterministic (0.09 nats, the correct mode at 0.99 and a Zipf tail); reward 1 iff all 10 positions are "
            "correct (noisy verifier 0.1); mean field, lr 1, 300 steps, the paper's H_tgt 0.3 nats (reward-optimal "
            "entropy 0.2 x ln 6 = 0.36)"
        ),
        "overrides": {
            "task": "forking", "mode": "expected", "reward": "verifiable", "num_prompts": 16, "group_size": 8,
            "seq_len": 10, "vocab_size": 32, "num_correct": 6, "forking_positions": 2, "tail_mass": 0.01,
            "zipf_exponent": 1.0, "threshold": 10, "reward_noise": 0.1, "lr": 1.0, "steps": 300,
            "checkpoint_every": 300, "loss": {"stare": {"target_entropy": 0.3}},
        },
        "methods": STORY_METHODS,
    },
    "bandit": {
        "kind": "tabular",
        "description": (
            "one position per prompt (64 prompts x 16 tokens, 3 correct); reward 1 iff the token is correct, "
            "flipped with probability 0.1 (noisy verifier); lr 0.5, 300 steps, H_tgt = 0.5 x ln 3 nats"
        ),
        "overrides": {
            "task": "bandit", "reward": "verifiable", "num_prompts": 64, "group_size": 8, "seq_len": 1,
            "vocab_size": 16, "num_correct": 3, "threshold": 1, "reward_noise": 0.1, "init_spread": 1.0,
            "lr": 0.5, "steps": 300, "target_entropy_rel": 0.5,
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
