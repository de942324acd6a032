"""STARE: the selected sets L± and the token weights, the entropy gate and the adaptive W/M controller
(docs/theory.md §4).

* :func:`select_stare_sets` — the sets themselves: L+ (and L− for variant C2) as bool masks with their counts, a
  :class:`STARESelection`; :meth:`STARESelection.weights` turns them into ω for a step's W and M. Callers that
  need the sets (the step preparation keeps them; the D terms of docs/theory.md §7 read them) use this.
* :func:`stare_token_weights` — ω straight away: the selection writes the float32 bit patterns of W, M and 1.0
  into the weights' memory in the same pass, the fastest path when the sets are not needed (the losses' scope
  ``microbatch``).

Both select with the radix select of :mod:`stare_lab.selection.radix`: exact (exactly k tokens per set, a documented
tie rule), linear-time, free of host synchronisation unless asked to validate inputs, and identical between its
tensor implementation (any device) and the fused CPU kernel (:mod:`stare_lab.selection.native`).

* :class:`STAREController` (in :mod:`stare_lab.loss.controller`, named here too) — the per-step state: the gate
  decision from the batch token-mean entropy and the W/M schedule, with ``state_dict()`` / ``load_state_dict()``.

Scope (``STAREConfig.scope``) is a property of *where* the weights are computed, not of these functions: scope
``global`` means the caller passes the whole optimizer batch (all micro-batches, gathered across ranks) once per
step (:func:`stare_lab.loss.step.prepare_step`); scope ``microbatch`` means the loss calls it on each micro-batch
(reference behaviour). See :mod:`stare_lab.loss.losses`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import Tensor

from stare_lab.config import STAREConfig, check_range
from stare_lab.loss.controller import STAREController  # noqa: F401 - named here too (its historical home)
from stare_lab.errors import DataError
from stare_lab.selection import native as native_select
from stare_lab.selection.radix import as_bool_mask, as_rows, float32_bits, p_scaled, select_into, select_top_surprisal

logger = logging.getLogger(__name__)

__all__ = ["STAREConfig", "STARESelection", "select_stare_sets", "stare_token_weights", "select_top_surprisal",
           "STAREController"]

# bit pattern of the float32 1.0: the weights are written as bit patterns (exactly fl(W), fl(M) and 1.0)
_ONE_BITS = 0x3F800000
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT32_TINY = float(torch.finfo(torch.float32).smallest_normal)
# set codes of select_stare_sets' int32 buffer
_CODE_LPLUS, _CODE_LMINUS = 1, 2


def _check_inputs(logprobs: Tensor, advantages: Tensor, response_mask: Tensor) -> None:
    if logprobs.dim() != 2:
        raise DataError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    if not logprobs.is_floating_point():
        raise DataError(f"logprobs must be a float tensor, got {logprobs.dtype}")
    if response_mask.shape != logprobs.shape:
        raise DataError(f"response_mask has shape {tuple(response_mask.shape)}, expected {tuple(logprobs.shape)}")
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise DataError(
            f"advantages has shape {tuple(advantages.shape)}, expected [B]={tuple(logprobs.shape[:1])} "
            f"or [B, T]={tuple(logprobs.shape)}"
        )


def _check_weights(w: float, m: float) -> None:
    """ω is float32: W ∈ [1, float32 max], M ∈ [float32 smallest normal, 1] (ConfigError naming the key)."""
    check_range("reweight_w", w, 1, _FLOAT32_MAX)
    check_range("reweight_m", m, _FLOAT32_TINY, 1)


def _zero_counts(device: torch.device) -> dict[str, Tensor]:
    zero = torch.zeros((), dtype=torch.int64, device=device)
    return {"stare/num_pos_selected": zero, "stare/num_neg_selected": zero, "stare/num_pos_candidates": zero,
            "stare/num_neg_candidates": zero, "stare/frac_pos_selected": zero.to(torch.float32),
            "stare/frac_neg_selected": zero.to(torch.float32)}


def _counts(k_pos: Tensor, n_pos: Tensor, k_neg: Tensor, n_neg: Tensor, num_valid: Tensor) -> dict[str, Tensor]:
    n_valid = num_valid.clamp_min(1).to(torch.float32)
    return {"stare/num_pos_selected": k_pos, "stare/num_neg_selected": k_neg, "stare/num_pos_candidates": n_pos,
            "stare/num_neg_candidates": n_neg, "stare/frac_pos_selected": k_pos.to(torch.float32) / n_valid,
            "stare/frac_neg_selected": k_neg.to(torch.float32) / n_valid}


@dataclasses.dataclass
class STARESelection:
    """The STARE sets of one batch (docs/theory.md §4): which tokens ω reweights.

    Held as one int32 code per token (0: neither set, 1: L+, 2: L−), the buffer the radix select writes; the masks
    are read off it on demand and ω is one table lookup.

    Attributes:
        code: ``[B, T]`` int32 set codes.
        has_lminus: whether L− was selected (variant C2).
        counts: 0-dim tensors ``stare/num_pos_selected``, ``stare/num_neg_selected`` (|L±|),
            ``stare/num_pos_candidates``, ``stare/num_neg_candidates`` (|T±|; 0 for T− without L−),
            ``stare/frac_pos_selected``, ``stare/frac_neg_selected`` (|L±| / valid tokens, over the whole
            selection — all ranks for a distributed one, while ``code`` holds this rank's rows).
    """

    code: Tensor
    has_lminus: bool
    counts: dict[str, Tensor]

    @classmethod
    def from_masks(cls, lplus: Tensor, lminus: Tensor | None, counts: dict[str, Tensor]) -> "STARESelection":
        """The selection of two disjoint bool masks (``lminus`` None: L− not selected)."""
        code = lplus.to(torch.int32)
        if lminus is not None:
            code.add_(lminus.to(torch.int32), alpha=_CODE_LMINUS)
        return cls(code=code, has_lminus=lminus is not None, counts=counts)

    @property
    def lplus(self) -> Tensor:
        """``[B, T]`` bool: L+ (the selected high-surprisal tokens with Â > 0)."""
        return self.code == _CODE_LPLUS

    @property
    def lminus(self) -> Tensor | None:
        """``[B, T]`` bool: L− (Â < 0, variant C2), or None when L− was not selected (variant O1)."""
        return (self.code == _CODE_LMINUS) if self.has_lminus else None

    def weights(self, reweight_w: float, reweight_m: float = 1.0) -> Tensor:
        """ω ``[B, T]`` float32: fl32(W) on L+, fl32(M) on L− (when selected), 1.0 elsewhere — the same bits as
        :func:`stare_token_weights` writes.

        Raises:
            ConfigError: ``reweight_w`` ∉ [1, float32 max] or ``reweight_m`` ∉ [float32 smallest normal, 1].
        """
        _check_weights(float(reweight_w), float(reweight_m))
        table = torch.tensor([1.0, float(reweight_w), float(reweight_m)], dtype=torch.float32, device=self.code.device)
        return table[self.code]


def select_stare_sets(
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    top_p_ratio: float,
    *,
    variant: str = "C2",
    check_inputs: bool = False,
) -> STARESelection:
    """The STARE sets of one rollout batch (docs/theory.md §4, step 4), as masks.

    T+ = valid tokens with Â > 0, T− = valid tokens with Â < 0 (Â = 0 and padding are never selected).
    L± = the k = max(1, ⌈P·|T±|⌉) tokens of T± with the highest surprisal s = −log π (none if T± is empty or
    P = 0), ties broken by position (see :func:`select_top_surprisal`); L− only for variant C2. One radix select
    writes both sets' codes into one int32 buffer (:attr:`STARESelection.code`).

    Args:
        logprobs: ``[B, T]`` log-probabilities (nats) of the sampled tokens (detached here).
        advantages: ``[B]`` or ``[B, T]``.
        response_mask: ``[B, T]`` bool or 0/1.
        top_p_ratio: P ∈ [0, 1].
        variant: ``C2`` (both sets) or ``O1`` (L+ only).
        check_inputs: also check values (one host synchronisation), as :func:`stare_token_weights`.

    Returns:
        A :class:`STARESelection` on the inputs' device.

    Raises:
        DataError: on shape/dtype mismatches, or (``check_inputs``) bad values.
    """
    _check_inputs(logprobs, advantages, response_mask)
    mask = as_bool_mask(response_mask)
    adv = advantages.detach()
    if check_inputs:
        _check_values(logprobs, adv, mask)
    adv_bt = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    lp2 = as_rows(logprobs)
    c2 = variant == "C2"
    code = torch.empty(lp2.shape, dtype=torch.int32, device=lp2.device)
    _, k_pos, n_pos, k_neg, n_neg, num_valid = select_into(
        lp2, mask, adv_bt > 0, top_p_ratio, code, _CODE_LPLUS, 0,
        member2=adv_bt < 0 if c2 else None, on_value2=_CODE_LMINUS, count_valid=True,
    )
    return STARESelection(code=code, has_lminus=c2, counts=_counts(k_pos, n_pos, k_neg, n_neg, num_valid))


def stare_token_weights(
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: STAREConfig | None = None,
    gate_on: bool = True,
    reweight_w: float | None = None,
    reweight_m: float | None = None,
    check_inputs: bool = False,
) -> tuple[Tensor, dict[str, Any]]:
    """STARE token weights ω over one rollout batch (docs/theory.md §4, step 4).

    The sets are those of :func:`select_stare_sets` (L± = the k = max(1, ⌈P·|T±|⌉) highest-surprisal tokens of
    T±, ties by position). With the gate on, ω = W on L+ and, for variant C2, ω = M on L−; ω = 1 elsewhere. With
    the gate off, ω ≡ 1 and nothing is selected. The selection writes the bit patterns of fl32(W), fl32(M) and
    1.0 straight into ω (no mask is materialised); use :func:`select_stare_sets` when the sets are needed.

    The selection runs over exactly the tokens given: pass the whole optimizer batch for scope ``global`` (the
    result is then independent of how the batch is later split into micro-batches), one micro-batch for scope
    ``microbatch``.

    Args:
        logprobs: ``[B, T]`` log-probabilities (nats) of the sampled tokens; the surprisal is taken from them
            (on-policy, the old log-probs equal the current ones). Detached: ω carries no gradient.
        advantages: ``[B]`` (broadcast over tokens) or ``[B, T]``.
        response_mask: ``[B, T]`` bool or 0/1; False/0 marks padding.
        config: :class:`STAREConfig` (variant, top_p_ratio, reweight_w, reweight_m); default ``STAREConfig()``.
        gate_on: the controller's gate decision for this step (``STAREController.gate_on``).
        reweight_w: W for this step (the controller's current value); default ``config.reweight_w``.
        reweight_m: M for this step (C2 only); default ``config.reweight_m``.
        check_inputs: also check values (one host synchronisation): non-finite or positive log-probabilities and
            non-finite advantages on valid tokens raise :class:`DataError`. Off by default so the selection stays
            free of host synchronisation; the losses validate their inputs themselves.

    Returns:
        ``(weights, stats)``: ``weights`` ``[B, T]`` float32, detached, 1 on padding; ``stats`` with the 0-dim
        count tensors of :attr:`STARESelection.counts` and Python floats ``stare/gate_on`` (0/1), ``stare/w``,
        ``stare/m``. With the gate off every count is 0.

    Raises:
        DataError: on shape/dtype mismatches, or (``check_inputs``) bad values.
        ConfigError: if ``reweight_w`` ∉ [1, float32 max] or ``reweight_m`` ∉ [float32 smallest normal, 1] (ω is
            float32).
    """
    config = STAREConfig() if config is None else config
    _check_inputs(logprobs, advantages, response_mask)
    w = float(config.reweight_w if reweight_w is None else reweight_w)
    m = float(config.reweight_m if reweight_m is None else reweight_m)
    _check_weights(w, m)
    adv = advantages.detach()
    if check_inputs:
        _check_values(logprobs, adv, as_bool_mask(response_mask))

    device = logprobs.device
    stats: dict[str, Any] = {"stare/gate_on": float(bool(gate_on)), "stare/w": w, "stare/m": m}
    if not gate_on:
        stats.update(_zero_counts(device))
        return torch.ones(logprobs.shape, dtype=torch.float32, device=device), stats

    lp2 = as_rows(logprobs)
    # The weights are written as float32 bit patterns: the selection writes bits(W) on L+, bits(M) on L− (C2) and
    # bits(1.0) elsewhere straight into the memory of the weights, so ω is exactly fl(W), fl(M) or 1.0.
    weights = torch.empty(lp2.shape, dtype=torch.float32, device=device)
    c2 = config.variant == "C2"
    if lp2.numel() and device.type == "cpu" and native_select.available():
        # the fused kernel reads the advantages ([B] or [B, T]: L± per token inside its first pass) and the mask
        # (bool or 0/1 float/int) as they are: no [B, T] set or bool mask is built first
        k_pos, n_pos, k_neg, n_neg, num_valid = native_select.select_by_advantage(
            lp2, response_mask, adv, c2, p_scaled(config.top_p_ratio), weights.view(torch.int32),
            float32_bits(w), float32_bits(m), _ONE_BITS)
    else:
        adv_bt = adv.unsqueeze(-1) if adv.dim() == 1 else adv
        _, k_pos, n_pos, k_neg, n_neg, num_valid = select_into(
            lp2, as_bool_mask(response_mask), adv_bt > 0, config.top_p_ratio, weights.view(torch.int32),
            float32_bits(w), _ONE_BITS, member2=adv_bt < 0 if c2 else None, on_value2=float32_bits(m),
            count_valid=True,
        )
    stats.update(_counts(k_pos, n_pos, k_neg, n_neg, num_valid))
    return weights, stats


def _check_values(logprobs: Tensor, adv: Tensor, mask: Tensor) -> None:
    lp = logprobs.detach()
    adv_bt = adv.unsqueeze(-1).expand_as(lp) if adv.dim() == 1 else adv
    bad_lp = mask & ~(torch.isfinite(lp) & (lp <= 0))
    bad_adv = mask & ~torch.isfinite(adv_bt)
    flags = torch.stack([bad_lp.any(), bad_adv.any()]).tolist()
    if flags[0]:
        idx = bad_lp.nonzero()[0].tolist()
        raise DataError(
            f"logprobs[{idx[0]}, {idx[1]}]={lp[idx[0], idx[1]].item()} on a valid token is not a finite "
            "log-probability (allowed: finite values <= 0)"
        )
    if flags[1]:
        idx = bad_adv.nonzero()[0].tolist()
        raise DataError(f"advantages at valid token ({idx[0]}, {idx[1]}) is not finite (allowed: finite values)")
