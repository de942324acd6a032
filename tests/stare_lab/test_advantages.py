"""Tests of stare_lab.loss.advantages against hand-computed group statistics (docs/theory.md §3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stare_lab.loss.advantages import filter_groups, group_advantages
from stare_lab.errors import ConfigError, DataError


def test_grpo_hand_group():
    """r = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 · 0.25 / 3) = sqrt(1/3) (by hand)."""
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    expect = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([expect, -expect, -expect, expect]), rtol=1e-6, atol=0)


def test_grpo_two_groups_and_eps():
    """Groups [1, 2, 3] (mean 2, std 1) and [0, 0, 6] (mean 2, std sqrt((4+4+16)/2) = sqrt(12)), eps = 0.5."""
    adv = group_advantages([1.0, 2.0, 3.0, 0.0, 0.0, 6.0], group_size=3, eps=0.5)
    s = math.sqrt(12.0)
    expect = [-1 / 1.5, 0.0, 1 / 1.5, -2 / (s + 0.5), -2 / (s + 0.5), 4 / (s + 0.5)]
    torch.testing.assert_close(adv, torch.tensor(expect), rtol=1e-6, atol=1e-7)


def test_dr_grpo_and_rloo_hand_values():
    """r = [1, 0, 0, 1]: dr_grpo = r − 0.5; rloo r_0 − mean(0, 0, 1) = 2/3, r_1 − mean(1, 0, 1) = −2/3 (by hand)."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(group_advantages(r, group_size=4, estimator="dr_grpo"), r - 0.5)
    torch.testing.assert_close(
        group_advantages(r, group_size=4, estimator="rloo"), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    )
    # uneven rewards: r = [3, 1, 2]: r_0 − (1+2)/2 = 1.5, r_1 − (3+2)/2 = −1.5, r_2 − (3+1)/2 = 0
    torch.testing.assert_close(
        group_advantages([3.0, 1.0, 2.0], group_size=3, estimator="rloo"), torch.tensor([1.5, -1.5, 0.0])
    )


def test_qae_two_regimes_binary():
    """QAE, K = 0.4, G = 8: Q_K is the sorted reward of rank ⌈3.2⌉ = 4. Hard query (2/8 correct, p ≤ 1−K):
    Q_K = 0, failures get 0. Easy query (6/8 correct, p > 1−K): Q_K = 1, successes get 0 (paper's two-regime gate)."""
    hard = [1.0, 0, 0, 1, 0, 0, 0, 0]
    easy = [1.0, 1, 0, 1, 1, 1, 0, 1]
    adv = group_advantages(hard + easy, group_size=8, estimator="qae", quantile_k=0.4)
    std_hard = np.std(hard, ddof=1)
    std_easy = np.std(easy, ddof=1)
    expect = [x / (std_hard + 1e-6) for x in hard] + [(x - 1) / (std_easy + 1e-6) for x in easy]
    torch.testing.assert_close(adv, torch.tensor(expect, dtype=torch.float32), rtol=1e-6, atol=0)
    # boundary p = 5/8 = 0.625 > 0.6: Q_K = 1 (a linear-interpolation quantile would give 0.8 here)
    mid = [1.0, 1, 1, 1, 1, 0, 0, 0]
    assert (group_advantages(mid, group_size=8, estimator="qae")[:5] == 0).all()


def test_qae_matches_numpy_inverted_cdf():
    """Baseline equals numpy.quantile(method='inverted_cdf') (an independent implementation), for several K."""
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(5 * 7, generator=gen, dtype=torch.float64)
    for k in (0.0, 0.1, 0.4, 0.5, 0.99, 1.0):
        adv = group_advantages(r, group_size=7, estimator="qae", quantile_k=k, eps=0.0)
        groups = r.numpy().reshape(5, 7)
        q = np.quantile(groups, k, axis=1, method="inverted_cdf")
        expect = (groups - q[:, None]) / groups.std(axis=1, ddof=1)[:, None]
        np.testing.assert_allclose(adv.numpy(), expect.reshape(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "qae"])
def test_constant_groups_and_singletons_are_exactly_zero(estimator):
    """All-equal groups (including 0.1 three times, whose float mean is not exactly 0.1) and groups of one → 0."""
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 7.0, 7.0, 7.0])
    adv = group_advantages(r, group_size=3, estimator=estimator)
    assert torch.equal(adv[:3], torch.zeros(3)) and torch.equal(adv[6:], torch.zeros(3))
    assert (adv[3:6] != 0).any()
    single = group_advantages(torch.tensor([0.3, -2.0]), group_size=1, estimator=estimator)
    assert torch.equal(single, torch.zeros(2))
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo", "qae"])
def test_group_ids_uneven_unsorted(estimator):
    """Uneven, interleaved groups via ids equal the per-group computation with group_size on each group alone."""
    r = torch.tensor([1.0, 5.0, 0.0, 2.0, 1.0, 9.0, 3.0])
    ids = torch.tensor([7, -1, 7, 3, 7, -1, 3])
    adv = group_advantages(r, group_ids=ids, estimator=estimator)
    for label in (7, -1, 3):
        sel = ids == label
        alone = group_advantages(r[sel], group_size=int(sel.sum()), estimator=estimator)
        torch.testing.assert_close(adv[sel], alone)


def test_errors():
    with pytest.raises(DataError, match="finite"):
        group_advantages([1.0, float("nan")], group_size=2)
    with pytest.raises(DataError, match="finite"):
        filter_groups(torch.tensor([1.0, float("inf")]), 2)
    with pytest.raises(DataError, match="group_size=4"):
        group_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(DataError, match="shape"):
        group_advantages(torch.zeros(2, 3), group_size=3)
    with pytest.raises(DataError, match="group_ids"):
        group_advantages(torch.zeros(3), group_ids=[0, 1])
    with pytest.raises(ConfigError, match="exactly one"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ConfigError, match="exactly one"):
        group_advantages(torch.zeros(4), group_size=2, group_ids=[0, 0, 1, 1])
    with pytest.raises(ConfigError, match="estimator='ppo'"):
        group_advantages(torch.zeros(4), group_size=2, estimator="ppo")
    with pytest.raises(ConfigError, match="quantile_k=1.5"):
        group_advantages(torch.zeros(4), group_size=2, estimator="qae", quantile_k=1.5)
    with pytest.raises(ConfigError, match="group_size=0"):
        group_advantages(torch.zeros(4), group_size=0)


def test_filter_groups():
    """Keep groups with ≥ 2 distinct rewards: [0,0] drop, [0,1] keep, [1,1] drop, [0.5,0.2] keep (by hand)."""
    keep = filter_groups(torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.2]), 2)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, True, True, False, False, True, True]
    keep = filter_groups([1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 1, 1])
    assert keep.tolist() == [True, True, False, False]
    # bool rewards (correct / wrong) read as 0/1
    assert filter_groups(torch.tensor([True, False, True, True]), 2).tolist() == [True, True, False, False]
    torch.testing.assert_close(
        group_advantages(torch.tensor([True, False]), group_size=2, estimator="dr_grpo"), torch.tensor([0.5, -0.5])
    )


def test_deterministic_and_empty():
    r = torch.rand(64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(group_advantages(r, group_size=8), group_advantages(r.clone(), group_size=8))
    assert group_advantages(torch.zeros(0), group_size=4).shape == (0,)
