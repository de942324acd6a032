"""Importance correction between the rollout engine and the trainer (docs/design.md §3; docs/trainer.md).

The engine returns the log-probs of the distribution it actually sampled from (vLLM
``logprobs_mode="processed_logprobs"``; the HF engine the same): the temperature-scaled distribution, and, with
``rollout.top_p < 1`` or ``rollout.top_k``, that distribution restricted to the nucleus / top-k set and
renormalised. The trainer's log-probs (``trainer.engines.policy``) are those of the temperature-scaled distribution over
the whole vocabulary — the policy the loss differentiates.

Choice: truncated importance sampling (``loss.tis_cap``) with ``top_p < 1`` or ``top_k`` is **refused**
(:func:`check_importance_config`), rather than computing the trainer's log-probs over the engine's support. Why:

- with a filtered support the ratio π_old/π_rollout on a sampled token is, up to the numeric mismatch TIS exists
  to correct, the probability mass Z < 1 of the kept set (measured 0.76–0.81 at top-p 0.7/0.9): TIS would scale
  every token down by Z and call it a correction;
- renormalising the trainer's distribution over "the same" support needs the engine's exact support, which the
  trainer can only recompute from its own logits: a token at the nucleus edge can fall outside it by one rounding
  step (ratio 0 or ∞), and the recomputation costs a full-vocabulary sort per token in the old-log-prob pass;
- the paper trains at ``top_p = 1`` (only its evaluation uses top-p 0.7), where both sides share the support.

The diagnostics ``rollout/logprob_diff_{max,mean}`` and ``rollout/ratio_mean`` are logged in every run; with
``top_p < 1`` / ``top_k`` they include the support effect above (documented), but are always finite: every ratio is
``exp`` of a log-ratio clamped to ±:data:`stare_lab.loss.losses.LOG_RATIO_CLAMP` nats.
"""

from __future__ import annotations

from typing import Any

import torch

from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.losses import LOG_RATIO_CLAMP

__all__ = ["check_importance_config", "engine_logprobs", "rollout_diagnostics"]


def check_importance_config(cfg: Any) -> None:
    """Refuse TIS when the engine samples from a filtered support (see the module docstring).

    Raises:
        ConfigError: ``loss.tis_cap`` is set and ``rollout.top_p < 1`` or ``rollout.top_k > 0``.
    """
    r, loss = cfg.rollout, cfg.loss
    if loss.tis_cap is None:
        return
    if r.top_p < 1.0 or r.top_k > 0:
        raise ConfigError(
            f"loss.tis_cap={loss.tis_cap} with rollout.top_p={r.top_p}, rollout.top_k={r.top_k}: the engine's "
            "log-probs are renormalised over the top-p/top-k set and the trainer's are not, so the importance ratio "
            "would measure that set's probability mass, not the engine/trainer mismatch; use rollout.top_p=1.0 and "
            "rollout.top_k=-1 with TIS, or turn TIS off (loss.tis_cap=null)")


def engine_logprobs(output: Any, where: str) -> torch.Tensor:
    """The engine's per-token log-probs of one response, checked, as a ``[T]`` float32 tensor (the one conversion
    from the engine's list).

    Args:
        output: a :class:`trainer.engines.rollout.RolloutOutput` (``token_ids``, ``logprobs``).
        where: what to name in an error (e.g. ``"step 3, prompt 5, sample 2"``).

    Returns:
        ``output.logprobs`` as float32 (``len == len(output.token_ids)``).

    Raises:
        DataError: the engine returned no log-probs, a wrong number of them, or a non-finite one (a sampled token
            has a positive probability, so its log-prob is finite).
    """
    lps = output.logprobs
    n = len(output.token_ids)
    if lps is None:
        raise DataError(f"{where}: the rollout engine returned no log-probs for a response of {n} tokens (the "
                        "trainer needs them for the importance ratio and the sync check; vLLM must be called with "
                        "logprobs=0)")
    if len(lps) != n:
        raise DataError(f"{where}: the rollout engine returned {len(lps)} log-probs for {n} response tokens")
    out = torch.tensor([float(v) for v in lps], dtype=torch.float32)
    bad = (~torch.isfinite(out)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise DataError(f"{where}: the rollout engine's log-prob of token {i} is {float(out[i])} (not a "
                        "log-probability)")
    return out


def rollout_diagnostics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                        mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums for the engine-vs-trainer metrics of one rank (reduced over ranks by the caller).

    Args:
        old_logprobs: ``[B, T]`` trainer log-probs (nats).
        rollout_logprobs: ``[B, T]`` engine log-probs.
        mask: ``[B, T]`` bool loss mask (padding False).

    Returns:
        0-dim float64 tensors: ``diff_sum`` (Σ |Δ log p| over masked-in tokens), ``diff_max`` (max |Δ log p|,
        clamped to ``LOG_RATIO_CLAMP``; 0 without a token), ``ratio_sum`` (Σ over sequences with ≥ 1 token of the
        token-mean of ``exp(clamp(old − rollout, ±LOG_RATIO_CLAMP))``) and ``n_ratio`` (that number of sequences).
        Every value is finite (a non-finite gap counts as ``LOG_RATIO_CLAMP`` nats; :func:`engine_logprobs` rejects
        such engine log-probs before this point).
    """
    m = mask.bool()
    log_ratio = (old_logprobs.double() - rollout_logprobs.double()).nan_to_num(
        nan=0.0, posinf=LOG_RATIO_CLAMP, neginf=-LOG_RATIO_CLAMP).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    zero = torch.zeros((), dtype=torch.float64)
    gaps = torch.where(m, log_ratio.abs(), zero)
    n_tok = m.sum(-1)
    has = n_tok > 0
    ratio_rows = torch.where(m, torch.exp(log_ratio), zero).sum(-1) / n_tok.clamp_min(1)
    return {"diff_sum": gaps.sum(), "diff_max": gaps.max() if gaps.numel() else zero,
            "ratio_sum": torch.where(has, ratio_rows, zero).sum(), "n_ratio": has.sum().double()}
