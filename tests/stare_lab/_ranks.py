"""Test helper: several data-parallel ranks in one process (threads) with an exact sum collective, and the
concatenation of the ranks' batches that one process would see."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from stare_lab.loss.step import StepBatch


class ThreadGroup:
    """Shared state of ``world_size`` thread ranks; counts the collective calls (per rank)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.barrier = threading.Barrier(world_size)
        self.calls = [0] * world_size


class ThreadCollective:
    """A :class:`stare_lab.collective.Collective` for one thread rank of a :class:`ThreadGroup`."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        g = self.group
        g.calls[self.rank] += 1
        g.slots[self.rank] = tensor.clone()
        g.barrier.wait()
        out = g.slots[0].clone()
        for t in g.slots[1:]:
            out += t
        g.barrier.wait()
        return out


class CountingLocal:
    """One process, counting the collective calls."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.calls = 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return tensor


def run_ranks(world_size: int, fn: Callable[[ThreadCollective], Any]) -> tuple[list[Any], ThreadGroup]:
    """``fn(collective)`` on each of ``world_size`` thread ranks; returns the results in rank order."""
    group = ThreadGroup(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(ThreadCollective(group, rank))
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)
            group.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, group


def concat_batches(parts: list[StepBatch]) -> StepBatch:
    """The ranks' batches concatenated in rank order, padded to the widest (padding: mask False, values 0)."""
    width = max(p.shape[1] for p in parts)

    def pad(x: torch.Tensor | None, value: float = 0.0) -> torch.Tensor | None:
        if x is None or x.dim() == 1:
            return x
        out = torch.full((x.shape[0], width), value, dtype=x.dtype)
        out[:, : x.shape[1]] = x
        return out

    fields = {}
    for name in ("response_mask", "advantages", "old_logprobs", "entropy", "rollout_logprobs", "ref_logprobs",
                 "group_ids"):
        vals = [getattr(p, name) for p in parts]
        fields[name] = None if vals[0] is None else torch.cat([pad(v) for v in vals])
    return StepBatch(**fields)
