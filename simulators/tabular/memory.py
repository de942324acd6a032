"""How much memory batched tabular runs need, and how much the machine has — so that a request too large for the
machine is refused before it starts (:func:`simulators.parallel.check_memory`) instead of being killed mid-run.

A batch of R runs (one :class:`~simulators.tabular.step.TabularBatch`: S prompts, G responses, L positions, V
tokens) allocates, per step:

* sampled mode: per sampled token (R·S·G·L of them) the draws, token ids, flat state indices, log-probs, Ψ,
  advantages, ω, the L+/L− masks and four coefficient sets (float64 / int64), plus, one run at a time, the core's
  step preparation and loss on that run's S·G·L tokens; per state entry (R·S·L·V) the policy tables (π, log π,
  ∂H/∂z, Ψ), the four Δz parts and the updated variants whose entropy is measured;
* expected mode: per state entry the same tables and parts plus the mean-field masses and their sort; per
  (run, prompt, position, count 0…L) the Poisson-binomial count laws of the exact reward probability (L·(L+1) per
  prompt: it dominates for long sequences over small vocabularies). G does not enter.

The byte counts below are these sizes with a margin of at least about 1.25x over what was measured (peak RSS of one
process running two steps, ``OMP_NUM_THREADS=1``, torch 2.13 CPU; e.g. 64 prompts x 4000 responses x 4 positions x
8 tokens: 274 MiB for one grpo run, 987 MiB for four runs grpo/o1/c2/o1-adaptive; 64 x 4 x 16384 tokens: 145-228
B per state entry sampled, 275-399 expected; the count laws 70-77 B per entry). Every run also keeps its metrics
rows in memory until it finishes (about 3.4 KB per row measured).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = [
    "PROCESS_BYTES", "SAMPLED_TOKEN_BYTES", "SAMPLED_RUN_TOKEN_BYTES", "SAMPLED_STATE_BYTES", "EXPECTED_STATE_BYTES",
    "EXPECTED_COUNT_BYTES", "ROW_BYTES", "batch_peak_bytes", "rows_bytes", "available_memory",
]

#: per process computing runs: what its first step loads and allocates besides the tensors (measured 27 MiB)
PROCESS_BYTES = 64 * 2**20
#: sampled mode, per sampled token of each run of a batch (measured 220-241)
SAMPLED_TOKEN_BYTES = 288
#: sampled mode, per sampled token of one run: the core's step preparation and loss, run by run (measured <= 100)
SAMPLED_RUN_TOKEN_BYTES = 128
#: sampled mode, per state entry (run, prompt, position, token) (measured 145-228)
SAMPLED_STATE_BYTES = 288
#: expected mode, per state entry (measured 275-399)
EXPECTED_STATE_BYTES = 512
#: expected mode, per (run, prompt, position, count 0…L) entry of the count laws (measured 70-77)
EXPECTED_COUNT_BYTES = 112
#: per metrics row a run keeps in memory until it finishes (measured 3.4 KB)
ROW_BYTES = 4096


def batch_peak_bytes(configs: Sequence[Any]) -> int:
    """Estimated peak bytes of the tensors one batched step of ``configs`` allocates (runs sharing
    :func:`~simulators.tabular.step.batch_key`; module docstring), conservative.

    Raises:
        ValueError: no configs.
    """
    if not configs:
        raise ValueError("batch_peak_bytes needs at least one config")
    c = configs[0]
    runs, S, G, L, V = len(configs), c.num_prompts, c.group_size, c.seq_len, c.vocab_size
    if c.mode == "sampled":
        tokens = S * G * L
        return runs * (SAMPLED_TOKEN_BYTES * tokens + SAMPLED_STATE_BYTES * S * L * V) + SAMPLED_RUN_TOKEN_BYTES * tokens
    return runs * (EXPECTED_STATE_BYTES * S * L * V + EXPECTED_COUNT_BYTES * S * L * (L + 1))


def rows_bytes(configs: Sequence[Any]) -> int:
    """Bytes of the metrics rows the runs of ``configs`` keep in memory (``steps`` rows each)."""
    return ROW_BYTES * sum(int(c.steps) for c in configs)


def available_memory() -> tuple[int, str] | None:
    """Memory this machine can give new allocations now, in bytes, and where the number comes from:
    ``MemAvailable`` of ``/proc/meminfo`` (free memory plus what the kernel can reclaim), else free physical pages
    (``os.sysconf``: a lower bound); None when neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages (os.sysconf)"
    except (OSError, ValueError, AttributeError):
        return None
