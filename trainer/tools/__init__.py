"""Tool use: the settings (``config``), the bubblewrap sandbox that runs the policy's code (``sandbox``) and the
multi-turn rollouts on top of any rollout engine (``tool_rollout``).

Public to the other rooms of the trainer: ``config``, ``tool_rollout``, ``sandbox``.
"""

PUBLIC_MODULES = ("config", "tool_rollout", "sandbox")
