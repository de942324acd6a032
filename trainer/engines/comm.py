"""The trainer's collectives over its data-parallel ranks: named reductions in one call each, and the core's
:class:`~stare_lab.collective.Collective` for :func:`stare_lab.loss.step.prepare_step`.

Every per-step statistic travels as a float64 tensor keyed by name (:meth:`Comm.sum`, :meth:`Comm.max`): the names
are sorted, the values packed into one buffer, reduced in ONE ``all_reduce`` and unpacked — never as positional
lists and never as pickled Python objects. The names must be the same on every rank (they come from the config,
which every rank shares); :meth:`Comm.sum` checks it cheaply (the count of names and a CRC of their joined text
travel in the same buffer) and raises instead of silently mixing two statistics.

On one process (or without ``torch.distributed``) both are the identity.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

import torch

from stare_lab.collective import Collective, LocalCollective, TorchCollective
from stare_lab.errors import RunError

__all__ = ["Comm"]


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Comm:
    """Named float reductions over all ranks (the world group).

    Attributes:
        rank, world_size: this process's place in the world (0 and 1 without ``torch.distributed``).
        collective: the core's :class:`~stare_lab.collective.Collective` over the same ranks
            (:class:`~stare_lab.collective.TorchCollective` on CPU/gloo, on the current CUDA device with NCCL).
    """

    def __init__(self) -> None:
        self.collective: Collective = TorchCollective() if _distributed() else LocalCollective()
        self.rank, self.world_size = self.collective.rank, self.collective.world_size
        self.device = getattr(self.collective, "device", torch.device("cpu"))

    def _reduce(self, values: Mapping[str, Any], op: str) -> dict[str, float]:
        names = sorted(values)
        if self.world_size == 1:
            return {n: float(values[n]) for n in names}
        import torch.distributed as dist

        local = [float(values[n]) for n in names]
        check = [float(len(names)), float(zlib.crc32("\0".join(names).encode()))]
        if op == "max":  # max of (count, crc) and of -(count, crc): equal on every rank iff min == max
            check = check + [-c for c in check]
        t = torch.tensor(local + check, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        out = t.cpu().tolist()
        got = out[len(names):]
        if op == "sum":
            ok = got[:2] == [c * self.world_size for c in check[:2]]
        else:
            ok = got[:2] == [-x for x in got[2:]]
        if not ok:
            raise RunError(f"ranks reduced different statistic names in one collective (rank {self.rank} had "
                           f"{len(names)}: {names[:6]}…); every rank must reduce the same names")
        return dict(zip(names, out[: len(names)]))

    def sum(self, values: Mapping[str, Any]) -> dict[str, float]:
        """name → Σ over ranks of ``values[name]`` (numbers or 0-dim tensors), in one collective.

        Raises:
            RunError: the ranks passed different names.
        """
        return self._reduce(values, "sum")

    def max(self, values: Mapping[str, Any]) -> dict[str, float]:
        """name → max over ranks of ``values[name]``, in one collective.

        Raises:
            RunError: the ranks passed different names.
        """
        return self._reduce(values, "max")
