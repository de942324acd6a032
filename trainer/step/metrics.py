"""The trainer's metrics row of a step (docs/design.md §4), from the step's padded tensors.

:func:`batch_stats` gives this rank's contributions, keyed by name; the step runner reduces
them together with the collector's (:meth:`trainer.step.collect.Collector.local_sums`) in one sum and one max
collective, and :func:`batch_row` turns the result into row entries. The loss-side entries (``entropy``, the gate,
W/M, token and sequence counts, ``stare/…``) come from :meth:`stare_lab.loss.step.PreparedStep.metrics`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from trainer.step.importance import rollout_diagnostics

__all__ = ["base_row", "batch_stats", "batch_row"]


def base_row(step: int) -> dict[str, Any]:
    """The keys every row has (docs/design.md §4), unset: filled in by the step."""
    return {"step": step, "entropy": None, "reward": None, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
            "pred_entropy_change": None, "entropy_change": None}


def batch_stats(batch: Any, old_logprobs: Tensor) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's ``(sums, maxima)``, keyed ``batch/<name>``. Sums: ``rows``, ``truncated``, ``response_tokens``
    (generated tokens of the kept responses) and the engine-vs-trainer sums of
    :func:`trainer.step.importance.rollout_diagnostics`; maxima: ``response_length`` and ``diff_max``."""
    diag = rollout_diagnostics(old_logprobs, batch.rollout_logprobs, batch.response_mask)
    sums = {"batch/rows": float(len(batch)), "batch/truncated": batch.truncated.sum(),
            "batch/response_tokens": batch.response_lens.sum()}
    sums.update({f"batch/{k}": diag[k] for k in ("diff_sum", "ratio_sum", "n_ratio")})
    maxes = {"batch/response_length": batch.response_lens.max() if len(batch) else 0,
             "batch/diff_max": diag["diff_max"]}
    return sums, maxes


def batch_row(red: dict[str, float], mx: dict[str, float], num_tokens: int) -> dict[str, Any]:
    """Row entries from the reduced sums (``red``) and maxima (``mx``) of :func:`batch_stats`: truncation rate
    and response length (over every kept response), ``rollout/logprob_diff_{max,mean}`` (nats, over the
    ``num_tokens`` loss tokens) and ``rollout/ratio_mean``."""
    rows = red["batch/rows"]
    return {"truncation_rate": red["batch/truncated"] / max(rows, 1),
            "response_length/mean": red["batch/response_tokens"] / max(rows, 1),
            "response_length/max": mx["batch/response_length"], "rollout/logprob_diff_max": mx["batch/diff_max"],
            "rollout/logprob_diff_mean": red["batch/diff_sum"] / max(num_tokens, 1),
            "rollout/ratio_mean": red["batch/ratio_sum"] / max(red["batch/n_ratio"], 1)}
