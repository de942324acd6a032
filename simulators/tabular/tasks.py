"""Tasks of the tabular simulator: initial logits and correct-token sets, and the reward-optimal entropy.

* ``sequence`` / ``bandit``: logits z ~ N(0, init_spread²) and ``num_correct`` random correct tokens per state
  (bandit: one position).
* ``forking``: the token-entropy structure reported for reasoning LLMs ("Beyond the 80/20 rule", arXiv
  2506.01939: most tokens near zero entropy, a minority of high-entropy forking tokens). Of the L positions of a
  prompt, ``forking_positions`` (chosen at random) fork: ``num_correct`` correct tokens, drawn at random from the
  2·``num_correct`` most likely ones, and initial probabilities p(rank r) ∝ r^(−s) over all V tokens (Zipf-like,
  s = ``zipf_exponent``). Every other position has one correct token, its mode, with probability 1 − ``tail_mass``
  and the tail mass spread Zipf-like over the other V − 1 tokens (ranks 2 … V). Token ranks are a random
  permutation per state. The reward-optimal entropy is then (forking_positions/L)·ln(num_correct) per position.

Reward coupling (every task, ``reward_coupling`` c ∈ (0, 1]): only the fraction c of the positions decides the
reward; every other position accepts every token (its correct set is the whole vocabulary), like a paraphrase that
any continuation of the text could replace. The deciding positions are drawn over the whole table and stratified,
so that the realised fraction does not vary with the seed: exactly max(1, ⌊c·n + ½⌋) of the n forks of all S
prompts and as many of the n other positions (one stratum outside ``forking``), chosen at random; a prompt may so
have no deciding position (its reward is then the verifier's noise alone). In ``forking`` a
free fork keeps its spread (GRPO has no signal there), and its sampled high-surprisal tokens, in rewarded responses
as often as in failed ones, are the L+ tokens whose reinforcement raises the entropy. The reward rule is
unchanged — a response earns 1 iff at least ``threshold`` of its positions are correct — and a free position always
counts as correct, so with ``threshold = L`` the reward is 1 iff all k deciding positions are correct. At c = 1
(the default) every position decides and the tables are those of the task without the knob, bit for bit. At a free
position the advantage is independent of the sampled token: in the mean-field limit GRPO does not move it at all,
with G sampled responses it drifts only through sampling noise (docs/theory.md §2, near-criticality), while STARE's
L+ tokens there raise its entropy — the weak token–reward link of a language model (docs/theory.md §8).

Both tables are drawn from one ``torch.Generator`` seeded with the run's ``init_seed``, so every method of a seed
starts from the same policy.
"""

from __future__ import annotations

import math

import torch

__all__ = ["init_tables", "deciding_positions", "reward_optimal_entropy"]


def init_tables(config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial logits ``[S, L, V]`` float64 and correct sets ``[S, L, V]`` bool of ``config``'s task, with the
    positions that do not decide the reward (``reward_coupling`` < 1, module docstring) accepting every token."""
    fork = None
    if config.task == "forking":
        logits, correct, fork = _forking_tables(config, generator)
    else:
        S, L, V = config.num_prompts, config.seq_len, config.vocab_size
        logits = config.init_spread * torch.randn(S, L, V, generator=generator, dtype=torch.float64)
        ranks = torch.rand(S, L, V, generator=generator).argsort(dim=-1).argsort(dim=-1)
        correct = ranks < config.num_correct
    if config.reward_coupling < 1.0:  # drawn after the task's tables: at c = 1 nothing else is drawn
        correct = correct | ~deciding_positions(config, generator, fork).unsqueeze(-1)
    return logits, correct


def deciding_positions(config, generator: torch.Generator, fork: torch.Tensor | None = None) -> torch.Tensor:
    """``[S, L]`` bool: the positions that decide the reward (module docstring). Within each stratum — the forks
    (``fork [S, L]`` bool, task ``forking``) and the other positions; one stratum without ``fork`` — exactly
    max(1, ⌊c·n + ½⌋) of its n positions over the whole table (all S prompts), chosen at random with
    ``generator`` (c = ``config.reward_coupling``)."""
    S, L = config.num_prompts, config.seq_len
    u = torch.rand(S * L, generator=generator, dtype=torch.float64)
    strata = [torch.ones(S * L, dtype=torch.bool)] if fork is None else [fork.reshape(-1), ~fork.reshape(-1)]
    decide = torch.zeros(S * L, dtype=torch.bool)
    for members in strata:
        idx = members.nonzero().flatten()
        if len(idx) == 0:
            continue
        k = max(1, math.floor(config.reward_coupling * len(idx) + 0.5))
        decide[idx[u[idx].argsort()[:k]]] = True
    return decide.view(S, L)


def _forking_tables(config, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits, correct sets and the forks ``[S, L]`` bool of the ``forking`` task (module docstring)."""
    S, L, V, K = config.num_prompts, config.seq_len, config.vocab_size, config.num_correct
    fork = torch.rand(S, L, generator=generator).argsort(-1).argsort(-1) < config.forking_positions  # [S, L]
    token_of_rank = torch.rand(S, L, V, generator=generator).argsort(-1)  # token_of_rank[..., r]: rank r + 1
    rank_of_token = token_of_rank.argsort(-1)
    zipf = torch.arange(1, V + 1, dtype=torch.float64) ** (-float(config.zipf_exponent))
    p_fork = zipf / zipf.sum()
    tail = zipf.clone()
    tail[0] = 0.0
    p_det = config.tail_mass * tail / tail.sum()
    p_det[0] = 1.0 - config.tail_mass
    probs = torch.where(fork.unsqueeze(-1), p_fork[rank_of_token], p_det[rank_of_token])
    # correct: the mode of a non-forking position; K of the 2K most likely tokens of a forking one
    pick = torch.rand(S, L, 2 * K, generator=generator).argsort(-1).argsort(-1) < K  # K of the top 2K ranks
    chosen = torch.zeros(S, L, V, dtype=torch.bool)
    chosen.scatter_(-1, token_of_rank[..., : 2 * K], pick)
    correct = torch.where(fork.unsqueeze(-1), chosen, rank_of_token == 0)
    return probs.log(), correct, fork


def reward_optimal_entropy(config, correct: torch.Tensor) -> float:
    """The reward-optimal entropy of the task (nats): the mean over states of ln K_state, K_state = the number of
    correct tokens of the state (``correct [S, L, V]`` bool), i.e. the entropy of the policy uniform over the
    correct tokens of every position (docs/theory.md §7). Under ``random`` rewards every policy is reward-optimal and
    this is ln V.

    With ``threshold`` < L a factored policy may also leave some positions free and still always be rewarded; ln K
    per position is the entropy of the symmetric reward-optimal policy the target is compared with (documented
    simplification).
    """
    if config.reward == "random":
        return math.log(config.vocab_size)
    k = correct.sum(-1).clamp_min(1).double()
    return float(k.log().mean())
