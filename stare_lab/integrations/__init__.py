"""STARE inside other training frameworks, unforked.

* :mod:`stare_lab.integrations.trl` — ``STAREGRPOConfig`` and ``STAREGRPOTrainer``, a subclass of TRL's
  ``GRPOTrainer`` (``pip install -e ".[trl]"`` from a clone; docs/integrations.md).
* :mod:`stare_lab.integrations.verl` (+ ``verl_trainer``) — verl's plugin: the ``stare`` policy loss and the ``stare``
  v1 trainer, found through verl's ``verl.plugins`` entry points (its own environment; docs/integrations-verl.md).

Each submodule imports its framework when it is imported itself; this package imports nothing, so
``import stare_lab`` never loads TRL or verl.
"""

__all__: list[str] = []
