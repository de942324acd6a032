"""The step's training batch as padded tensors, built once from the rollout engine's token lists (docs/design.md §3
step 5).

:func:`build_rollout_batch` turns this rank's kept groups into a :class:`RolloutBatch` — prompt ‖ response ids,
lengths, response mask, advantages (the core's ``group_advantages``, one call for all groups), the engine's
log-probs — all ``[B, …]`` tensors from here to the update: the old-log-prob pass fills ``[B, T]`` tensors, the
core's :class:`~stare_lab.loss.step.StepBatch` is made of them (:meth:`RolloutBatch.step_batch`), and every micro-batch
is a row slice (:meth:`RolloutBatch.micro_batch`). Nothing goes back to Python lists.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from stare_lab.errors import DataError

__all__ = ["RolloutBatch", "MicroBatch", "build_rollout_batch"]


@dataclasses.dataclass
class MicroBatch:
    """Rows ``rows`` of a :class:`RolloutBatch`, cut to their own longest sequence / response.

    Attributes:
        rows: ``[b]`` int64 row indices into the step batch.
        input_ids: ``[b, L]`` prompt ‖ response, right-padded with 0.
        attention_mask: ``[b, L]`` int64 1 on real tokens.
        positions: ``[b, t]`` int64 index of the logit that predicts response token j of row r
            (``prompt_len_r − 1 + j``; the last prompt position on padding, so every gathered logit is a real one).
        tokens: ``[b, t]`` int64 response tokens (0 on padding).
        valid: ``[b, t]`` bool, True on the row's response positions (padding False; the loss mask is separate).
    """

    rows: Tensor
    input_ids: Tensor
    attention_mask: Tensor
    positions: Tensor
    tokens: Tensor
    valid: Tensor


@dataclasses.dataclass
class RolloutBatch:
    """One rank's training sequences of a step (its share of the TP group's kept groups), padded once.

    Attributes:
        input_ids: ``[B, L]`` int64 prompt ‖ response, right-padded with 0 (``L`` = longest sequence).
        prompt_lens: ``[B]`` int64.
        response_lens: ``[B]`` int64, ≥ 1 (an empty response is one eos token outside the loss).
        response_ids: ``[B, T]`` int64 response tokens, right-padded with 0 (``T`` = longest response).
        response_mask: ``[B, T]`` bool: tokens in the loss (False on padding, on a masked overlong response and on
            tool-interpreter tokens).
        advantages: ``[B]`` float32, one per sequence.
        rollout_logprobs: ``[B, T]`` float32 log-probs of the engine's sampling distribution (0 on padding).
        group_ids: ``[B]`` int64 index of the row's prompt group on this rank.
        truncated: ``[B]`` bool, the response hit ``rollout.max_response_length``.
    """

    input_ids: Tensor
    prompt_lens: Tensor
    response_lens: Tensor
    response_ids: Tensor
    response_mask: Tensor
    advantages: Tensor
    rollout_logprobs: Tensor
    group_ids: Tensor
    truncated: Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_lens(self) -> Tensor:
        """``[B]`` prompt + response lengths."""
        return self.prompt_lens + self.response_lens

    def padding(self) -> Tensor:
        """``[B, T]`` bool, True on each row's response positions (the complement of padding)."""
        t = self.response_ids.shape[1]
        return torch.arange(t).unsqueeze(0) < self.response_lens.unsqueeze(1)

    def micro_batch(self, rows: Tensor, device: torch.device | str = "cpu") -> MicroBatch:
        """The rows ``rows`` (``[b]`` int64) as a :class:`MicroBatch` on ``device``."""
        seq = self.seq_lens.index_select(0, rows)
        resp = self.response_lens.index_select(0, rows)
        prompt = self.prompt_lens.index_select(0, rows)
        width, t = int(seq.max()), int(resp.max())
        ids = self.input_ids.index_select(0, rows)[:, :width]
        attn = (torch.arange(width).unsqueeze(0) < seq.unsqueeze(1)).to(torch.long)
        j = torch.arange(t).unsqueeze(0)
        valid = j < resp.unsqueeze(1)
        positions = torch.where(valid, prompt.unsqueeze(1) - 1 + j, prompt.unsqueeze(1) - 1)
        tokens = self.response_ids.index_select(0, rows)[:, :t]
        return MicroBatch(rows, ids.to(device), attn.to(device), positions.to(device), tokens.to(device),
                          valid.to(device))

    def step_batch(self, old_logprobs: Tensor, entropy: Tensor) -> Any:
        """The core's :class:`~stare_lab.loss.step.StepBatch` of this batch with the old-log-prob pass's ``[B, T]``
        ``old_logprobs`` and ``entropy`` (nats; 0 on padding)."""
        from stare_lab.loss.step import StepBatch

        return StepBatch(self.response_mask, self.advantages, old_logprobs, entropy=entropy,
                         rollout_logprobs=self.rollout_logprobs, group_ids=self.group_ids)


def build_rollout_batch(kept: Sequence[dict[str, Any]], cfg: Any, eos_id: int, step: int) -> RolloutBatch:
    """This rank's :class:`RolloutBatch` from its kept groups (dicts with ``outputs``: ``rollout.n``
    :class:`trainer.engines.rollout.RolloutOutput`, and ``rewards``): advantages per group (the core's
    ``group_advantages`` over all groups at once), the mask from lengths (eos included; never from pad ids) times the
    tool-use ``loss_mask``, overlong responses masked with ``algorithm.overlong=mask``.

    Raises:
        DataError: the engine returned no, too few or non-finite log-probs for a response, or a ``loss_mask`` of the
            wrong length.
    """
    from stare_lab.loss.advantages import group_advantages

    from trainer.step.importance import engine_logprobs

    n = cfg.rollout.n
    rewards = torch.tensor([float(r) for g in kept for r in g["rewards"]], dtype=torch.float32)
    adv = group_advantages(rewards, group_size=n, estimator=cfg.algorithm.advantage_estimator,
                           eps=cfg.algorithm.adv_eps, quantile_k=cfg.algorithm.quantile_k) if len(rewards) else rewards
    mask_overlong = cfg.algorithm.overlong == "mask"
    seqs, resps, masks, lps, plens, trunc, gids = [], [], [], [], [], [], []
    for gi, g in enumerate(kept):
        for j, o in enumerate(g["outputs"]):
            lp = engine_logprobs(o, f"step {step}, group {gi}, sample {j}")
            empty = not o.token_ids
            ids = torch.tensor(list(o.token_ids) if not empty else [eos_id], dtype=torch.long)
            truncated = o.finish_reason == "length"
            keep = not empty and not (truncated and mask_overlong)
            mask = torch.full(ids.shape, keep, dtype=torch.bool)
            loss_mask = getattr(o, "loss_mask", None)
            if loss_mask and not empty:  # tool use: interpreter tokens (loss_mask 0) leave the loss
                if len(loss_mask) != len(ids):
                    raise DataError(f"rollout returned loss_mask of length {len(loss_mask)} for {len(ids)} response "
                                    "tokens")
                mask &= torch.tensor(loss_mask) != 0
            prompt = torch.tensor(list(o.prompt_token_ids), dtype=torch.long)
            seqs.append(torch.cat([prompt, ids]))
            resps.append(ids)
            masks.append(mask)
            lps.append(lp if not empty else torch.zeros(1))  # the placeholder eos is outside the loss
            plens.append(len(prompt))
            trunc.append(truncated)
            gids.append(gi)
    if not seqs:
        z = torch.zeros((0, 1), dtype=torch.long)
        e = torch.zeros(0, dtype=torch.long)
        return RolloutBatch(z, e, e, z, z.bool(), torch.zeros(0), z.float(), e, e.bool())
    return RolloutBatch(
        input_ids=pad_sequence(seqs, batch_first=True),
        prompt_lens=torch.tensor(plens, dtype=torch.long),
        response_lens=torch.tensor([len(r) for r in resps], dtype=torch.long),
        response_ids=pad_sequence(resps, batch_first=True),
        response_mask=pad_sequence(masks, batch_first=True),
        advantages=adv.to(torch.float32),
        rollout_logprobs=pad_sequence(lps, batch_first=True),
        group_ids=torch.tensor(gids, dtype=torch.long),
        truncated=torch.tensor(trunc, dtype=torch.bool),
    )
