"""Memory hygiene of the colocated GPU path and the weight-version check (issue 15; docs/trainer.md).

One step, in the order the mature colocated trainers (verl, OpenRLHF) use::

    generate ── engine.sleep() ── empty_cache ── [reload DeepSpeed states] ── old log-probs ── update
        ── [offload DeepSpeed states] ── empty_cache ── engine.wake_up(["weights"]) ── weight sync
        ── engine.wake_up(["kv_cache"]) ── (next step) generate

- vLLM sleeps right after generation, *before* the old-log-prob pass: its KV cache and weights are off the GPU for
  the two trainer passes (sleep level 1 backs the weights up in host memory, level 2 drops them — they are
  reloaded by the sync anyway).
- ``deepspeed.offload_during_rollout``: DeepSpeed's optimizer states, fp32 master weights and gradient buffers go
  to host memory while vLLM holds its KV cache (``engine.offload_states``), and come back before the old-log-prob
  pass (``engine.reload_states``). The 16-bit parameter partitions stay on the GPU: the sync gathers them.
- The weights wake first, the KV cache only after the sync, so the sync's gathered buckets never sit next to a
  full KV cache.
- :class:`WeightVersions` counts optimizer updates and syncs: the engine refuses to generate from weights older than
  the policy's (a sync skipped or lost would otherwise train silently off-policy).

On CPU every memory call here is a no-op (``empty_cache``, sleep, offload), but the order and the version check
run the same and are tested with a fake engine (tests/trainer/test_memory_schedule.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from stare_lab.errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["WeightVersions", "ColocatedSchedule", "PhaseMemory", "empty_cache"]


def empty_cache() -> None:
    """Return the caching allocator's free blocks to the device (``torch.cuda.empty_cache``; no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class WeightVersions:
    """Version counters of the policy's weights and of the rollout engine's copy.

    ``policy`` counts optimizer updates (0 = the initial weights the engine was built from); ``engine`` is the
    policy version the engine last received. :meth:`check_fresh` before every generation round.
    """

    def __init__(self, start: int = 0) -> None:
        self.policy = start
        self.engine = start

    def updated(self) -> None:
        """The optimizer stepped: the policy is one version ahead of the engine until the next sync."""
        self.policy += 1

    def synced(self) -> None:
        """The engine received the policy's current weights."""
        self.engine = self.policy

    def check_fresh(self) -> None:
        """Raises :class:`~stare_lab.errors.RunError` if the engine's weights are older than the policy's."""
        if self.engine != self.policy:
            raise RunError(f"the rollout engine holds weights of version {self.engine} but the policy is at version "
                           f"{self.policy}: generating now would sample from stale weights (a weight sync was "
                           "skipped)")


class ColocatedSchedule:
    """The memory transitions of one colocated step around a rollout ``engine`` and a ``policy``.

    Args:
        engine: a rollout engine (``sleep()``, ``wake_up(tags)``, ``sync_weights(it)``).
        policy: a :class:`trainer.engines.policy.PolicyEngine` (``offload_states()``, ``reload_states()``,
            ``iter_named_params(bucket_bytes)``).
        bucket_bytes: gather bucket of the weight sync.
        offload_during_rollout: move DeepSpeed's optimizer / master / gradient states to host memory while the
            engine holds its KV cache.
        offloaded: the states are already offloaded (done before the engine was built, so that vLLM sizes its
            pool with them off the GPU).
        versions: the :class:`WeightVersions` to keep (a new one starting at 0 if ``None``).
        free: the cache-emptying call (:func:`empty_cache`; tests pass a recorder).
    """

    def __init__(self, engine: Any, policy: Any, *, bucket_bytes: float, offload_during_rollout: bool = False,
                 offloaded: bool = False, versions: WeightVersions | None = None,
                 free: Callable[[], None] = empty_cache) -> None:
        self.engine, self.policy = engine, policy
        self.bucket_bytes = bucket_bytes
        self.offload = offload_during_rollout
        self.versions = versions or WeightVersions()
        self.free = free
        self._offloaded = offloaded  # True when the caller offloaded the states before building the engine

    def before_generation(self) -> None:
        """Check the engine's weights are the policy's (every generation round)."""
        self.versions.check_fresh()

    def after_generation(self) -> None:
        """The rollout is over: engine to sleep, free its blocks, DeepSpeed states back for the trainer passes."""
        self.engine.sleep()
        self.free()
        if self._offloaded:
            self.policy.reload_states()
            self._offloaded = False

    def after_update(self) -> None:
        """The optimizer stepped: the policy version moves on (the engine is stale until :meth:`sync`)."""
        self.versions.updated()

    def sync(self) -> None:
        """Back to rollout: [offload DeepSpeed states], free, wake the weights, sync them, wake the KV cache."""
        if self.offload:
            self.policy.offload_states()
            self._offloaded = True
        self.free()
        self.engine.wake_up(["weights"])
        self.engine.sync_weights(self.policy.iter_named_params(self.bucket_bytes))
        self.versions.synced()
        self.engine.wake_up(["kv_cache"])

    def skipped_update(self) -> None:
        """A step without an update (all groups filtered): the weights are unchanged, just wake the engine up
        (the versions stay equal)."""
        self.free()
        self.engine.wake_up(None)
        if self.offload and not self._offloaded:
            self.policy.offload_states()
            self._offloaded = True


class PhaseMemory:
    """Peak GPU memory per phase of a step (``torch.cuda.max_memory_allocated`` since the phase began, GiB).

    ``start(phase)`` resets the peak counter; ``stop(phase)`` records it. On CPU it records nothing (``rows()`` is
    empty), so CPU runs' metrics rows do not carry ``memory/…`` keys.
    """

    def __init__(self) -> None:
        self.enabled = torch.cuda.is_available()
        self.peaks: dict[str, float] = {}

    def start(self, phase: str) -> None:
        if self.enabled:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def stop(self, phase: str) -> None:
        if self.enabled:
            torch.cuda.synchronize()
            gib = torch.cuda.max_memory_allocated() / 2**30
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), gib)

    def row(self) -> dict[str, float]:
        """``{"memory/<phase>_peak_gib": GiB}`` of the phases recorded since the last call (then cleared)."""
        out = {f"memory/{k}_peak_gib": v for k, v in self.peaks.items()}
        self.peaks = {}
        return out
