"""One training step (docs/design.md §3, steps 1–10), phase by phase, on padded tensors.

``collect`` (prompts, generation, rewards, dynamic sampling: :class:`trainer.step.collect.Collector`) → ``batch``
(:func:`trainer.step.batch.build_rollout_batch`: the engine's token lists become ``[B, …]`` tensors, once) →
``old_logprob`` (log-probs and entropies ``[B, T]``; when every rank's batch is one micro-batch and
``optim.fuse_old_logprob`` is on, this forward keeps its graph and is also the update's) → ``prepare``
(:func:`stare_lab.loss.step.prepare_step`: counts, H̄, the gate and W/M, ω over all ranks, each loss's global
statistics — the one place for them) → ``update``
(:meth:`trainer.engines.policy.PolicyEngine.update`) → [``schedule.measure_entropy_change``: the first-order predictions
of :mod:`trainer.step.prediction` and the measured change] → ``sync`` (:class:`trainer.engines.memory.ColocatedSchedule`) →
the metrics row. With ``schedule.probe_only`` the update and the sync are replaced by the probe of the step
(:meth:`trainer.step.prediction.EntropyPrediction.probe`): the weights never change.

A step without a valid token (every group filtered by dynamic sampling, or every response masked) skips the
update: its row has ``skipped=1``, ``entropy`` null, the controller untouched (the key the simulators use too).
Every row has ``skipped`` (0 or 1). Per-phase wall-clock seconds are ``time/<phase>_s``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from stare_lab.loss.losses import loss_needs
from stare_lab.loss.step import prepare_step

from trainer.step.batch import build_rollout_batch
from trainer.step.metrics import base_row, batch_row, batch_stats
from trainer.faults import fault

logger = logging.getLogger(__name__)

__all__ = ["StepRunner", "PHASES"]

#: The timed phases of a step (``time/<phase>_s``).
PHASES = ("rollout", "reward", "old_logprob", "prepare", "update", "sync")


class StepRunner:
    """Runs one step with the run's collaborators.

    Args:
        cfg: the :class:`trainer.config.TrainerConfig`.
        dist: the :class:`trainer.engines.launch.DistInfo`.
        comm: the :class:`trainer.engines.comm.Comm`.
        policy: the :class:`trainer.engines.policy.PolicyEngine` (or a stand-in with the same methods).
        collector: the :class:`trainer.step.collect.Collector`.
        controller: the run's :class:`stare_lab.loss.stare.STAREController`.
        schedule: the :class:`trainer.engines.memory.ColocatedSchedule`.
        memory: the :class:`trainer.engines.memory.PhaseMemory`.
        eos_id: the token that stands for an empty response (one masked token).
    """

    def __init__(self, cfg: Any, dist: Any, comm: Any, policy: Any, collector: Any, controller: Any, schedule: Any,
                 memory: Any, eos_id: int | None) -> None:
        self.cfg, self.dist, self.comm, self.policy = cfg, dist, comm, policy
        self.collector, self.controller, self.schedule, self.memory = collector, controller, schedule, memory
        self.eos_id = 0 if eos_id is None else int(eos_id)
        self.fuse = cfg.optim.fuse_old_logprob
        self.entropy_grad = loss_needs(cfg.loss.loss_mode, cfg.loss).entropy_grad
        self.predictor = None
        self.probe_only = cfg.schedule.probe_only
        if cfg.schedule.measure_entropy_change or self.probe_only:
            from trainer.step.prediction import EntropyPrediction

            self.predictor = EntropyPrediction(policy, comm, cfg.loss, cfg.optim.grad_clip,
                                               tangent=cfg.schedule.probe_tangent)

    def _timed(self, phase: str, fn: Any, *args: Any) -> Any:
        self.memory.start(phase)
        t0 = time.perf_counter()
        out = fn(*args)
        self.t[phase] = self.t.get(phase, 0.0) + time.perf_counter() - t0
        self.memory.stop(phase)
        return out

    def step(self, step: int) -> dict[str, Any]:
        """One optimizer step (collective); returns its metrics row. The memory transitions around the engine are
        :class:`trainer.engines.memory.ColocatedSchedule`'s (sleep right after generation, wake the weights, sync, wake the
        KV cache); ``memory/<phase>_peak_gib`` are logged on a GPU."""
        cfg, dist, policy, sch = self.cfg, self.dist, self.policy, self.schedule
        self.t = {k: 0.0 for k in PHASES}
        t_step = time.perf_counter()
        self.memory.start("rollout")
        kept = self.collector.collect(step)
        self.memory.stop("rollout")
        self.t.update(self.collector.timers)
        sch.after_generation()
        fault(step, "rollout")
        if dist.tp > 1:  # the ranks of a TP group hold the same groups: each keeps a disjoint share
            kept = kept[dist.tp_rank::dist.tp]
        batch = build_rollout_batch(kept, cfg, self.eos_id, step)
        plan = policy.micro_plan(batch, self.comm)
        # one micro-batch per rank and no probes: the old-log-prob forward is also the update's (graph kept)
        fused = self.fuse and len(plan) == 1 and self.predictor is None and policy.fusable
        grad_sum = None
        if self.predictor is not None and self.predictor.from_old_logprob:  # ∇θH̄ from this forward
            old_lp, old_ent, grad_sum = self._timed("old_logprob", policy.logprobs_and_entropy_grad, batch, plan,
                                                    self.predictor.keep_tangent)
            self.t["old_logprob"] -= policy.entropy_grad_s
            self.t["predict"] = self.t.get("predict", 0.0) + policy.entropy_grad_s
        else:
            old_lp, old_ent = self._timed("old_logprob", lambda: policy.compute_logprobs(
                batch, plan, keep_graph=fused, entropy_grad=self.entropy_grad))
        step_batch = batch.step_batch(old_lp, old_ent)
        prep = self._timed("prepare", lambda: prepare_step(step_batch, cfg.loss, controller=self.controller,
                                                           collective=self.comm.collective, step=step, seed=cfg.seed))
        row = self._row(step, batch, old_lp, prep)
        if prep.skip:
            logger.warning("step %d: no trainable tokens (all groups filtered or all responses masked); "
                           "skipping the update", step)
            row["skipped"] = 1
            policy.release()
            sch.skipped_update()
        elif self.probe_only:  # the probe of the step, no update: the weights (and the engine's copy) stay
            row.update(self._timed("predict", self.predictor.probe, batch, plan, prep, step_batch, grad_sum))
            sch.skipped_update()
            row["skipped"] = 0
        else:
            fault(step, "update")
            probes = None
            if self.predictor is not None:
                probes = self._timed("predict", self.predictor.before_update, batch, plan, prep, step_batch,
                                     grad_sum)
            row.update(self._timed("update", policy.update, batch, plan, prep, self.comm))
            sch.after_update()
            if self.predictor is not None:
                row.update(self._timed("predict", self.predictor.after_update, probes, row.get("grad_norm")))
                row["entropy_change"] = self._timed("entropy_after", self._entropy_change, batch, plan, old_ent)
            self._timed("sync", sch.sync)
            row["skipped"] = 0
        row.update(self.memory.row())
        for k, v in self.t.items():
            row[f"time/{k}_s"] = v
        row["time/step_s"] = time.perf_counter() - t_step
        row["time/rollout_tokens_per_s"] = self.gen_tokens / max(self.t["rollout"], 1e-9)
        return row

    def _row(self, step: int, batch: Any, old_lp: Any, prep: Any) -> dict[str, Any]:
        """The row before the update: the collector's and the batch's statistics (one sum and one max collective
        for all of them) and the prepared step's entries."""
        sums, maxes = batch_stats(batch, old_lp)
        red = self.comm.sum({**self.collector.local_sums(), **sums})
        mx = self.comm.max(maxes)
        self.gen_tokens = red["batch/response_tokens"]
        row = base_row(step)
        row.update(self.collector.row(red))
        row.update(prep.metrics())
        row.update(batch_row(red, mx, prep.num_tokens))
        return row

    def _entropy_change(self, batch: Any, plan: Any, old_ent: Any) -> float:
        """Token-mean entropy (nats) of the updated policy on ``batch`` minus that of the old one — the same tokens,
        masks and temperature, both summed in float64 — so the difference is the update's effect alone.
        Collective."""
        _, ent = self.policy.compute_logprobs(batch, plan)
        m = batch.response_mask
        red = self.comm.sum({"after": ent.double()[m].sum(), "before": old_ent.double()[m].sum(), "n": m.sum()})
        return (red["after"] - red["before"]) / max(red["n"], 1.0)
