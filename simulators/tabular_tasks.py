"""Tasks of the tabular simulator: initial logits and correct-token sets, and the reward-optimal entropy.

* ``sequence`` / ``bandit``: logits z ~ N(0, init_spread²) and ``num_correct`` random correct tokens per state
  (bandit: one position).

Both tables are drawn from one ``torch.Generator`` seeded with the run's ``init_seed``, so every method of a seed
starts from the same policy.
"""

from __future__ import annotations

import math

import torch

__all__ = ["init_tables", "reward_optimal_entropy"]


def init_tables(config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial logits ``[S, L, V]`` float64 and correct sets ``[S, L, V]`` bool of ``config``'s task."""
    S, L, V = config.num_prompts, config.seq_len, config.vocab_size
    logits = config.init_spread * torch.randn(S, L, V, generator=generator, dtype=torch.float64)
    ranks = torch.rand(S, L, V, generator=generator).argsort(dim=-1).argsort(dim=-1)
    correct = ranks < config.num_correct
    return logits, correct


def reward_optimal_entropy(config, correct: torch.Tensor) -> float:
    """The reward-optimal entropy of the task (nats): the mean over states of ln K_state, K_state = the number of
    correct tokens of the state (``correct [S, L, V]`` bool), i.e. the entropy of the policy uniform over the
    correct tokens of every position (science.md §7). Under ``random`` rewards every policy is reward-optimal and
    this is ln V.

    With ``threshold`` < L a factored policy may also leave some positions free and still always be rewarded; ln K
    per position is the entropy of the symmetric reward-optimal policy the target is compared with (documented
    simplification).
    """
    if config.reward == "random":
        return math.log(config.vocab_size)
    k = correct.sum(-1).clamp_min(1).double()
    return float(k.log().mean())
