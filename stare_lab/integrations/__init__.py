"""STARE inside other training frameworks, unforked (docs/integrations.md).

* :mod:`stare_lab.integrations.trl` — ``STAREGRPOConfig`` and ``STAREGRPOTrainer``, a subclass of TRL's
  ``GRPOTrainer`` (needs ``pip install 'stare-lab[trl]'``).

Each submodule imports its framework when it is imported itself; this package imports nothing, so
``import stare_lab`` never loads TRL (or any other framework).
"""

__all__: list[str] = []
