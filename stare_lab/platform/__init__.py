"""The run platform: the run directory, its summary and verdict, completeness and the evidence check, locks, the
``--out`` policy, input files, plugins and thread defaults (docs/design.md §4)."""

PUBLIC_MODULES = ["completeness", "evidence", "files", "outdir", "plugins", "runlock", "runs", "summary", "threads",
                  "verdict"]
