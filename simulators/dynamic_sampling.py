"""The simulators' one dynamic-sampling rule (DAPO, arXiv 2503.14476; docs/theory.md §3), used by the tabular and
the transformer simulator alike.

A step draws rounds of rollouts, one group of G responses per prompt; from each round it keeps, in order, the groups
with reward variance (:func:`stare_lab.loss.advantages.filter_groups`: a group whose G rewards are all equal has zero
group advantages and carries no signal), until ``num_groups`` groups are kept or ``max_rounds`` rounds were drawn.
If no group survives, the step has nothing to train on: the caller skips the update and logs ``skipped=1`` (the
trainer's key and meaning; :func:`stare_lab.loss.step.prepare_step` then reports ``skip`` and leaves the STARE controller
as it is).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from stare_lab.loss.advantages import filter_groups

__all__ = ["GroupSelection", "select_groups"]


@dataclasses.dataclass
class GroupSelection:
    """The kept groups of one step: ``picks`` = ``(round, group indices kept from that round)`` in order (rounds
    that kept nothing are left out), ``rounds`` = rounds drawn (≥ 1)."""

    picks: list[tuple[int, torch.Tensor]]
    rounds: int

    @property
    def num_kept(self) -> int:
        """Groups kept over all rounds."""
        return sum(int(idx.numel()) for _, idx in self.picks)

    @property
    def skip(self) -> bool:
        """No group survived: the step skips its update (``skipped=1``)."""
        return self.num_kept == 0


def select_groups(
    rewards_of_round: Callable[[int], torch.Tensor], group_size: int, num_groups: int, max_rounds: int
) -> GroupSelection:
    """Apply the rule of the module docstring.

    Args:
        rewards_of_round: ``round → [num_groups · group_size]`` float rewards of that round's groups (group-major:
            the G responses of a group are contiguous); round 0 is the step's first round, later rounds are drawn
            only when needed (the callback draws them, in order).
        group_size: G ≥ 1.
        num_groups: groups wanted (and groups per round) ≥ 1.
        max_rounds: rounds at most ≥ 1.

    Returns:
        The :class:`GroupSelection` (at most ``num_groups`` groups).

    Raises:
        DataError: from :func:`~stare_lab.loss.advantages.filter_groups` (non-finite rewards, a size not divisible by G).
    """
    picks: list[tuple[int, torch.Tensor]] = []
    kept, rounds = 0, 0
    while True:
        keep = filter_groups(rewards_of_round(rounds), group_size).view(-1, group_size)[:, 0]
        idx = keep.nonzero().squeeze(-1)[: num_groups - kept]
        if idx.numel():
            picks.append((rounds, idx))
            kept += int(idx.numel())
        rounds += 1
        if kept >= num_groups or rounds >= max_rounds:
            return GroupSelection(picks, rounds)
