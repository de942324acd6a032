"""Tests of stare_lab.selection.native: building, caching, the fallback without a compiler, and argument checks.
(Its results are compared with the tensor implementation and an independent sort in test_stare.py.)"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from stare_lab.selection import native as native_select
from stare_lab.config import STAREConfig
from stare_lab.loss.stare import stare_token_weights


@pytest.fixture
def fresh_state(monkeypatch, tmp_path):
    """A clean build state and cache directory; the module's state is restored afterwards."""
    monkeypatch.setattr(native_select, "_lib", None)
    monkeypatch.setattr(native_select, "_error", None)
    monkeypatch.setattr(native_select, "_tried", False)
    monkeypatch.setenv("STARE_LAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("STARE_LAB_NATIVE", "1")
    return tmp_path


def test_builds_into_the_cache_dir_and_reuses_it(fresh_state):
    if not native_select.available():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: the kernel must build: {native_select.load_error()}")
        pytest.skip(f"no C compiler: {native_select.load_error()}")
    libs = list(fresh_state.glob("stare_select-*.so"))
    assert len(libs) == 1
    mtime = libs[0].stat().st_mtime_ns
    native_select._lib, native_select._tried = None, False
    assert native_select.available()  # loads the cached library, does not rebuild
    assert libs[0].stat().st_mtime_ns == mtime and len(list(fresh_state.glob("*.so"))) == 1


def test_without_a_compiler_falls_back_to_the_tensor_implementation(fresh_state, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    lp = -torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) * 3
    adv = torch.tensor([1.0, -1.0, 2.0, 0.0])
    mask = torch.ones(4, 6, dtype=torch.bool)
    with caplog.at_level(logging.WARNING):
        w, stats = stare_token_weights(lp, adv, mask, STAREConfig(top_p_ratio=0.25, reweight_w=2.0))
    assert not native_select.available()
    assert "nonexistent" in (native_select.load_error() or "")
    assert "tensor implementation" in caplog.text
    # k = ⌈0.25 · 12⌉ = 3 of the 12 tokens of rows 0 and 2 (Â > 0), highest surprisal first
    s = torch.where(mask & (adv[:, None] > 0), -lp, torch.tensor(-1.0)).view(-1)
    expected = torch.ones(24)
    expected[torch.topk(s, 3).indices] = 2.0
    assert torch.equal(w.view(-1), expected) and int(stats["stare/num_pos_selected"]) == 3


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("STARE_LAB_NATIVE", "0")
    assert not native_select.available()
    with pytest.raises(RuntimeError, match="not available"):
        native_select.select_into(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool),
                                  torch.ones(1, 1, dtype=torch.uint8), 0.1, torch.zeros(1, 1, dtype=torch.int32),
                                  1, 1, 0)


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("ON", True), ("0", False), ("off", False),
                                       ("False", False)])
def test_the_switch_values(monkeypatch, value, on):
    from stare_lab.selection import native_enabled

    monkeypatch.setenv("STARE_LAB_NATIVE", value)
    assert native_enabled() is on


def test_a_bad_switch_value_is_refused_not_ignored(monkeypatch):
    """Issue 29, item 7: STARE_LAB_NATIVE=banana was silently the default (on); it is a ConfigError naming the
    value, from the kernel's own check and before any command runs (the front door)."""
    from stare_lab.cli import main
    from stare_lab.errors import ConfigError

    monkeypatch.setenv("STARE_LAB_NATIVE", "banana")
    with pytest.raises(ConfigError, match=r"STARE_LAB_NATIVE='banana' is not one of 1, 0"):
        native_select.available()
    assert main(["simulate", "--steps", "1", "--out", "/nonexistent/never-written"]) == 1


def test_rejects_a_bad_output_buffer(monkeypatch):
    monkeypatch.setenv("STARE_LAB_NATIVE", "1")
    if not native_select.available():
        pytest.skip("no C compiler")
    with pytest.raises(RuntimeError, match="contiguous int32"):
        native_select.select_into(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                  torch.ones(2, 1, dtype=torch.uint8), 0.1, torch.zeros(2, 3), 1, 1, 0)


def test_cc_with_arguments_is_split_like_a_shell_word_list(fresh_state, monkeypatch):
    """CC="cc -O2" (a compiler with flags, as make accepts it) builds; a wrong first word is reported by name."""
    import shutil

    if shutil.which("cc") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: no C compiler")
        pytest.skip("no C compiler")
    monkeypatch.setenv("CC", "cc -O2")
    assert native_select.available(), native_select.load_error()
