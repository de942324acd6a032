"""The statistics of a whole step that a policy loss can declare (``LossNeeds.global_stats``).

:func:`stare_lab.loss.step.prepare_step` computes each declared statistic once over the whole step (all micro-batches
and ranks) and hands it to every micro-batch's loss inputs (``PolicyLossInputs.global_stats``, and the field of
the same name where there is one). Three kinds: a token-mean of a step-batch field (:class:`TokenMean`), a top
quantile value (:class:`TopQuantile`) and a seeded generator (:class:`StepGenerator`). The built-in losses' needs
are in :data:`GLOBAL_STATS`; a loss defined elsewhere adds its own with :func:`register_global_stat`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from stare_lab.config import LossConfig
from stare_lab.errors import ConfigError

__all__ = ["TokenMean", "TopQuantile", "StepGenerator", "GlobalStat", "GLOBAL_STATS", "register_global_stat",
           "STEP_FIELDS"]

#: The float ``[B, T]`` fields of :class:`stare_lab.loss.step.StepBatch` a statistic can read (plus ``advantages``).
STEP_FIELDS = ("old_logprobs", "entropy", "rollout_logprobs", "ref_logprobs")


@dataclasses.dataclass(frozen=True)
class TokenMean:
    """The mean of a :class:`StepBatch` field over the valid tokens of the whole step (0.0 without valid tokens);
    ``field`` is ``advantages``, ``old_logprobs``, ``entropy``, ``rollout_logprobs`` or ``ref_logprobs``."""

    field: str


@dataclasses.dataclass(frozen=True)
class TopQuantile:
    """The k-th largest value of a :class:`StepBatch` field over the valid tokens of the whole step,
    k = max(1, ⌈q·N⌉) with q = ``quantile(config)`` ∈ (0, 1] and N the valid tokens (as
    :func:`stare_lab.loss.losses.forking_entropy_threshold`); +inf without valid tokens. A 0-dim float32 tensor."""

    field: str
    quantile: Callable[[LossConfig], float]


@dataclasses.dataclass(frozen=True)
class StepGenerator:
    """A ``torch.Generator`` seeded from (seed, step, rank) (numpy ``SeedSequence``), on the batch's device: the
    same numbers on a rerun, different streams on different ranks. Shared by every micro-batch of the step."""


GlobalStat = TokenMean | TopQuantile | StepGenerator

#: name → definition of the statistics a loss can declare in ``LossNeeds.global_stats``. Names that are also
#: fields of :class:`~stare_lab.loss.losses.PolicyLossInputs` fill that field; every one is in ``inputs.global_stats``.
GLOBAL_STATS: dict[str, GlobalStat] = {
    "logprob_mean": TokenMean("old_logprobs"),
    "advantage_mean": TokenMean("advantages"),
    "entropy_threshold": TopQuantile("entropy", lambda cfg: cfg.top_entropy_quantile),
    "generator": StepGenerator(),
}


def register_global_stat(name: str, definition: GlobalStat) -> None:
    """Add a statistic a loss can declare (e.g. ``register_global_stat("entropy_q90", TopQuantile("entropy",
    lambda cfg: 0.1))``).

    Raises:
        ConfigError: if ``name`` is taken or ``definition`` is not a TokenMean / TopQuantile / StepGenerator.
    """
    if name in GLOBAL_STATS:
        raise ConfigError(f"global statistic {name!r} is already registered")
    if not isinstance(definition, (TokenMean, TopQuantile, StepGenerator)):
        raise ConfigError(f"global statistic {name!r}: definition must be a TokenMean, TopQuantile or "
                          f"StepGenerator, got {type(definition).__name__}")
    if isinstance(definition, (TokenMean, TopQuantile)) and definition.field not in ("advantages", *STEP_FIELDS):
        raise ConfigError(f"global statistic {name!r}: field={definition.field!r} is not one of "
                          f"{{'advantages', {', '.join(map(repr, STEP_FIELDS))}}}")
    GLOBAL_STATS[name] = definition

