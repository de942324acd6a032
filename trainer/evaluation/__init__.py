"""Evaluation: the bundled benchmarks (``benchmarks``), avg@k / pass@k / maj@k (``evaluate``) and
``stare-lab evaluate`` (``cli``).

Public to the other rooms of the trainer: ``evaluate`` (periodic evaluation during training) and ``cli`` (the
subcommand, found by name from :mod:`trainer.cli`).
"""

PUBLIC_MODULES = ("evaluate", "cli")
