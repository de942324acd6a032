"""One training step's batch and its preparation: everything computed once per step, before the update.

A caller (trainer, simulators) builds a :class:`StepBatch` of padded ``[B, T]`` tensors — its share of the step's
rollouts — and calls :func:`prepare_step` once. Over the whole step (all ranks, through a
:class:`~stare_lab.collective.Collective`) it computes

* the token and sequence counts (the loss normalisers ``global_num_tokens`` / ``global_num_sequences``) and the
  batch token-mean entropy H̄ — all the step's named sums in ONE collective;
* the STARE gate and W/M, decided by the :class:`~stare_lab.loss.stare.STAREController` (docs/theory.md §4 step 3) through
  :func:`step_gate`, the one place the gate is decided;
* the STARE sets L± (kept, :class:`~stare_lab.loss.stare.STARESelection`), ω and its statistics for scope ``global``
  (docs/theory.md §4 step 4), exact over all ranks (:mod:`stare_lab.selection.distributed` reduces radix histograms;
  nothing is gathered);
* each global statistic the loss declared at registration (:class:`~stare_lab.loss.registry.LossNeeds`,
  :data:`GLOBAL_STATS`): token-means (Clip-Cov / KL-Cov's covariance centres), top quantiles (the forking-token
  entropy threshold), a seeded generator (Clip-Cov's random subset);

and returns a :class:`PreparedStep` whose :meth:`~PreparedStep.inputs` builds the
:class:`~stare_lab.loss.losses.PolicyLossInputs` of any micro-batch (a row slice), so
``compute_policy_loss(config.loss_mode, prepared.inputs(logprobs, rows), config)`` summed over the micro-batches
and ranks is the loss of the whole step, whatever the micro-batch size or the number of ranks.

Exactness across ranks: counts and histograms are integers; the float sums behind the token-means (H̄, the mean
log-prob and advantage) are accumulated in fixed point (:data:`FIXED_POINT_BITS` fractional bits, int64), so they
do not depend on the order of summation: 1 rank and N ranks give the same bits (the quantisation error of a mean is
below 2⁻²⁵ ≈ 3e-8, under float32 resolution).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from stare_lab.collective import Collective, LocalCollective, reduce_named
from stare_lab.config import LossConfig
from stare_lab.errors import ConfigError, DataError
from stare_lab.selection.distributed import distributed_top_k, key_to_float, ordered_keys, surprisal_keys
from stare_lab.loss.global_stats import GLOBAL_STATS, STEP_FIELDS, StepGenerator, TokenMean, TopQuantile, register_global_stat
from stare_lab.loss.registry import LossNeeds, PolicyLossInputs, _as_config, loss_needs
from stare_lab.loss.losses import forking_entropy_threshold  # also registers the built-in losses before their needs are read
from stare_lab.selection.radix import num_selected
from stare_lab.loss.stare import STAREController, STARESelection, select_stare_sets

__all__ = [
    "StepBatch",
    "PreparedStep",
    "prepare_step",
    "step_gate",
    "TokenMean",
    "TopQuantile",
    "StepGenerator",
    "GLOBAL_STATS",
    "register_global_stat",
    "FIXED_POINT_BITS",
]

#: Fractional bits of the fixed-point sums behind the step's token-means (resolution 2⁻²⁴ ≈ 6e-8 per token).
FIXED_POINT_BITS = 24
_SCALE = float(1 << FIXED_POINT_BITS)
#: Largest Σ|round(x·2²⁴)| over the step a fixed-point sum may hold (int64 headroom: 2⁶²; Σ|x| < 2³⁸).
_FIXED_LIMIT = float(2**62)


@dataclasses.dataclass
class StepBatch:
    """One rank's share of a step's training tokens, padded to ``[B, T]`` (docs/design.md §1).

    Attributes:
        response_mask: ``[B, T]`` bool or 0/1 (stored as bool); False marks padding and tokens left out of the loss.
        advantages: ``[B]`` (one per sequence) or ``[B, T]`` float.
        old_logprobs: ``[B, T]`` float log π_old of the sampled tokens (nats); on-policy also the surprisal source.
        entropy: ``[B, T]`` float per-token entropy of π_old (nats), or None. Needed for H̄ (the gate) unless
            :func:`prepare_step` gets ``batch_entropy``, and by losses that declare ``entropy``.
        rollout_logprobs: ``[B, T]`` log-probs of the inference engine (for ``tis_cap``), or None.
        ref_logprobs: ``[B, T]`` log π_ref (for ``kl_coef > 0``), or None.
        group_ids: ``[B]`` int64 prompt-group index of each sequence, or None; a group lives on one rank.

    Padding entries must be finite (they are never read as values, but the losses check every entry). Across
    ranks, every rank's batch sets the same optional fields (they decide which sums travel in the collective).

    Raises:
        DataError: on a shape or dtype mismatch (the message names the field).
    """

    response_mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor
    entropy: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    ref_logprobs: Tensor | None = None
    group_ids: Tensor | None = None

    def __post_init__(self) -> None:
        lp = self.old_logprobs
        if not isinstance(lp, Tensor) or lp.dim() != 2 or not lp.is_floating_point():
            raise DataError(f"StepBatch.old_logprobs must be a float [B, T] tensor, got "
                            f"{getattr(lp, 'dtype', type(lp).__name__)} of shape {tuple(getattr(lp, 'shape', ()))}")
        shape = lp.shape
        mask = self.response_mask
        if not isinstance(mask, Tensor) or mask.shape != shape:
            raise DataError(f"StepBatch.response_mask has shape {tuple(getattr(mask, 'shape', ()))}, "
                            f"expected {tuple(shape)}")
        if mask.dtype != torch.bool:
            if mask.is_complex():
                raise DataError(f"StepBatch.response_mask must be bool or 0/1, got dtype {mask.dtype}")
            self.response_mask = mask != 0
        for name in STEP_FIELDS[1:]:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, Tensor) or value.shape != shape
                                      or not value.is_floating_point()):
                raise DataError(f"StepBatch.{name} must be a float tensor of shape {tuple(shape)}, got "
                                f"{getattr(value, 'dtype', type(value).__name__)} of shape "
                                f"{tuple(getattr(value, 'shape', ()))}")
        adv = self.advantages
        if not isinstance(adv, Tensor) or adv.shape not in (shape[:1], shape) or not adv.is_floating_point():
            raise DataError(f"StepBatch.advantages must be a float tensor of shape [B]={tuple(shape[:1])} or "
                            f"[B, T]={tuple(shape)}, got {getattr(adv, 'dtype', type(adv).__name__)} of shape "
                            f"{tuple(getattr(adv, 'shape', ()))}")
        g = self.group_ids
        if g is not None and (not isinstance(g, Tensor) or g.shape != shape[:1] or g.is_floating_point()):
            raise DataError(f"StepBatch.group_ids must be an integer tensor of shape {tuple(shape[:1])}, got "
                            f"{getattr(g, 'dtype', type(g).__name__)} of shape {tuple(getattr(g, 'shape', ()))}")

    @classmethod
    def from_rows(
        cls,
        old_logprobs: Sequence[Tensor],
        advantages: Tensor,
        response_mask: Sequence[Tensor] | None = None,
        *,
        entropy: Sequence[Tensor] | None = None,
        rollout_logprobs: Sequence[Tensor] | None = None,
        ref_logprobs: Sequence[Tensor] | None = None,
        group_ids: Tensor | None = None,
    ) -> "StepBatch":
        """A batch from per-sequence ``[T_i]`` tensors, right-padded once to ``T = max T_i``
        (``torch.nn.utils.rnn.pad_sequence``): padding is 0 and outside the mask.

        Args:
            old_logprobs: B tensors ``[T_i]``.
            advantages: ``[B]``.
            response_mask: B bool/0-1 tensors ``[T_i]`` (e.g. a tool-use loss mask); None → every token valid.
            entropy, rollout_logprobs, ref_logprobs: B tensors ``[T_i]`` each, or None.
            group_ids: ``[B]`` integers, or None.

        Raises:
            DataError: if a row's length differs between the fields.
        """
        from torch.nn.utils.rnn import pad_sequence

        lengths = [int(x.shape[0]) for x in old_logprobs]
        if response_mask is None:
            response_mask = [torch.ones(n, dtype=torch.bool, device=x.device) for n, x in zip(lengths, old_logprobs)]

        def pad(rows: Sequence[Tensor] | None, name: str) -> Tensor | None:
            if rows is None:
                return None
            got = [int(r.shape[0]) for r in rows]
            if len(got) != len(lengths):
                raise DataError(f"StepBatch.from_rows: {name} has {len(got)} rows, old_logprobs {len(lengths)}")
            bad = next((i for i, (a, b) in enumerate(zip(got, lengths)) if a != b), None)
            if bad is not None:
                raise DataError(f"StepBatch.from_rows: row {bad} of {name} has {got[bad]} tokens, old_logprobs "
                                f"{lengths[bad]} (row lengths must agree)")
            if not rows:
                return torch.zeros((0, 0))
            return pad_sequence(list(rows), batch_first=True)

        mask = pad([m != 0 for m in response_mask], "response_mask")
        return cls(mask, advantages, pad(old_logprobs, "old_logprobs"), entropy=pad(entropy, "entropy"),
                   rollout_logprobs=pad(rollout_logprobs, "rollout_logprobs"),
                   ref_logprobs=pad(ref_logprobs, "ref_logprobs"), group_ids=group_ids)

    @property
    def shape(self) -> torch.Size:
        """``(B, T)``."""
        return self.old_logprobs.shape

    def advantages_bt(self) -> Tensor:
        """The advantages broadcast to ``[B, T]`` (a view for ``[B]`` advantages)."""
        adv = self.advantages
        return adv.unsqueeze(-1).expand(self.shape) if adv.dim() == 1 else adv


# ------------------------------------------------------------------------------------------------------------
# the prepared step
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PreparedStep:
    """What :func:`prepare_step` computed over the whole step (identical on every rank except ``token_weights``,
    this rank's rows). Build each micro-batch's loss inputs with :meth:`inputs`.

    Attributes:
        batch: this rank's :class:`StepBatch`.
        config: the :class:`LossConfig`; ``config.loss_mode`` names the loss.
        needs: what the loss reads (:func:`stare_lab.loss.losses.loss_needs`).
        num_tokens: valid tokens of the whole step (``global_num_tokens``).
        num_sequences: sequences with ≥ 1 valid token in the whole step (``global_num_sequences``).
        entropy: the batch token-mean entropy H̄ (nats) the gate saw (``batch_entropy`` if given), None when
            unknown or there is no valid token.
        skip: True when the step has no valid token: there is nothing to update (the controller was left as is).
        gate_on, reweight_w, reweight_m: the step's STARE gate and W/M (False, 1.0, 1.0 for a loss without STARE:
            ω ≡ 1).
        token_weights: ``[B, T]`` float32 ω of this rank's rows (scope ``global`` with the gate on), else None.
        stare_stats: counts and fractions of the selection (``stare/…``, 0-dim tensors) when ω was computed.
        global_stats: name → value of each declared global statistic.
        num_groups: prompt groups with ≥ 1 valid token over the whole step (when the batch has ``group_ids``).
        selection: the sets L+ (and L− for C2) behind ω, on this rank's rows
            (:class:`~stare_lab.loss.stare.STARESelection`), whenever ω was computed; else None.
    """

    batch: StepBatch
    config: LossConfig
    needs: LossNeeds
    num_tokens: int
    num_sequences: int
    entropy: float | None
    skip: bool
    gate_on: bool
    reweight_w: float
    reweight_m: float
    token_weights: Tensor | None
    stare_stats: dict[str, Any] | None
    global_stats: dict[str, Any]
    num_groups: int | None = None
    selection: STARESelection | None = None

    def metrics(self) -> dict[str, Any]:
        """The step's row entries (docs/design.md §4 keys): ``entropy`` (H̄ or None), ``gate_on`` (0/1), ``stare_w``,
        ``stare_m``, ``num_tokens``, ``num_sequences``, ``num_groups`` (with group ids) and, when ω was computed,
        ``stare/num_pos_selected`` … ``stare/frac_neg_selected`` as floats."""
        row: dict[str, Any] = {"entropy": self.entropy, "gate_on": int(self.gate_on), "stare_w": self.reweight_w,
                               "stare_m": self.reweight_m, "num_tokens": self.num_tokens,
                               "num_sequences": self.num_sequences}
        if self.num_groups is not None:
            row["num_groups"] = self.num_groups
        if self.stare_stats is not None:
            keys = [k for k, v in self.stare_stats.items() if isinstance(v, Tensor)]
            row.update(zip(keys, torch.stack([self.stare_stats[k].double() for k in keys]).tolist()))
        return row

    def inputs(
        self,
        logprobs: Tensor,
        rows: slice | Sequence[int] | Tensor | None = None,
        *,
        entropy: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
    ) -> PolicyLossInputs:
        """The :class:`~stare_lab.loss.losses.PolicyLossInputs` of one micro-batch: rows ``rows`` of this rank's batch.

        Args:
            logprobs: ``[b, t]`` log π_θ of the micro-batch's sampled tokens (with their graph), ``t ≤ T``: a
                micro-batch may be padded to its own longest response if every column from ``t`` on is padding.
            rows: a slice, indices or a bool/int tensor of rows of the batch (``b`` of them); None = all rows.
            entropy: ``[b, t]`` the current policy's entropy with its graph; required when the loss needs
                ``entropy_grad`` (``entropy_coeff > 0``). Otherwise the batch's old entropies are passed when the
                loss reads entropy.
            ref_logprobs: ``[b, t]`` log π_ref for these rows; default: the batch's.

        Returns:
            The inputs, with the step's global normalisers, gate, W/M, ω and declared statistics, on the device of
            ``logprobs``.

        Raises:
            DataError: wrong shapes, columns from ``t`` on that hold valid tokens, or a needed input missing.
        """
        b = self.batch
        idx = _row_index(rows, b.shape[0])
        if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
            raise DataError(f"logprobs must be a [b, t] tensor, got shape {tuple(getattr(logprobs, 'shape', ()))}")
        n_rows = b.shape[0] if idx is None else idx.numel()
        t = logprobs.shape[1]
        if logprobs.shape[0] != n_rows or t > b.shape[1]:
            raise DataError(f"logprobs has shape {tuple(logprobs.shape)}; expected [{n_rows}, t] with "
                            f"t <= T={b.shape[1]} for these rows")
        dev = logprobs.device

        def take(x: Tensor | None, per_token: bool = True) -> Tensor | None:
            if x is None:
                return None
            x = x if idx is None else x.index_select(0, idx.to(x.device))
            return (x[:, :t] if per_token and x.dim() == 2 else x).to(dev)

        mask_rows = b.response_mask if idx is None else b.response_mask.index_select(0, idx.to(b.response_mask.device))
        if t < b.shape[1] and bool(mask_rows[:, t:].any()):
            raise DataError(f"logprobs has {t} columns but these rows have valid tokens beyond column {t}")
        needs = self.needs
        if needs.entropy_grad:
            if entropy is None:
                raise DataError(f"loss {self.config.loss_mode!r} with entropy_coeff={self.config.entropy_coeff} "
                                "needs the current policy's entropy (with its graph): pass entropy=")
            ent = entropy
        else:  # the old entropies whenever the batch has them (they also give the loss/entropy metric)
            ent = entropy if entropy is not None else take(b.entropy)
        if needs.entropy and ent is None:
            raise DataError(f"loss {self.config.loss_mode!r} needs per-token entropy: StepBatch.entropy is None")
        ref = ref_logprobs if ref_logprobs is not None else take(b.ref_logprobs)
        stats = self.global_stats
        return PolicyLossInputs(
            logprobs=logprobs,
            old_logprobs=take(b.old_logprobs),
            advantages=take(b.advantages),
            response_mask=mask_rows[:, :t].to(dev),
            entropy=ent,
            rollout_logprobs=take(b.rollout_logprobs),
            token_weights=take(self.token_weights),
            ref_logprobs=ref,
            global_num_tokens=self.num_tokens,
            global_num_sequences=self.num_sequences,
            gate_on=self.gate_on if needs.stare else None,
            reweight_w=self.reweight_w if needs.stare else None,
            reweight_m=self.reweight_m if needs.stare else None,
            logprob_mean=stats.get("logprob_mean"),
            advantage_mean=stats.get("advantage_mean"),
            entropy_threshold=stats.get("entropy_threshold"),
            generator=stats.get("generator"),
            stare_stats=self.stare_stats,
            global_stats=stats,
        )


def _row_index(rows: slice | Sequence[int] | Tensor | None, n: int) -> Tensor | None:
    if rows is None:
        return None
    if isinstance(rows, slice):
        return torch.arange(n)[rows]
    idx = torch.as_tensor(rows)
    if idx.dtype == torch.bool:
        if idx.shape != (n,):
            raise DataError(f"a bool row mask must have shape ({n},), got {tuple(idx.shape)}")
        return idx.nonzero().squeeze(1)
    if idx.is_floating_point() or idx.dim() != 1:
        raise DataError(f"rows must be a slice, a list of row indices or a 1-D integer/bool tensor, got {rows!r}")
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise DataError(f"row indices must lie in [0, {n}), got min {int(idx.min())}, max {int(idx.max())}")
    return idx.to(torch.int64) % max(n, 1)


# ------------------------------------------------------------------------------------------------------------
# the preparation
# ------------------------------------------------------------------------------------------------------------


def _fixed_point(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(Σ round(x·2^FIXED_POINT_BITS) over the valid tokens as int64, the same Σ of |·| in float64 for the range
    check).

    Exact in the values' own float type: scaling by a power of two is exact, rounding a float to an integer is
    exact (an integer-valued float32 above 2²⁴ is already an integer), and ``sum(dtype=int64)`` converts each
    element before adding, so no float64 copy is made."""
    x = values.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)
    q = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).mul_(_SCALE).round_()
    return q.sum(dtype=torch.int64), q.abs_().sum(dtype=torch.float64)


def _step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(step), int(rank)]).generate_state(1)[0])


def prepare_step(
    batch: StepBatch,
    config: LossConfig | Mapping[str, Any] | None = None,
    *,
    controller: STAREController | None = None,
    collective: Collective | None = None,
    step: int = 0,
    seed: int = 0,
    batch_entropy: float | None = None,
) -> PreparedStep:
    """Prepare one optimizer step of the loss ``config.loss_mode`` over the whole (all-rank) batch.

    Every rank calls it once per step with its own rows, before the update; the result is the same on every rank
    (except this rank's ω) and the same as one process with the ranks' batches concatenated in rank order.

    Order: (1) the named sums in one collective — valid tokens N, sequences S, Σ entropy, and the sums of each
    declared token-mean; (2) the gate and W/M: ``controller.update(H̄)`` when the loss uses STARE and there is a
    valid token (H̄ = ``batch_entropy`` if given, else the token-mean of ``batch.entropy``); (3) when the gate is on
    and scope is ``global``: the sets L± over all ranks (docs/theory.md §4: the k = max(1, ⌈P·|T±|⌉)
    highest-surprisal tokens of T±, surprisal from ``old_logprobs``, ties by global position), kept as
    ``selection``, and ω from them; (4) declared top quantiles; (5) the seeded generator. Collectives (none on one
    rank): 1, plus 3 when (3) or (4) runs. On one rank the sets and the quantiles come from
    :func:`stare_lab.loss.stare.select_stare_sets` and
    :func:`stare_lab.loss.losses.forking_entropy_threshold` themselves; across ranks from :mod:`stare_lab.selection.distributed`,
    which gives the same bits.

    Args:
        batch: this rank's :class:`StepBatch`.
        config: :class:`LossConfig` (or a mapping of its keys); ``loss_mode`` names the registered loss.
        controller: the run's :class:`STAREController` (updated here, once per step, when the loss uses STARE);
            None → a fresh one for this step (only without ``stare.adaptive``, whose W/M need the run's state).
        collective: the data-parallel ranks (:class:`~stare_lab.collective.TorchCollective`); None → one process.
        step: the optimizer step number (seeds the generator).
        seed: the run seed (seeds the generator).
        batch_entropy: H̄ (nats) measured by the caller (e.g. the tabular simulator's exact mean over states);
            None → the token-mean of ``batch.entropy`` over the whole step.

    Returns:
        A :class:`PreparedStep`.

    Raises:
        ConfigError: unknown loss, bad config, an undeclared global statistic, or ``stare.adaptive`` without a
            controller.
        DataError: a needed field missing from the batch (entropy for the gate or a declared statistic), a
            non-finite value on a valid token of a summed field, or sums beyond the fixed-point range.
    """
    cfg = _as_config(config)
    needs = loss_needs(cfg.loss_mode, cfg)
    coll = LocalCollective() if collective is None else collective
    unknown = [n for n in needs.global_stats if n not in GLOBAL_STATS]
    if unknown:
        raise ConfigError(f"loss {cfg.loss_mode!r} declares global statistic(s) {unknown} that are not in "
                          f"GLOBAL_STATS {{{', '.join(map(repr, GLOBAL_STATS))}}} (register_global_stat)")
    stat_defs = {n: GLOBAL_STATS[n] for n in needs.global_stats}
    mask = batch.response_mask
    device = mask.device
    gate_needs_entropy = needs.stare and (cfg.stare.gate == "entropy" or cfg.stare.adaptive)
    if needs.stare and controller is None:
        if cfg.stare.adaptive:
            raise ConfigError("stare.adaptive=true needs the run's STAREController (its W/M carry over steps): "
                              "pass controller=")
        controller = STAREController(cfg.stare)

    # (1) every named sum in one collective
    summed: dict[str, str] = {}  # sum name -> field
    if batch.entropy is not None:
        summed["sum/entropy"] = "entropy"
    elif gate_needs_entropy and batch_entropy is None:
        raise DataError(f"stare.gate={cfg.stare.gate!r} needs the batch entropy: StepBatch.entropy is None and "
                        "no batch_entropy was given")
    for name, d in stat_defs.items():
        if isinstance(d, (TokenMean, TopQuantile)) and _field(batch, d.field) is None:
            raise DataError(f"loss {cfg.loss_mode!r} needs global statistic {name!r} of StepBatch.{d.field}, "
                            "which is None")
        if isinstance(d, TokenMean):
            summed[f"sum/{d.field}"] = d.field
    has_token = mask.any(-1)
    values: dict[str, Tensor] = {
        "num_tokens": torch.count_nonzero(mask).to(torch.int64),
        "num_sequences": torch.count_nonzero(has_token).to(torch.int64),
    }
    if batch.group_ids is not None:
        values["num_groups"] = torch.tensor(torch.unique(batch.group_ids[has_token]).numel(),
                                            dtype=torch.int64, device=device)
    abs_sums = []
    for key, field in summed.items():
        values[key], abs_sum = _fixed_point(_field(batch, field), mask)
        abs_sums.append(abs_sum)
    if abs_sums:
        limit = _FIXED_LIMIT / coll.world_size
        for (key, field), a in zip(summed.items(), torch.stack(abs_sums).tolist()):
            if not math.isfinite(a):
                raise DataError(f"StepBatch.{field} has a non-finite value on a valid token (or one beyond "
                                "the float range once scaled by 2^24)")
            if a >= limit:
                raise DataError(f"StepBatch.{field}: Σ|x| over this rank's valid tokens is {a / _SCALE:.3g}, "
                                f"beyond the fixed-point range {limit / _SCALE:.3g} of the step's sums")
    reduced = reduce_named(coll, values)
    host = dict(zip(reduced, torch.stack(list(reduced.values())).tolist()))
    n_tok, n_seq = int(host["num_tokens"]), int(host["num_sequences"])
    means = {field: (host[key] / _SCALE / n_tok if n_tok else 0.0) for key, field in summed.items()}
    skip = n_tok == 0
    h_bar = None if skip else (float(batch_entropy) if batch_entropy is not None else means.get("entropy"))

    # (2) the gate and W/M, decided by the controller (the one place: step_gate)
    gate_on, w, m = step_gate(cfg, controller, None if skip else h_bar, needs=needs)

    # (3) ω (scope global) and (4) top quantiles, over all ranks
    weights, stare_stats, selection = None, None, None
    want_weights = needs.token_weights and gate_on and not skip
    quantiles = {n: d for n, d in stat_defs.items() if isinstance(d, TopQuantile)}
    stats: dict[str, Any] = {n: means[d.field] for n, d in stat_defs.items() if isinstance(d, TokenMean)}
    if coll.world_size == 1:
        if want_weights:
            selection = select_stare_sets(batch.old_logprobs, batch.advantages, mask, cfg.stare.top_p_ratio,
                                          variant=cfg.stare.variant)
        for n, d in quantiles.items():
            stats[n] = forking_entropy_threshold(_field(batch, d.field), mask, d.quantile(cfg))
    elif want_weights or quantiles:
        selection, qvals = _distributed_selections(batch, cfg, coll, want_weights, quantiles, n_tok)
        stats.update(qvals)
    if selection is not None:
        weights = selection.weights(w, m)
        stare_stats = {"stare/gate_on": 1.0, "stare/w": w, "stare/m": m, **selection.counts}
    if needs.token_weights and not want_weights:
        stare_stats = _zero_stare_stats(gate_on, w, m, device) if needs.stare else None

    # (5) the seeded generator
    for n, d in stat_defs.items():
        if isinstance(d, StepGenerator):
            stats[n] = torch.Generator(device=device).manual_seed(_step_seed(seed, step, coll.rank))
    return PreparedStep(batch=batch, config=cfg, needs=needs, num_tokens=n_tok, num_sequences=n_seq,
                        entropy=h_bar, skip=skip, gate_on=gate_on, reweight_w=w, reweight_m=m,
                        token_weights=weights, stare_stats=stare_stats, global_stats=stats,
                        num_groups=int(host["num_groups"]) if "num_groups" in host else None, selection=selection)


def step_gate(
    config: LossConfig | Mapping[str, Any] | None,
    controller: STAREController | None,
    batch_entropy: float | None,
    *,
    needs: LossNeeds | None = None,
) -> tuple[bool, float, float]:
    """The step's STARE gate and W/M — the one rule, used by :func:`prepare_step` and by callers without a token
    batch (the tabular simulator's mean-field mode, whose "batch" is the policy itself).

    A loss without STARE (``needs.stare`` False): ``(False, 1.0, 1.0)`` (ω ≡ 1). Otherwise ``controller.update(H̄)``
    once (docs/theory.md §4 step 3) when ``batch_entropy`` is given — None (no valid token: a skipped step, or no
    entropy measured) leaves the controller as it is — and the controller's ``(gate_on, reweight_w, reweight_m)``.

    Args:
        config: the :class:`LossConfig` (or a mapping of its keys).
        controller: the run's controller; None → a fresh one (only without ``stare.adaptive``).
        batch_entropy: H̄ (nats) of the step, or None.
        needs: :func:`~stare_lab.loss.registry.loss_needs` of the config, if the caller has it (saves the lookup).

    Raises:
        ConfigError: unknown loss or bad config; ``stare.adaptive`` without a controller.
    """
    cfg = _as_config(config)
    needs = loss_needs(cfg.loss_mode, cfg) if needs is None else needs
    if not needs.stare:
        return False, 1.0, 1.0
    if controller is None:
        if cfg.stare.adaptive:
            raise ConfigError("stare.adaptive=true needs the run's STAREController (its W/M carry over steps): "
                              "pass controller=")
        controller = STAREController(cfg.stare)
    if batch_entropy is not None:
        controller.update(batch_entropy)
    return bool(controller.gate_on), float(controller.reweight_w), float(controller.reweight_m)


def _field(batch: StepBatch, field: str) -> Tensor | None:
    return batch.advantages_bt() if field == "advantages" else getattr(batch, field)


def _zero_stare_stats(gate_on: bool, w: float, m: float, device: torch.device) -> dict[str, Any]:
    zero = torch.zeros((), dtype=torch.int64, device=device)
    return {"stare/gate_on": float(gate_on), "stare/w": w, "stare/m": m, "stare/num_pos_selected": zero,
            "stare/num_neg_selected": zero, "stare/num_pos_candidates": zero, "stare/num_neg_candidates": zero,
            "stare/frac_pos_selected": zero.float(), "stare/frac_neg_selected": zero.float()}


def _distributed_selections(
    batch: StepBatch, cfg: LossConfig, coll: Collective, want_sets: bool, quantiles: dict[str, TopQuantile],
    n_tok: int,
) -> tuple[STARESelection | None, dict[str, Tensor]]:
    """The STARE sets and the top quantiles over all ranks in one :func:`distributed_top_k` call (3 collectives)."""
    mask = batch.response_mask
    keys, k_fns, positions = [], [], []
    c2 = cfg.stare.variant == "C2"
    if want_sets:
        s = surprisal_keys(batch.old_logprobs)
        adv = batch.advantages_bt().detach()
        p = cfg.stare.top_p_ratio
        for member in ([adv > 0, adv < 0] if c2 else [adv > 0]):
            keys.append(torch.where(mask & member, s, -1))
            k_fns.append(lambda n, p=p: num_selected(n, p))
            positions.append(True)
    for d in quantiles.values():
        q = d.quantile(cfg)
        if not (0 < q <= 1):
            raise ConfigError(f"top quantile q={q!r} is outside (0, 1]")
        k = max(1, math.ceil(q * n_tok * (1 - 1e-12))) if n_tok else 0
        keys.append(torch.where(mask, ordered_keys(_field(batch, d.field)), -1))
        k_fns.append(lambda n, k=k: torch.full_like(n, k))
        positions.append(False)
    res = distributed_top_k(keys, k_fns, coll, positions, max_count=n_tok)
    selection = None
    if want_sets:
        pos, neg = res[0], (res[1] if c2 else None)
        zero = torch.zeros((), dtype=torch.int64, device=mask.device)
        k_neg, n_neg = (zero, zero) if neg is None else (neg.k, neg.n)
        n_valid = torch.tensor(n_tok, dtype=torch.int64, device=mask.device).clamp_min(1).to(torch.float32)
        counts = {"stare/num_pos_selected": pos.k, "stare/num_neg_selected": k_neg,
                  "stare/num_pos_candidates": pos.n, "stare/num_neg_candidates": n_neg,
                  "stare/frac_pos_selected": pos.k.to(torch.float32) / n_valid,
                  "stare/frac_neg_selected": k_neg.to(torch.float32) / n_valid}
        selection = STARESelection.from_masks(pos.selected, None if neg is None else neg.selected, counts)
        res = res[2 if c2 else 1:]
    qvals = {}
    for (n, _), r in zip(quantiles.items(), res):
        qvals[n] = key_to_float(r.threshold) if n_tok else torch.tensor(float("inf"), device=mask.device)
    return selection, qvals
