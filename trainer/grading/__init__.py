"""Grading responses: the reward rules (``rewards``), answer extraction (``answers``) and symbolic equivalence
through math-verify (``symbolic``).

Public to the other rooms of the trainer: ``rewards``.
"""

PUBLIC_MODULES = ("rewards",)
