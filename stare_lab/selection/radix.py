"""The radix select behind the STARE sets L± (docs/theory.md §4): exact, linear-time, no host synchronisation.

A non-negative float32 surprisal s = |log π| orders like its bit pattern read as an integer, so the k largest
surprisals of a candidate set are found by two histogram passes over the bit patterns (the high 16 bits, then the low
15 bits inside the threshold bin) and one write that takes the ties in row-major order — no sort, no top-k. Two
implementations with identical results: tensor operations (any device, :func:`_select_tensor`) and, for CPU tensors,
the fused C kernel of :mod:`stare_lab.selection.native`. The public entry points are :func:`select_top_surprisal` (one
set, a bool mask) and :func:`select_into` (one or two disjoint sets written as values into an int32 buffer: STARE's
weights as float32 bit patterns, or set codes); :mod:`stare_lab.loss.stare` builds the token weights and the selected
sets on them, :mod:`stare_lab.selection.distributed` distributes the same select over ranks.
"""

from __future__ import annotations

import struct

import torch
from torch import Tensor

from stare_lab.selection import native as native_select
from stare_lab.errors import DataError

__all__ = ["select_top_surprisal", "select_into", "num_selected", "p_scaled", "float32_bits", "as_rows", "as_bool_mask",
           "CHUNK_ELEMS"]

# Radix select layout: a non-negative float32 surprisal has a bit pattern in [0, 2**31) that orders like the float.
# Pass 1 histograms the high 16 bits (65536 bins), pass 2 the low 15 bits (32768 bins) of the threshold bin.
_LO_BITS = 15
_LO_BINS = 1 << _LO_BITS
_HI_BINS = 1 << 16
# Pass 2 sends the keys outside the threshold bin to _TRASH_BINS bins below (and one above) the real ones, spread by
# position: index_add_ into one bin serialises on that address and costs twice as much as into distinct bins.
_TRASH_BINS = 64
# Relative tolerance on P·n before the ceiling: a decimal P such as 0.1 is stored slightly above 1/10, and
# ⌈fl(0.1)·30⌉ would be 4 instead of the intended 3.
_K_RTOL = 1e-12


def num_selected(n: Tensor, top_p_ratio: float) -> Tensor:
    """k = max(1, ⌈P·n⌉) for n ≥ 1, 0 for n = 0 or P = 0, as an int64 0-dim tensor (docs/theory.md §4).

    ``n`` is an int64 0-dim tensor; computed in float64 with a relative tolerance of 1e-12 below the product so
    that decimal P give the intended k (e.g. P = 0.1, n = 30 → 3). ``P = 0`` selects nothing, like the reference
    implementation (hp-luo/STARE returns an empty set when ``top_p_ratio <= 0``).
    """
    if top_p_ratio <= 0.0:
        return torch.zeros((), dtype=torch.int64, device=n.device)
    k = torch.ceil(n.to(torch.float64) * (top_p_ratio * (1.0 - _K_RTOL))).to(torch.int64)
    k = torch.minimum(k.clamp_min(1), n)
    return k  # n = 0 → min(1, 0) = 0


def p_scaled(top_p_ratio: float) -> float:
    """P·(1 − 1e-12): the factor of n before the ceiling of :func:`num_selected`, as the fused kernel takes it."""
    return top_p_ratio * (1.0 - _K_RTOL) if top_p_ratio > 0 else 0.0


def _threshold(hist: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """For a histogram ``hist[b]`` (bins ordered by key) and k ≥ 0: the bin b* holding the k-th largest key and the
    number of keys strictly above that bin. For k = 0 it returns the top bin and 0 (nothing is selected later)."""
    count_ge = hist.flip(0).cumsum(0).flip(0)  # count_ge[b] = #keys in bins >= b (non-increasing in b)
    b = ((count_ge >= k).sum() - 1).clamp_min(0)
    above = count_ge.gather(0, b.view(1)).squeeze(0) - hist.gather(0, b.view(1)).squeeze(0)
    return b, above


def select_top_surprisal(
    logprobs: Tensor, candidates: Tensor, top_p_ratio: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The k = max(1, ⌈P·n⌉) candidate tokens with the highest surprisal s = −log π (docs/theory.md §4, sets L±).

    Exact and linear-time: a two-pass radix select on the float32 bit patterns of s (a non-negative float32 orders
    like its bit pattern read as int32), 16 + 15 bits, with histograms accumulated by ``index_add_`` into
    fixed-size bins and the threshold found from cumulative counts over the bins; k stays a tensor, so there is no
    host synchronisation (no ``.item()``, no data-dependent shapes).

    Tie rule: all candidates with s above the k-th largest value are selected; among the candidates whose s equals
    it exactly, the first ones in row-major order (lower row first, then lower column) are taken until exactly k
    tokens are selected.

    Surprisal: s = |log π| bit for bit, i.e. −log π for every log-probability ≤ 0, with −0.0 and +0.0 both giving
    s = +0. A positive or NaN log-probability is not a log-probability; :func:`stare_token_weights` rejects it when
    ``check_inputs`` is on (without the check a NaN ranks above +inf).

    Args:
        logprobs: ``[B, T]`` (or ``[N]``) log-probabilities of the sampled tokens (nats, ≤ 0), any float dtype;
            detached here and ranked as float32 (float64 values that round to the same float32 are ties).
        candidates: bool, same shape: the set to select from (e.g. valid tokens with Â > 0).
        top_p_ratio: P ∈ [0, 1]; P = 0 selects nothing.

    Returns:
        ``(selected, k, n)``: bool mask (same shape) with exactly k True entries, all inside ``candidates``; k and
        the candidate count n as int64 0-dim tensors.

    Raises:
        DataError: if the shapes differ or the tensors are not 1-D/2-D.
    """
    if logprobs.shape != candidates.shape:
        raise DataError(f"candidates has shape {tuple(candidates.shape)}, expected {tuple(logprobs.shape)}")
    if logprobs.dim() not in (1, 2):
        raise DataError(f"logprobs must be [N] or [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    lp2 = as_rows(logprobs)
    cand = as_bool_mask(candidates).reshape(lp2.shape)
    out = torch.empty(lp2.shape, dtype=torch.int32, device=lp2.device)
    every_row = torch.ones((lp2.shape[0], 1), dtype=torch.bool, device=lp2.device)
    selected, k, n, _, _, _ = select_into(lp2, cand, every_row, top_p_ratio, out, on_value=1, off_value=0)
    return selected.bool().view(shape), k, n


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as bool (non-zero → True); a bool tensor is returned as is."""
    return mask if mask.dtype == torch.bool else mask != 0


def as_rows(logprobs: Tensor) -> Tensor:
    """Detached float32 ``[rows, cols]`` view (``[N]`` → ``[1, N]``)."""
    lp = logprobs.detach().to(torch.float32)
    return lp.reshape(1, -1) if lp.dim() == 1 else lp


#: Elements per chunk of the CPU selection passes (512 KiB of int32): the temporaries of a chunk stay in cache.
CHUNK_ELEMS = 1 << 17


def select_into(
    lp2: Tensor,
    valid: Tensor,
    member: Tensor,
    top_p_ratio: float,
    out: Tensor,
    on_value: int,
    off_value: int,
    member2: Tensor | None = None,
    on_value2: int = 0,
    count_valid: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Core of :func:`select_top_surprisal` on ``lp2`` ``[rows, cols]`` float32, for one set or two disjoint ones.

    The candidates of a set are the ``valid`` tokens (bool ``[rows, cols]``) whose flag is set: ``member`` for the
    first set, ``member2`` (optional, disjoint from ``member``) for the second (bool ``[rows, 1]`` per row, or
    ``[rows, cols]``; e.g. Â > 0 and Â < 0). The result is written into the int32 ``out`` ``[rows, cols]``:
    ``on_value`` / ``on_value2`` on the selected tokens of the first / second set, ``off_value`` elsewhere (the
    weights pass float32 bit patterns here, so that no separate pass converts a 0/1 selection into weights).
    Returns ``(out, k, n, k2, n2, num_valid)`` (k2 = n2 = 0 without a second set; num_valid, the number of valid
    tokens, only when ``count_valid``, else None).

    On CPU the fused kernel of :mod:`stare_lab.selection.native` runs when it is available (same keys, k and tie rule;
    identical result); otherwise, and on every other device, :func:`_select_tensor`.
    """
    rows, cols = lp2.shape
    if rows * cols > 0 and lp2.device.type == "cpu" and native_select.available():
        set_id = member.to(torch.uint8)
        if member2 is not None:
            set_id = set_id + member2.to(torch.uint8) * 2
        k, n, k2, n2, num_valid = native_select.select_into(
            lp2, valid, set_id, p_scaled(top_p_ratio), out, on_value, on_value2, off_value
        )
        return out, k, n, k2, n2, (num_valid if count_valid else None)
    set_code = member.to(torch.int32).sub_(2)  # -1 where the flag is set, -2 where not
    _, k, n, num_valid = _select_tensor(lp2, valid, set_code, top_p_ratio, out, on_value, off_value, count_valid)
    zero = torch.zeros((), dtype=torch.int64, device=lp2.device)
    k2 = n2 = zero
    if member2 is not None:  # the second set into its own buffer, as (on2 − off) / 0, then added: sets are disjoint
        second = torch.empty_like(out)
        set_code2 = member2.to(torch.int32).sub_(2)
        _, k2, n2, _ = _select_tensor(lp2, valid, set_code2, top_p_ratio, second, on_value2 - off_value, 0)
        out.add_(second)
    return out, k, n, k2, n2, num_valid


def _select_tensor(
    lp2: Tensor,
    valid: Tensor,
    set_code: Tensor,
    top_p_ratio: float,
    out: Tensor,
    on_value: int,
    off_value: int,
    count_valid: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The selection in tensor operations, for any device: exact, linear-time, no host synchronisation.

    ``set_code`` is int32 ``[rows, 1]`` or ``[rows, cols]``, −1 where the set flag holds and −2 where not, so that
    valid + set_code is 0 exactly on the candidates and −1 or −2 elsewhere. Arguments and result otherwise as
    :func:`select_into`.

    Four sweeps: two histogram passes, one tie count, one write. On CPU they run over chunks of about
    :data:`CHUNK_ELEMS` elements so that their temporaries stay in cache (the whole batch is memory-bound
    otherwise), and use integer arithmetic rather than comparisons (bool outputs are slow there); on other devices
    each sweep is one chunk.
    """
    rows, cols = lp2.shape
    device = lp2.device
    zero = torch.zeros((), dtype=torch.int64, device=device)
    if rows * cols == 0:
        return out.fill_(off_value), zero, zero, (zero if count_valid else None)
    step = max(1, CHUNK_ELEMS // cols) if device.type == "cpu" else rows
    bounds = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
    chunk_elems = min(step, rows) * cols
    scratch = torch.empty(chunk_elems, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.int32, device=device).expand(chunk_elems)
    # the keys live in `out` until sweep 3 turns them into d and the final sweep into the result; per chunk:
    # (r0, r1, rows of out, the same flat, scratch of the chunk's size)
    chunks = [
        (r0, r1, out[r0:r1], out[r0:r1].view(-1), scratch[: (r1 - r0) * cols]) for r0, r1 in bounds
    ]

    # pass 1: key = bits of |log π| (≥ 0, orders like s) for candidates; -1 or -2 for the others (OR with the code);
    # histogram of the high 16 bits shifted to bins 1..65536; non-candidates (key >> 15 = -1) land in bin 0
    hist1 = torch.zeros(_HI_BINS + 1, dtype=torch.int32, device=device)
    counts = []
    for r0, r1, key, flat, buf in chunks:
        if count_valid:
            counts.append(torch.count_nonzero(valid[r0:r1]))
        code = buf.view(r1 - r0, cols).copy_(valid[r0:r1]).add_(set_code[r0:r1])
        torch.abs(lp2[r0:r1], out=key.view(torch.float32))
        key.bitwise_or_(code)
        idx = torch.bitwise_right_shift(flat, _LO_BITS, out=buf).add_(1)
        hist1.index_add_(0, idx, ones[: buf.numel()])
    hist1 = hist1[1:].to(torch.int64)
    n = hist1.sum()
    k = num_selected(n, top_p_ratio)
    b1, above1 = _threshold(hist1, k)
    k2 = k - above1

    # pass 2: the low 15 bits of the keys inside bin b1 go to bins TRASH..TRASH+32767. Every other key is trash:
    # below the bin (and the non-candidates) it is clamped up to bin (position mod TRASH), spread so that
    # index_add_ does not serialise on one address; above the bin it is clamped down to bin TRASH + 32768.
    # Overflow: key ≥ -2 and key − offset ≤ INT32_MAX except for keys within 64 of INT32_MAX (NaN payloads) when
    # offset < 0, i.e. b1 = 0; those are above the bin, wrap to negative and are clamped into trash as well.
    offset = ((b1 << _LO_BITS) - _TRASH_BINS).to(torch.int32)
    trash = torch.arange(chunk_elems, dtype=torch.int32, device=device).bitwise_and_(_TRASH_BINS - 1)
    top = torch.full((), _TRASH_BINS + _LO_BINS, dtype=torch.int32, device=device)
    hist2 = torch.zeros(_TRASH_BINS + _LO_BINS + 1, dtype=torch.int32, device=device)
    for _, _, _, flat, buf in chunks:
        idx = torch.sub(flat, offset, out=buf)
        torch.clamp(idx, min=trash[: buf.numel()], max=top, out=idx)
        hist2.index_add_(0, idx, ones[: buf.numel()])
    hist2 = hist2[_TRASH_BINS : _TRASH_BINS + _LO_BINS].to(torch.int64)
    b2, above2 = _threshold(hist2, k2)
    t = offset + _TRASH_BINS + b2.to(torch.int32)  # the k-th largest key (INT32_MAX when k = 0: nothing reaches it)
    need = k2 - above2  # how many of the keys equal to t to take (0 when k = 0)

    # sweep 3: d = clamp(key − (t − 1), 0, 2) ∈ {0: below t, 1: equal to t (tie), 2: above t}, kept in `out`;
    # ties per row = Σ (d & 1). (key ≥ −2 and t ≥ 0, so key − (t − 1) ≥ INT32_MIN; it overflows only for a NaN
    # key with every payload bit set at t = 0, which then stays unselected.)
    ties_per_row = torch.empty(rows, dtype=torch.int32, device=device)
    t_minus_1 = t - 1
    for r0, r1, key, _, buf in chunks:
        d = key.sub_(t_minus_1).clamp_(0, 2)
        tie = torch.bitwise_and(d, 1, out=buf.view(r1 - r0, cols))
        torch.sum(tie, 1, dtype=torch.int32, out=ties_per_row[r0:r1])

    # ties, row-major: rows before r* take all their ties, row r* the first `need - ties before r*`, later none.
    # Rows before r* select d ≥ 1, rows from r* on d ≥ 2: selected = clamp(d + [row < r*] − 1, 0, 1), written as
    # off + (on − off)·selected; row r* is then rewritten alone.
    ties_per_row = ties_per_row.to(torch.int64)
    ties_before = ties_per_row.cumsum(0) - ties_per_row
    r = (ties_before + ties_per_row < need).sum().clamp_max(rows - 1)  # first row whose ties reach `need`
    shift = (torch.arange(rows, device=device) < r).to(torch.int32).sub_(1).unsqueeze(1)  # 0 before r*, −1 after
    d_r = out.index_select(0, r.view(1))  # [1, cols], before the final sweep rewrites row r*
    alpha = on_value - off_value
    off = torch.full((), off_value, dtype=torch.int32, device=device)
    for r0, r1, d, _, _ in chunks:
        sel = d.add_(shift[r0:r1]).clamp_(0, 1)
        if (on_value, off_value) != (1, 0):
            torch.add(off, sel, alpha=alpha, out=sel)
    tie_r = d_r == 1
    take_r = tie_r & (tie_r.cumsum(1) <= need - ties_before.gather(0, r.view(1)))
    sel_r = ((d_r == 2) | take_r).to(torch.int32)
    out.index_copy_(0, r.view(1), sel_r.mul_(alpha).add_(off_value))
    return out, k, n, (torch.stack(counts).sum() if count_valid else None)


def float32_bits(value: float) -> int:
    """The bit pattern of fl32(value) as a signed int32 (round to nearest, like ``torch.tensor(value)``)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]
