"""Helpers (not collected) of the verl plugin tests: verl's own config composed with the documented launch overrides
(docs/integrations-verl.md), a hand-made rollout batch, and an independent brute-force STARE selection. The tests run
with ``--import-mode=importlib``: the test modules put this folder on ``sys.path`` to import it."""

from __future__ import annotations

import dataclasses
import math

import torch

#: The STARE overrides of the documented launch (docs/integrations-verl.md), minus the trainer's own keys.
STARE_OVERRIDES = [
    "actor_rollout_ref.actor.policy_loss._target_=stare_lab.integrations.verl.STAREPolicyLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=stare",
    "+actor_rollout_ref.actor.policy_loss.variant=C2",
    "+actor_rollout_ref.actor.policy_loss.top_p_ratio=0.25",
    "+actor_rollout_ref.actor.policy_loss.reweight_w=1.1",
    "+actor_rollout_ref.actor.policy_loss.reweight_m=0.9",
    "+actor_rollout_ref.actor.policy_loss.target_entropy=0.3",
    "+actor_rollout_ref.actor.policy_loss.scope=microbatch",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=3.0",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.v1.trainer_mode=stare",
]


def compose(overrides: list[str]):
    """verl's ``ppo_trainer`` config with ``overrides``, as ``python -m verl.trainer.main_ppo`` would compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def with_loss(actor, **changes):
    """A copy of the actor config with policy-loss fields (``loss_mode``, ``scope``, ``gate``, …) or actor fields
    (``loss_agg_mode``, ``clip_ratio_c``, …) changed; a fresh ``global_batch_info``."""
    from verl.workers.config import PolicyLossConfig

    pl_fields = {f.name for f in dataclasses.fields(actor.policy_loss)}
    pl_changes = {k: v for k, v in changes.items() if k in pl_fields}
    actor_changes = {k: v for k, v in changes.items() if k not in pl_fields}
    if pl_changes.get("loss_mode") == "vanilla":
        policy_loss = PolicyLossConfig(loss_mode="vanilla")
    else:
        policy_loss = dataclasses.replace(actor.policy_loss, **pl_changes)
    return dataclasses.replace(actor, policy_loss=policy_loss, global_batch_info={}, **actor_changes)


@dataclasses.dataclass
class Batch:
    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    lengths: list[int]


def make_batch(seed: int = 0, B: int = 6, T: int = 12) -> Batch:
    """A GRPO-like batch: per-sequence advantages (+, −, 0) broadcast over the valid tokens, ragged lengths, and a
    current policy far enough from the old one that clip-low, clip-high (ε 0.2 / 0.28) and the dual clip (c = 3,
    ratios up to e^1.5 ≈ 4.5) all bind on some tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = [T, T - 3, T - 5, T - 1, T - 7, T - 2][:B]
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    old = -torch.rand(B, T, generator=g) * 4.0 - 0.01
    delta = (torch.rand(B, T, generator=g) - 0.5) * 3.0
    log_prob = (old + delta).clamp(max=0.0)
    # the dual clip binds (Â < 0, ρ = e² > c = 3) and so does clip-high (Â > 0, ρ = e^0.5 > 1.28)
    old[1, 0], log_prob[1, 0] = -3.0, -1.0
    old[4, 1], log_prob[4, 1] = -2.5, -0.5
    old[0, 2], log_prob[0, 2] = -1.0, -0.5
    seq_adv = torch.tensor([1.2, -0.8, 0.0, 0.5, -1.5, 0.9][:B])
    adv = seq_adv[:, None] * mask.float()
    return Batch(old, log_prob, adv, mask, lengths)


def brute_force_weights(old_log_prob, advantages, mask, p, w, m, c2=True):
    """ω by definition (docs/theory.md §4), by sorting: for T+ (and T− with C2) the k = max(1, ⌈P·|T±|⌉) tokens of
    highest surprisal −log π_old get W (M); every other token 1. (The test batches have no tied surprisals.)"""
    s = -old_log_prob.flatten().double()
    out = torch.ones(old_log_prob.numel(), dtype=torch.float32)
    sets = [(advantages.flatten() > 0, w)] + ([(advantages.flatten() < 0, m)] if c2 else [])
    for member, value in sets:
        idx = (member & mask.flatten()).nonzero().flatten().tolist()
        if not idx:
            continue
        k = max(1, math.ceil(p * len(idx) - 1e-9))
        for i in sorted(idx, key=lambda j: -s[j].item())[:k]:
            out[i] = value
    return out.view_as(old_log_prob)
