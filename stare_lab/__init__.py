"""stare_lab: the one math core for entropy-preserving RL post-training (STARE, arXiv 2606.19236).

Submodules: :mod:`stare_lab.losses` (the policy losses; registry in :mod:`stare_lab.loss_registry`),
:mod:`stare_lab.stare` (the STARE sets, token weights, gate, controller; the radix select in
:mod:`stare_lab.radix_select`), :mod:`stare_lab.step` (the step batch and its one
preparation: gate, ω, counts, each loss's global statistics; over ranks with :mod:`stare_lab.collective` and
:mod:`stare_lab.global_select`), :mod:`stare_lab.advantages`, :mod:`stare_lab.entropy`, :mod:`stare_lab.first_order`, :mod:`stare_lab.config`,
:mod:`stare_lab.runs`, :mod:`stare_lab.summary` (the one run summary), :mod:`stare_lab.plugins` (user plugins),
:mod:`stare_lab.cli`. ``import stare_lab`` needs only torch and numpy.
"""

__version__ = "0.1.0"

from .errors import ConfigError, DataError, LossError, RunError, StareLabError  # noqa: E402

__all__ = ["__version__", "StareLabError", "ConfigError", "DataError", "RunError", "LossError"]
