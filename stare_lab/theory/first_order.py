"""First-order entropy dynamics of softmax policies: Φ, s* and the predicted entropy change of an update
(docs/theory.md §2). Diagnostics: chunked like :mod:`stare_lab.loss.entropy`, no autograd, detached results (except
:func:`pred_param_update`, which differentiates the entropy it is given). Entropy and surprisal in nats.

Temperature and the first-order predictors. Φ, :func:`predicted_entropy_change` and the ``pred_*`` functions
describe a step on the *scaled* logits ``u = z / τ``: a logit step ``Δz`` is a step ``Δu = Δz / τ``. The named
policy-gradient predictors assume the update is written on ``u`` (e.g. ``Δu = η A (e_a − π)``); a vanilla PG step
taken on the raw logits ``z`` has ``Δz = η A (e_a − π) / τ``, i.e. ``Δu`` smaller by ``1/τ²``, so its ΔH is the
predictor's value divided by ``τ²``. At τ = 1 the two coincide.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from torch import Tensor

from stare_lab.loss.entropy import (
    _check_chunk,
    _check_finite_values,
    _check_logits,
    _check_temperature,
    _check_tokens,
    _compute_dtype,
    _ranges,
    _row_max,
)
from stare_lab.errors import DataError

__all__ = [
    "entropy_sensitivity",
    "critical_surprisal",
    "share_above_critical",
    "mass_above_critical",
    "predicted_entropy_change",
    "logprob_change",
    "token_first_order",
    "pred_single_token_pg",
    "pred_expected_pg",
    "pred_grpo_group",
    "pred_param_update",
]


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
        out[start:stop] = _critical_from(p, logp, ent).to(out.dtype)
    return out.reshape(logits.shape[:-1])


def _critical_from(p: Tensor, logp: Tensor, ent: Tensor) -> Tensor:
    """s* per row of one chunk of :func:`_distribution_chunks` (float64; :func:`critical_surprisal`)."""
    h = ent.double().clamp(min=0.0)
    c = torch.maximum(_sensitivity_offset(p, logp, ent).double().clamp(max=0.0), -h)
    lo, hi = torch.zeros_like(h), h.clone()
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        below = torch.exp(-mid) * (mid - h) < c  # f(mid) < C → root is above mid
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return 0.5 * (lo + hi)


def _check_token_step(
    logits: Tensor, delta_logits: Tensor, tokens: Tensor, temperature: float
) -> tuple[Tensor, Tensor, float]:
    """The shared checks of a logit step at sampled tokens: ``(delta_logits [N, V] detached, tokens [N, 1] int64,
    temperature)``. Raises DataError / ConfigError as :func:`logprob_change`."""
    _check_logits(logits)
    _check_logits(delta_logits, "delta_logits")
    if delta_logits.shape != logits.shape:
        raise DataError(
            f"delta_logits must have the shape of logits {tuple(logits.shape)}, got {tuple(delta_logits.shape)}"
        )
    _check_tokens(tokens, logits)
    return (delta_logits.detach().reshape(-1, logits.shape[-1]), tokens.reshape(-1, 1).long(),
            _check_temperature(temperature))


def token_first_order(
    logits: Tensor, delta_logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Per position, in one pass over the vocabulary (one softmax per chunk instead of four): log π of ``tokens``
    (0 for a token with π = 0), H, :func:`logprob_change`, :func:`predicted_entropy_change` and
    :func:`critical_surprisal` of ``logits`` / ``delta_logits`` (``[..., V]``; ``tokens`` ``[...]``).

    Returns:
        ``(logprobs, entropy, d_logprobs, d_entropy, s_star)``, each ``[...]`` float32 (float64 for float64
        logits), detached, nats.

    Raises:
        DataError / ConfigError: as :func:`logprob_change`. Source: docs/theory.md §2.
    """
    flat_delta, flat_tok, temperature = _check_token_step(logits, delta_logits, tokens, temperature)
    outs = [torch.empty(flat_delta.shape[0], dtype=_compute_dtype(logits), device=logits.device) for _ in range(5)]
    for start, stop, p, logp, ent in _distribution_chunks(logits, temperature, chunk_size):
        du = flat_delta[start:stop].to(p.dtype) / temperature
        _check_finite_values(du, "delta_logits")
        tok = flat_tok[start:stop]
        outs[0][start:stop] = logp.gather(-1, tok)[:, 0]
        outs[1][start:stop] = ent
        outs[2][start:stop] = du.gather(-1, tok)[:, 0] - (p * du).sum(-1)
        outs[3][start:stop] = _neg_cov_logp(p, logp, ent, du)
        outs[4][start:stop] = _critical_from(p, logp, ent).to(outs[4].dtype)
    lp, h, dlp, dh, s_star = (o.reshape(tokens.shape) for o in outs)
    return lp, h, dlp, dh, s_star


def mass_above_critical(surprisal: Tensor, s_star: Tensor, mask: Tensor) -> tuple[float, float]:
    """The two sums of :func:`share_above_critical`: ``(Σ_{mask, s > s*} π_a, Σ_mask π_a)`` with ``π_a = exp(−s_a)``
    (float64), so that shares of several micro-batches or ranks can be combined (sum each, then divide). A floating
    ``mask`` holds weights ≥ 0 (each π_a counted that many times), as in :func:`share_above_critical`.

    Raises:
        DataError: shapes differ, or a floating ``mask`` has a negative or non-finite weight.
    """
    if not (surprisal.shape == s_star.shape == mask.shape):
        raise DataError(f"share_above_critical: shapes {tuple(surprisal.shape)}, {tuple(s_star.shape)} and "
                        f"{tuple(mask.shape)} differ")
    s = surprisal.detach().double()
    if mask.is_floating_point():
        if not bool(torch.isfinite(mask).all() and (mask >= 0).all()):
            raise DataError("share_above_critical: a floating mask holds weights, which must be finite and >= 0")
        p = mask.detach().double().to(s.device) * torch.exp(-s)
    else:
        p = torch.where(mask.detach().bool(), torch.exp(-s), torch.zeros((), dtype=torch.float64, device=s.device))
    above = torch.where(s > s_star.detach().double().to(s.device), p, torch.zeros_like(p))
    return float(above.sum()), float(p.sum())


def share_above_critical(surprisal: Tensor, s_star: Tensor, mask: Tensor) -> float | None:
    """The share of the selected tokens' probability mass whose surprisal is above its position's ``s*``:
    ``Σ_{mask, s > s*} π_a / Σ_mask π_a`` with ``π_a = exp(−s_a)``. With ``mask`` = L+ these are the tokens whose
    reinforcement raises the entropy (Φ > 0); the rest of L+ lowers it (docs/theory.md §2, §8).

    Args:
        surprisal: ``[...]`` surprisal ``s_a = −log π_a`` of the sampled tokens (nats).
        s_star: ``[...]`` the critical surprisal of each token's position (:func:`critical_surprisal`).
        mask: ``[...]`` bool / integer 0-1, the selected tokens (e.g. L+); or a floating tensor of weights ≥ 0
            (e.g. the expected number of times each token of a table is in L+, the mean-field limit), each entry's
            π_a counted that many times: ``Σ w·π_a·1[s > s*] / Σ w·π_a``.

    Returns:
        The share in [0, 1] (float64 sums, :func:`mass_above_critical`), or ``None`` when the mask selects no token.

    Raises:
        DataError: shapes differ, or a floating ``mask`` has a negative or non-finite weight.

    Source: docs/theory.md §8 (the L+-above-s* calibration target).
    """
    above, total = mass_above_critical(surprisal, s_star, mask)
    return above / total if total > 0 else None


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


def logprob_change(
    logits: Tensor, delta_logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> Tensor:
    """Exact first-order change of the log-probability of ``tokens`` for a logit change ``delta_logits``:
    ``Δ log π_a ≈ (Δz_a − Σ_k π_k Δz_k) / τ`` (``∂log π_a/∂z_k = (δ_ak − π_k)/τ``). With ``delta_logits`` the
    directional derivative of the logits along a parameter direction v (a forward-mode pass), this is
    ``∇θ log π_a · v``. Masked tokens (π = 0) contribute nothing to the mean.

    Args:
        logits: ``[..., V]`` float logits (``-inf`` allowed). delta_logits: ``[..., V]`` finite, the same shape.
        tokens: ``[...]`` integer ids in ``[0, V)``. temperature: τ > 0. chunk_size: rows per chunk (None → default).

    Returns:
        ``[...]`` float32 (float64 for float64 logits), detached.

    Raises:
        DataError: shapes differ, ids out of range, non-finite ``delta_logits`` (plus the checks of
            :func:`logprobs_from_logits`). ConfigError: bad ``temperature`` / ``chunk_size``.

    Source: docs/theory.md §2 (the softmax Jacobian).
    """
    flat_delta, flat_tok, temperature = _check_token_step(logits, delta_logits, tokens, temperature)
    out = torch.empty(flat_delta.shape[0], dtype=_compute_dtype(logits), device=logits.device)
    for start, stop, p, _, _ in _distribution_chunks(logits, temperature, chunk_size):
        dz = flat_delta[start:stop].to(p.dtype)
        _check_finite_values(dz, "delta_logits")
        out[start:stop] = (dz.gather(-1, flat_tok[start:stop])[:, 0] - (p * dz).sum(-1)) / temperature
    return out.reshape(tokens.shape)


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
