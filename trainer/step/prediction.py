"""First-order predictions of a trainer step's entropy change and the probe of its near-criticality
(``schedule.measure_entropy_change``, ``schedule.probe_only``; docs/theory.md §2 "Beyond one softmax", §7, §8;
docs/trainer.md "Predicted vs measured entropy change").

Per step, on the step's batch (the tokens, masks and temperature of the pre-update H̄):

* ``pred_entropy_change`` = ∇θH̄ · Δθ: the gradient of the batch's token-mean entropy H̄ at the pre-update
  parameters, dotted with the applied update Δθ = θ_after − θ_before (fp32 master weights; Adam, momentum, clipping
  and weight decay included). It is exact to first order for any optimizer.
* the split of the step's own gradient by token sets (docs/theory.md §7), ``pred/d_grpo``, ``pred/d_lplus`` and,
  for STARE C2, ``pred/d_lminus``:

      D_X = ∇θH̄ · Δθ_X,   Δθ_X = −P ⊙ g_X,
      P = lr · (1 − β₁)/(1 − β₁ᵗ) · c / (√(v_t/(1 − β₂ᵗ)) + ε)

  where g_X is the gradient of the policy loss restricted to X — X = GRPO: the ``grpo`` loss with the run's clip,
  aggregation, TIS, KL and entropy-bonus settings (ω ≡ 1); X = L+ (L−): the same surrogate on the selected
  positive- (negative-) advantage high-surprisal tokens alone (ω = 1 on them, 0 elsewhere, global normaliser,
  no bonus/KL) — and P is the AdamW preconditioner of this step: ``v_t`` Adam's second moment after the step, t the
  step number, c the gradient-clipping factor min(1, clip/(‖g‖ + 1e-6)) (DeepSpeed's). Δθ_X is the part of this
  step's Adam update that the gradient g_X carries, with v_t held fixed (∂Δθ/∂g at this step: Adam is not linear
  in the gradient, its linearisation around this step is). So the split is exact in the sense
  D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L− = ∇θH̄ · (−P ⊙ g_applied) whenever ρ ≡ 1 (one on-policy update), and at the
  first step (no momentum, no weight decay) it equals ``pred_entropy_change`` (tested); later steps'
  ``pred_entropy_change`` also carries the momentum of earlier steps, the split does not.
  L+/L− are selected as STARE would (the run's ``stare.top_p_ratio``, scope global, exact over ranks) whatever the
  loss and the gate, so a GRPO run gives the conservative W* estimate and a STARE run the held-trajectory one
  (docs/theory.md §7).
* the probe's row entries (:func:`stare_lab.theory.probe.probe_row`): ``pred/d_ratio`` = D_L+/|D_GRPO|,
  ``pred/lplus_above_sstar`` (the share of the L+ probability mass above each token's critical surprisal s*) and
  ``pred/w_star`` = W*(t) = 1 − (D_GRPO + (M − 1)·D_L−)/D_L+ (M = ``stare.reweight_m`` for C2, else 1), the W at
  which this step's own Adam-linearised update would leave H̄ unchanged (null when no W does).

How the D terms are computed. ZeRO 0–2 (every rank holds the full parameters): ONE backward for ∇θH̄ and ONE
tangent pass (:mod:`stare_lab.theory.probe`): ∇θH̄ is the backward of the old-log-prob forward (which then runs
through leaves of the parameters, :meth:`trainer.engines.policy.PolicyEngine.logprobs_and_entropy_grad`; a model
with dropout gets a forward+backward of its own), θ_before is kept (one parameter-sized copy), the update runs, P is
read from the optimizer state after it, and the logits' directional derivative at θ_before along v = P ⊙ ∇θH̄ gives
every token's ∇θ log π_t·v and ∇θH_t·v. With ``schedule.probe_tangent`` graph (``auto``: a model of at most
:data:`GRAPH_TANGENT_MAX_PARAMS` parameters) and one micro-batch per rank that derivative is one
backward through the ∇θH̄ backward's kept graph (:class:`stare_lab.theory.probe.GraphTangent`; the old-log-prob forward
then runs with the math attention kernel, so its log-probs equal the unprobed ones to rounding), else a
``torch.func.jvp`` at θ_before. Each D_X is then a weighted sum over the tokens with the elementwise derivatives
of the core's objective X as weights (the three-backward values to float rounding, tested); the pass's logits give
s*. The output layer is computed from the first response position on only.
Cost: about one backward and a forward-mode pass's tangent half (the kept graph), or one backward and one
forward-mode pass (≈ 3 forwards), per step.
ZeRO-3 (partitioned parameters, no forward-mode pass through DeepSpeed's gathers): one backward for ∇θH̄ and one
per D term, each kept as a gradient-sized float32 copy of this rank's partition, every dot product over the
partition and all-reduced (one collective for all); ``pred/lplus_above_sstar`` is null there. Dot products
accumulate in float64; ``Σ g_H·θ_after − Σ g_H·θ_before`` gives ∇θH̄·Δθ without keeping a copy of the master
weights.

Probe without updates (``schedule.probe_only``, :meth:`EntropyPrediction.probe`): the same entries at the current
weights, with P of the Adam step the batch's own gradient g would make — from the optimizer's state when it has
one (v_t = β₂v_{t−1} + (1 − β₂)(c·g)², t = its step + 1), else of a first Adam step (t = 1,
v_1 = (1 − β₂)(c·g)², so P = lr·c/(|c·g| + ε) elementwise; a ``schedule.probe_only`` run always starts with a fresh
optimizer) — and ``pred_entropy_change`` = ∇θH̄·(−P ⊙ g), the first-order change of the step that is not taken
(momentum and weight decay excluded). Cost: the old-log-prob pass's backward, one forward+backward for g and one
forward-mode pass.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from stare_lab.config import LossConfig
from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LPLUS, KEY_LPLUS_ABOVE
from stare_lab.theory.decomposition import grpo_objective, part_objective, selected_parts
from stare_lab.errors import ConfigError
from stare_lab.theory.adam_linear import adam_exp_avg_sq, adam_preconditioner, linearised_entropy_change, param_dot
from stare_lab.theory.probe import (
    LPLUS_ABOVE_SUM,
    LPLUS_MASS_SUM,
    directional_terms,
    lplus_mass,
    preconditioned_direction,
    probe_row,
    token_tangents,
)

__all__ = ["EntropyPrediction", "KEY_PRED", "GRAPH_TANGENT_MAX_PARAMS"]

#: The row key of ∇θH̄·Δθ (docs/design.md §4); the D terms' keys are :mod:`stare_lab.theory.critical`'s.
KEY_PRED = "pred_entropy_change"


@dataclasses.dataclass
class _Probes:
    grad_entropy: list[Tensor]
    before: float
    lr: float
    context: tuple  # (batch, plan, prep, step_batch, parts)
    theta: dict[str, Tensor] | None = None  # θ_before (forward-mode path)
    grads: dict[str, list[Tensor]] | None = None  # the D terms' gradients (ZeRO-3 path)


#: ``schedule.probe_tangent=auto`` keeps the graph for models up to this size: where per-operation overhead sets the
#: cost (the tiny model: 1.4× the update against forward mode's 2.0×) and the kept graph is small; SmolLM2-135M's kept
#: graph for 16 sequences did not fit in 24 GiB (docs/benchmarks.md A.9)
GRAPH_TANGENT_MAX_PARAMS = 20_000_000


class EntropyPrediction:
    """The probes of one step: :meth:`before_update` (∇θH̄, θ_before or the gradients, collective), then the
    update, then :meth:`after_update` (P, the D terms and the row entries; collective); or :meth:`probe` alone
    (``schedule.probe_only``). The objectives and the selection of L+/L− are the core's
    (:mod:`stare_lab.theory.decomposition`), shared with the transformer simulator.

    Args:
        policy: the :class:`trainer.engines.policy.PolicyEngine`.
        comm: the :class:`trainer.engines.comm.Comm`.
        loss: the run's :class:`~stare_lab.config.LossConfig`.
        grad_clip: ``optim.grad_clip`` (0 = off).
        method: ``auto`` (forward mode unless the parameters are partitioned; with one micro-batch and ``tangent``
            graph, a backward through the old-log-prob pass's graph instead: :class:`stare_lab.theory.probe.GraphTangent`),
            ``jvp`` (``torch.func.jvp`` always: the old log-probs bit for bit those of a run without the probe) or
            ``backward`` (one gradient per D term; the reference the forward-mode values are tested against).
        tangent: ``schedule.probe_tangent``: ``graph``, ``jvp`` or ``auto`` (graph for a model of at most
            :data:`GRAPH_TANGENT_MAX_PARAMS` parameters).

    Raises:
        ConfigError: ``method`` or ``tangent`` unknown, or ``jvp`` under ZeRO-3.
    """

    def __init__(self, policy: Any, comm: Any, loss: LossConfig, grad_clip: float, method: str = "auto",
                 tangent: str = "auto") -> None:
        if method not in ("auto", "jvp", "backward"):
            raise ConfigError(f"method={method!r} is not one of auto, jvp, backward")
        if tangent not in ("auto", "graph", "jvp"):
            raise ConfigError(f"schedule.probe_tangent={tangent!r} is not one of auto, graph, jvp")
        if method == "jvp" and policy.partitioned:
            raise ConfigError("method='jvp' needs the full parameters on every rank (ZeRO 0-2); under ZeRO-3 use "
                              "'backward' or 'auto'")
        self.policy, self.comm, self.loss, self.grad_clip = policy, comm, loss, float(grad_clip)
        self.jvp = method == "jvp" or (method == "auto" and not policy.partitioned)
        #: ∇θH̄ comes from the old-log-prob pass (:meth:`trainer.engines.policy.PolicyEngine.logprobs_and_entropy_grad`)
        self.from_old_logprob = self.jvp and bool(getattr(policy, "fusable", False))
        #: ``method="auto"`` and ``tangent`` graph (auto: a small model): that pass keeps its graph, whose backward
        #: replaces the forward-mode pass (``keep_tangent``)
        small = sum(p.numel() for p in policy.engine.module.parameters()) <= GRAPH_TANGENT_MAX_PARAMS \
            if self.from_old_logprob and tangent == "auto" else False
        self.keep_tangent = method == "auto" and self.from_old_logprob and (tangent == "graph" or small)
        c2 = loss.loss_mode == "stare" and loss.stare.variant == "C2"
        self.reweight_m = float(loss.stare.reweight_m) if c2 else 1.0

    # ------------------------------------------------------------------------------------------------ passes
    def _grad_entropy(self, batch: Any, plan: Sequence[Tensor], n_tok: float) -> list[Tensor]:
        """∇θH̄ (one forward+backward): H̄ = the token-mean entropy over the response mask, N = ``n_tok``."""
        def entropy_mean(mb: Any, lp: Tensor, ent: Tensor | None) -> Tensor:
            mask = batch.response_mask.index_select(0, mb.rows)[:, : ent.shape[1]].to(ent.device)
            return torch.where(mask, ent.float(), torch.zeros((), device=ent.device)).sum() / n_tok

        return self.policy.gradient(batch, plan, entropy_mean, need_entropy=True, entropy_grad=True)

    def _objectives(self, mb: Any, prep: Any, step_batch: Any, parts: dict[str, Tensor], width: int) -> dict:
        """The micro-batch's objectives ``(log-probs, entropies) -> loss`` of GRPO, L+ (and L−)."""
        loss, bonus = self.loss, prep.needs.entropy_grad
        cut = lambda x: x.index_select(0, mb.rows)[:, :width].to(mb.tokens.device)  # noqa: E731
        out = {KEY_D_GRPO: lambda lp, ent: grpo_objective(
            prep.inputs(lp, mb.rows, entropy=ent if bonus else None), loss)}
        for key, ind in parts.items():
            # the part objectives have no bonus: the old entropies only stand in for the input the run's
            # preparation requires with entropy_coeff > 0
            out[key] = lambda lp, ent, ind=ind: part_objective(
                prep.inputs(lp, mb.rows, entropy=cut(step_batch.entropy) if bonus else None), cut(ind), loss)
        return out

    def _gradients(self, batch: Any, plan: Sequence[Tensor], prep: Any, step_batch: Any,
                   parts: dict[str, Tensor]) -> dict[str, list[Tensor]]:
        """The gradients of the GRPO, L+ (and L−) objectives (one backward each; the ZeRO-3 path)."""
        bonus = prep.needs.entropy_grad
        grads = {}
        for key in (KEY_D_GRPO, *parts):
            def fn(mb: Any, lp: Tensor, ent: Tensor | None, key: str = key) -> Tensor:
                return self._objectives(mb, prep, step_batch, parts, lp.shape[1])[key](lp, ent)

            use_ent = bonus and key == KEY_D_GRPO
            grads[key] = self.policy.gradient(batch, plan, fn, need_entropy=use_ent, entropy_grad=use_ent)
        return grads

    def _forward_mode(self, batch: Any, plan: Sequence[Tensor], prep: Any, step_batch: Any, parts: dict[str, Tensor],
                      theta: dict[str, Tensor] | None, grad_h: list[Tensor], precond: Iterable[Tensor]) -> dict:
        """The D terms and L+ mass sums of this rank's rows from one forward-mode pass at ``theta`` along
        v = P ⊙ ∇θH̄ (not yet summed over ranks)."""
        policy = self.policy
        like = list(theta.values()) if theta is not None else [p for _, p in policy.engine.module.named_parameters()]
        names = list(theta) if theta is not None else [n for n, _ in policy.engine.module.named_parameters()]
        tangent, scale = preconditioned_direction(grad_h, precond, like)
        sums: dict[str, float] = {}
        lplus = parts.get(KEY_D_LPLUS)
        for mb, logits, dot in policy.tangent_logits(batch, plan, theta, dict(zip(names, tangent))):
            tt = token_tangents(logits, dot, mb.tokens, policy.temperature, scale)
            del logits, dot
            width = tt.logprobs.shape[1]
            for key, v in directional_terms(tt, self._objectives(mb, prep, step_batch, parts, width)).items():
                sums[key] = sums.get(key, 0.0) + v
            if lplus is not None:
                ind = lplus.index_select(0, mb.rows)[:, :width] * mb.valid.cpu()
                for key, v in lplus_mass(tt, ind).items():
                    sums[key] = sums.get(key, 0.0) + v
        for key in (KEY_D_GRPO, *parts, LPLUS_ABOVE_SUM, LPLUS_MASS_SUM):
            sums.setdefault(key, 0.0)
        return sums

    def _summed(self, probes: _Probes, precond: Callable[[], Iterator[Tensor]], pred: float) -> dict[str, float]:
        """``pred`` (this rank's part under ZeRO-3, else the full value) and the D terms (and L+ masses) summed
        over all ranks: one collective (none on ZeRO 0–2's backward path). ``precond()`` yields P tensor by
        tensor."""
        batch, plan, prep, step_batch, parts = probes.context
        if self.jvp:  # per-row sums over this rank's rows; pred is already the full value on every rank
            sums = self._forward_mode(batch, plan, prep, step_batch, parts, probes.theta, probes.grad_entropy,
                                      precond())
            return {KEY_PRED: pred, **self.comm.sum(sums)}
        pc = list(precond())
        sums = {key: linearised_entropy_change(probes.grad_entropy, pc, g) for key, g in probes.grads.items()}
        sums[KEY_PRED] = pred
        return self.comm.sum(sums) if self.policy.partitioned else sums

    @staticmethod
    def _precond(exp_avg_sq: Sequence[Tensor | None], adam: dict[str, float], lr: float, step: float, clip: float,
                 grad: Sequence[Tensor] | None = None) -> Callable[[], Iterator[Tensor]]:
        """P (:func:`stare_lab.theory.adam_linear.adam_preconditioner`) per parameter tensor, one float64 tensor at a time
        (never all of them at once). ``exp_avg_sq``: v_t after the step; with ``grad``: v_{t−1} (``None``: no
        state) of a step not taken, v_t formed with :func:`stare_lab.theory.adam_linear.adam_exp_avg_sq`."""
        def gen() -> Iterator[Tensor]:
            for j, v in enumerate(exp_avg_sq):
                if grad is not None:
                    v = adam_exp_avg_sq([v], [grad[j]], beta2=adam["beta2"], clip=clip)[0]
                yield adam_preconditioner([v], lr=lr, beta1=adam["beta1"], beta2=adam["beta2"], eps=adam["eps"],
                                          step=step, clip=clip)[0]

        return gen

    def _clip(self, grad_norm: float | None) -> float:
        if self.grad_clip > 0 and grad_norm is not None and math.isfinite(grad_norm):
            return min(1.0, self.grad_clip / (grad_norm + 1e-6))
        return 1.0

    # ------------------------------------------------------------------------------------------- per step
    def _grad_h(self, batch: Any, plan: Sequence[Tensor], prep: Any, entropy_grad_sum: list[Tensor] | None
                ) -> list[Tensor]:
        if entropy_grad_sum is None:
            return self._grad_entropy(batch, plan, prep.num_tokens)
        return [g / prep.num_tokens for g in entropy_grad_sum]

    def before_update(self, batch: Any, plan: Sequence[Tensor], prep: Any, step_batch: Any,
                      entropy_grad_sum: list[Tensor] | None = None) -> _Probes:
        """∇θH̄ (one forward+backward, or ``entropy_grad_sum`` / N from the old-log-prob pass when
        :attr:`from_old_logprob`), the L+/L− selection and θ_before (forward mode) or the D terms' gradients
        (ZeRO-3), each pass followed by clearing the accumulated gradients (the update that follows is unchanged).
        Collective."""
        policy = self.policy
        grad_h = self._grad_h(batch, plan, prep, entropy_grad_sum)
        parts = selected_parts(step_batch, self.loss, collective=self.comm.collective)
        context = (batch, plan, prep, step_batch, parts)
        before = param_dot(grad_h, policy.local_view("param"))
        lr = policy.adam_settings()["lr"]
        if self.jvp:
            return _Probes(grad_h, before, lr, context, theta=policy.snapshot())
        return _Probes(grad_h, before, lr, context, grads=self._gradients(batch, plan, prep, step_batch, parts))

    def after_update(self, probes: _Probes, grad_norm: float | None) -> dict[str, float | None]:
        """The row entries (nats): ``pred_entropy_change``, the D terms of the step just taken and the probe's
        ratio, L+ share above s* and W*(t). Collective."""
        policy = self.policy
        adam = policy.adam_settings()  # after the step: "step" = t, the number of this update
        precond = self._precond(policy.local_view("exp_avg_sq"), adam, probes.lr, max(adam["step"], 1.0),
                                self._clip(grad_norm))
        pred = param_dot(probes.grad_entropy, policy.local_view("param")) - probes.before
        sums = self._summed(probes, precond, pred)
        probes.theta = None
        return {KEY_PRED: sums.pop(KEY_PRED), **self._row(sums)}

    def probe(self, batch: Any, plan: Sequence[Tensor], prep: Any, step_batch: Any,
              entropy_grad_sum: list[Tensor] | None = None) -> dict[str, float | None]:
        """The row entries of a step that is not taken (``schedule.probe_only``; the weights do not change): P of
        the Adam step the batch's gradient would make (module docstring) and the entries of :meth:`after_update`,
        with ``pred_entropy_change`` = ∇θH̄·(−P ⊙ g). ``entropy_grad_sum``: as for :meth:`before_update`.
        Collective."""
        policy = self.policy
        grad_h = self._grad_h(batch, plan, prep, entropy_grad_sum)
        parts = selected_parts(step_batch, self.loss, collective=self.comm.collective)
        g = policy.gradient(batch, plan, self._update_loss(prep), need_entropy=prep.needs.entropy_grad,
                            entropy_grad=prep.needs.entropy_grad)
        sq = sum(float(x.double().pow(2).sum()) for x in g)
        norm = math.sqrt(self.comm.sum({"g2": sq})["g2"] if policy.partitioned else sq)
        clip = self._clip(norm)
        adam = policy.adam_settings()
        prev = policy.local_view("exp_avg_sq") if adam["step"] > 0 else [None] * len(g)
        precond = self._precond(prev, adam, adam["lr"], adam["step"] + 1, clip, grad=g)
        probes = _Probes(grad_h, 0.0, adam["lr"], (batch, plan, prep, step_batch, parts))
        if not self.jvp:
            probes.grads = self._gradients(batch, plan, prep, step_batch, parts)
        sums = self._summed(probes, precond, linearised_entropy_change(grad_h, precond(), g))
        return {KEY_PRED: sums.pop(KEY_PRED), **self._row(sums)}

    def _update_loss(self, prep: Any) -> Any:
        """The run's loss of one micro-batch (the objective of the update the probe does not apply)."""
        from stare_lab.loss.losses import compute_policy_loss

        cfg = prep.config

        def loss_fn(mb: Any, lp: Tensor, ent: Tensor | None) -> Tensor:
            inputs = prep.inputs(lp, mb.rows, entropy=ent if prep.needs.entropy_grad else None)
            return compute_policy_loss(cfg.loss_mode, inputs, cfg)[0]

        return loss_fn

    def _row(self, sums: dict[str, float]) -> dict[str, float | None]:
        row = probe_row(sums, self.reweight_m)
        if not self.jvp:
            row[KEY_LPLUS_ABOVE] = None  # no logits at θ_before on this path
        return row
