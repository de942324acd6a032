"""A small collective protocol for the step preparation: tensor reductions over the data-parallel ranks.

:func:`stare_lab.loss.step.prepare_step` needs exactly two operations, both on tensors (never pickled Python objects):
an element-wise sum (``all_reduce``) and, through it, a sum of named tensors in one call (:func:`reduce_named`).
:class:`LocalCollective` is the one-process default (a no-op); :class:`TorchCollective` runs them with
``torch.distributed`` (gloo on CPU, NCCL on GPUs). Anything with the same three members works (a test can count the
calls). Every rank must make the same calls in the same order with tensors of the same shapes and dtypes.
"""

from __future__ import annotations

from typing import Mapping, Protocol, runtime_checkable

import torch
from torch import Tensor

from stare_lab.errors import DataError

__all__ = ["Collective", "LocalCollective", "TorchCollective", "default_collective", "reduce_named"]


@runtime_checkable
class Collective(Protocol):
    """Sum-reduction over the data-parallel ranks.

    Attributes:
        rank: this process's index among the ranks, ``0 ≤ rank < world_size``.
        world_size: number of ranks whose batches together form the step's batch (rank order = batch order).
    """

    rank: int
    world_size: int

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """The element-wise sum of ``tensor`` over all ranks (same shape, dtype and device as ``tensor``)."""
        ...


class LocalCollective:
    """One process: ``rank = 0``, ``world_size = 1``, and ``all_reduce`` returns its argument unchanged."""

    rank = 0
    world_size = 1

    def all_reduce(self, tensor: Tensor) -> Tensor:
        return tensor


class TorchCollective:
    """``torch.distributed`` sum-reduction over ``group`` (default: the world).

    Args:
        group: a process group, or ``None`` for the default group (which must be initialised).
        device: where the reduction runs; default CUDA (current device) when the group's backend is NCCL, else
            CPU. Tensors are moved there and the result is moved back to the argument's device.

    Raises:
        DataError: if ``torch.distributed`` is not initialised.
    """

    def __init__(self, group: object | None = None, device: torch.device | str | None = None) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise DataError("TorchCollective needs an initialised torch.distributed process group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if device is None:
            nccl = str(dist.get_backend(group)).lower() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.device = torch.device(device)

    def all_reduce(self, tensor: Tensor) -> Tensor:
        import torch.distributed as dist

        t = tensor.to(self.device).clone() if tensor.device == self.device else tensor.to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t.to(tensor.device)


def default_collective() -> Collective:
    """:class:`TorchCollective` over the world when ``torch.distributed`` is initialised with more than one rank,
    else :class:`LocalCollective`."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollective()
    return LocalCollective()


def reduce_named(collective: Collective, values: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Sum every named int64 tensor over the ranks in ONE collective call.

    The tensors are flattened into one buffer in sorted name order, reduced, and split again, so every rank must
    pass the same names with the same shapes (they come from the config, which every rank shares).

    Args:
        collective: the :class:`Collective`.
        values: name → int64 tensor (any shape; 0-dim for a count), all on one device.

    Returns:
        name → the summed tensor (same shape and device).

    Raises:
        DataError: if a value is not an int64 tensor or the tensors are on different devices.
    """
    names = sorted(values)
    if not names:
        return {}
    devices = {values[n].device for n in names}
    for n in names:
        if not isinstance(values[n], Tensor) or values[n].dtype != torch.int64:
            got = getattr(values[n], "dtype", type(values[n]).__name__)
            raise DataError(f"reduce_named: {n!r} must be an int64 tensor, got {got}")
    if len(devices) != 1:
        raise DataError(f"reduce_named: tensors are on several devices {sorted(map(str, devices))}")
    flat = torch.cat([values[n].reshape(-1) for n in names])
    flat = collective.all_reduce(flat)
    out: dict[str, Tensor] = {}
    offset = 0
    for n in names:
        size = values[n].numel()
        out[n] = flat[offset:offset + size].reshape(values[n].shape)
        offset += size
    return out
