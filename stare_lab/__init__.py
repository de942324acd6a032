"""stare_lab: the one math core for entropy-preserving RL post-training (STARE, arXiv 2606.19236).

Submodules: :mod:`stare_lab.losses` (policy-loss registry), :mod:`stare_lab.stare` (token weights, gate,
controller), :mod:`stare_lab.advantages`, :mod:`stare_lab.entropy`, :mod:`stare_lab.config`,
:mod:`stare_lab.runs`, :mod:`stare_lab.cli`. ``import stare_lab`` needs only torch and numpy.
"""

__version__ = "0.1.0"

from .errors import ConfigError, DataError, RunError, StareLabError  # noqa: E402

__all__ = ["__version__", "StareLabError", "ConfigError", "DataError", "RunError"]
