"""STARE selection with verl's layout: ``[B, T]`` advantages (constant along each row, zero on padding, or truly
per token) and a float / int 0/1 mask read as they are. The fused CPU kernel must give the weights of the tensor
implementation (STARE_LAB_NATIVE=0) and of an independent sort, bit for bit, for every layout.

Independent reference (docs/theory.md §4): L+ = the ⌈P·n+⌉ valid tokens with Â > 0 of largest surprisal −log p (ties
in row-major order), weight W; for C2 likewise L− among Â < 0, weight M; 1 elsewhere."""

from __future__ import annotations

import math
import os

import pytest
import torch

from stare_lab.selection import native as native_select
from stare_lab.config import STAREConfig
from stare_lab.loss.stare import stare_token_weights


@pytest.fixture(autouse=True)
def kernel(monkeypatch):
    monkeypatch.setenv("STARE_LAB_NATIVE", "1")
    if not native_select.available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the kernel must build: {native_select.load_error()}")
        pytest.skip(f"no C compiler: {native_select.load_error()}")


def _reference(lp, adv_bt, valid, p, w, m, c2):
    """Sort-based selection on the flattened batch (stable sort on −surprisal keeps row-major order for ties)."""
    s = (-lp.to(torch.float32)).abs().reshape(-1)
    out = torch.ones(s.numel())
    for sign, value in ((1, w), (-1, m)):
        if sign < 0 and not c2:
            continue
        cand = (valid.reshape(-1) != 0) & (adv_bt.reshape(-1) * sign > 0)
        idx = cand.nonzero().squeeze(1)
        if idx.numel() == 0:
            continue
        k = max(1, math.ceil(p * idx.numel() * (1 - 1e-12)))
        order = torch.sort(-s[idx], stable=True).indices[:k]
        out[idx[order]] = torch.tensor(value, dtype=torch.float32)
    return out.view(lp.shape)


def _batch(seed=0, b=24, t=40):
    g = torch.Generator().manual_seed(seed)
    lp = -(torch.rand(b, t, generator=g).pow(3) * 6)
    lp[0, :10] = -1.5  # ties
    adv = torch.randn(b, generator=g)
    adv[3] = 0.0
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    lengths[1] = 0  # a row without a valid token
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return lp, adv, mask


LAYOUTS = ["B-bool", "BT-rowconst-float", "BT-rowconst-int64", "BT-expanded-bool", "BT-pertoken-float",
           "BT-pertoken-int32", "B-uint8"]


def _inputs(layout, lp, adv, mask, seed):
    fmask = mask.to(torch.float32)
    if layout == "B-bool":
        return adv, mask
    if layout == "BT-rowconst-float":  # verl: scores.unsqueeze(-1) * response_mask
        return adv[:, None] * fmask, fmask
    if layout == "BT-rowconst-int64":
        return adv[:, None] * fmask, mask.to(torch.int64)
    if layout == "BT-expanded-bool":  # constant by construction (stride 0)
        return adv[:, None].expand_as(lp), mask
    if layout == "B-uint8":
        return adv, mask.to(torch.uint8)
    per = torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed + 100))
    per[2] = 0.0
    return per, (fmask if layout.endswith("float") else mask.to(torch.int32))


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_equals_tensor_path_and_sort(monkeypatch, layout, variant):
    for seed in range(3):
        lp, adv, mask = _batch(seed)
        adv_in, mask_in = _inputs(layout, lp, adv, mask, seed)
        cfg = STAREConfig(variant=variant, top_p_ratio=0.2, reweight_w=1.3, reweight_m=0.7, scope="global")
        w_native, st_native = stare_token_weights(lp, adv_in, mask_in, cfg)
        monkeypatch.setenv("STARE_LAB_NATIVE", "0")
        w_tensor, st_tensor = stare_token_weights(lp, adv_in, mask_in, cfg)
        monkeypatch.setenv("STARE_LAB_NATIVE", "1")
        adv_bt = adv_in if adv_in.dim() == 2 and adv_in.shape[1] == lp.shape[1] else adv_in.reshape(-1, 1).expand_as(lp)
        ref = _reference(lp, adv_bt, mask_in, 0.2, 1.3, 0.7, variant == "C2")
        assert torch.equal(w_native, w_tensor) and torch.equal(w_native, ref), (layout, variant, seed)
        for key in ("stare/num_pos_selected", "stare/num_neg_selected", "stare/num_pos_candidates",
                    "stare/num_neg_candidates", "stare/frac_pos_selected"):
            assert torch.equal(st_native[key], st_tensor[key]), key


def test_nan_advantage_is_in_no_set():
    """A NaN advantage on a valid token is neither > 0 nor < 0 (as in the tensor path): never selected."""
    lp, adv, mask = _batch(1)
    per = adv[:, None] * mask.to(torch.float32)
    per[0, 0] = float("nan")
    w, _ = stare_token_weights(lp, per, mask.to(torch.float32), STAREConfig(variant="C2", top_p_ratio=1.0))
    assert w[0, 0] == 1.0
