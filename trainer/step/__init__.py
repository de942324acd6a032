"""One training step, phase by phase (docs/trainer.md "What a step does"): collect rollouts and rewards
(``collect``), the step's padded tensors (``batch``), importance correction (``importance``), the step itself
(``runner``: old log-probs, the core's step preparation, the update), its metrics row (``metrics``) and the
first-order predictions (``prediction``).

Public to the other rooms of the trainer: ``runner``, ``collect`` and ``importance`` (whose settings preflight checks).
"""

PUBLIC_MODULES = ("runner", "collect", "importance")
