"""Aggregation of a per-token loss ``[B, T]`` to a scalar with global normalisers (docs/theory.md §3; verl's modes).

Used by every loss of :mod:`stare_lab.loss.losses` (which re-exports :func:`aggregate_loss` and :func:`masked_mean`).
With normalisers counted over the whole optimizer step (all micro-batches and ranks), the sum of the micro-batch
losses equals the full-batch loss, and so do the gradients.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stare_lab.config import LossConfig
from stare_lab.errors import ConfigError, DataError

__all__ = ["aggregate_loss", "masked_mean"]


def _normaliser(value: int | float | Tensor | None, default: Tensor, name: str) -> Tensor:
    if value is None:
        return default
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise DataError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        return value.reshape(()).to(device=default.device, dtype=torch.float32)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise DataError(f"{name}={value!r} must be a finite number >= 0")
    return torch.tensor(float(value), dtype=torch.float32, device=default.device)


def _safe_div(total: Tensor, count: Tensor) -> Tensor:
    """total / count, and exactly 0 (with zero gradient, never NaN) where count is not > 0 (0, or a NaN / negative
    tensor normaliser, which the policy losses reject before they return)."""
    positive = count > 0
    return torch.where(positive, total / torch.where(positive, count, torch.ones_like(count)), torch.zeros_like(total))


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    global_num_tokens: int | float | Tensor | None = None,
    global_num_sequences: int | float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (verl's aggregation modes, docs/theory.md §3).

    With n_b the valid tokens of sequence b, N = ``global_num_tokens`` and S = ``global_num_sequences``:

    * ``token-mean``: Σ_b Σ_t m·ℓ / N
    * ``seq-mean-token-mean``: Σ_b (Σ_t m·ℓ / n_b) / S
    * ``seq-mean-token-sum``: Σ_b Σ_t m·ℓ / S
    * ``seq-mean-token-sum-norm``: Σ_b Σ_t m·ℓ / (S · L), L = ``loss_scale_factor`` or T (Dr. GRPO's constant)

    Padding entries are excluded with a select (not a product), so non-finite padding values cannot leak into the
    value. Python-number normalisers are checked here; a tensor normaliser is not read back (no host
    synchronisation) — a NaN or non-positive one gives 0 with zero gradient, and the policy losses reject it with a
    :class:`DataError`. With ``token_weights`` ω (STARE, docs/theory.md §4 step 5) every sum runs over m·ω·ℓ instead, computed as
    ℓ · where(m, ω, 0): one product in place of a select and a second product. ω is read on valid tokens only, but
    ``loss_mat`` must then be finite on padding too (0 · NaN = NaN); the policy losses guarantee that (every input
    is checked finite and ρ is clamped). Sequences without valid tokens contribute 0. Defaults: N = this call's valid tokens, S = this call's
    sequences with ≥ 1 valid token. A zero normaliser gives exactly 0 (zero gradient), never NaN. With global N, S
    the sum over micro-batches equals the full-batch value.

    Args:
        loss_mat: ``[B, T]`` float.
        mask: ``[B, T]`` bool or 0/1.
        mode: one of ``LossConfig.AGG_MODES``.
        global_num_tokens, global_num_sequences: int/float/0-dim tensor ≥ 0, or None.
        loss_scale_factor: L > 0 or None.
        token_weights: ``[B, T]`` float per-token weights (no gradient flows into them), or None.

    Returns:
        0-dim tensor (dtype of ``loss_mat``).

    Raises:
        ConfigError: unknown ``mode`` or ``loss_scale_factor <= 0``.
        DataError: shape mismatch, or a negative / non-finite Python-number normaliser.
    """
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise DataError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} must be the same [B, T]")
    if mode not in LossConfig.AGG_MODES:
        raise ConfigError(f"loss_agg_mode={mode!r} is not one of {{{', '.join(map(repr, LossConfig.AGG_MODES))}}}")
    m = mask if mask.dtype == torch.bool else mask != 0
    zero = torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device)
    if token_weights is None:
        masked = torch.where(m, loss_mat, zero)
    else:
        if token_weights.shape != loss_mat.shape:
            raise DataError(f"token_weights {tuple(token_weights.shape)} must have the shape of loss_mat {tuple(loss_mat.shape)}")
        masked = loss_mat * torch.where(m, token_weights.detach().to(loss_mat.dtype), zero)
    if mode == "token-mean":
        count = _normaliser(global_num_tokens, torch.count_nonzero(m).to(torch.float32), "global_num_tokens")
        return _safe_div(masked.sum(), count)
    seq_tokens = m.sum(-1, dtype=torch.int32)
    seq_sum = masked.sum(-1)
    num_seq = _normaliser(
        global_num_sequences, torch.count_nonzero(seq_tokens).to(torch.float32), "global_num_sequences"
    )
    if mode == "seq-mean-token-mean":
        per_seq = seq_sum / seq_tokens.clamp_min(1).to(seq_sum.dtype)  # 0 for empty sequences (sum is 0)
        return _safe_div(per_seq.sum(), num_seq)
    if mode == "seq-mean-token-sum":
        return _safe_div(seq_sum.sum(), num_seq)
    if loss_scale_factor is None:
        scale = float(loss_mat.shape[-1])
    elif isinstance(loss_scale_factor, bool) or not (
        isinstance(loss_scale_factor, (int, float)) and math.isfinite(loss_scale_factor) and loss_scale_factor > 0
    ):
        raise ConfigError(f"loss_scale_factor={loss_scale_factor!r} must be a finite number > 0")
    else:
        scale = float(loss_scale_factor)
    return _safe_div(seq_sum.sum(), num_seq * scale)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` (0-dim float32; 0 when the mask is empty). Padding excluded by select."""
    m = mask if mask.dtype == torch.bool else mask != 0
    count = torch.count_nonzero(m).to(torch.float32)
    if values.dtype == torch.bool:
        return _safe_div(torch.count_nonzero(values & m).to(torch.float32), count)
    total = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    return _safe_div(total.to(torch.float32), count)
