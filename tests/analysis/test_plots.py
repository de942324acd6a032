"""What the report's figures draw (read back from the matplotlib artists, not from the pixels)."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from analysis.compare import compare
from analysis.plots import plot_dynamics
from stare_lab.runs import RunWriter


@pytest.fixture(autouse=True)
def _matplotlib():
    if os.environ.get("CI") == "true":
        importlib.import_module("matplotlib")
    else:
        pytest.importorskip("matplotlib")


def _run(path, method: str, variant: str | None, m_of_step, steps: int = 20) -> None:
    """A run whose logged ``stare_m`` follows ``m_of_step`` (as O1-adaptive's controller logs an M that O1 never
    applies) and ``stare_w`` = 1.2 (1 for the baseline)."""
    loss = {"loss_mode": "grpo"} if variant is None else {"loss_mode": "stare", "stare": {"variant": variant}}
    cfg = {"source": "simulator", "method": method, "seed": 0, "loss": loss}
    with RunWriter(path, cfg) as w:
        for i in range(steps):
            w.log({"step": i, "entropy": 1.0, "reward": 0.5, "gate_on": 1, "stare_w": 1.0 if variant is None else 1.2,
                   "stare_m": m_of_step(i), "pred_entropy_change": None, "entropy_change": None})


def test_weights_panel_draws_m_only_for_c2(tmp_path):
    """Review finding: o1-adaptive's logged M (falling to 0.5) was drawn although O1 never applies M. Expected:
    W lines for the two STARE groups (1.2), one M line (c2's 0.9), nothing at 0.5, nothing for GRPO but the
    reference line at 1."""
    _run(tmp_path / "grpo" / "seed0", "grpo", None, lambda i: 1.0)
    _run(tmp_path / "o1-adaptive" / "seed0", "o1-adaptive", "O1", lambda i: max(0.5, 1.0 - 0.05 * i))
    _run(tmp_path / "c2" / "seed0", "c2", "C2", lambda i: 0.9)
    fig = plot_dynamics(compare(tmp_path))
    ax_w = fig.axes[3]
    assert "C2 only" in ax_w.get_title()
    levels = sorted(round(float(np.mean(line.get_ydata())), 6) for line in ax_w.get_lines())
    assert levels == [0.9, 1.0, 1.2, 1.2], levels  # c2's M, the reference at 1, W of o1-adaptive and of c2
    assert all(float(np.min(line.get_ydata())) > 0.85 for line in ax_w.get_lines())  # no o1-adaptive M at 0.5
