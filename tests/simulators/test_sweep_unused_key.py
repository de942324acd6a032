"""A --sweep over a key that none of the chosen methods uses is an error naming the key (it used to collapse
silently into one group): loss.stare.* keys change STARE methods only, loss.stare.reweight_m only variant C2."""

from __future__ import annotations

import pytest

from stare_lab.cli import main as cli_main
from stare_lab.errors import ConfigError
from simulators.sweep import plan_sweep


def test_grpo_only_sweep_over_w_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli_main(["simulate", "--methods", "grpo", "--sweep", "stare.reweight_w=1.1,1.2,1.3", "--out", str(out),
                     "--no-plots"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stare-lab simulate: error: --sweep loss.stare.reweight_w: none of the methods grpo uses "
                   "loss.stare.reweight_w (only STARE methods (e.g. o1, c2) do), so every grid point would be the "
                   "same run; add such a method to --methods or sweep another key"]
    assert not out.exists()


def test_m_needs_c2_and_used_keys_pass(tmp_path):
    with pytest.raises(ConfigError, match=r"--sweep loss.stare.reweight_m: none of the methods o1,grpo uses"):
        plan_sweep("collapse", ["o1", "grpo"], 1, tmp_path / "a", sweep=["stare.reweight_m=0.8,0.9"])
    plan = plan_sweep("collapse", ["grpo", "c2"], 1, tmp_path / "b", sweep=["stare.reweight_m=0.8,0.9"])
    assert sorted(plan.groups) == ["c2 [M=0.8]", "c2 [M=0.9]", "grpo"]
    plan = plan_sweep("collapse", ["grpo"], 1, tmp_path / "c", sweep=["lr=0.5,1.0"])  # a key GRPO uses
    assert len(plan.groups) == 2
