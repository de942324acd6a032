"""The run: what ``stare-lab train`` does from start to end — checks before anything expensive (``preflight``), the
session built once (``session``), the step loop with resume and evaluation (``loop``), checkpoints
(``checkpoint``) and the run's log, rows and summary (``runlog``).

Public to the other rooms of the trainer: ``loop`` (:func:`~trainer.run.loop.train`), ``preflight`` and ``runlog``
(a run's rows, read back by ``stare-lab train``'s summary).
"""

PUBLIC_MODULES = ("loop", "preflight", "runlog")
