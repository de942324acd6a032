"""Log-probabilities, entropy and first-order entropy dynamics of softmax policies (docs/theory.md §1–§2).

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

Temperature and the first-order predictors. Φ, :func:`predicted_entropy_change` and the ``pred_*`` functions
describe a step on the *scaled* logits ``u = z / τ``: a logit step ``Δz`` is a step ``Δu = Δz / τ``. The named
policy-gradient predictors assume the update is written on ``u`` (e.g. ``Δu = η A (e_a − π)``); a vanilla PG step
taken on the raw logits ``z`` has ``Δz = η A (e_a − π) / τ``, i.e. ``Δu`` smaller by ``1/τ²``, so its ΔH is the
predictor's value divided by ``τ²``. At τ = 1 the two coincide.
"""

from __future__ import annotations

import logging
import math
from typing import Iterator, Sequence

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "default_chunk_rows",
    "logprobs_from_logits",
    "entropy_from_logits",
    "entropy_sensitivity",
    "critical_surprisal",
    "predicted_entropy_change",
    "pred_single_token_pg",
    "pred_expected_pg",
    "pred_grpo_group",
    "pred_param_update",
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


# ----------------------------------------------------------------------------------------------------------------
# first-order entropy dynamics (diagnostics: no autograd, chunked, detached results)
# ----------------------------------------------------------------------------------------------------------------


def _distribution_chunks(
    logits: Tensor, temperature: float, chunk_size: int | None
) -> Iterator[tuple[int, int, Tensor, Tensor, Tensor]]:
    """Yield ``(start, stop, π, log π with −inf→0, H)`` per chunk of the flattened rows (detached)."""
    vocab = logits.shape[-1]
    rows = _check_chunk(chunk_size, vocab)
    flat = logits.detach().reshape(-1, vocab)
    dtype = _compute_dtype(logits)
    for start, stop in _ranges(flat.shape[0], rows):
        z = flat[start:stop].to(dtype, copy=True)
        if temperature != 1.0:
            z.div_(temperature)
        m = _row_max(z, start)
        z.sub_(m)
        z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))  # log π (−inf on masked tokens)
        p = torch.exp(z)
        logp = z.masked_fill_(torch.isneginf(z), 0.0)  # π·log π = 0 there, so 0 is the right stand-in
        ent = -(p * logp).sum(-1)
        yield start, stop, p, logp, ent


def _neg_cov_logp(p: Tensor, logp: Tensor, ent: Tensor, y: Tensor) -> Tensor:
    """−Cov_{k∼π}(log π_k, y_k) per row = −(E[log π · y] + H · E[y]), using E[log π] = −H."""
    return -((p * logp * y).sum(-1) + ent * (p * y).sum(-1))


def _sensitivity_offset(p: Tensor, logp: Tensor, ent: Tensor) -> Tensor:
    """C = Σ_k π_k² (s_k − H) per row (≤ 0; 0 iff π is uniform on its support), docs/theory.md §2."""
    return (p * p * (-logp - ent[:, None])).sum(-1)


def entropy_sensitivity(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Entropy sensitivity Φ(a) of each sampled token: the first-order ΔH per unit of ``η·A``.

    ``Φ(a) = π_a (s_a − H) − Σ_k π_k² (s_k − H)`` with ``s = −log π``, ``π = softmax(logits/τ)``. A vanilla
    policy-gradient step on the scaled logits, ``Δu = η A (e_a − π)``, changes the entropy by ``η A Φ(a)`` to first
    order (see the module docstring for τ ≠ 1). E_{a∼π}[Φ(a)] = 0 identically, and ``sign Φ(a) = sign(s_a − s*)``
    with ``s*`` from :func:`critical_surprisal`.

    Args:
        logits: ``[..., V]`` float logits (``-inf`` allowed; a masked token has Φ = −C).
        tokens: ``[...]`` integer token ids in ``[0, V)``.
        temperature: τ > 0.
        chunk_size: rows per chunk (None → default); extra memory is a few ``[chunk, V]`` blocks.

    Returns:
        ``[...]`` float32 (float64 for float64 logits) Φ in nats, detached (a diagnostic, not differentiable).

    Raises:
        DataError / ConfigError: as :func:`logprobs_from_logits`.

    Source: docs/theory.md §2 (*derived*: ΔH ≈ −Cov_π(log π, Δu) with Δu = ηA(e_a − π)).
    """
    _check_logits(logits)
    _check_tokens(tokens, logits)
    temperature = _check_temperature(temperature)
    flat_tok = tokens.reshape(-1, 1).long()
    out = torch.empty(flat_tok.shape[0], dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, chunk_size):
        tok = flat_tok[start:stop]
        p_a = p.gather(-1, tok)[:, 0]
        s_a = -logp.gather(-1, tok)[:, 0]
        out[start:stop] = p_a * (s_a - ent) - _sensitivity_offset(p, logp, ent)
    return out.reshape(tokens.shape)


def critical_surprisal(logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """The surprisal ``s*`` at which Φ changes sign, per position (splits tokens into low/high surprisal).

    Φ(a) = f(s_a) − C with f(s) = e^{−s}(s − H) and C = Σ_k π_k²(s_k − H) ∈ [−H, 0]. On s ∈ [0, H], f rises
    monotonically from −H to 0 (f' = e^{−s}(1 + H − s) > 0); for s > H, f > 0 ≥ C. Hence f(s) = C has exactly one
    root with s ≤ H, and Φ(a) < 0 for s_a < s*, Φ(a) > 0 for s_a > s* (a second root at s → ∞ exists only in the
    limit C = 0). Closed form: ``s* = H − W₀(−C e^H)`` (W₀ the principal Lambert-W branch); computed here by
    bisection on [0, H] in float64 (64 halvings). Uniform π (C = 0): s* = H, where every Φ is 0. One-hot π: s* = 0.

    Args:
        logits: ``[..., V]`` float logits (``-inf`` allowed).
        temperature: τ > 0.
        chunk_size: rows per chunk (None → default).

    Returns:
        ``[...]`` float32 (float64 for float64 logits) s* in nats, 0 ≤ s* ≤ H, detached.

    Raises:
        DataError / ConfigError: as :func:`entropy_from_logits`.

    Source: docs/theory.md §2 (*derived* here; quadrants of STARE Fig. 2: sign ΔH = sign Â · sign(s − s*)).
    """
    _check_logits(logits)
    temperature = _check_temperature(temperature)
    n = logits.reshape(-1, logits.shape[-1]).shape[0]
    out = torch.empty(n, dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, chunk_size):
        h = ent.double().clamp(min=0.0)
        c = torch.maximum(_sensitivity_offset(p, logp, ent).double().clamp(max=0.0), -h)
        lo, hi = torch.zeros_like(h), h.clone()
        for _ in range(64):
            mid = 0.5 * (lo + hi)
            below = torch.exp(-mid) * (mid - h) < c  # f(mid) < C → root is above mid
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        out[start:stop] = (0.5 * (lo + hi)).to(out.dtype)
    return out.reshape(logits.shape[:-1])


def predicted_entropy_change(
    logits: Tensor, delta_logits: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Exact first-order entropy change per position for a logit change ``delta_logits``.

    ``ΔH ≈ Σ_k ∂H/∂u_k Δu_k = −Cov_{k∼π}(log π_k, Δu_k)`` with ``u = z/τ``, ``Δu = Δz/τ``. Masked tokens (π = 0)
    contribute nothing.

    Args:
        logits: ``[..., V]`` float logits (``-inf`` allowed).
        delta_logits: ``[..., V]`` finite logit change Δz (same shape).
        temperature: τ > 0.
        chunk_size: rows per chunk (None → default).

    Returns:
        ``[...]`` float32 (float64 for float64 logits) predicted ΔH in nats, detached.

    Raises:
        DataError: shape mismatch or non-finite ``delta_logits`` (plus the checks of :func:`entropy_from_logits`).
        ConfigError: bad ``temperature`` / ``chunk_size``.

    Source: docs/theory.md §2, ∂H/∂z_k = −π_k(log π_k + H).
    """
    _check_logits(logits)
    _check_logits(delta_logits, "delta_logits")
    if delta_logits.shape != logits.shape:
        raise DataError(
            f"delta_logits must have the shape of logits {tuple(logits.shape)}, got {tuple(delta_logits.shape)}"
        )
    temperature = _check_temperature(temperature)
    flat_delta = delta_logits.detach().reshape(-1, logits.shape[-1])
    out = torch.empty(flat_delta.shape[0], dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, chunk_size):
        du = flat_delta[start:stop].to(p.dtype) / temperature
        _check_finite_values(du, "delta_logits")
        out[start:stop] = _neg_cov_logp(p, logp, ent, du)
    return out.reshape(logits.shape[:-1])


def _check_scalar_or_shape(x: Tensor | float, shape: Sequence[int], name: str) -> Tensor | float:
    if isinstance(x, Tensor):
        try:
            ok = torch.broadcast_shapes(tuple(x.shape), tuple(shape)) == torch.Size(shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise DataError(f"{name} must broadcast to shape {tuple(shape)}, got {tuple(x.shape)}")
        _check_finite_values(x, name)
        return x.detach()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise DataError(f"{name}={x!r} must be a finite number or tensor")
    return float(x)


def pred_single_token_pg(
    logits: Tensor, tokens: Tensor, advantage: Tensor | float, lr: float, temperature: float = 1.0
) -> Tensor:
    """First-order ΔH of one vanilla policy-gradient step on a single sampled token: ``η · A · Φ(a)``.

    The step is ``Δu = η A (e_a − π)`` on the scaled logits ``u = z/τ`` (for a step on raw logits divide by τ²;
    module docstring). Natural PG for one token would give ``η A (s_a − H)`` instead (docs/theory.md §2).

    Args:
        logits: ``[..., V]``; tokens: ``[...]`` integer ids; advantage: float or tensor broadcastable to ``[...]``;
        lr: η (finite float); temperature: τ > 0.

    Returns:
        ``[...]`` predicted ΔH in nats (float32, float64 for float64 logits), detached.

    Raises:
        DataError: bad shapes, non-finite ``advantage``/``lr`` (plus the checks of :func:`entropy_sensitivity`).

    Source: docs/theory.md §2 (vanilla PG, one sampled token).
    """
    phi = entropy_sensitivity(logits, tokens, temperature)
    adv = _check_scalar_or_shape(advantage, phi.shape, "advantage")
    eta = _check_scalar_or_shape(lr, (), "lr")
    return (eta * adv * phi).to(phi.dtype)


def pred_expected_pg(
    logits: Tensor,
    advantages_per_token: Tensor,
    lr: float,
    natural: bool = False,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> Tensor:
    """First-order ΔH of the *expected* (natural) policy-gradient update at each position (Cui et al. 2025).

    * PG: the exact expected gradient on free logits is ``Δu_k = η π_k (A_k − E_π A)``, so
      ``ΔH ≈ −η Cov_{a∼π}(log π(a), π(a)(A(a) − E_π A))``. For centred advantages (E_π A = 0, true for
      A = Q − V) this is Cui et al.'s ``−η Cov(log π, π A)``; for uncentred A this exact form is what is returned.
    * NPG (``natural=True``): ``Δu = η A`` (up to a constant shift, which does not change π), so
      ``ΔH ≈ −η Cov_{a∼π}(log π(a), A(a))``.

    Args:
        logits: ``[..., V]`` float logits (``-inf`` allowed).
        advantages_per_token: ``[..., V]`` finite advantage A(a) of every token at each position.
        lr: η. natural: NPG instead of PG. temperature: τ > 0 (steps on u = z/τ). chunk_size: rows per chunk.

    Returns:
        ``[...]`` predicted ΔH in nats (float32, float64 for float64 logits), detached.

    Raises:
        DataError: shape mismatch or non-finite advantages / lr (plus the checks of :func:`entropy_from_logits`).

    Source: Cui et al. 2025 (arXiv 2505.22617), Thm. for softmax policies; docs/theory.md §2 (expected updates).
    """
    _check_logits(logits)
    _check_logits(advantages_per_token, "advantages_per_token")
    if advantages_per_token.shape != logits.shape:
        raise DataError(
            f"advantages_per_token must have the shape of logits {tuple(logits.shape)}, "
            f"got {tuple(advantages_per_token.shape)}"
        )
    temperature = _check_temperature(temperature)
    eta = _check_scalar_or_shape(lr, (), "lr")
    flat_adv = advantages_per_token.detach().reshape(-1, logits.shape[-1])
    out = torch.empty(flat_adv.shape[0], dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, chunk_size):
        adv = flat_adv[start:stop].to(p.dtype)
        _check_finite_values(adv, "advantages_per_token")
        if natural:
            du = adv
        else:
            du = p * (adv - (p * adv).sum(-1, keepdim=True))
        out[start:stop] = eta * _neg_cov_logp(p, logp, ent, du)
    return out.reshape(logits.shape[:-1])


def pred_grpo_group(
    logits: Tensor, tokens: Tensor, advantages: Tensor, lr: float, temperature: float = 1.0
) -> Tensor:
    """First-order ΔH of a GRPO group update at one shared state (per position of ``logits``' leading axes).

    G responses sample tokens ``a_i`` with advantages ``Â_i``; the update is
    ``Δu = (η/G) Σ_i Â_i (e_{a_i} − π)``. Its exact first-order entropy change is
    ``ΔH = (η/G) Σ_i Â_i Φ(a_i) = (η/G) [Σ_i Â_i π_{a_i}(s_{a_i} − H) − C · Σ_i Â_i]`` with
    ``C = Σ_k π_k²(s_k − H)``; when ``Σ_i Â_i = 0`` (GRPO's centred advantages) this is docs/theory.md's
    ``(η/G) Σ_i Â_i π_{a_i}(s_{a_i} − H)``.

    Args:
        logits: ``[..., V]`` (usually ``[V]``: one state).
        tokens: ``[..., G]`` integer ids sampled at that state. advantages: ``[..., G]`` finite Â_i.
        lr: η. temperature: τ > 0 (the step is on u = z/τ).

    Returns:
        ``[...]`` predicted ΔH in nats (0-dim for ``[V]`` logits), float32 (float64 for float64 logits), detached.

    Raises:
        DataError: shape mismatch, ids outside ``[0, V)``, non-finite advantages or lr, G = 0.

    Source: docs/theory.md §2 (GRPO group at one shared state; general-Â form *derived* as the sum of Φ terms).
    """
    _check_logits(logits)
    _check_tokens(tokens, logits, trailing=True)
    if not isinstance(advantages, Tensor) or tuple(advantages.shape) != tuple(tokens.shape):
        got = tuple(advantages.shape) if isinstance(advantages, Tensor) else type(advantages).__name__
        raise DataError(f"advantages must be a tensor of the tokens' shape {tuple(tokens.shape)}, got {got}")
    _check_finite_values(advantages, "advantages")
    group = tokens.shape[-1]
    if group < 1:
        raise DataError(f"a group needs G >= 1 tokens, got tokens of shape {tuple(tokens.shape)}")
    temperature = _check_temperature(temperature)
    eta = _check_scalar_or_shape(lr, (), "lr")
    flat_tok = tokens.reshape(-1, group).long()
    flat_adv = advantages.detach().reshape(-1, group)
    out = torch.empty(flat_tok.shape[0], dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, None):
        tok = flat_tok[start:stop]
        adv = flat_adv[start:stop].to(p.dtype)
        p_a, s_a = p.gather(-1, tok), -logp.gather(-1, tok)
        direct = (adv * p_a * (s_a - ent[:, None])).sum(-1)
        out[start:stop] = (eta / group) * (direct - _sensitivity_offset(p, logp, ent) * adv.sum(-1))
    return out.reshape(tokens.shape[:-1])


def pred_param_update(entropy: Tensor, params: Sequence[Tensor], deltas: Sequence[Tensor]) -> Tensor:
    """Exact first-order entropy change of an arbitrary parameter update: ``ΔH ≈ Σ_j ⟨∂H/∂θ_j, Δθ_j⟩``.

    Works for any model and optimizer (docs/theory.md §2, last point): pass the scalar entropy (e.g. the token-mean of
    :func:`entropy_from_logits`, with its autograd graph), the parameters and the update the optimizer applied
    (``Δθ = θ_after − θ_before``). The graph is retained, so ``entropy`` can be back-propagated again.

    Args:
        entropy: 0-dim float tensor that requires grad (nats).
        params: tensors (leaves or not) ``entropy`` depends on; a parameter it does not depend on contributes 0.
        deltas: tensors of the same shapes as ``params``.

    Returns:
        0-dim float tensor (the promoted dtype of the gradients, at least float32): predicted ΔH in nats, detached.

    Raises:
        DataError: ``entropy`` not a scalar with grad, ``params``/``deltas`` of different lengths or shapes,
            non-finite deltas.

    Source: docs/theory.md §2 ("for any model and optimizer ΔH ≈ ∇_θH · Δθ").
    """
    if not isinstance(entropy, Tensor) or entropy.numel() != 1 or not entropy.requires_grad:
        raise DataError("entropy must be a scalar tensor that requires grad (keep its autograd graph)")
    params, deltas = list(params), list(deltas)
    if len(params) != len(deltas):
        raise DataError(f"params and deltas must have the same length, got {len(params)} and {len(deltas)}")
    for j, (p, d) in enumerate(zip(params, deltas)):
        if not isinstance(d, Tensor) or tuple(p.shape) != tuple(d.shape):
            got = tuple(d.shape) if isinstance(d, Tensor) else type(d).__name__
            raise DataError(f"deltas[{j}] must have the shape of params[{j}] {tuple(p.shape)}, got {got}")
        _check_finite_values(d, f"deltas[{j}]")
    grads = torch.autograd.grad(entropy.reshape(()), params, retain_graph=True, allow_unused=True)
    total = torch.zeros((), dtype=torch.promote_types(entropy.dtype, torch.float32), device=entropy.device)
    for g, d in zip(grads, deltas):
        if g is not None:
            total = total + (g.detach().to(total.dtype) * d.detach().to(total.dtype)).sum()
    return total
