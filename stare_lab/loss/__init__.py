"""The loss: log-probs and entropy, advantages, the policy losses and their registry, the aggregation, STARE's
token weights and controller, the method table, and the once-per-step preparation (docs/design.md §1)."""

PUBLIC_MODULES = ["advantages", "aggregation", "entropy", "global_stats", "losses", "methods", "registry", "stare",
                  "step"]
