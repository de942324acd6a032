"""Tests of stare_lab.loss.stare: the L± selection (docs/theory.md §4), the token weights and the controller.

Expected selections are worked out by hand in the comments, or come from an independent sort-based reference
(`reference_selection`: a plain Python sort by (surprisal descending, flat position ascending), k computed with
exact decimal arithmetic).
"""

from __future__ import annotations

import logging
import math
import os
from fractions import Fraction

import pytest
import torch

from stare_lab.selection import native as native_select
from stare_lab.config import STAREConfig
from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.stare import STAREController, select_stare_sets, select_top_surprisal, stare_token_weights


@pytest.fixture(autouse=True, params=["native", "tensor"])
def backend(request, monkeypatch):
    """Every selection test runs on both implementations: the fused CPU kernel (stare_lab.selection.native) and the
    tensor one (used on accelerators, and on CPU without a C compiler)."""
    if request.param == "tensor":
        monkeypatch.setenv("STARE_LAB_NATIVE", "0")
    else:
        monkeypatch.setenv("STARE_LAB_NATIVE", "1")
        if not native_select.available():
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI: the fused CPU selection kernel must build here: {native_select.load_error()}")
            pytest.skip(f"fused CPU selection kernel unavailable: {native_select.load_error()}")
    return request.param


def reference_selection(logprobs: torch.Tensor, candidates: torch.Tensor, p: float) -> torch.Tensor:
    """Independent reference: sort candidates by (−log π descending, flat index ascending), take the first k,
    k = max(1, ⌈P·n⌉) with P read as the exact decimal it was written as (0 for n = 0 or P = 0)."""
    lp = logprobs.flatten().tolist()
    cand = candidates.flatten().tolist()
    idx = [i for i, c in enumerate(cand) if c]
    k = 0 if (not idx or p == 0) else max(1, math.ceil(Fraction(str(p)) * len(idx)))
    idx.sort(key=lambda i: (lp[i], i))  # lowest log-prob = highest surprisal first; ties by position
    chosen = set(idx[:k])
    return torch.tensor([i in chosen for i in range(len(cand))]).view(logprobs.shape)


# ---------------------------------------------------------------------------------------------- hand-made batches

# Two responses of 5 tokens. Row 0 has Â = +1, row 1 Â = −1. Last token of row 1 is padding.
LP = torch.tensor(
    [
        [-0.1, -2.0, -0.5, -3.0, -0.2],  # surprisals 0.1 2.0 0.5 3.0 0.2
        [-1.0, -0.3, -4.0, -0.05, -9.0],  # surprisals 1.0 0.3 4.0 0.05 (9.0 is padding)
    ]
)
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -1.0])


def test_o1_selects_ceil_p_n_highest_surprisal_positive_tokens():
    # T+ = row 0 (5 tokens). P = 0.1: k = max(1, ⌈0.5⌉) = 1 → the token with s = 3.0 at (0, 3).
    cfg = STAREConfig(variant="O1", top_p_ratio=0.1, reweight_w=1.1)
    w, stats = stare_token_weights(LP, ADV, MASK, cfg)
    expected = torch.ones(2, 5)
    expected[0, 3] = 1.1
    assert torch.equal(w, expected)
    assert int(stats["stare/num_pos_selected"]) == 1 and int(stats["stare/num_pos_candidates"]) == 5
    assert int(stats["stare/num_neg_selected"]) == 0
    assert float(stats["stare/frac_pos_selected"]) == pytest.approx(1 / 9)  # 9 valid tokens
    # P = 0.5: k = ⌈2.5⌉ = 3 → s = 3.0, 2.0, 0.5 at (0, 3), (0, 1), (0, 2)
    w, _ = stare_token_weights(LP, ADV, MASK, STAREConfig(top_p_ratio=0.5, reweight_w=1.2))
    assert w[0].tolist() == pytest.approx([1.0, 1.2, 1.2, 1.2, 1.0])
    assert w[1].tolist() == [1.0] * 5


def test_c2_also_downweights_negative_set_and_never_picks_padding():
    # T− = row 1 valid tokens (4): P = 0.5 → k = 2 → s = 4.0 (1, 2) and 1.0 (1, 0). The padding token (1, 4) has
    # the highest surprisal (9.0) but must never be selected.
    cfg = STAREConfig(variant="C2", top_p_ratio=0.5, reweight_w=1.1, reweight_m=0.9)
    w, stats = stare_token_weights(LP, ADV, MASK, cfg)
    assert w[1].tolist() == pytest.approx([0.9, 1.0, 0.9, 1.0, 1.0])
    assert w[0].tolist() == pytest.approx([1.0, 1.1, 1.1, 1.1, 1.0])
    assert int(stats["stare/num_neg_selected"]) == 2 and int(stats["stare/num_neg_candidates"]) == 4


def test_zero_advantage_never_selected_and_empty_sets():
    # Row 0 Â = 0 (not in T+ nor T−), row 1 Â = −1; O1 → T+ empty → nothing selected, ω ≡ 1.
    adv = torch.tensor([0.0, -1.0])
    w, stats = stare_token_weights(LP, adv, MASK, STAREConfig(variant="O1", top_p_ratio=1.0))
    assert torch.equal(w, torch.ones(2, 5))
    assert int(stats["stare/num_pos_selected"]) == 0 and int(stats["stare/num_pos_candidates"]) == 0
    # C2 with P = 1: all of T− (4 valid tokens of row 1) get M, none of row 0 (Â = 0)
    w, _ = stare_token_weights(LP, adv, MASK, STAREConfig(variant="C2", top_p_ratio=1.0, reweight_m=0.5))
    assert w[0].tolist() == [1.0] * 5
    assert w[1].tolist() == [0.5, 0.5, 0.5, 0.5, 1.0]
    # all padding: nothing selected, no NaN in the fractions
    w, stats = stare_token_weights(LP, ADV, torch.zeros(2, 5, dtype=torch.bool), STAREConfig(variant="C2"))
    assert torch.equal(w, torch.ones(2, 5))
    assert float(stats["stare/frac_pos_selected"]) == 0.0 and float(stats["stare/frac_neg_selected"]) == 0.0


def test_ties_broken_by_row_major_position_exact_k():
    # 3 × 4 all-equal surprisal (log π = −1), all Â > 0: n = 12, P = 0.5 → k = 6 → the first 6 tokens in
    # row-major order: row 0 (4 tokens) and (1, 0), (1, 1).
    lp = torch.full((3, 4), -1.0)
    cand = torch.ones(3, 4, dtype=torch.bool)
    sel, k, n = select_top_surprisal(lp, cand, 0.5)
    assert int(k) == 6 and int(n) == 12
    assert sel.tolist() == [[True] * 4, [True, True, False, False], [False] * 4]
    # A tie at the threshold after one strictly larger value: s = [5, 1, 1, 1 | 1, 1, 1, 1], k = 3 →
    # (0, 0) (largest) and the first two ties (0, 1), (0, 2).
    lp = torch.tensor([[-5.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    sel, k, _ = select_top_surprisal(lp, torch.ones(2, 4, dtype=torch.bool), 0.3)  # ⌈2.4⌉ = 3
    assert int(k) == 3
    assert sel.tolist() == [[True, True, True, False], [False] * 4]
    # Ties skipping non-candidates: the tie slots go to the first *candidates* in row-major order.
    cand = torch.tensor([[True, False, True, True], [True, True, False, True]])
    sel, k, _ = select_top_surprisal(torch.full((2, 4), -2.0), cand, 0.5)  # n = 6, k = 3
    assert sel.tolist() == [[True, False, True, True], [False] * 4]


def test_signed_zero_and_infinite_surprisal():
    # log π = +0.0 and −0.0 both mean s = 0; log π = −inf (s = +inf) ranks first.
    lp = torch.tensor([[0.0, -0.0, -float("inf"), -1e-30]])
    cand = torch.ones(1, 4, dtype=torch.bool)
    sel, _, _ = select_top_surprisal(lp, cand, 0.25)  # k = 1
    assert sel.tolist() == [[False, False, True, False]]
    sel, _, _ = select_top_surprisal(lp, cand, 0.75)  # k = 3: inf, 1e-30, then the first zero (position 0)
    assert sel.tolist() == [[True, False, True, True]]


def test_k_uses_decimal_p():
    # ⌈0.1·30⌉ = 3 (in floating point 0.1·30 = 3.0000000000000004 would give 4); ⌈0.1·31⌉ = 4; P = 1 → all;
    # P = 0 → none (reference implementation returns an empty set for top_p_ratio <= 0).
    lp = -torch.rand(1, 31)
    cand = torch.ones(1, 31, dtype=torch.bool)
    cand30 = cand.clone()
    cand30[0, 0] = False
    assert int(select_top_surprisal(lp, cand30, 0.1)[1]) == 3
    assert int(select_top_surprisal(lp, cand, 0.1)[1]) == 4
    assert int(select_top_surprisal(lp, cand, 1.0)[0].sum()) == 31
    assert int(select_top_surprisal(lp, cand, 0.0)[0].sum()) == 0
    assert int(select_top_surprisal(lp, cand, 1e-9)[1]) == 1  # max(1, ·)


def test_gate_off_all_ones_and_nothing_selected():
    w, stats = stare_token_weights(LP, ADV, MASK, STAREConfig(variant="C2", top_p_ratio=1.0), gate_on=False)
    assert torch.equal(w, torch.ones(2, 5)) and w.dtype == torch.float32
    assert stats["stare/gate_on"] == 0.0 and int(stats["stare/num_pos_selected"]) == 0


def test_weights_detached_and_step_overrides():
    lp = LP.clone().requires_grad_(True)
    w, stats = stare_token_weights(lp, ADV, MASK, STAREConfig(variant="C2", top_p_ratio=0.1), reweight_w=1.3,
                                   reweight_m=0.7)
    assert not w.requires_grad
    assert w[0, 3].item() == pytest.approx(1.3) and w[1, 2].item() == pytest.approx(0.7)
    assert stats["stare/w"] == pytest.approx(1.3) and stats["stare/m"] == pytest.approx(0.7)
    with pytest.raises(ConfigError, match="reweight_w"):
        stare_token_weights(LP, ADV, MASK, reweight_w=0.5)


def test_advantages_per_token_and_float_mask():
    # [B, T] advantages with mixed signs in one row and a 0/1 float mask give the same as the reference.
    torch.manual_seed(1)
    lp = -torch.rand(3, 7) * 3
    adv = torch.randn(3, 7)
    mask = (torch.rand(3, 7) < 0.8).float()
    cfg = STAREConfig(variant="C2", top_p_ratio=0.3, reweight_w=1.5, reweight_m=0.5)
    w, _ = stare_token_weights(lp, adv, mask, cfg)
    pos = reference_selection(lp, (mask > 0) & (adv > 0), 0.3)
    neg = reference_selection(lp, (mask > 0) & (adv < 0), 0.3)
    expected = torch.ones(3, 7) + 0.5 * pos.float() - 0.5 * neg.float()
    assert torch.equal(w, expected)


@pytest.mark.parametrize("seed", range(6))
def test_matches_sort_reference_random(seed):
    """Random batches with many exact ties (values drawn from a small grid) against the sort-based reference."""
    g = torch.Generator().manual_seed(seed)
    for trial in range(60):
        b, t = torch.randint(1, 9, (2,), generator=g).tolist()
        if trial % 2:
            lp = -torch.randint(0, 4, (b, t), generator=g).float() * 0.25
        else:
            lp = -torch.rand(b, t, generator=g) * 6
        cand = torch.rand(b, t, generator=g) < 0.7
        p = [0.0, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0][trial % 7]
        sel, k, n = select_top_surprisal(lp, cand, p)
        ref = reference_selection(lp, cand, p)
        assert torch.equal(sel, ref), (lp, cand, p)
        assert int(k) == int(ref.sum()) and int(n) == int(cand.sum())


@pytest.mark.parametrize("chunk_elems", [1, 7, 64])
def test_chunked_sweeps_match_reference(monkeypatch, chunk_elems):
    """Tiny chunks (one row or a few rows per chunk) exercise the chunk boundaries of every sweep of the tensor
    implementation (the only one with chunks, so it runs whatever the backend parameter), with ties spread over
    many rows."""
    import stare_lab.selection.radix as radix_module

    monkeypatch.setenv("STARE_LAB_NATIVE", "0")
    monkeypatch.setattr(radix_module, "CHUNK_ELEMS", chunk_elems)
    g = torch.Generator().manual_seed(chunk_elems)
    for trial in range(40):
        b, t = torch.randint(1, 12, (2,), generator=g).tolist()
        lp = -torch.randint(0, 3, (b, t), generator=g).float() * 0.5 if trial % 2 else -torch.rand(b, t, generator=g)
        cand = torch.rand(b, t, generator=g) < 0.6
        p = [0.05, 0.1, 0.3, 0.5, 1.0][trial % 5]
        sel, k, _ = select_top_surprisal(lp, cand, p)
        assert torch.equal(sel, reference_selection(lp, cand, p)), (lp, cand, p)


def test_keys_around_the_threshold_bin_edges():
    """Surprisals whose float32 bit patterns sit just below, inside and just above one high-16-bit bin (the keys
    within 64 below the bin share the trash bins of the second pass; keys above clamp into the top trash bin)."""
    base = 0x3F800000  # bits of 1.0, a multiple of 2**15
    offsets = torch.tensor([-200, -65, -64, -63, -1, 0, 1, 2, 2, 5, 100, 32767, 32768, 32769, 40000])
    s = (base + offsets).to(torch.int32).view(torch.float32)
    lp = (-s).repeat(3, 1)
    g = torch.Generator().manual_seed(0)
    for trial in range(30):
        cand = torch.rand(lp.shape, generator=g) < 0.7
        p = (trial % 10 + 1) / 10
        sel, _, _ = select_top_surprisal(lp, cand, p)
        assert torch.equal(sel, reference_selection(lp, cand, p)), (cand, p)


def test_weights_are_exact_float32_values():
    """ω is exactly fl32(W) on L+, fl32(M) on L− and 1.0 elsewhere (bit patterns written directly)."""
    lp = -torch.rand(6, 9, generator=torch.Generator().manual_seed(3)) * 4
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 3.0])
    mask = torch.ones(6, 9, dtype=torch.bool)
    for w_val, m_val in [(1.1, 0.9), (1.3, 0.2), (5.0, 0.7), (1.0, 1.0), (3e38, 1e-30)]:
        cfg = STAREConfig(variant="C2", top_p_ratio=0.3, reweight_w=w_val, reweight_m=m_val)
        w, stats = stare_token_weights(lp, adv, mask, cfg)
        values = set(w.unique().tolist())
        assert values <= {1.0, torch.tensor(w_val).item(), torch.tensor(m_val).item()}
        pos = reference_selection(lp, mask & (adv[:, None] > 0), 0.3)
        neg = reference_selection(lp, mask & (adv[:, None] < 0), 0.3)
        expected = torch.where(pos, torch.tensor(w_val), torch.where(neg, torch.tensor(m_val), torch.tensor(1.0)))
        assert torch.equal(w, expected)


def test_selected_sets_are_the_hand_picked_tokens_and_give_the_same_weights():
    """select_stare_sets returns L+ and L− as masks (no marker weights): on the hand-made batch, P = 0.5, C2:
    L+ = {(0, 3), (0, 1), (0, 2)} (s = 3.0, 2.0, 0.5 of row 0), L− = {(1, 2), (1, 0)} (s = 4.0, 1.0 of row 1; the
    padding at (1, 4) never). The sets are the same whatever W and M — also W = M = 1, where ω cannot tell them
    apart — and ``weights(W, M)`` is bit for bit the ω of stare_token_weights."""
    sel = select_stare_sets(LP, ADV, MASK, 0.5, variant="C2")
    assert sel.lplus.nonzero().tolist() == [[0, 1], [0, 2], [0, 3]]
    assert sel.lminus.nonzero().tolist() == [[1, 0], [1, 2]]
    assert [int(sel.counts[k]) for k in ("stare/num_pos_selected", "stare/num_neg_selected",
                                         "stare/num_pos_candidates", "stare/num_neg_candidates")] == [3, 2, 5, 4]
    assert float(sel.counts["stare/frac_neg_selected"]) == pytest.approx(2 / 9)
    o1 = select_stare_sets(LP, ADV, MASK, 0.5, variant="O1")
    assert o1.lminus is None and torch.equal(o1.lplus, sel.lplus)
    assert int(o1.counts["stare/num_neg_selected"]) == 0
    g = torch.Generator().manual_seed(5)
    lp = -torch.rand(7, 11, generator=g) * 3
    adv = torch.randn(7, generator=g)
    mask = torch.rand(7, 11, generator=g) < 0.8
    for variant in ("O1", "C2"):
        sets = select_stare_sets(lp, adv, mask, 0.3, variant=variant)
        assert torch.equal(sets.lplus, reference_selection(lp, mask & (adv[:, None] > 0), 0.3))
        if variant == "C2":
            assert torch.equal(sets.lminus, reference_selection(lp, mask & (adv[:, None] < 0), 0.3))
        for w_val, m_val in [(1.0, 1.0), (1.3, 0.7), (3e38, 1e-30)]:
            cfg = STAREConfig(variant=variant, top_p_ratio=0.3, reweight_w=w_val, reweight_m=m_val)
            w, stats = stare_token_weights(lp, adv, mask, cfg)
            assert torch.equal(sets.weights(w_val, m_val), w)
            assert all(torch.equal(stats[k], v) for k, v in sets.counts.items())
    with pytest.raises(ConfigError, match="reweight_w"):
        sel.weights(0.5, 1.0)


def test_large_batch_matches_topk():
    """2·10^5 distinct surprisals spanning many exponents (both radix passes matter) vs torch.topk."""
    g = torch.Generator().manual_seed(0)
    lp = -torch.exp(torch.randn(400, 500, generator=g) * 4)  # s from ~1e-7 to ~1e7
    cand = torch.rand(400, 500, generator=g) < 0.5
    sel, k, n = select_top_surprisal(lp, cand, 0.1)
    s = torch.where(cand, -lp, torch.tensor(-1.0))
    top = torch.zeros(400 * 500, dtype=torch.bool)
    top[torch.topk(s.view(-1), int(k)).indices] = True
    assert int(k) == math.ceil(0.1 * int(n))
    assert torch.equal(sel.view(-1), top)


def test_check_inputs_and_shape_errors():
    bad = LP.clone()
    bad[0, 2] = float("nan")
    with pytest.raises(DataError, match=r"logprobs\[0, 2\]"):
        stare_token_weights(bad, ADV, MASK, check_inputs=True)
    pos = LP.clone()
    pos[1, 1] = 0.5  # a positive "log-probability"
    with pytest.raises(DataError, match="log-probability"):
        stare_token_weights(pos, ADV, MASK, check_inputs=True)
    pad_nan = LP.clone()
    pad_nan[1, 4] = float("nan")  # padding may hold anything for the selection
    stare_token_weights(pad_nan, ADV, MASK, check_inputs=True)
    with pytest.raises(DataError, match="advantages"):
        stare_token_weights(LP, torch.ones(3), MASK)
    with pytest.raises(DataError, match="response_mask"):
        stare_token_weights(LP, ADV, MASK[:, :4])
    with pytest.raises(DataError, match="candidates"):
        select_top_surprisal(LP, MASK[:1], 0.1)


# ---------------------------------------------------------------------------------------------- controller


def test_controller_gate_follows_target():
    ctl = STAREController(STAREConfig(target_entropy=0.3))
    assert ctl.gate_on is False  # no entropy seen yet: plain GRPO
    assert ctl.update(0.5) is False
    assert ctl.update(0.29) is True
    assert ctl.update(0.3) is False  # gate on iff H̄ < H_tgt (strict)
    assert ctl.reweight_w == 1.1 and ctl.reweight_m == 0.9  # adaptive off: W, M fixed
    assert STAREController(STAREConfig(gate="always")).update(5.0) is True
    assert STAREController(STAREConfig(gate="never")).update(0.0) is False


def test_controller_adaptive_schedule_by_hand():
    # α = 0.1, W0 = 1.1, M0 = 0.9, w_max = 1.3, m_min = 0.75, H_tgt = 0.3.
    cfg = STAREConfig(adaptive=True, alpha=0.1, reweight_w=1.1, reweight_m=0.9, w_max=1.3, m_min=0.75)
    ctl = STAREController(cfg)
    ctl.update(0.1)  # below target: W 1.2, M 0.8
    assert (ctl.reweight_w, ctl.reweight_m) == pytest.approx((1.2, 0.8))
    ctl.update(0.1)  # W 1.3 (= w_max), M 0.75 (= m_min, clipped from 0.7)
    assert (ctl.reweight_w, ctl.reweight_m) == pytest.approx((1.3, 0.75))
    ctl.update(0.1)  # stays clipped
    assert (ctl.reweight_w, ctl.reweight_m) == pytest.approx((1.3, 0.75))
    ctl.update(0.3)  # sgn(0) = 0: unchanged
    assert (ctl.reweight_w, ctl.reweight_m) == pytest.approx((1.3, 0.75))
    for _ in range(5):  # above target: W down to 1, M up to 1 (clipped)
        ctl.update(0.9)
    assert (ctl.reweight_w, ctl.reweight_m) == pytest.approx((1.0, 1.0))


def test_controller_non_finite_leaves_state_and_reports(caplog):
    ctl = STAREController(STAREConfig(adaptive=True))
    ctl.update(0.1)
    before = ctl.state_dict()
    with caplog.at_level(logging.WARNING, logger="stare_lab.loss.stare"):
        assert ctl.update(float("nan")) is True  # the previous decision
    assert "not finite" in caplog.text
    assert ctl.last_update_skipped is True and ctl.num_skipped == 1
    after = ctl.state_dict()
    assert {k: v for k, v in after.items() if k not in ("num_skipped", "last_update_skipped")} == {
        k: v for k, v in before.items() if k not in ("num_skipped", "last_update_skipped")
    }
    ctl.update(torch.tensor(float("inf")))
    assert ctl.num_skipped == 2
    ctl.update(torch.tensor(0.5))
    assert ctl.last_update_skipped is False and ctl.gate_on is False
    with pytest.raises(DataError):
        ctl.update("0.1")


def test_controller_state_dict_round_trip():
    cfg = STAREConfig(adaptive=True, alpha=0.05)
    a = STAREController(cfg)
    for h in (0.1, 0.2, 0.5, 0.05):
        a.update(h)
    b = STAREController(cfg)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    for h in (0.4, 0.1, 0.1):  # resumed controller continues identically
        assert a.update(h) == b.update(h)
        assert (a.reweight_w, a.reweight_m) == (b.reweight_w, b.reweight_m)
    state = a.state_dict()
    state.pop("reweight_w")
    with pytest.raises(DataError, match="missing keys"):
        b.load_state_dict(state)
    with pytest.raises(DataError, match="gate_on"):
        b.load_state_dict({**a.state_dict(), "gate_on": 1})


def test_native_and_tensor_implementations_agree_bit_for_bit(monkeypatch):
    """Large batches with per-row and per-token advantages, both variants, many ties: identical weights and counts."""
    monkeypatch.setenv("STARE_LAB_NATIVE", "1")
    if not native_select.available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the fused CPU selection kernel must build here: {native_select.load_error()}")
        pytest.skip(f"fused CPU selection kernel unavailable: {native_select.load_error()}")
    g = torch.Generator().manual_seed(7)
    for trial in range(8):
        b, t = 64 + trial * 13, 700 + trial * 111
        lp = -torch.rand(b, t, generator=g) * 5
        if trial % 2:
            lp = (lp * 4).round() / 4  # a coarse grid: many exact ties
        adv = torch.randn(b, generator=g) if trial < 4 else torch.randn(b, t, generator=g)
        adv[::7] = 0.0
        mask = torch.rand(b, t, generator=g) < 0.8
        cfg = STAREConfig(variant="C2" if trial % 3 else "O1", top_p_ratio=[0.1, 0.03, 0.5, 1.0][trial % 4],
                          reweight_w=1.3, reweight_m=0.6)
        monkeypatch.setenv("STARE_LAB_NATIVE", "1")
        w_native, s_native = stare_token_weights(lp, adv, mask, cfg)
        monkeypatch.setenv("STARE_LAB_NATIVE", "0")
        w_tensor, s_tensor = stare_token_weights(lp, adv, mask, cfg)
        assert torch.equal(w_native, w_tensor)
        for key in s_tensor:
            assert float(s_native[key]) == float(s_tensor[key]), key


def test_no_host_synchronisation_in_the_selection(monkeypatch, backend):
    """The selection never reads a tensor value back into Python (.item(), .tolist(), bool()/int()/float() of a
    tensor, data-dependent nonzero): on an accelerator each of those would stall the device."""
    lp = -torch.rand(37, 53, generator=torch.Generator().manual_seed(5)) * 4
    adv = torch.randn(37, generator=torch.Generator().manual_seed(6))
    mask = torch.rand(37, 53, generator=torch.Generator().manual_seed(7)) < 0.7

    def forbidden(*args, **kwargs):
        raise AssertionError("host synchronisation in the selection")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    monkeypatch.setattr(torch, "nonzero", forbidden)
    for variant in ("O1", "C2"):
        w, stats = stare_token_weights(lp, adv, mask, STAREConfig(variant=variant, top_p_ratio=0.2))
    monkeypatch.undo()
    monkeypatch.setenv("STARE_LAB_NATIVE", "1" if backend == "native" else "0")
    pos = reference_selection(lp, mask & (adv[:, None] > 0), 0.2)
    neg = reference_selection(lp, mask & (adv[:, None] < 0), 0.2)
    expected = torch.where(pos, torch.tensor(1.1), torch.where(neg, torch.tensor(0.9), torch.tensor(1.0)))
    assert torch.equal(w, expected)


def test_weights_must_be_representable_in_float32_and_controller_inputs():
    with pytest.raises(ConfigError, match="reweight_w"):
        stare_token_weights(LP, ADV, MASK, STAREConfig(), reweight_w=1e39)
    with pytest.raises(ConfigError, match="reweight_m"):
        stare_token_weights(LP, ADV, MASK, STAREConfig(variant="C2"), reweight_m=1e-46)  # would round to 0
    import numpy as np

    ctl = STAREController(STAREConfig(target_entropy=0.3))
    assert ctl.update(np.float32(0.2)) is True and ctl.last_entropy == pytest.approx(0.2)
    state = ctl.state_dict()
    for key, value in (("reweight_w", 0.2), ("reweight_w", float("nan")), ("reweight_m", 0.0), ("reweight_m", 1.5)):
        with pytest.raises(DataError, match=key):
            STAREController().load_state_dict({**state, key: value})
