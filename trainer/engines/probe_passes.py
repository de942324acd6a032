"""The passes of the near-criticality probe on the policy (:mod:`trainer.step.prediction`, :mod:`stare_lab.theory.probe`):
the old-log-prob pass that also gives ∇θH̄ (and, with one micro-batch, keeps its graph for the tangent), θ before
the update, and the logits' directional derivative along the probe's direction. A mixin of
:class:`trainer.engines.policy.PolicyEngine` (it uses the engine's ``engine``, ``dist``, ``zero3``, ``fusable``,
``temperature``, ``device``, ``release``, ``_forward`` and ``_functional_logits``).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from stare_lab.loss.entropy import entropy_from_logits, logprobs_from_logits

logger = logging.getLogger(__name__)


class ProbePasses:
    """The probe's passes of :class:`trainer.engines.policy.PolicyEngine` (ZeRO 0–2 only)."""

    #: (rows, micro-batch, logits, GraphTangent, leaves) of the last old-log-prob pass that kept its graph
    _tangent: tuple | None = None
    _warned_tangent: bool = False  # the fallback to forward mode is logged once

    def logprobs_and_entropy_grad(self, batch: Any, plan: Sequence[Tensor], keep_tangent: bool = False
                                  ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """:meth:`compute_logprobs` through detached leaves of the parameters with autograd on (train mode,
        ``torch.func.functional_call``, outside DeepSpeed; the logits from the first response position on), which
        also returns the gradient of Σ H_t over the response mask (nats; divided by the step's token count it is
        the probe's ∇θH̄), summed over the micro-batches and the ranks: ∇θH̄ from the forward the step needs anyway,
        one backward more (its wall-clock and process CPU seconds in :attr:`entropy_grad_s`,
        :attr:`entropy_grad_cpu_s`). ZeRO 0–2 and :attr:`fusable` models only. Collective.

        ``keep_tangent`` with one micro-batch (``len(plan) == 1``; with more, forward mode and one logged
        warning): the leaves are a copy of θ (they serve as :meth:`snapshot`), the forward runs with
        ``scaled_dot_product_attention``'s math backend and the backward is recorded
        (:class:`stare_lab.theory.probe.GraphTangent`), kept through the update for :meth:`tangent_logits`: the probe
        then needs no forward-mode pass. Its log-probs and entropies equal :meth:`compute_logprobs`' to the
        rounding of the attention kernel (bit for bit otherwise, tested); the kept graphs cost about 4× the
        micro-batch's activation memory until :meth:`tangent_logits` or :meth:`release`."""
        import time

        from torch.nn.attention import SDPBackend, sdpa_kernel

        from stare_lab.theory.probe import GraphTangent

        if self.zero3 or not self.fusable:
            raise RuntimeError("logprobs_and_entropy_grad needs ZeRO 0-2 and a model without dropout")
        self.release()
        self.engine.train()
        keep = keep_tangent and len(plan) == 1
        if keep_tangent and not keep and not self._warned_tangent:
            self._warned_tangent = True
            logger.warning("the probe's kept graph (schedule.probe_tangent) needs one micro-batch per rank; this step "
                           "has %d (optim.micro_batch_max_tokens): forward mode instead", len(plan))
        leaves = {n: (p.detach().clone() if keep else p.detach()).requires_grad_(True)
                  for n, p in self.engine.module.named_parameters()}
        grads = [torch.zeros_like(p, dtype=torch.float32) for p in leaves.values()]
        shape = batch.response_ids.shape
        lps, ents = torch.zeros(shape), torch.zeros(shape)
        self.entropy_grad_s = self.entropy_grad_cpu_s = 0.0
        for rows in plan:
            if not rows.numel():
                continue
            mb = batch.micro_batch(rows, self.device)
            zero = torch.zeros((), device=self.device)
            if keep:
                with sdpa_kernel(SDPBackend.MATH):
                    logits = self._functional_logits(mb, leaves)
                lp = logprobs_from_logits(logits.detach(), mb.tokens, self.temperature)
                z = logits.detach().requires_grad_(True)
                ent = entropy_from_logits(z, self.temperature)
            else:
                lp, ent = self._forward(mb, need_entropy=True, entropy_grad=True, params=leaves)
            t = lp.shape[1]
            lps[rows, :t] = torch.where(mb.valid, lp.detach().float(), zero).cpu()
            ents[rows, :t] = torch.where(mb.valid, ent.detach().float(), zero).cpu()
            mask = batch.response_mask.index_select(0, rows)[:, :t].to(ent.device) & mb.valid
            t0, c0 = time.perf_counter(), time.process_time()
            if keep:  # w = ∂ΣH_t/∂z, then the recorded backward Jᵀw
                (w,) = torch.autograd.grad(torch.where(mask, ent.float(), zero).sum(), z)
                graph = GraphTangent(logits, list(leaves.values()), w)
                got = graph.gradient
                self._tangent = (rows, mb, logits.detach(), graph, leaves)
            else:
                got = torch.autograd.grad(torch.where(mask, ent.float(), zero).sum(), list(leaves.values()),
                                          allow_unused=True)
            for acc, g in zip(grads, got):
                if g is not None:
                    acc += g.float()
            self.entropy_grad_s += time.perf_counter() - t0
            self.entropy_grad_cpu_s += time.process_time() - c0
        if self.dist.world_size > 1:
            import torch.distributed as tdist

            flat = torch.cat([g.reshape(-1) for g in grads])
            tdist.all_reduce(flat)
            grads = [x.view_as(g) for x, g in zip(flat.split([g.numel() for g in grads]), grads)]
        return lps, ents, grads

    def snapshot(self) -> dict[str, Tensor]:
        """Detached copies of the module's parameters by name, in their compute dtype: θ before an update, for the
        probe's forward-mode pass (:meth:`tangent_logits`). ZeRO 0–2 only (every rank holds the full tensors).

        Raises:
            RuntimeError: under ZeRO-3 (partitioned parameters).
        """
        if self.zero3:
            raise RuntimeError("snapshot: ZeRO-3 partitions the parameters; the probe falls back to gradients")
        if self._tangent is not None:  # the leaves of the kept graph are a copy of θ already
            return {n: p.detach() for n, p in self._tangent[4].items()}
        return {n: p.detach().clone() for n, p in self.engine.module.named_parameters()}

    def tangent_logits(self, batch: Any, plan: Sequence[Tensor], primals: dict[str, Tensor] | None,
                       tangents: dict[str, Tensor]) -> Iterator[tuple[Any, Tensor, Tensor]]:
        """One forward-mode pass per micro-batch (:func:`stare_lab.theory.probe.jvp_logits`): yields ``(micro-batch,
        response logits [b, t, V], their directional derivative along tangents)`` at ``primals`` (``None``: the
        current parameters), in the parameters' dtype, outside DeepSpeed (``torch.func.functional_call``; no
        gradient hooks, no graph). ZeRO 0–2 only; empty micro-batches are skipped (no collective). The graph kept
        by :meth:`logprobs_and_entropy_grad` at these primals replaces the pass (one backward through it)."""
        from stare_lab.theory.probe import jvp_logits

        if self.zero3:
            raise RuntimeError("tangent_logits: ZeRO-3 partitions the parameters")
        kept, self._tangent = self._tangent, None
        current = dict(self.engine.module.named_parameters()) if kept is not None and primals is None else {}
        if kept is not None and len(plan) == 1 and torch.equal(kept[0], plan[0]) and all(
                torch.equal(p, current[n]) if primals is None else primals[n].data_ptr() == p.data_ptr()
                for n, p in kept[4].items()):
            _, mb, logits, graph, leaves = kept  # the graph of the old-log-prob pass at these primals
            yield mb, logits, graph.logits_dot([tangents[n] for n in leaves])
            return
        del kept
        self.engine.train()
        module = self.engine.module
        if primals is None:
            primals = {n: p.detach() for n, p in module.named_parameters()}
        for rows in plan:
            if not rows.numel():
                continue
            mb = batch.micro_batch(rows, self.device)
            logits, dot = jvp_logits(lambda params, mb=mb: self._functional_logits(mb, params), primals, tangents)
            yield mb, logits, dot
            del logits, dot  # before the next micro-batch's pass
