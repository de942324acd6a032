"""Log-probabilities and entropy of softmax policies, chunked and differentiable (docs/theory.md §1).

Every function reads logits ``z`` of shape ``[..., V]`` and works with the policy ``π = softmax(z / τ)`` where ``τ``
is the sampling temperature, so log-probs and entropies always come from the same temperature-scaled logits that
sampling used. Entropy and surprisal are in nats.

Memory. The rows (all leading axes flattened) are processed in chunks, so a full float32 ``[rows, V]`` softmax is
never materialised: the extra memory of :func:`entropy_from_logits` is two float32 ``[chunk, V]`` work buffers, that
of :func:`logprobs_from_logits` one, each allocated once per call and reused by every chunk. The default chunk holds
:data:`DEFAULT_CHUNK_ELEMENTS` elements (128 MiB in float32; 220 rows at V = 151,936) — see
:func:`default_chunk_rows`; measured on 4096 × 151,936 float32 logits: extra peak 0.11× the input, faster than one
big chunk (tests/benchmarks/bench_entropy.py). Both functions are differentiable through a custom
:class:`torch.autograd.Function` that saves only the input logits and two numbers per row and recomputes the softmax
chunk by chunk in backward, so training keeps no ``[rows, V]`` float32 activation either; backward needs the
``[rows, V]`` gradient (input dtype) plus the same work buffers. First derivatives only: double backward raises.

Precision. Each chunk is upcast to float32 (bf16/fp16 input) and all sums accumulate in float32; float64 input is
computed and returned in float64 (useful for finite-difference checks of the tabular simulators).

Masked vocabulary. ``-inf`` logits are allowed: such tokens have π = 0 and contribute 0·log 0 = 0 to the entropy,
with finite (zero) gradients. A row whose logits are all ``-inf`` has no distribution and raises
:class:`~stare_lab.errors.DataError`, as does any NaN or ``+inf`` logit. A bad temperature or chunk size raises
:class:`~stare_lab.errors.ConfigError` (both are ``ValueError`` subclasses).

The first-order entropy dynamics (Φ, s*, the predictors) are in :mod:`stare_lab.theory.first_order`.
"""

from __future__ import annotations

import logging
import math
from typing import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from stare_lab.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "default_chunk_rows",
    "logprobs_from_logits",
    "entropy_from_logits",
]

#: Elements of one float32 ``[chunk, V]`` block by default: 2**25 (128 MiB). At V = 151,936 that is 220 rows, so
#: the two blocks :func:`entropy_from_logits` needs are 0.11× a 4096-row float32 input (benchmark goal: ≤ 0.25×).
DEFAULT_CHUNK_ELEMENTS = 1 << 25


# ----------------------------------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------------------------------


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk used when ``chunk_size`` is None: ``max(1, DEFAULT_CHUNK_ELEMENTS // vocab_size)``."""
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(1, int(vocab_size)))


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, Tensor):
        temperature = float(temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature):
        raise ConfigError(f"temperature={temperature!r} must be a finite number > 0")
    if temperature <= 0:
        raise ConfigError(f"temperature={temperature} must be > 0 (the sampling temperature)")
    return float(temperature)


def _check_chunk(chunk_size: int | None, vocab_size: int) -> int:
    if chunk_size is None:
        return default_chunk_rows(vocab_size)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError(f"chunk_size={chunk_size!r} must be an integer >= 1 (rows per chunk) or None")
    return chunk_size


def _check_logits(logits: Tensor, name: str = "logits") -> None:
    if not isinstance(logits, Tensor):
        raise DataError(f"{name} must be a torch.Tensor of shape [..., V], got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise DataError(f"{name} must have shape [..., V] with V >= 1, got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise DataError(f"{name} must be a floating tensor, got dtype {logits.dtype}")


def _check_tokens(tokens: Tensor, logits: Tensor, name: str = "tokens", trailing: bool = False) -> None:
    """``tokens`` must be an integer tensor of shape ``logits.shape[:-1]`` (or ``[..., G]`` with ``trailing``)."""
    integer = isinstance(tokens, Tensor) and not (tokens.is_floating_point() or tokens.is_complex())
    if not integer or tokens.dtype == torch.bool:
        got = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise DataError(f"{name} must be an integer tensor, got {got}")
    lead = tuple(logits.shape[:-1])
    if trailing:
        if tokens.dim() != len(lead) + 1 or tuple(tokens.shape[:-1]) != lead:
            raise DataError(
                f"{name} must have shape {lead + ('G',)} for logits of shape {tuple(logits.shape)}, "
                f"got {tuple(tokens.shape)}"
            )
    elif tuple(tokens.shape) != lead:
        raise DataError(
            f"{name} must have shape {lead} for logits of shape {tuple(logits.shape)}, got {tuple(tokens.shape)}"
        )
    vocab = logits.shape[-1]
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise DataError(
            f"{name} must lie in [0, {vocab - 1}] (vocabulary size {vocab}), "
            f"got values in [{int(tokens.min())}, {int(tokens.max())}]"
        )


def _compute_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _ranges(n_rows: int, rows: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n_rows, rows):
        yield start, min(start + rows, n_rows)


def _workspace(n_rows: int, rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """One reusable ``[min(rows, n_rows), V]`` buffer: allocated once per call, so the chunks reuse the same pages
    (no allocate/free — and no fresh page faults — per chunk, and no overlap of an old and a new block)."""
    return torch.empty((max(1, min(rows, n_rows)), vocab), dtype=dtype, device=device)


def _scaled(x: Tensor, temperature: float, buf: Tensor) -> Tensor:
    """``x / τ`` written into the first ``len(x)`` rows of ``buf`` (upcast to the buffer's dtype)."""
    z = buf[: x.shape[0]]
    z.copy_(x)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _row_max(z: Tensor, start: int) -> Tensor:
    """Row maxima ``[n, 1]`` of a scaled chunk; raises DataError for rows with NaN/+inf or with no finite logit."""
    m = z.amax(dim=-1, keepdim=True)
    bad = ~torch.isfinite(m)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        if float(m[row, 0]) == -math.inf and not bool(torch.isnan(z[row]).any()):
            raise DataError(
                f"logits row {start + row} (flattened over leading axes) is all -inf: every token is masked, "
                "the softmax is undefined"
            )
        raise DataError(f"logits row {start + row} (flattened over leading axes) contains NaN or +inf")
    return m


def _check_finite_values(x: Tensor, name: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise DataError(f"{name} must be finite, got NaN or inf")


# ----------------------------------------------------------------------------------------------------------------
# log-probs and entropy (chunked, differentiable)
# ----------------------------------------------------------------------------------------------------------------


class _ChunkedLogProbs(torch.autograd.Function):
    """log π(tokens) for 2-D logits; backward recomputes π per chunk: ∂log π_a/∂z = (e_a − π)/τ."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, rows: int) -> Tensor:  # type: ignore[override]
        dtype = _compute_dtype(logits)
        n, vocab = logits.shape
        out = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        buf = _workspace(n, rows, vocab, dtype, logits.device)
        for start, stop in _ranges(n, rows):
            z = _scaled(logits[start:stop], temperature, buf)
            m = _row_max(z, start)
            z_tok = z.gather(-1, tokens[start:stop, None])
            log_sum = z.sub_(m).exp_().sum(-1, keepdim=True).log_()
            out[start:stop] = ((z_tok - m) - log_sum)[:, 0]
            lse[start:stop] = (m + log_sum)[:, 0]
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        logits, tokens, lse = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        dtype = lse.dtype
        n, vocab = logits.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        buf = _workspace(n, rows, vocab, dtype, logits.device)
        g = grad_out.to(dtype) / temperature
        for start, stop in _ranges(n, rows):
            p = _scaled(logits[start:stop], temperature, buf).sub_(lse[start:stop, None]).exp_()
            gs = g[start:stop, None]
            p.mul_(-gs).scatter_add_(-1, tokens[start:stop, None], gs)
            grad[start:stop] = p
        return grad, None, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """H = −Σ π log π for 2-D logits; backward recomputes π per chunk: ∂H/∂z_k = −π_k (log π_k + H)/τ."""

    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float, rows: int) -> Tensor:  # type: ignore[override]
        dtype = _compute_dtype(logits)
        n, vocab = logits.shape
        ent = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        buf_z = _workspace(n, rows, vocab, dtype, logits.device)
        buf_p = torch.empty_like(buf_z)
        for start, stop in _ranges(n, rows):
            z = _scaled(logits[start:stop], temperature, buf_z)
            m = _row_max(z, start)
            z.sub_(m)  # z ≤ 0, max 0; -inf stays -inf
            p = torch.exp(z, out=buf_p[: stop - start])  # unnormalised, sum ≥ 1
            total = p.sum(-1)
            p.mul_(z).nan_to_num_(nan=0.0)  # e^z·z, with 0·(−inf) := 0 (masked tokens)
            log_total = total.log()
            # H = log Σe^z − Σ e^z z / Σ e^z; clamp the rounding error of near-deterministic rows (true H ≥ 0)
            ent[start:stop] = (log_total - p.sum(-1) / total).clamp_(min=0.0)
            lse[start:stop] = m[:, 0] + log_total
        ctx.save_for_backward(logits, ent, lse)
        ctx.temperature, ctx.rows = temperature, rows
        return ent

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        logits, ent, lse = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        dtype = lse.dtype
        n, vocab = logits.shape
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        buf_z = _workspace(n, rows, vocab, dtype, logits.device)
        buf_p = torch.empty_like(buf_z)
        g = grad_out.to(dtype) / temperature
        for start, stop in _ranges(n, rows):
            logp = _scaled(logits[start:stop], temperature, buf_z).sub_(lse[start:stop, None])
            p = torch.exp(logp, out=buf_p[: stop - start])
            logp.add_(ent[start:stop, None]).mul_(p).nan_to_num_(nan=0.0)  # π(log π + H), 0 on masked tokens
            grad[start:stop] = logp.mul_(-g[start:stop, None])
        return grad, None, None


def logprobs_from_logits(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Log-probability of ``tokens`` under ``softmax(logits / temperature)``, chunked over rows.

    Args:
        logits: ``[..., V]``, any float dtype (bf16/fp16 are upcast per chunk; accumulation in float32).
            ``-inf`` entries (masked vocabulary) are allowed.
        tokens: ``[...]`` integer token ids in ``[0, V)``, the shape of ``logits`` without its last axis.
        temperature: τ > 0, the temperature the tokens were sampled with.
        chunk_size: rows (leading axes flattened) per chunk; None → :func:`default_chunk_rows`. Extra memory is
            one ``[chunk_size, V]`` float32 block, forward and backward.

    Returns:
        ``[...]`` float32 log-probs (float64 for float64 logits), ≤ 0; ``-inf`` exactly when the token's logit is
        ``-inf`` (probability 0). Differentiable w.r.t. ``logits`` (first derivatives;
        ∂log π_a/∂z = (e_a − π)/τ, computed chunk by chunk in backward).

    Raises:
        DataError: bad shapes/dtypes, token ids outside ``[0, V)``, a NaN/+inf logit, or a row of all ``-inf``.
        ConfigError: ``temperature`` ≤ 0 or non-finite, ``chunk_size`` < 1.

    Source: log π_a = z_a/τ − logsumexp(z/τ) (docs/theory.md §1).
    """
    _check_logits(logits)
    _check_tokens(tokens, logits)
    temperature = _check_temperature(temperature)
    vocab = logits.shape[-1]
    rows = _check_chunk(chunk_size, vocab)
    flat = logits.reshape(-1, vocab)
    out = _ChunkedLogProbs.apply(flat, tokens.reshape(-1).long(), temperature, rows)
    return out.reshape(tokens.shape)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """Entropy of ``softmax(logits / temperature)`` over the last axis, in nats, chunked over rows.

    Args:
        logits: ``[..., V]``, any float dtype (upcast per chunk; float32 accumulation). ``-inf`` entries are
            allowed and contribute 0·log 0 = 0.
        temperature: τ > 0, the sampling temperature.
        chunk_size: rows per chunk; None → :func:`default_chunk_rows`. Extra memory is two ``[chunk_size, V]``
            float32 blocks (forward and backward); nothing of size ``[rows, V]`` is kept for backward beyond the
            input logits themselves.

    Returns:
        ``[...]`` float32 entropies (float64 for float64 logits) in ``[0, log V]``, clamped at 0 against rounding.
        Differentiable w.r.t. ``logits`` (first derivatives; ∂H/∂z_k = −π_k (log π_k + H)/τ, zero on masked
        tokens).

    Raises:
        DataError: no vocabulary axis, non-float dtype, a NaN/+inf logit, or a row of all ``-inf``.
        ConfigError: ``temperature`` ≤ 0 or non-finite, ``chunk_size`` < 1.

    Source: H = −Σ_k π_k log π_k (docs/theory.md §1).
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    vocab = logits.shape[-1]
    rows = _check_chunk(chunk_size, vocab)
    out = _ChunkedEntropy.apply(logits.reshape(-1, vocab), temperature, rows)
    return out.reshape(logits.shape[:-1])
