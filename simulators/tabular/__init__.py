"""The tabular simulator: softmax policies over free logits (bandits and factored sequences), many runs advanced as
one batched tensor computation. ``runner`` (a run, a batch of runs, resume; the module docstring explains the
update and the logged keys), ``config`` (the dataclass), ``tasks`` (reward rules and the reward-coupling knob),
``engine`` (the batched step loop), ``step`` (shared step parts), ``sampled`` and ``expected`` (the two modes),
``memory`` (the peak-memory estimate).

Public to the rest of the simulators: ``runner``, ``config``, ``tasks``, ``memory``.
"""

PUBLIC_MODULES = ("runner", "config", "tasks", "memory")
