"""stare_lab: the one math core for entropy-preserving RL post-training (STARE, arXiv 2606.19236).

Rooms (docs/design.md §1):

* :mod:`stare_lab.loss` — log-probs and entropy, advantages, the policy losses and their registry, the aggregation,
  STARE's token weights and controller, the method table, the once-per-step preparation;
* :mod:`stare_lab.selection` — the exact top-k of the highest surprisals (radix select, over ranks);
* :mod:`stare_lab.theory` — the first-order theory: Φ, s*, the D terms, the critical strength;
* :mod:`stare_lab.platform` — the run platform: run directory, summary, verdict, locks, ``--out``, files, plugins;
* :mod:`stare_lab.integrations` — STARE inside TRL and verl.

At the top: :mod:`stare_lab.config`, :mod:`stare_lab.errors`, :mod:`stare_lab.collective` (reductions over ranks)
and :mod:`stare_lab.cli` (the front door). ``import stare_lab`` needs only torch and numpy.
"""

__version__ = "0.1.0"

from stare_lab.errors import ConfigError, DataError, LossError, RunError, StareLabError  # noqa: E402

__all__ = ["__version__", "StareLabError", "ConfigError", "DataError", "RunError", "LossError"]
