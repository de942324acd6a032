"""The small-transformer simulator: a tiny causal LM (a transformers config with tiny sizes, random init) on
synthetic verifiable tasks, warm-started by a short supervised phase, then RL through the core. ``runner`` (a run),
``config`` (the dataclass and presets), ``model`` (the tiny causal LM and its sampler), ``tasks`` (the synthetic
tasks and their registry).

Public to the rest of the simulators: ``runner``, ``config``, ``tasks``.
"""

PUBLIC_MODULES = ("runner", "config", "tasks")
