"""Exact top-k selections over a batch split across data-parallel ranks, by reducing radix histograms.

The STARE sets L± (docs/theory.md §4) and the forking-token entropy threshold (docs/theory.md §3) are quantiles of the
*whole* step's batch. Across ranks they are computed without gathering the tokens: every rank histograms its keys,
the histograms are summed (:class:`~stare_lab.collective.Collective`), and every rank reads the same threshold off
the sum — the two-pass radix select of :mod:`stare_lab.selection.radix` (16 high bits, then the 16 low bits inside the
threshold bin), distributed. Ties at the threshold are taken in global row-major order (rank 0's rows first, then
rank 1's, …; within a rank, row-major), which is the order of the ranks' batches concatenated, so the selection is
the one :func:`stare_lab.selection.radix.select_top_surprisal` makes on the concatenated batch, token for token.

Cost per call, whatever the batch size: three collectives (two histograms of ``S × 65536`` counts, int32 when
they fit, and one ``S × world_size`` int64 tie count; ``S`` = number of sets) and linear-time local work.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from stare_lab.collective import Collective
from stare_lab.errors import DataError
from stare_lab.selection.radix import _threshold

__all__ = ["TopK", "distributed_top_k", "surprisal_keys", "ordered_keys", "key_to_float"]

_BINS = 1 << 16
_LOW = _BINS - 1
_SIGN = 1 << 31


class TopK(NamedTuple):
    """One set's result of :func:`distributed_top_k` (0-dim int64 tensors, identical on every rank, and this rank's
    selection).

    Attributes:
        threshold: the key of the k-th largest candidate (``2**32 − 1`` when k = 0).
        k: how many candidates are selected over all ranks.
        n: how many candidates there are over all ranks.
        selected: bool, the shape of the keys: this rank's selected candidates (None unless asked for).
    """

    threshold: Tensor
    k: Tensor
    n: Tensor
    selected: Tensor | None


def surprisal_keys(logprobs: Tensor) -> Tensor:
    """int64 keys that order like the surprisal s = |log π| as float32, as :mod:`stare_lab.selection.radix` ranks it: the bit
    pattern of |fl32(log π)| (a non-negative float32 orders like its bit pattern), in ``[0, 2**31)`` (NaN above
    +inf)."""
    return torch.abs(logprobs.detach().to(torch.float32)).view(torch.int32).to(torch.int64)


def ordered_keys(values: Tensor) -> Tensor:
    """int64 keys in ``[0, 2**32)`` that order like the float32 values (any sign; −0.0 is taken as +0.0): the bit
    pattern, with the 31 low bits flipped for negative values, plus 2**31."""
    bits = (values.detach().to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits) + _SIGN


def key_to_float(key: Tensor) -> Tensor:
    """The float32 value whose :func:`ordered_keys` key is ``key`` (0-dim int64 → 0-dim float32)."""
    bits = key.to(torch.int64) - _SIGN
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return bits.to(torch.int32).view(torch.float32)


def distributed_top_k(
    keys: Sequence[Tensor],
    num_selected: Sequence[Callable[[Tensor], Tensor]],
    collective: Collective,
    positions: Sequence[bool],
    max_count: int | None = None,
) -> list[TopK]:
    """For each set s: the k_s = ``num_selected[s](n_s)`` candidates with the largest keys over all ranks.

    Args:
        keys: per set, this rank's keys: an int64 tensor (any shape, read in row-major order) holding a key in
            ``[0, 2**32)`` for each candidate and −1 for every other entry (see :func:`surprisal_keys`,
            :func:`ordered_keys`). Sets may have different shapes; every rank passes the same number of sets.
        num_selected: per set, k as a function of the global candidate count n (0-dim int64 → 0-dim int64,
            ``0 ≤ k ≤ n``; e.g. ``lambda n: radix_select.num_selected(n, P)``).
        collective: the ranks' :class:`~stare_lab.collective.Collective` (:class:`LocalCollective` for one).
        positions: per set, whether to return this rank's selection (ties in global row-major order) or only the
            threshold and counts (enough for a quantile value).
        max_count: an upper bound on the candidates of a set over all ranks (e.g. the step's valid tokens); below
            2³¹ the histograms travel as int32 (half the bytes), else (or None) as int64.

    Returns:
        One :class:`TopK` per set, in order.

    Raises:
        DataError: if the argument lists differ in length or a key tensor is not int64.
    """
    if not (len(keys) == len(num_selected) == len(positions)):
        raise DataError(f"distributed_top_k: {len(keys)} key sets, {len(num_selected)} k functions and "
                        f"{len(positions)} position flags must be as many")
    if not keys:
        return []
    for s, key in enumerate(keys):
        if key.dtype != torch.int64:
            raise DataError(f"distributed_top_k: keys of set {s} must be int64, got {key.dtype}")
    device = keys[0].device
    flat = [key.reshape(-1) for key in keys]
    cand = [f >= 0 for f in flat]
    # pass 1: histograms of the high 16 bits, summed over the ranks
    wire = torch.int32 if max_count is not None and max_count < 2**31 else torch.int64
    hist1 = torch.stack([torch.bincount(f[c] >> 16, minlength=_BINS) for f, c in zip(flat, cand)])
    hist1 = collective.all_reduce(hist1.to(wire)).to(torch.int64)
    n = hist1.sum(1)
    k = torch.stack([torch.as_tensor(fn(n[s]), dtype=torch.int64, device=device).reshape(())
                     for s, fn in enumerate(num_selected)])
    if bool(((k < 0) | (k > n)).any()):
        raise DataError(f"distributed_top_k: k={k.tolist()} must lie in [0, n={n.tolist()}]")
    b1, above1 = zip(*(_threshold(hist1[s], k[s]) for s in range(len(keys))))
    # pass 2: histograms of the low 16 bits of the keys inside each set's threshold bin
    hist2 = torch.stack([torch.bincount(f[c & ((f >> 16) == b)] & _LOW, minlength=_BINS)
                         for f, c, b in zip(flat, cand, b1)])
    hist2 = collective.all_reduce(hist2.to(wire)).to(torch.int64)
    results = []
    needs = []
    for s in range(len(keys)):
        b2, above2 = _threshold(hist2[s], k[s] - above1[s])
        t = (b1[s] << 16) | b2
        needs.append(k[s] - above1[s] - above2)  # keys equal to t still to take, in global order
        results.append([t, k[s], n[s]])
    if not any(positions):
        return [TopK(t, kk, nn, None) for t, kk, nn in results]
    # ties: every rank's count of keys equal to the threshold, so each knows how many come before its own
    ties = [flat[s] == results[s][0] for s in range(len(keys))]
    counts = torch.zeros((len(keys), collective.world_size), dtype=torch.int64, device=device)
    counts[:, collective.rank] = torch.stack([tie.sum() for tie in ties])
    counts = collective.all_reduce(counts)
    before = counts[:, : collective.rank].sum(1)
    out = []
    for s, (t, kk, nn) in enumerate(results):
        if not positions[s]:
            out.append(TopK(t, kk, nn, None))
            continue
        take = (needs[s] - before[s]).clamp(0, counts[s, collective.rank])
        tie = ties[s]
        selected = (flat[s] > t) | (tie & (torch.cumsum(tie, 0) <= take))
        out.append(TopK(t, kk, nn, selected.reshape(keys[s].shape)))
    return out
