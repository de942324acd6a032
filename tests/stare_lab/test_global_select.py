"""stare_lab.selection.distributed: the distributed radix top-k equals the one-process selection token for token.

Reference: :func:`stare_lab.loss.stare.select_top_surprisal` on the concatenated batch (itself checked against a sort in
test_stare.py), and a stable sort for the quantile keys. Ranks are threads with an exact int64 sum collective.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from stare_lab.collective import LocalCollective
from stare_lab.errors import DataError
from stare_lab.selection.distributed import distributed_top_k, key_to_float, ordered_keys, surprisal_keys
from stare_lab.selection.radix import num_selected as _num_selected, select_top_surprisal

sys.path.insert(0, str(Path(__file__).parent))
from _ranks import run_ranks  # noqa: E402


def _split(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(x, sizes))


@pytest.mark.parametrize("world, sizes", [(1, [7]), (2, [3, 4]), (3, [0, 5, 2])])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_matches_select_top_surprisal_with_ties(world, sizes, p):
    g = torch.Generator().manual_seed(11)
    # log-probs on a grid of 4 values: many exact ties at the threshold
    lp = -torch.randint(0, 4, (7, 9), generator=g).float() * 0.5
    cand = torch.rand(7, 9, generator=g) > 0.3
    ref, k_ref, n_ref = select_top_surprisal(lp, cand, p)
    parts_lp, parts_c = _split(lp, sizes), _split(cand, sizes)

    def fn(coll):
        r = coll.rank
        keys = torch.where(parts_c[r], surprisal_keys(parts_lp[r]), -1)
        return distributed_top_k([keys], [lambda n: _num_selected(n, p)], coll, [True])[0]

    if world == 1:
        res = [fn(LocalCollective())]
    else:
        res, _ = run_ranks(world, fn)
    sel = torch.cat([r.selected for r in res])
    assert torch.equal(sel, ref)
    assert all(int(r.k) == int(k_ref) and int(r.n) == int(n_ref) for r in res)


def test_quantile_value_equals_the_kth_largest():
    """k-th largest of values of any sign (−0.0 counted as +0.0), from a sort."""
    g = torch.Generator().manual_seed(3)
    vals = torch.cat([torch.randn(40, generator=g), torch.tensor([0.0, -0.0, 3.5, 3.5, -2.25])])
    sorted_desc = torch.sort(vals, descending=True).values
    for k in (1, 2, 7, 45):
        def fn(coll, k=k):
            part = vals[coll.rank * 23:(coll.rank + 1) * 23]
            return distributed_top_k([ordered_keys(part)], [lambda n: torch.full_like(n, k)], coll, [False])[0]

        res, group = run_ranks(2, fn)
        assert key_to_float(res[0].threshold).item() == sorted_desc[k - 1].item()
        assert res[0].selected is None and group.calls == [2, 2]  # no tie pass without positions


def test_keys_round_trip_and_order():
    x = torch.tensor([-3.0, -1e-30, 0.0, 1e-30, 2.0, float("inf"), -float("inf")])
    keys = ordered_keys(x)
    assert torch.equal(torch.stack([key_to_float(k) for k in keys]), x)
    assert torch.equal(torch.argsort(keys), torch.argsort(x))
    assert int(ordered_keys(torch.tensor([-0.0]))[0]) == int(ordered_keys(torch.tensor([0.0]))[0])


def test_two_sets_in_the_same_three_collectives():
    lp = -torch.arange(12.0).reshape(3, 4) / 4
    adv = torch.tensor([1.0, -1.0, 1.0])[:, None].expand(3, 4)

    def fn(coll):
        rows = slice(0, 2) if coll.rank == 0 else slice(2, 3)
        s = surprisal_keys(lp[rows])
        keys = [torch.where(adv[rows] > 0, s, -1), torch.where(adv[rows] < 0, s, -1)]
        return distributed_top_k(keys, [lambda n: _num_selected(n, 0.25)] * 2, coll, [True, True])

    res, group = run_ranks(2, fn)
    assert group.calls == [3, 3]
    # L+ from rows 0 and 2 (8 tokens, k = 2): surprisals 2.75, 2.5 (row 2); L− from row 1 (4 tokens, k = 1): 1.75
    pos = torch.cat([res[0][0].selected, res[1][0].selected])
    neg = torch.cat([res[0][1].selected, res[1][1].selected])
    assert pos.nonzero().tolist() == [[2, 2], [2, 3]] and neg.nonzero().tolist() == [[1, 3]]


def test_bad_arguments():
    with pytest.raises(DataError, match="must be as many"):
        distributed_top_k([torch.zeros(2, dtype=torch.int64)], [], LocalCollective(), [True])
    with pytest.raises(DataError, match="int64"):
        distributed_top_k([torch.zeros(2)], [lambda n: n], LocalCollective(), [True])
    with pytest.raises(DataError, match="must lie in"):
        distributed_top_k([torch.zeros(2, dtype=torch.int64)], [lambda n: n + 1], LocalCollective(), [True])
