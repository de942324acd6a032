"""Named simulator presets and the method table shared by every simulator.

A *preset* is a named bundle of config overrides for one simulator *kind*:

* ``kind="tabular"`` presets live here in :data:`PRESETS` (overrides for
  :class:`simulators.tabular.runner.TabularSimConfig`);
* ``kind="transformer"`` presets live here too, in :data:`TRANSFORMER_PRESETS` (overrides for
  ``simulators.transformer.config.TransformerSimConfig``), with :data:`TRANSFORMER_DESCRIPTIONS` and the methods ×
  seeds each runs (:data:`TRANSFORMER_SWEEPS`). Plain data: this module imports nothing heavy, so the command
  line can list presets and methods without loading torch.

A *method* (``grpo``, ``o1``, …) is a name the simulators and analysis use for a training recipe; :data:`METHODS`
maps it to the settings of the core's loss registry (``stare_lab.loss.losses``) and to the simulator-level switches
(dynamic sampling). :func:`method_overrides` returns those settings as config overrides, so both simulators resolve
a method the same way.

Paper defaults (docs/theory.md §4: W = 1.1, M = 0.9, P = 10 %, G = 8, 64 prompts) are the preset defaults. Every
tabular preset steps in the first-order regime of docs/theory.md §7: the first-order prediction explains GRPO's
measured one-step entropy change (pooled R² ≥ 0.95, slope 1 ± 0.15; ``theory`` ≥ 0.99 / 1 ± 0.05; measured in
docs/benchmarks.md) and STARE's push acts at more than 80 % of its first-order size. Targets come from the task, never
from the random initial policy: absolute (``stare.target_entropy``) or relative to the reward-optimal entropy
(``target_entropy_rel``: × the mean ln K of the K correct tokens per position), below it unless said otherwise.

``demo`` (the default, ``make demo``) is the ``collapse`` task in the mean-field limit (``mode=expected``, G → ∞:
the exact expected update, deterministic given the seed's initial policy) with 16 prompts and lr 2 (300 steps; lr 1
and 600 steps, as in issue 13, give the same picture at twice the cost): GRPO's collapse, O1 at the paper's W 1.1
and a W sweep to 1.5 that measures the critical W of docs/theory.md §7 without sampling noise (1.3), and the auto
schedule, which finds its W itself (:data:`DEMO_METHODS`, :data:`DEMO_SWEEP`: its request when neither --methods
nor --sweep is given). ``collapse`` is the same task with
G = 8 sampled responses per prompt, where sampling noise adds a second-order (noise-driven) drift at H_tgt on top
of the first-order one (docs/benchmarks.md: it raises the measured critical W).

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
from stare_lab.loss.methods import METHODS, method_overrides  # noqa: F401 - re-exported: the shared method table

__all__ = [
    "SEED_MAX", "MAX_SEEDS", "PRESETS", "TRANSFORMER_PRESETS", "TRANSFORMER_DESCRIPTIONS", "TRANSFORMER_SWEEPS",
    "DEFAULT_PRESET", "METHODS", "DEFAULT_METHODS", "STORY_METHODS", "DEMO_METHODS", "DEMO_SWEEP", "method_overrides",
    "get_preset", "preset_names",
]

#: seeds are integers in [0, SEED_MAX] (2**31 - 1: every seed stream the simulators derive from a seed, e.g.
#: 2**32 + seed or 3_000_017·seed + …, stays within torch's 64-bit generator seeds)
SEED_MAX = 2**31 - 1
#: the most seeds one sweep runs (``--seeds N``): every seed is a run directory per method and grid point
MAX_SEEDS = 10_000

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

#: the methods the tabular presets run by default: GRPO, the paper's O1 and C2 at their defaults, and the adaptive
#: schedule
STORY_METHODS = ["grpo", "o1", "c2", "o1-adaptive"]
#: what ``make demo`` shows (the ``demo`` preset's methods and grid): GRPO, O1 at the paper's W 1.1 and a small W
#: sweep around the demo's critical W (1.3), and the auto schedule, which finds its W itself
DEMO_METHODS = ["grpo", "o1", "o1-auto"]
DEMO_SWEEP = ["stare.reweight_w=1.1,1.2,1.3,1.4,1.5"]

#: The ``llm`` preset: the forking token-entropy structure with a weak token-reward link (``reward_coupling``: only
#: a fraction of the positions decides the reward, the others accept every token, like paraphrases), G = 8 sampled
#: responses as in training. Its knobs (coupling, fork width ``num_correct``, verifier noise) and target are those
#: ``stare-lab calibrate`` fitted to a GRPO probe of the small transformer (docs/calibration.md, the validation);
#: calibrate any other model with ``stare-lab calibrate PROBE_RUN``.
LLM_OVERRIDES: dict[str, Any] = {
    "task": "forking", "mode": "sampled", "reward": "verifiable", "num_prompts": 32, "group_size": 8, "seq_len": 10,
    "vocab_size": 32, "num_correct": 8, "forking_positions": 6, "tail_mass": 0.01, "zipf_exponent": 1.0,
    "threshold": 10, "reward_coupling": 0.6, "reward_noise": 0.0, "lr": 1.0, "steps": 300, "checkpoint_every": 300,
    "loss": {"stare": {"target_entropy": 0.85}},
}
LLM_DESCRIPTION = (
    "the forking structure with a weak token-reward link, calibrated to a GRPO probe of the small transformer "
    "(docs/calibration.md): 32 prompts x 10 positions x 32 tokens, 6 of 10 positions fork (8 correct tokens at a "
    "deciding fork), only 60 % of the positions decide the reward (reward_coupling 0.6; the others accept every "
    "token, like paraphrases), exact verifier, G = 8 sampled responses, lr 1, 300 steps, H_tgt 0.85 nats (0.48 of "
    "the initial entropy, as the transformer's 0.7 of 1.45). Calibrate it to your model: stare-lab calibrate PROBE_RUN"
)

#: Tabular presets: name → {"kind", "description", "overrides"} (overrides for TabularSimConfig), optionally the
#: default ``methods``, ``seeds`` and ``sweep`` (grid items ``KEY=V1,V2,…``, run when neither --methods nor --sweep
#: is given) of ``stare-lab simulate``.
PRESETS: dict[str, dict[str, Any]] = {
    "demo": {
        "kind": "tabular",
        "description": (
            "the collapse task (16 prompts) in the mean-field limit (mode=expected: the exact expected GRPO/STARE "
            "update, G -> infinity), lr 2, 300 steps, H_tgt 0.4 nats (below ln 2, the reward-optimal entropy): GRPO "
            "collapses; O1 at W 1.1 (the paper's) to 1.5 measures the critical W; o1-auto finds its W itself and "
            "holds the band (without --methods and --sweep: grpo, o1 x W 1.1-1.5, o1-auto)"
        ),
        "overrides": {**_COLLAPSE_TASK, "mode": "expected", "num_prompts": 16, "lr": 2.0, "steps": 300,
                      "checkpoint_every": 300, "loss": {"stare": {"target_entropy": 0.4}}},
        "methods": DEMO_METHODS,
        "sweep": DEMO_SWEEP,
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
            "entropy 0.2 x ln 6 = 0.36). The documented failure mode (docs/theory.md §8): every position decides the "
            "reward, so too few positive-advantage tokens are above the critical surprisal s* when GRPO crosses "
            "H_tgt; L+ fills with confident tokens (the forks' likely correct ones), whose reinforcement lowers the "
            "entropy, and the measured critical W is 8. For guidance on a language model use the calibrated 'llm'"
        ),
        "overrides": {
            "task": "forking", "mode": "expected", "reward": "verifiable", "num_prompts": 16, "group_size": 8,
            "seq_len": 10, "vocab_size": 32, "num_correct": 6, "forking_positions": 2, "tail_mass": 0.01,
            "zipf_exponent": 1.0, "threshold": 10, "reward_noise": 0.1, "lr": 1.0, "steps": 300,
            "checkpoint_every": 300, "loss": {"stare": {"target_entropy": 0.3}},
        },
        "methods": STORY_METHODS,
    },
    "llm": {
        "kind": "tabular",
        "description": LLM_DESCRIPTION,
        "overrides": LLM_OVERRIDES,
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


# ------------------------------------------------------------------------------------------- transformer presets
#: The strong STARE push of the presets (adaptive bounds wide enough for o1-adaptive to move W and M).
_OPTIM = {"lr": 1e-3, "adam_beta1": 0.95, "adam_beta2": 0.99}
_STRONG_PUSH = {"reweight_w": 5.0, "reweight_m": 0.2, "target_entropy": 0.7, "w_max": 8.0, "m_min": 0.1, "alpha": 0.05}
#: what every transformer preset shares (the presets deep-copy it: get_preset)
_TF_COMMON = {**_OPTIM, "eval_every": 50, "checkpoint_every": 100, "loss": {"stare": _STRONG_PUSH}}

#: Transformer presets: name → overrides of ``simulators.transformer.config.TransformerSimConfig`` (``stare-lab
#: simulate`` applies them, then the user's).
TRANSFORMER_PRESETS: dict[str, dict[str, Any]] = {
    # GRPO, O1, C2 on one seed in ~75 s (2 cores; docs/benchmarks.md, bench_transformer.py). Task "pick" has several correct answers per prompt (here 4 prompt
    # digits, answers of 3: 24 correct answers when the digits are distinct): token reweighting needs room to act
    # (docs/theory.md §6; see "transformer-sort" for the single-answer control). How the settings were chosen (GRPO,
    # R² = fit of the measured ΔH on ∇θH̄·Δθ over all RL steps; collapse = first step below 10 % of the
    # post-warm-start entropy; seeds 0/1/2):
    # * The old preset (5 digits, answers of 4, lr 1e-3, β1 0.9, 130 steps) gave R² 0.886 and collapse at
    #   106/178–195 (seeds 1–2 past the preset's steps). Its misfit was spread over all phases (steps 1–10: 2 % of
    #   the variance, 41–80: 3.5 %, the collapse 81–110: 5 %, the tail: 3 %, one grad-norm spike in the tail 2 %),
    #   and the logit-space first-order prediction misfit as much (R² 0.87): the per-step logit change was too
    #   large, mostly through Adam's noise component, not a few outlier steps.
    # * Tried on seed 0 (R² / collapse step): no clip 0.873/100; clip 0.25 0.915/127; β2 0.999 0.871/none in
    #   130; Adam ε 1e-4 0.857/111; lr warm-up 10 steps 0.868/none; 64 prompts 0.918/99; 16 prompts 0.917/none in
    #   180; lr 7e-4 0.918/166; lr 5e-4 0.959/none (130 steps); β1 0 0.079 (!); β1 0.95 0.954/111; β1 0.97
    #   0.951/130; β1 0.98 0.965/none. Momentum averages the sampling noise out of Δθ, so β1 0.95 halves the misfit
    #   at the same lr — but on the 5-digit task seeds 1/2 still collapsed late (none in 250 / 168). A noisy
    #   verifier (flip 0.1) slowed the collapse (none in 200 for seeds 0–2) and cost R²; G 16 × 16 prompts and a
    #   longer warm start did not help either.
    # * The smaller 4-digit / 3-answer task is learnt sooner, so GRPO reaches its collapse phase sooner: with
    #   lr 1e-3, β1 0.95, β2 0.99 it collapses at steps 133 / 104 / 144 / 162 / 128 / 166 (seeds 0–5) with R²
    #   0.978 / 0.959 / 0.988 over 200 steps (seeds 0–2; 0.989 / 0.965 / 0.975 for seeds 3–5 over 240); with the
    #   256 held-out prompts of "transformer-long" (another train split) seed 0 collapsed at 191. lr 1.5e-3
    #   collapsed at 68–99 but R² fell to 0.92 on seed 0. Its shorter sequences also make a step cheaper (with the
    #   prompt KV shared by a group, ~0.085 s). 200 steps leave margin after the latest collapse seen.
    # The STARE push is strong (W = 5, M = 0.2, H_tgt = 0.7 ≈ half the post-warm-start entropy); at the paper's
    # defaults it is too weak here — try stare.reweight_w=1.1 stare.reweight_m=0.9 stare.target_entropy=0.3.
    # The D terms (measure_decomposition: W*(t), the critical W) cost ~60 % of the RL time here, so this quick
    # preset leaves them off; "transformer-long" logs them (docs/benchmarks.md: the transformer's critical W).
    "transformer": {**_TF_COMMON, "steps": 200, "measure_decomposition": False,
                    "task": {"name": "pick", "num_digits": 4, "answer_len": 3, "eval_size": 64}},
    # Longer studies (several seeds: stare-lab simulate --preset transformer-long --seeds 3).
    "transformer-long": {**_TF_COMMON, "steps": 400, "eval_samples": 16,
                         "task": {"name": "pick", "num_digits": 4, "answer_len": 3, "eval_size": 256}},
    # Negative control: one correct answer per prompt; STARE's reweighting has nothing to act on.
    "transformer-sort": {**_TF_COMMON, "steps": 200,
                         "task": {"name": "sort", "num_digits": 5, "answer_len": 5, "eval_size": 64}},
}

#: Preset name → one-line description (for ``stare-lab simulate --list-presets``).
TRANSFORMER_DESCRIPTIONS: dict[str, str] = {
    "transformer": "tiny Qwen2 LM on 'pick' (4 digits, answers of 3: several correct answers), 200 RL steps, "
    "lr 1e-3, beta1 0.95; GRPO collapses, gated STARE (W 5, M 0.2, H_tgt 0.7) holds the entropy; ~75 s for "
    "grpo,o1,c2 x 1 seed on 2 cores (warm start included); add measure_decomposition=true for W* and the "
    "critical W (~60 % more RL time)",
    "transformer-long": "as 'transformer' with 400 steps and 256 held-out prompts x 16 samples; run several seeds",
    "transformer-sort": "negative control: 'sort' has one correct answer, so token reweighting has nothing to act on",
}

#: Preset name → the methods and seeds its sweep runs (the CLI loops over methods × seeds).
TRANSFORMER_SWEEPS: dict[str, dict[str, list]] = {
    "transformer": {"methods": ["grpo", "o1", "c2"], "seeds": [0]},
    "transformer-long": {"methods": ["grpo", "grpo-ds", "o1", "c2", "o1-adaptive"], "seeds": [0, 1, 2]},
    "transformer-sort": {"methods": ["grpo", "o1", "c2"], "seeds": [0]},
}



def preset_names(include_transformer: bool = True) -> list[str]:
    """All preset names: the tabular ones, then the transformer ones."""
    return list(PRESETS) + ([n for n in TRANSFORMER_PRESETS if n not in PRESETS] if include_transformer else [])


def get_preset(name: str) -> dict[str, Any]:
    """Resolve a preset name to ``{"name", "kind", "description", "overrides"}`` (a deep copy), plus the preset's
    default ``methods`` and ``seeds`` (a list) where it defines them.

    Tabular presets come from :data:`PRESETS`, transformer presets (``kind="transformer"``) from
    :mod:`simulators.transformer.config`.

    Raises:
        ConfigError: unknown preset (the message lists the known names).
    """
    if name in PRESETS:
        out = copy.deepcopy(PRESETS[name])
        out["name"] = name
        return out
    if name in TRANSFORMER_PRESETS:
        sweep = TRANSFORMER_SWEEPS.get(name, {})
        out = {"name": name, "kind": "transformer",
               "description": TRANSFORMER_DESCRIPTIONS.get(name, "small transformer simulator (simulators.transformer.runner)"),
               "overrides": copy.deepcopy(TRANSFORMER_PRESETS[name])}
        if sweep.get("methods"):
            out["methods"] = list(sweep["methods"])
        if sweep.get("seeds"):
            out["seeds"] = list(sweep["seeds"])
        return out
    raise ConfigError(f"preset={name!r} is not one of {{{', '.join(preset_names())}}}")
