"""stare_lab.loss.step: the step preparation — hand-computed counts and statistics, one collective for the named sums,
ranks vs one process, micro-batch invariance, gate off ⇒ GRPO, and a loss registered from outside the package.

Ranks are threads sharing an exact int64 sum (tests/stare_lab/_ranks.py); test_step_distributed.py repeats the
rank comparison with torch.distributed (gloo, 2 processes).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.losses import LossNeeds, compute_policy_loss, register_policy_loss
from stare_lab.loss.stare import STAREController
from stare_lab.loss.step import GLOBAL_STATS, StepBatch, TokenMean, prepare_step, register_global_stat

sys.path.insert(0, str(Path(__file__).parent))
from _ranks import CountingLocal, concat_batches, run_ranks  # noqa: E402
from _step_gloo import random_batch as _random_batch  # noqa: E402


def _hand_batch(**extra) -> StepBatch:
    """3 rows × 4 columns; row 2 has no valid token. Valid: row 0 cols 0–2, row 1 cols 0–1 (N = 5, S = 2)."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    lp = torch.tensor([[-0.5, -1.0, -2.0, 0.0], [-0.25, -3.0, 0.0, 0.0], [0.0] * 4])
    ent = torch.tensor([[0.5, 1.0, 0.25, 0.0], [2.0, 0.75, 0.0, 0.0], [0.0] * 4])
    return StepBatch(mask, torch.tensor([1.0, -0.5, 2.0]), lp, entropy=ent, **extra)


def _cfg(mode: str = "stare", **stare) -> LossConfig:
    return LossConfig(loss_mode=mode, stare=STAREConfig(**{"gate": "entropy", "target_entropy": 1.0, **stare}))


# ------------------------------------------------------------------------------------------------ by hand


def test_counts_means_and_gate_by_hand():
    """N = 5 valid tokens, S = 2 sequences with one; H̄ = (0.5 + 1 + 0.25 + 2 + 0.75)/5 = 0.9 < H_tgt 1.0 → gate on;
    mean log π = (−0.5 − 1 − 2 − 0.25 − 3)/5 = −1.35; mean Â over tokens = (3·1 + 2·(−0.5))/5 = 0.4."""
    p = prepare_step(_hand_batch(), _cfg("kl_cov"))
    assert (p.num_tokens, p.num_sequences, p.entropy, p.skip) == (5, 2, 0.9, False)
    assert p.global_stats == {"logprob_mean": -6.75 / 5, "advantage_mean": 2.0 / 5}
    assert (p.gate_on, p.reweight_w, p.reweight_m) == (False, 1.0, 1.0)  # kl_cov has no STARE gate: ω ≡ 1
    ctrl = STAREController(_cfg().stare)
    s = prepare_step(_hand_batch(), _cfg(variant="C2", top_p_ratio=0.5), controller=ctrl)
    assert s.gate_on and ctrl.num_updates == 1 and ctrl.last_entropy == 0.9
    off = prepare_step(_hand_batch(), _cfg(target_entropy=0.5))  # 0.9 ≥ 0.5 → off, no ω
    assert not off.gate_on and off.token_weights is None and off.metrics()["stare/num_pos_selected"] == 0.0


def test_stare_weights_by_hand():
    """P = 0.5. T+ = row 0's 3 tokens (Â = 1): k = ⌈1.5⌉ = 2 → surprisals 2.0 (0,2) and 1.0 (0,1) get W;
    C2: T− = row 1's 2 tokens: k = 1 → surprisal 3.0 at (1,1) gets M. Fractions of N = 5: 2/5 and 1/5."""
    p = prepare_step(_hand_batch(), _cfg(variant="C2", top_p_ratio=0.5, reweight_w=1.5, reweight_m=0.5))
    want = torch.ones(3, 4)
    want[0, 1:3] = 1.5
    want[1, 1] = 0.5
    assert torch.equal(p.token_weights, want)
    assert p.selection.lplus.nonzero().tolist() == [[0, 1], [0, 2]]  # the sets themselves are kept
    assert p.selection.lminus.nonzero().tolist() == [[1, 1]]
    row = p.metrics()
    assert row["stare/num_pos_selected"] == 2 and row["stare/num_neg_selected"] == 1
    assert row["stare/num_pos_candidates"] == 3 and row["stare/num_neg_candidates"] == 2
    assert row["stare/frac_pos_selected"] == pytest.approx(0.4) and row["stare/frac_neg_selected"] == pytest.approx(0.2)
    assert (row["gate_on"], row["stare_w"], row["stare_m"], row["num_tokens"]) == (1, 1.5, 0.5, 5)


def test_forking_threshold_and_generator_by_hand():
    """Valid entropies 0.5, 1, 0.25, 2, 0.75: q = 0.2 → k = max(1, ⌈1⌉) = 1 → 2.0; q = 0.5 → k = ⌈2.5⌉ = 3 → 0.75."""
    for q, thr in ((0.2, 2.0), (0.5, 0.75)):
        p = prepare_step(_hand_batch(), LossConfig(loss_mode="forking_tokens", top_entropy_quantile=q))
        assert p.global_stats["entropy_threshold"].item() == thr
    a = prepare_step(_hand_batch(), LossConfig(loss_mode="clip_cov"), step=4, seed=7)
    b = prepare_step(_hand_batch(), LossConfig(loss_mode="clip_cov"), step=4, seed=7)
    c = prepare_step(_hand_batch(), LossConfig(loss_mode="clip_cov"), step=5, seed=7)
    draw = lambda p: torch.rand(4, generator=p.global_stats["generator"])  # noqa: E731
    x, y, z = draw(a), draw(b), draw(c)
    assert torch.equal(x, y) and not torch.equal(x, z)


def test_one_collective_for_the_named_sums():
    """grpo and clip_cov: counts, Σ entropy and the token-means go in one call; STARE on one rank adds none."""
    for cfg in (LossConfig(), LossConfig(loss_mode="clip_cov"), _cfg(gate="always")):
        coll = CountingLocal()
        prepare_step(_hand_batch(group_ids=torch.tensor([0, 0, 1])), cfg, collective=coll)
        assert coll.calls == 1, cfg.loss_mode


def test_skip_without_valid_tokens_leaves_the_controller():
    batch = StepBatch(torch.zeros(2, 3, dtype=torch.bool), torch.ones(2), torch.zeros(2, 3),
                      entropy=torch.zeros(2, 3))
    ctrl = STAREController(_cfg().stare)
    p = prepare_step(batch, _cfg(), controller=ctrl)
    assert p.skip and p.entropy is None and ctrl.num_updates == 0 and (p.num_tokens, p.num_sequences) == (0, 0)
    assert prepare_step(batch, LossConfig(loss_mode="forking_tokens")).global_stats["entropy_threshold"] == math.inf


def test_errors_are_clear():
    no_ent = StepBatch(torch.ones(1, 2, dtype=torch.bool), torch.ones(1), torch.full((1, 2), -1.0))
    with pytest.raises(DataError, match="needs the batch entropy"):
        prepare_step(no_ent, _cfg())
    prepare_step(no_ent, _cfg(), batch_entropy=0.4)  # the caller's own H̄ is enough for the gate
    with pytest.raises(DataError, match="StepBatch.entropy"):
        prepare_step(no_ent, LossConfig(loss_mode="forking_tokens"))
    with pytest.raises(ConfigError, match="needs the run's STAREController"):
        prepare_step(_hand_batch(), _cfg(adaptive=True))
    with pytest.raises(DataError, match="advantages must be"):
        StepBatch(torch.ones(2, 2, dtype=torch.bool), torch.ones(3), torch.zeros(2, 2))
    bad = _hand_batch()
    bad.old_logprobs[0, 0] = float("nan")
    with pytest.raises(DataError, match="non-finite"):
        prepare_step(bad, LossConfig(loss_mode="kl_cov"))
    p = prepare_step(_hand_batch(), LossConfig(entropy_coeff=0.1))
    lp = _hand_batch().old_logprobs.clone().requires_grad_(True)
    with pytest.raises(DataError, match="current policy's entropy"):
        p.inputs(lp)
    with pytest.raises(DataError, match="valid tokens beyond column 2"):
        p.inputs(lp[:2, :2], rows=[0, 1], entropy=torch.ones(2, 2))
    with pytest.raises(DataError, match="expected \\[2, t\\]"):
        p.inputs(lp, rows=slice(0, 2), entropy=torch.ones(3, 4))


# ------------------------------------------------------------------------------------------------ ranks


CASES = [
    ("o1-row", _cfg(gate="always", top_p_ratio=0.2), False, False),
    ("o1-ties", _cfg(gate="always", top_p_ratio=0.3), False, True),
    ("c2-token", _cfg(gate="always", variant="C2", top_p_ratio=0.2), True, False),
    ("c2-token-ties", _cfg(gate="always", variant="C2", top_p_ratio=0.5), True, True),
    ("forking-ties", LossConfig(loss_mode="forking_tokens", top_entropy_quantile=0.3), False, True),
    ("clip_cov", LossConfig(loss_mode="clip_cov"), True, False),
    ("gate-entropy", _cfg(target_entropy=1.0), False, False),
]


def _compare_to_one_process(parts: list[StepBatch], cfg: LossConfig) -> None:
    whole = concat_batches(parts)
    ref = prepare_step(whole, cfg, controller=STAREController(cfg.stare), step=3, seed=5)
    results, group = run_ranks(len(parts), lambda c: prepare_step(parts[c.rank], cfg, collective=c, step=3, seed=5,
                                                                  controller=STAREController(cfg.stare)))
    for r in results:
        assert r.metrics() == ref.metrics()
        assert (r.num_tokens, r.num_sequences, r.entropy, r.gate_on) == (ref.num_tokens, ref.num_sequences,
                                                                          ref.entropy, ref.gate_on)
        for k, v in ref.global_stats.items():
            if k != "generator":
                assert torch.equal(torch.as_tensor(r.global_stats[k]), torch.as_tensor(v)), k
        if ref.stare_stats is not None:
            for k, v in ref.stare_stats.items():
                assert torch.equal(torch.as_tensor(r.stare_stats[k]), torch.as_tensor(v)), k
    if ref.token_weights is not None:
        width = whole.shape[1]
        got = torch.cat([torch.nn.functional.pad(r.token_weights, (0, width - r.token_weights.shape[1]), value=1.0)
                         for r in results])
        assert torch.equal(got, ref.token_weights)
        assert group.calls == [4] * len(parts)  # named sums + 2 histograms + ties
        for key in ("lplus", "lminus"):  # each rank keeps its rows of the sets
            if getattr(ref.selection, key) is None:
                assert all(getattr(r.selection, key) is None for r in results)
                continue
            sets = torch.cat([torch.nn.functional.pad(getattr(r.selection, key), (0, width - r.token_weights.shape[1]))
                              for r in results])
            assert torch.equal(sets, getattr(ref.selection, key)), key
    else:
        assert ref.needs.token_weights is False or not ref.gate_on


@pytest.mark.parametrize("name, cfg, per_token, ties", CASES, ids=[c[0] for c in CASES])
def test_ranks_equal_one_process(name, cfg, per_token, ties):
    """Rank batches of different widths (and one empty rank): ω, counts, H̄, gate and statistics equal the
    one-process result over the concatenated batch bit for bit."""
    parts = [_random_batch(1, 5, 7, per_token, ties), _random_batch(2, 4, 9, per_token, ties)]
    _compare_to_one_process(parts, cfg)
    empty = StepBatch(torch.zeros(0, 3, dtype=torch.bool), torch.zeros((0, 3) if per_token else (0,)),
                      torch.zeros(0, 3), entropy=torch.zeros(0, 3), group_ids=torch.zeros(0, dtype=torch.int64))
    _compare_to_one_process([parts[0], empty, parts[1]], cfg)


# ------------------------------------------------------------------------------------------------ the loss path


def _current(batch: StepBatch, seed: int = 0) -> torch.Tensor:
    """log π_θ = log π_old + noise (ρ ≠ 1, so clipping is exercised), a leaf with a gradient."""
    g = torch.Generator().manual_seed(seed)
    return (batch.old_logprobs + 0.3 * torch.randn(batch.shape, generator=g)).requires_grad_(True)


def _loss_and_grad(p, lp, chunks, theta=None):
    total = 0.0
    for rows in chunks:
        sub = lp[rows]
        width = int(p.batch.response_mask[rows].any(0).nonzero().max()) + 1  # trim to the chunk's last valid column
        entropy = None
        if p.needs.entropy_grad:
            entropy = torch.nn.functional.softplus(theta[rows][:, :width])
        loss, _ = compute_policy_loss(p.config.loss_mode, p.inputs(sub[:, :width], rows, entropy=entropy), p.config)
        total = total + loss
    leaves = [lp] + ([theta] if theta is not None else [])
    grads = torch.autograd.grad(total, leaves)
    return total.detach(), grads


INVARIANT = [
    ("grpo", LossConfig()),
    ("grpo-seq-mean", LossConfig(loss_agg_mode="seq-mean-token-mean")),
    ("stare-c2-global", _cfg(gate="always", variant="C2", top_p_ratio=0.3)),
    ("forking", LossConfig(loss_mode="forking_tokens")),
    ("entropy-bonus", LossConfig(entropy_coeff=0.05)),
    ("tis", LossConfig(tis_cap=1.5)),
]


@pytest.mark.parametrize("name, cfg", INVARIANT, ids=[c[0] for c in INVARIANT])
@pytest.mark.parametrize("per_token", [False, True])
def test_micro_batch_invariance_of_loss_and_gradient(name, cfg, per_token):
    """The sum over micro-batches (rows 0–2, 3–4, 5–7, each trimmed to its own width) of the losses built by
    ``prepared.inputs`` equals the full-batch loss, and so do the gradients (global normalisers, docs/theory.md §3)."""
    batch = _random_batch(3, 8, 6, per_token, ties=False)
    batch.rollout_logprobs = batch.old_logprobs - 0.1
    batch.response_mask[:, -1] = False  # the last column is padding everywhere
    p = prepare_step(batch, cfg)
    lp = _current(batch)
    theta = torch.randn(batch.shape, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    theta = theta if p.needs.entropy_grad else None
    full, g_full = _loss_and_grad(p, lp, [slice(0, 8)], theta)
    micro, g_micro = _loss_and_grad(p, lp, [slice(0, 3), [3, 4], torch.tensor([5, 6, 7])], theta)
    torch.testing.assert_close(micro, full, rtol=0, atol=1e-6)
    for a, b in zip(g_micro, g_full):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert float(g_full[0].abs().sum()) > 0


@pytest.mark.parametrize("scope", ["global", "microbatch"])
@pytest.mark.parametrize("gate", [dict(gate="entropy", target_entropy=0.1), dict(gate="never")])
def test_gate_off_stare_equals_grpo_bit_for_bit(scope, gate):
    batch = _random_batch(4, 6, 5, per_token=False, ties=False)
    stare_cfg = _cfg(scope=scope, variant="C2", **gate)
    grpo_cfg = LossConfig()
    out = []
    for cfg in (stare_cfg, grpo_cfg):
        p = prepare_step(batch, cfg)
        lp = _current(batch)
        loss, _ = compute_policy_loss(cfg.loss_mode, p.inputs(lp), cfg)
        loss.backward()
        out.append((loss.detach(), lp.grad, p))
    (ls, gs, ps), (lg, gg, _) = out
    assert not ps.gate_on and ps.token_weights is None
    assert torch.equal(ls, lg) and torch.equal(gs, gg)


# ------------------------------------------------------------------------------------------------ a new loss


register_global_stat("test_step_entropy_mean", TokenMean("entropy"))


def _toy_needs(cfg: LossConfig) -> LossNeeds:
    # reads the old entropies and their step mean; with entropy_coeff > 0 the registry adds entropy_grad itself
    return LossNeeds(entropy=True, global_stats=("test_step_entropy_mean",))


@register_policy_loss("test_step_entropy_centred", needs=_toy_needs, metrics=("loss/toy",))
def entropy_centred(ctx, cfg):
    """A toy loss defined outside the package: ℓ = −Â·ρ·(H_t − H̄_step), H̄_step the step's token-mean entropy."""
    h = ctx.inputs.entropy.detach().float()
    return -ctx.adv * ctx.ratio * (h - ctx.inputs.global_stats["test_step_entropy_mean"]), {"loss/toy": 1.0}


def test_a_loss_registered_outside_the_package():
    """prepare_step honours the toy loss's declared needs: the step mean of the entropy (here, by hand, over the
    _hand_batch: 0.9) is computed and handed over, the same on 2 ranks; entropy is required; the loss is micro-batch
    invariant because the centre is the step's, not the micro-batch's."""
    cfg = LossConfig(loss_mode="test_step_entropy_centred")
    p = prepare_step(_hand_batch(), cfg)
    assert p.global_stats == {"test_step_entropy_mean": 0.9} and "test_step_entropy_mean" in GLOBAL_STATS
    no_ent = StepBatch(torch.ones(1, 2, dtype=torch.bool), torch.ones(1), torch.full((1, 2), -1.0))
    with pytest.raises(DataError, match="test_step_entropy_mean"):
        prepare_step(no_ent, cfg)
    # value by hand on the hand batch at ρ = 1: Σ −Â (H − 0.9) / 5 = −[(0.5+1+0.25 − 2.7)·1 + (2+0.75 − 1.8)·(−0.5)]/5
    lp = _hand_batch().old_logprobs.clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(cfg.loss_mode, p.inputs(lp), cfg)
    assert loss.item() == pytest.approx(-((1.75 - 2.7) - 0.5 * (2.75 - 1.8)) / 5, abs=1e-6) and metrics["loss/toy"] == 1
    batch = _random_batch(5, 8, 6, per_token=True, ties=False)
    p = prepare_step(batch, cfg)
    lp = _current(batch)
    full, g_full = _loss_and_grad(p, lp, [slice(0, 8)])
    micro, g_micro = _loss_and_grad(p, lp, [slice(0, 4), slice(4, 8)])
    torch.testing.assert_close(micro, full, rtol=0, atol=1e-6)
    torch.testing.assert_close(g_micro[0], g_full[0], rtol=0, atol=1e-7)
    _compare_to_one_process([_random_batch(6, 3, 5, False, False), _random_batch(7, 4, 4, False, False)], cfg)


def test_from_rows_pads_once():
    """Ragged rows [T_i] → [B, max T]: padding 0 and masked; a tool-use loss mask is kept; lengths must agree."""
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5]), torch.tensor([-3.0, -1.5, -0.25])]
    b = StepBatch.from_rows(lp, torch.tensor([1.0, 0.0, -1.0]), [torch.tensor([1, 0]), torch.tensor([1]),
                                                                 torch.tensor([1, 1, 1])],
                            entropy=[torch.ones(2), torch.ones(1), torch.ones(3)])
    assert b.shape == (3, 3) and b.old_logprobs[1].tolist() == [-0.5, 0.0, 0.0]
    assert b.response_mask.tolist() == [[True, False, False], [True, False, False], [True, True, True]]
    assert prepare_step(b, LossConfig()).num_tokens == 5
    assert StepBatch.from_rows(lp, torch.zeros(3)).response_mask.sum() == 6
    with pytest.raises(DataError, match="row 1 of entropy has 2 tokens"):
        StepBatch.from_rows(lp, torch.zeros(3), entropy=[torch.ones(2), torch.ones(2), torch.ones(3)])
