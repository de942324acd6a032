"""First-order theory: Φ and s*, the first-order predictors of an update's entropy change, the D terms, the
critical strength and the regime it was found in (docs/theory.md §2, §7–9)."""

PUBLIC_MODULES = ["adam_linear", "critical", "decomposition", "first_order", "probe", "regime"]
