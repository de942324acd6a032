"""The calibration's optional fit knob ``clip_rel`` (simulators/calibrate.py OPTIONAL_KNOBS; the tabular clip of
simulators/tabular/config.py): absent from the default grid, parsed by ``--grid clip_rel=off,…``, validated before
anything runs, and recovered from a held probe whose push it limits."""

from __future__ import annotations

import math

import pytest

import simulators.calibrate as C
from simulators.tabular.runner import config_from_overrides, run_batch
from stare_lab.errors import ConfigError


def test_clip_is_fitted_only_when_gridded():
    """Without ``clip_rel`` in the grid the fit's knobs are the four of before (calibration.json unchanged); with
    it the knob is appended with its values, None (off) included."""
    assert list(C._check_grid({})) == list(C.KNOBS)
    grid = C._check_grid({"clip_rel": [None, 1.5]})
    assert list(grid) == [*C.KNOBS, "clip_rel"] and grid["clip_rel"] == [None, 1.5]
    assert C._label({"reward_coupling": 0.6, "clip_rel": None}) == "reward_coupling=0.6,clip_rel=off"
    with pytest.raises(ConfigError, match="lists a value twice"):
        C._check_grid({"clip_rel": [1.5, 1.5]})


def test_bad_clip_in_the_grid_is_refused_before_running(tmp_path):
    probe = C.Probe(["x"], "simulator", None, [1], 0.5, 1.0, 1.0, 0.3, 0.5, 0.5)
    with pytest.raises(ConfigError, match=r"fit grid point .*clip_rel=0: clip_rel=0 is outside \(0, inf\)"):
        C.fit_knobs(probe, tmp_path / "fit", {"clip_rel": [0.0]}, workers=1)
    assert not (tmp_path / "fit").exists()


def test_cli_grid_parses_off(tmp_path, capsys, monkeypatch):
    """``--grid clip_rel=off,1,2.5`` reaches the calibration as [None, 1, 2.5] (the call is intercepted)."""
    from stare_lab.cli import main

    seen = {}

    def fake(paths, out, **kw):
        seen.update(kw)
        raise ConfigError("stop here")

    monkeypatch.setattr(C, "calibrate", fake)
    assert main(["calibrate", str(tmp_path), "--grid", "clip_rel=off,1,2.5", "--out", str(tmp_path / "o")]) == 1
    assert "stop here" in capsys.readouterr().err
    assert seen["grid"] == {"clip_rel": [None, 1, 2.5]}


def test_held_fit_recovers_the_clip(tmp_path):
    """A C2 held probe (W 10, M 0.2) of the llm toy at coupling 0.9 with clip_rel 1 (probe seeds 3, 4) is fitted
    over clip_rel ∈ {off, 1} (fit seeds 0, 1, the other knobs the probe's): the fit must pick the clip. Measured at
    this size (300 steps, H_tgt 0.86): the probe's balance W is 6.67 (D_L+/|D_GRPO| 0.55, share 0.72); the fit's
    clipped setting 6.22 (0.53, 0.71; residual 0.07), the unclipped one 4.63 (0.74, 0.85; residual 0.39): each
    clipped push raises the entropy less, so the gate opens more often (balance W 5.6–6.8 by seed with the clip,
    4.5–4.7 without, seeds 0–2)."""
    truth = {"reward_coupling": 0.9, "forking_positions": 6, "num_correct": 8, "reward_noise": 0.0, "clip_rel": 1.0}
    sched = {"loss.stare.reweight_w": 10.0, "loss.stare.reweight_m": 0.2, "loss.stare.target_entropy": 0.86}
    data = C._base_overrides({**truth, **sched})
    probes = [tmp_path / "probe" / f"seed{s}" for s in (3, 4)]
    run_batch([config_from_overrides({**data, "method": "c2", "seed": s}) for s in (3, 4)], probes)
    probe = C.read_probe(probes)
    assert probe.kind == "held" and probe.schedule["method"] == "c2"
    grid = {**{k: [v] for k, v in truth.items()}, "clip_rel": [None, 1.0], "push_efficiency": [None]}
    best, table = C.fit_knobs(probe, tmp_path / "fit", grid, seeds=(0, 1), workers=1)
    assert best["knobs"] == {**truth, "push_efficiency": None}, table
    off, clip = table
    assert math.isfinite(off["residual"]) and clip["balance_w"] > off["balance_w"] * 1.15, table


def test_cli_probe_named_like_an_override(tmp_path, capsys, monkeypatch):
    """A probe directory named like a sweep's run (`W=6/seed0`) is a probe, not an override; a word that is no
    path and holds `=` is an override (the call is intercepted)."""
    from stare_lab.cli import main

    seen = {}

    def fake(paths, out, **kw):
        seen.update(paths=list(paths), overrides=kw["overrides"])
        raise ConfigError("stop here")

    probe = tmp_path / "o1" / "W=6" / "seed0"
    probe.mkdir(parents=True)
    monkeypatch.setattr(C, "calibrate", fake)
    assert main(["calibrate", str(probe), "steps=200", "--out", str(tmp_path / "o")]) == 1
    assert "stop here" in capsys.readouterr().err
    assert seen == {"paths": [str(probe)], "overrides": {"steps": 200}}


@pytest.mark.parametrize("w_grid, msg", [("", "--w-grid= must be numbers >= 1"),
                                         ("6,3,3", "--w-grid=6.0,3.0,3.0 lists a value twice")])
def test_cli_bad_w_grid_is_one_line(tmp_path, capsys, w_grid, msg):
    """Fresh-user items: an empty --w-grid ran the default grid; a repeated W was reported as a --sweep error."""
    from stare_lab.cli import main

    probe = tmp_path / "p"
    probe.mkdir()
    assert main(["calibrate", str(probe), "--out", str(tmp_path / "o"), "--w-grid", w_grid]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab calibrate: error: {msg}"] and not (tmp_path / "o").exists()
