"""Planning a run before it starts: per-GPU memory by phase (``plan``, ``stare-lab plan``) and promoting settings
validated in simulation into a trainer or verl config (``promote``, ``stare-lab promote``).

Public to the other rooms of the trainer: ``plan``, ``promote``.
"""

PUBLIC_MODULES = ("plan", "promote")
