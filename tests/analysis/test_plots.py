"""What the report's figures draw (read back from the matplotlib artists, not from the pixels)."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from analysis.compare import compare
from analysis.plots import plot_dynamics
from stare_lab.platform.runs import RunWriter


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


def _legend_colours(fig) -> set[str]:
    """The colours the figure's legend names (lines and patches), as hex."""
    from matplotlib.colors import to_hex

    out = set()
    for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
        for h in leg.legend_handles:
            if hasattr(h, "get_color"):
                out.add(to_hex(h.get_color()))
            if hasattr(h, "get_facecolor"):
                out.add(to_hex(h.get_facecolor()))
    return out


def _methods_run(root, method: str, seed: int, h_late: float, steps: int = 40) -> None:
    """Entropy 1.5 for the first half, then ``h_late`` (nats); seed-dependent noise on reward and ΔH so bands exist;
    measured ΔH = predicted ΔH + a seeded offset."""
    variant = {"o1": "O1", "c2": "C2", "o1-adaptive": "O1"}.get(method)
    loss = {"loss_mode": "grpo"} if variant is None else {"loss_mode": "stare", "stare": {
        "variant": variant, "target_entropy": 0.4}}
    cfg = {"source": "simulator", "method": method, "seed": seed, "loss": loss}
    rng = np.random.default_rng(seed)
    with RunWriter(root / method / f"seed{seed}", cfg) as w:
        for i in range(steps):
            pred = -0.01 * (i % 7)
            w.log({"step": i, "entropy": (1.5 if i < steps // 2 else h_late) + 0.01 * seed, "reward": 0.5 + 0.1 * seed,
                   "gate_on": 0, "stare_w": 1.0 if variant is None else 1.2, "stare_m": 1.0,
                   "pred_entropy_change": pred, "entropy_change": pred + 0.001 * rng.standard_normal()})


@pytest.fixture
def four_methods(tmp_path):
    """grpo, o1, c2, o1-adaptive × 2 seeds; late entropies 0.2, 0.3, 0.38, 0.4 (+ 0.01 for seed 1)."""
    for method, h in (("grpo", 0.2), ("o1", 0.3), ("c2", 0.38), ("o1-adaptive", 0.4)):
        for seed in (0, 1):
            _methods_run(tmp_path, method, seed, h)
    return compare(tmp_path)


def test_bands_are_edge_lines_in_legend_colours(four_methods):
    """Review finding: overlapping translucent seed bands blended into a grey that no legend names. Every line of
    the entropy and reward panels is drawn in a colour the legend names (a band's two edges in its group's colour),
    nothing is translucent, and the only filled patch is the opaque target band."""
    from matplotlib.colors import to_hex, to_rgba

    from analysis.figstyle import SEED_BAND

    fig = plot_dynamics(four_methods)
    named = _legend_colours(fig)
    for ax in (fig.axes[0], fig.axes[1], fig.axes[4]):  # zoomed entropy, reward, whole-run entropy
        edges = [line for line in ax.get_lines() if line.get_gid() == SEED_BAND]
        assert len(edges) == 2 * 4  # two seeds per group: a band for each of the 4 groups
        for line in ax.get_lines():
            if line.get_gid() == SEED_BAND or line.get_label()[:1] != "_":
                assert to_hex(line.get_color()) in named and to_rgba(line.get_color())[3] == 1.0
                assert line.get_alpha() in (None, 1.0)
        for coll in ax.collections:
            assert coll.get_hatch() and all(c[3] == 1.0 for c in coll.get_facecolor())  # the target band only
    assert any("95% seed band" in t.get_text() for t in fig.axes[5].get_legend().get_texts())


def test_entropy_panel_is_zoomed_on_the_band_and_the_second_half(four_methods):
    """The zoomed panel spans the seed means over the second half (steps ≥ 19.5: 0.205, 0.305, 0.385, 0.405) and
    the target band 0.4 ± 0.05: [0.205, 0.45], span 0.245, widened by 10% each side → [0.1805, 0.4745]. The
    whole-run panel starts at 0 and reaches the first half's 1.505."""
    fig = plot_dynamics(four_methods)
    assert fig.axes[0].get_ylim() == pytest.approx((0.1805, 0.4745), abs=1e-9)
    lo, hi = fig.axes[4].get_ylim()
    assert lo == 0.0 and hi > 1.505
    assert "whole run" in fig.axes[4].get_title()


def test_a_sweep_grid_is_a_colour_scale_with_a_colour_bar(tmp_path):
    """Review finding: eight W values were eight near-identical reds. Five W values of o1: each group's line has
    its own colour, in W order along the colour map, a colour bar ticked 1.1 … 1.5 names them, and the legend
    names o1 once (not five times) next to GRPO, which keeps its own colour."""
    from matplotlib.colors import to_hex

    from analysis.figstyle import COLOUR_BAR, METHOD_COLORS

    ws = (1.1, 1.2, 1.3, 1.4, 1.5)
    for w in ws:
        for seed in (0, 1):
            _grid_run(tmp_path / f"W={w}" / f"seed{seed}", w, seed, lambda i: 1)
    _run(tmp_path / "grpo" / "seed0", "grpo", None, lambda i: 1.0, steps=10)
    fig = plot_dynamics(compare(tmp_path))
    bars = [ax for ax in fig.axes if ax.get_label() == COLOUR_BAR]
    assert len(bars) == 1
    assert [t.get_text() for t in bars[0].get_xticklabels()] == ["1.1", "1.2", "1.3", "1.4", "1.5"]
    assert "W (loss.stare.reweight_w) of o1" == bars[0].get_xlabel()
    w_lines = {round(float(np.mean(line.get_ydata())), 6): to_hex(line.get_color()) for line in fig.axes[3].get_lines()
               if line.get_label()[:1] == "_" and float(np.mean(line.get_ydata())) > 1.05}
    assert sorted(w_lines) == list(ws) and len(set(w_lines.values())) == 5  # five distinct colours
    from matplotlib.collections import QuadMesh

    solids = next(c for c in bars[0].collections if isinstance(c, QuadMesh))  # the bar's cells
    cells = [to_hex(c) for c in solids.to_rgba(np.asarray(solids.get_array()).ravel())]
    assert [w_lines[w] for w in ws] == cells  # each line's colour is its W's cell of the colour bar
    labels = [t.get_text() for t in fig.axes[5].get_legend().get_texts()]
    assert sum(x.startswith("o1") for x in labels) == 1 and "grpo" in labels
    grpo = next(h for h, t in zip(fig.axes[5].get_legend().legend_handles, labels) if t == "grpo")
    assert to_hex(grpo.get_color()) == METHOD_COLORS["grpo"]


def test_prediction_markers_differ_per_method(four_methods):
    """Review finding: the prediction scatter's colours could not be told apart. Each method's points have their
    own marker shape (GRPO, which has no line marker, gets 'x') and colour, drawn hollow and opaque; groups with equal
    pairs are interleaved (stride 4 over 80 pairs: 20 points each, no step shown twice)."""
    from matplotlib.colors import to_hex

    from analysis.plots import plot_prediction

    fig = plot_prediction(four_methods)
    scatters = fig.axes[0].collections
    assert len(scatters) == 4
    shapes = [tuple(map(tuple, np.round(s.get_paths()[0].vertices, 6))) for s in scatters]
    assert len(set(shapes)) == 4
    assert len({to_hex(s.get_edgecolor()[0]) for s in scatters}) == 4
    for s in scatters:
        assert s.get_alpha() is None and s.get_edgecolor()[0][3] == 1.0
        assert len(s.get_facecolor()) == 0 or s.get_facecolor()[0][3] in (0.0, 1.0)  # hollow or an unfilled 'x'
        assert len(s.get_offsets()) == 20
    xs = [tuple(np.round(s.get_offsets()[:, 0], 9)) for s in scatters]
    assert len(set(xs)) == 4  # interleaved: each group shows other pairs


def test_report_figures_are_150_dpi_and_shown_at_their_size(tmp_path):
    """The report's PNGs are rendered at 150 dpi: the pHYs chunk says 150/0.0254 = 5906 pixels per metre, the
    dynamics figure (8.0 in wide) is 1200 pixels wide, and report.html shows it 8.0 × 96 = 768 CSS pixels wide."""
    import re
    import struct

    from stare_lab.cli import main

    for seed in (0, 1):
        _methods_run(tmp_path / "runs", "grpo", seed, 0.2)
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path / "runs"), "--out", str(out)]) == 0
    png = (out / "dynamics.png").read_bytes()
    width = struct.unpack(">I", png[16:20])[0]
    i = png.index(b"pHYs")
    ppm_x, ppm_y, unit = struct.unpack(">IIB", png[i + 4:i + 13])
    assert unit == 1 and ppm_x == ppm_y == round(150 / 0.0254)
    assert width == 1200
    html = (out / "report.html").read_text()
    assert re.search(r'<img src="data:image/png;base64,[^"]+" width="768" alt="entropy, reward', html)


def test_figures_are_written_in_this_process(tmp_path, monkeypatch):
    """Issue 29: the figures were drawn by a pool forked from the command, whose exit could hang for ever (a worker
    that inherited the command's SIGTERM handler lost the pool's SIGTERM). save_figures forks nothing now, whatever
    the cores: os.fork raises here (with 4 cores the old code forked a pool of 3). The files are PNGs, and the PNG
    copies are those of the figures."""
    from matplotlib.figure import Figure

    from analysis.figstyle import save_figures

    def no_fork():
        raise AssertionError("save_figures forked a process")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    jobs = []
    for i in range(3):
        fig = Figure(figsize=(1 + i, 1))
        fig.subplots().plot([0, 1], [i, 1])
        jobs.append((fig, tmp_path / f"f{i}.png"))
    pngs = save_figures(jobs, dpi=50, png_copies=True)
    for (fig, path), png in zip(jobs, pngs):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(png[16:20], "big") == round(fig.get_figwidth() * 50)  # its own width in pixels
    assert save_figures(jobs[:1], dpi=50) == [None]
