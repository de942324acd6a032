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


def _grid_run(path, w: float, seed: int, gate) -> None:
    cfg = {"source": "simulator", "method": "o1", "seed": seed,
           "loss": {"loss_mode": "stare", "stare": {"variant": "O1", "reweight_w": w}}}
    with RunWriter(path, cfg) as wr:
        for i in range(10):
            wr.log({"step": i, "entropy": 1.0, "reward": 0.5, "gate_on": gate(i), "stare_w": w, "stare_m": 1.0,
                    "pred_entropy_change": None, "entropy_change": None})


def test_gate_panel_is_one_row_per_grid_point_for_more_than_four(tmp_path):
    """Review finding: 8 grid points of one method gave 8 shades of one colour in the gate panel. With 5 W values
    the panel has one row per group, top to bottom in group order, each row's value the fraction of its 2 seeds
    with the gate on: W=1.1 seeds on/off every step → 0.5; the others on from step 5 in both seeds → 0, then 1."""
    ws = (1.1, 1.2, 1.3, 1.4, 1.5)
    for w in ws:
        for seed in (0, 1):
            gate = (lambda i, s=seed: int(s == 0)) if w == 1.1 else (lambda i: int(i >= 5))
            _grid_run(tmp_path / f"W={w}" / f"seed{seed}", w, seed, gate)
    _run(tmp_path / "grpo" / "seed0", "grpo", None, lambda i: 1.0, steps=10)
    ax_g = plot_dynamics(compare(tmp_path)).axes[2]
    assert [t.get_text() for t in ax_g.get_yticklabels()] == [f"W={w:g}" for w in ws]  # no row for GRPO
    assert "black: on in all seeds" in ax_g.get_title() and not ax_g.get_lines()
    rows = [np.asarray(m.get_array()).ravel() for m in ax_g.collections]
    assert len(rows) == 5 and rows[0].tolist() == [0.5] * 10
    assert all(r.tolist() == [0.0] * 5 + [1.0] * 5 for r in rows[1:])
    # four grid points: lines as before
    import shutil

    shutil.rmtree(tmp_path / "W=1.5")
    ax_g = plot_dynamics(compare(tmp_path)).axes[2]
    assert not ax_g.collections and len(ax_g.get_lines()) == 5  # 4 o1 groups + GRPO (gate off)
