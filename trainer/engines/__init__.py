"""The engines a step drives: rollout engines (``rollout``: vLLM and HF ``generate``), the DeepSpeed policy
(``policy``, with the probe's passes in ``probe_passes``), HF weight files (``weights``), memory moves between them
(``memory``), collectives (``comm``) and the process launch (``launch``).

Public to the other rooms of the trainer: every module here.
"""

PUBLIC_MODULES = ("rollout", "policy", "probe_passes", "weights", "memory", "comm", "launch")
