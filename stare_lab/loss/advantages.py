"""Group-relative advantages (GRPO and baselines) and the dynamic-sampling keep mask (docs/theory.md §3).

Rollouts come in groups (the G responses to one prompt). A group is given either by ``group_size`` (the rewards
are contiguous groups of G: ``rewards.reshape(-1, G)``) or by ``group_ids`` (any integer label per rollout; groups
may be uneven and unsorted). Every estimator returns 0 *exactly* for a group whose rewards are all equal (no
learning signal), including a group of one rollout, so no NaN can come out of a zero or undefined spread.

Statistics are computed in float64 and returned as float32.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch
from torch import Tensor

from stare_lab.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = ["ESTIMATORS", "group_advantages", "filter_groups", "group_index"]

#: Estimators accepted by :func:`group_advantages`.
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "qae")


def _check_rewards(rewards: Tensor | Sequence[float]) -> Tensor:
    if not isinstance(rewards, Tensor):
        try:
            rewards = torch.as_tensor(rewards, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as err:
            raise DataError(f"rewards must be a 1-D tensor or sequence of numbers: {err}") from None
    if rewards.dim() != 1:
        raise DataError(f"rewards must have shape [N], got shape {tuple(rewards.shape)}")
    if rewards.is_complex():
        raise DataError(f"rewards must be real numbers (bool counts as 0/1), got dtype {rewards.dtype}")
    r = rewards.detach().to(torch.float64)
    bad = ~torch.isfinite(r)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise DataError(
            f"rewards must be finite: {int(bad.sum())} of {r.numel()} are NaN/inf (first at index {i}: {float(r[i])})"
        )
    return r


def group_index(
    n: int, group_size: int | None = None, group_ids: Tensor | Sequence[int] | None = None
) -> tuple[Tensor, int]:
    """Map ``n`` rollouts to dense group indices ``[n]`` long in ``[0, num_groups)``; returns ``(index, num_groups)``.

    Exactly one of ``group_size`` (contiguous groups of G; ``n % G == 0``) and ``group_ids`` (``[n]`` integer labels,
    any order, uneven sizes allowed; dense indices follow the sorted label values) must be given.

    Raises:
        ConfigError: both or neither given, or ``group_size`` not an integer ≥ 1.
        DataError: ``n`` not divisible by ``group_size``; ``group_ids`` not ``[n]`` integers.
    """
    if (group_size is None) == (group_ids is None):
        raise ConfigError("give exactly one of group_size (contiguous groups) and group_ids (a label per rollout)")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ConfigError(f"group_size={group_size!r} must be an integer >= 1")
        if n % group_size:
            raise DataError(f"{n} rewards cannot be split into contiguous groups of group_size={group_size}")
        return torch.arange(n) // group_size, n // group_size
    ids = group_ids if isinstance(group_ids, Tensor) else torch.as_tensor(group_ids)
    if ids.dim() != 1 or ids.numel() != n:
        raise DataError(f"group_ids must have shape [{n}] (one label per reward), got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise DataError(f"group_ids must be integers, got dtype {ids.dtype}")
    uniq, inverse = torch.unique(ids.cpu(), return_inverse=True)
    return inverse.long(), int(uniq.numel())


def _qae_baseline(r: Tensor, index: Tensor, num_groups: int, quantile_k: float) -> Tensor:
    """Per-group K-quantile ``inf{x : F̂(x) ≥ K}`` (inverted empirical CDF) of the rewards, ``[num_groups]``."""
    out = torch.empty(num_groups, dtype=r.dtype)
    order = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=num_groups).tolist()
    start = 0
    for g, size in enumerate(counts):
        values = torch.sort(r[order[start : start + size]]).values
        # 1-based rank ceil(K·n), at least 1; the 1e-9 guards K·n landing a rounding error above an integer
        rank = max(1, math.ceil(quantile_k * size - 1e-9))
        out[g] = values[rank - 1]
        start += size
    return out


def group_advantages(
    rewards: Tensor | Sequence[float],
    group_size: int | None = None,
    group_ids: Tensor | Sequence[int] | None = None,
    estimator: str = "grpo",
    eps: float = 1e-6,
    quantile_k: float = 0.4,
) -> Tensor:
    """Group-relative advantage of every rollout (one scalar per response, broadcast to its tokens by the loss).

    For a group with rewards r_1..r_G, mean r̄ and *unbiased* standard deviation
    σ = sqrt(Σ (r_i − r̄)² / (G − 1)) (torch's default ``correction=1``):

    * ``grpo``:    Â_i = (r_i − r̄) / (σ + eps)                       (DeepSeekMath GRPO; docs/theory.md §3)
    * ``dr_grpo``: Â_i = r_i − r̄                                       (Dr. GRPO: no std division)
    * ``rloo``:    Â_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − r̄)    (leave-one-out baseline)
    * ``qae``:     Â_i = (r_i − Q_K) / (σ + eps)                       (QAE, arXiv 2509.22611: the group mean of GRPO
      replaced by the group K-quantile Q_K; the std normalisation of GRPO is kept, as the paper presents QAE as a
      one-line change of the baseline). Q_K = inf{x : F̂(x) ≥ K} is the inverted empirical CDF (numpy
      ``method="inverted_cdf"``, *not* torch.quantile's default linear interpolation): the sorted reward of rank
      max(1, ⌈K·G⌉). For binary rewards with success rate p this gives exactly the paper's two-regime gate:
      Q_K = 0 iff p ≤ 1 − K (only successes get a non-zero advantage), else Q_K = 1 (only failures do).

    A group whose rewards are all equal (including a group of one rollout, where σ and the leave-one-out mean are
    undefined) gets Â = 0 exactly, for every estimator.

    Args:
        rewards: ``[N]`` finite real rewards (tensor or sequence; bool is read as 0/1).
        group_size: G for contiguous groups (``N % G == 0``), or None when ``group_ids`` is given.
        group_ids: ``[N]`` integer group labels (any values and order; uneven groups allowed), or None.
        estimator: one of :data:`ESTIMATORS`.
        eps: ε ≥ 0 added to σ (grpo, qae); default 1e-6 (docs/theory.md §3).
        quantile_k: K ∈ [0, 1] for ``qae`` (paper default 0.4).

    Returns:
        ``[N]`` float32 advantages, in the order of ``rewards``, on the device of ``rewards`` if it is a tensor.

    Raises:
        DataError: non-finite rewards, bad shapes, ``N`` not divisible by ``group_size``.
        ConfigError: unknown estimator, ``eps`` < 0, ``quantile_k`` ∉ [0, 1], both/neither of group_size/group_ids.
    """
    device = rewards.device if isinstance(rewards, Tensor) else torch.device("cpu")
    r = _check_rewards(rewards).cpu()
    if estimator not in ESTIMATORS:
        raise ConfigError(f"estimator={estimator!r} is not one of {{{', '.join(ESTIMATORS)}}}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ConfigError(f"eps={eps!r} must be a finite number >= 0")
    if estimator == "qae" and (
        isinstance(quantile_k, bool) or not isinstance(quantile_k, (int, float)) or not 0 <= quantile_k <= 1
    ):
        raise ConfigError(f"quantile_k={quantile_k!r} is outside [0, 1]")
    index, num_groups = group_index(r.numel(), group_size, group_ids)
    if r.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)

    counts = torch.bincount(index, minlength=num_groups).to(torch.float64)
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, r) / counts
    centred = r - mean[index]
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, centred * centred)
    lo = torch.full((num_groups,), math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amin")
    hi = torch.full((num_groups,), -math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amax")
    constant = (hi == lo)[index]  # all rewards equal, or a group of one
    size = counts[index]
    safe = torch.where(size > 1, size - 1, torch.ones_like(size))
    std = torch.sqrt(sq[index] / safe)  # unbiased (correction=1)

    if estimator == "grpo":
        adv = centred / (std + eps)
    elif estimator == "dr_grpo":
        adv = centred
    elif estimator == "rloo":
        adv = centred * size / safe
    else:  # qae
        baseline = _qae_baseline(r, index, num_groups, float(quantile_k))
        adv = (r - baseline[index]) / (std + eps)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(torch.float32).to(device)


def filter_groups(
    rewards: Tensor | Sequence[float],
    group_size: int | None = None,
    group_ids: Tensor | Sequence[int] | None = None,
) -> Tensor:
    """Dynamic-sampling keep mask (DAPO): True for every rollout of a group with at least two distinct rewards.

    Groups whose rewards are all equal (all correct, all wrong, or a single rollout) carry no group-relative
    signal and are dropped. For binary rewards this is DAPO's 0 < #correct < G.

    Args:
        rewards: ``[N]`` finite rewards. group_size / group_ids: as in :func:`group_advantages` (exactly one).

    Returns:
        ``[N]`` bool keep mask, in the order of ``rewards``, on the device of ``rewards`` if it is a tensor.

    Raises:
        DataError: non-finite rewards, bad shapes, ``N`` not divisible by ``group_size``.
        ConfigError: both/neither of group_size/group_ids, bad group_size.

    Source: DAPO (arXiv 2503.14476) dynamic sampling; docs/theory.md §3–§4.
    """
    device = rewards.device if isinstance(rewards, Tensor) else torch.device("cpu")
    r = _check_rewards(rewards).cpu()
    index, num_groups = group_index(r.numel(), group_size, group_ids)
    if r.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=device)
    lo = torch.full((num_groups,), math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amin")
    hi = torch.full((num_groups,), -math.inf, dtype=torch.float64).scatter_reduce_(0, index, r, "amax")
    return (hi > lo)[index].to(device)
