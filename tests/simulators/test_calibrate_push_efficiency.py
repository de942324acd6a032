"""The calibration's optional fit knob ``push_efficiency`` (simulators/calibrate.py OPTIONAL_KNOBS; the tabular knob
of simulators/tabular/config.py): fitted only when gridded, and recovered from a held probe whose push it scales."""

from __future__ import annotations

import math

import pytest

import simulators.calibrate as C
from simulators.tabular.runner import config_from_overrides, run_batch
from stare_lab.errors import ConfigError


def test_push_efficiency_is_fitted_for_a_held_probe_or_when_gridded():
    """A crossing probe's fit (GRPO runs: no push) leaves it out unless gridded; a held probe's grids it by
    default, whole push (off) included; a grid that names it replaces the default."""
    assert "push_efficiency" not in C._check_grid({})
    assert C._check_grid({}, held=True)["push_efficiency"] == [None, 0.7, 0.5, 0.35, 0.25]
    grid = C._check_grid({"push_efficiency": [None, 0.35]})
    assert list(grid) == [*C.KNOBS, "push_efficiency"] and grid["push_efficiency"] == [None, 0.35]
    assert C._check_grid({"push_efficiency": [None]}, held=True)["push_efficiency"] == [None]
    assert C._label({"push_efficiency": None}) == "push_efficiency=off"
    with pytest.raises(ConfigError, match=r"fit grid push_efficiency=off,off lists a value twice \(1 is off\)"):
        C._check_grid({"push_efficiency": [None, 1.0]})


def test_bad_push_efficiency_in_the_grid_is_refused_before_running(tmp_path):
    probe = C.Probe(["x"], "simulator", None, [1], 0.5, 1.0, 1.0, 0.3, 0.5, 0.5)
    with pytest.raises(ConfigError, match=r"fit grid point .*push_efficiency=2: push_efficiency=2 is outside \(0, 1\]"):
        C.fit_knobs(probe, tmp_path / "fit", {"push_efficiency": [2.0]}, workers=1)
    assert not (tmp_path / "fit").exists()


def test_held_fit_recovers_the_push_efficiency(tmp_path):
    """An O1 held probe (W 10) of the llm toy at coupling 0.6 with push_efficiency 0.35 (probe seeds 3, 4) is fitted
    over push_efficiency ∈ {off, 0.35} (fit seeds 0, 1, the other knobs the probe's): the fit must pick 0.35. A push
    that raises the entropy less opens the gate more often, so the balance W must be well above the whole push's.
    Measured at this size (300 steps, H_tgt 0.85): the probe's balance W is 7.18 (D_L+/|D_GRPO| 0.52, share 0.97);
    the fit's setting at 0.35 gives 7.27 (0.57, 0.94; residual 0.04), the whole push 3.52 (0.54, 0.96; residual
    0.71): the D terms barely tell them apart, the balance W does."""
    truth = {"reward_coupling": 0.6, "forking_positions": 6, "num_correct": 8, "reward_noise": 0.0,
             "push_efficiency": 0.35}
    sched = {"loss.stare.reweight_w": 10.0, "loss.stare.target_entropy": 0.85}
    data = C._base_overrides({**truth, **sched})
    probes = [tmp_path / "probe" / f"seed{s}" for s in (3, 4)]
    run_batch([config_from_overrides({**data, "method": "o1", "seed": s}) for s in (3, 4)], probes)
    probe = C.read_probe(probes)
    assert probe.kind == "held" and probe.schedule["method"] == "o1"
    grid = {**{k: [v] for k, v in truth.items()}, "push_efficiency": [None, 0.35]}
    best, table = C.fit_knobs(probe, tmp_path / "fit", grid, seeds=(0, 1), workers=1)
    assert best["knobs"] == truth, table
    whole, part = table
    assert math.isfinite(whole["residual"]) and part["balance_w"] > whole["balance_w"] * 1.3, table


def test_fit_runs_do_not_log_their_warnings(tmp_path, caplog, monkeypatch):
    """A fit grid of hundreds of toys must not print each run's warnings: a held probe at ρ = 0.95 of its initial
    entropy puts the toy's matched target far above its reward-optimal entropy (2 of 10 positions fork between 4
    correct tokens: 0.2·ln 4 = 0.277 nats), which a run alone warns about (checked here first); inside the fit
    nothing from the runner is logged, and its level is restored."""
    import logging

    import simulators.tabular.runner as runner

    probe = C.Probe(["x"], "simulator", None, [1], 1.7, 1.79, 0.5, 0.9, 1.7, 0.95, kind="held", balance_w=3.0,
                    schedule={"method": "o1", "reweight_w": 3.0})
    grid = {"reward_coupling": [1.0], "forking_positions": [2], "num_correct": [4], "reward_noise": [0.0],
            "push_efficiency": [None]}  # reward-optimal entropy 2/10 · ln 4 = 0.277 nats
    target, _ = C.matched_target(probe, (0,), {k: v[0] for k, v in grid.items()})
    alone = config_from_overrides({**C._base_overrides({**{k: v[0] for k, v in grid.items()},
                                                         "loss.stare.target_entropy": target}),
                                   "target_entropy_rel": None, "method": "o1", "steps": 2})
    with caplog.at_level(logging.WARNING, logger="simulators.tabular.runner"):
        runner.run(alone, tmp_path / "alone")
        assert any("above the reward-optimal entropy" in r.getMessage() for r in caplog.records)
        caplog.clear()
        monkeypatch.setattr(runner, "_WARNED", set())  # a message is logged once per process: forget it
        C.fit_knobs(probe, tmp_path / "fit", grid, seeds=(0,), overrides={"steps": 2}, workers=1)
        assert [r.getMessage() for r in caplog.records if r.name == "simulators.tabular.runner"] == []
    assert logging.getLogger("simulators.tabular.runner").level == logging.NOTSET


def test_help_states_the_default_grids(capsys):
    """calibrate --help gives the default fit grids and W grid as the module defines them."""
    from stare_lab.cli import main

    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    fmt = lambda vals: ",".join("off" if v is None else f"{v:g}" for v in vals)  # noqa: E731
    assert " / ".join(fmt(C.DEFAULT_GRID[k]) for k in C.KNOBS) in text
    assert f"for a held probe {' / '.join(fmt(C.HELD_DEFAULT_GRID[k]) for k in C.KNOBS)}" in text
    assert f"default {fmt(C.HELD_DEFAULT_GRID['push_efficiency'])} for a held probe" in text
    assert f"(default {fmt(C.DEFAULT_W_GRID)})" in text
