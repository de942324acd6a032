"""How long ``stare-lab calibrate`` takes and what it says meanwhile (simulators/calibrate_time.py): the progress
lines on stderr (one updating line on a terminal, a line every 10 % otherwise), the estimate line printed before the
fit, the fit's slices, and ``--max-minutes`` refusing a calibration or stopping one with its partial fit named."""

from __future__ import annotations

import io
import json
import math
import re

import pytest
import torch

from stare_lab.cli import main
from stare_lab.errors import ConfigError
from simulators import calibrate as C
from simulators import calibrate_time as T
from simulators.tabular.runner import config_from_overrides, run_batch

torch.set_num_threads(1)

#: a small llm toy: a probe and its fit take seconds
SIZE = {"num_prompts": 8, "steps": 30, "checkpoint_every": 30}
#: two settings (couplings 0.6 and 1.0) of the other knobs at the preset's values
GRID = ["--grid", "reward_coupling=0.6,1.0", "--grid", "forking_positions=6", "--grid", "num_correct=8",
        "--grid", "reward_noise=0"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A GRPO probe of the small llm toy (seed 9)."""
    path = tmp_path_factory.mktemp("probe") / "seed9"
    run_batch([config_from_overrides({**C._base_overrides(SIZE), "method": "grpo", "seed": 9})], [path])
    return path


def _cli(probe, out, *extra):
    return main(["calibrate", str(probe), "--out", str(out), *GRID, "--w-grid", "2,5", "--seeds", "1",
                 "--workers", "1", *extra, *(f"{k}={v}" for k, v in SIZE.items())])


# ------------------------------------------------------------------------------------------------------ progress
def test_progress_off_a_terminal_is_a_line_every_tenth():
    """5 settings of 4 run-steps each, fed 1 run-step at a time (20 calls): a new tenth every 2 run-steps, so 10
    lines, 10 % … 100 %, the settings done being ⌊run-steps / 4⌋ = ⌊2k / 4⌋ at the k-th tenth."""
    out = io.StringIO()
    progress = T.Progress(out)
    assert progress.tty is False  # a StringIO is no terminal
    with progress.phase("calibrate fit", 5, "settings", 4) as update:
        for _ in range(20):
            update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    for k, line in enumerate(lines, 1):
        assert line.startswith(f"calibrate fit: {10 * k}% ({2 * k // 4}/5 settings), "), line
        assert re.search(r", \d+ s elapsed, about \d+ s left$", line), line


def test_progress_on_a_terminal_is_one_updating_line():
    """On a terminal the counter redraws one line (carriage returns), ends at 3/3 runs, and leaves at most the
    final line's newline; a note while it runs goes above it."""
    out = io.StringIO()
    progress = T.Progress(out, tty=True)
    with progress.phase("calibrate W sweep", 3, "runs", 10) as update:
        for _ in range(30):
            update(1)
        progress.note("a note")
    text = out.getvalue()
    assert "\r" in text and text.count("\n") <= 3, repr(text)
    assert "a note" in text
    assert text.rstrip().splitlines()[-1].split("\r")[-1].startswith("calibrate W sweep: 100%")
    assert "3/3 runs" in text


def test_minutes_and_slices_by_hand():
    """minutes: below 60 s in seconds, then minutes with one decimal below 10. slices: 480 settings × 2 seeds on
    2 workers: max(⌈48⌉, ⌈32·2/2⌉) = 48 settings a slice → 10 slices; 96 settings: max(10, 32) = 32 → 3;
    5 settings on 1 worker and 1 seed: max(1, 32) → one slice; every index once."""
    assert (T.minutes(42), T.minutes(90), T.minutes(600)) == ("42 s", "1.5 min", "10 min")
    for n, seeds, workers, size in ((480, 2, 2, 48), (96, 2, 2, 32), (5, 1, 1, 5)):
        parts = T.slices(n, seeds, workers)
        assert [len(p) for p in parts[:-1]] == [size] * (len(parts) - 1) and len(parts) == math.ceil(n / size)
        assert [i for p in parts for i in p] == list(range(n))


def test_cost_model_by_hand():
    """fixed 2 s + 100 steps × 0.5 s a batched step of 10 runs: 20 runs 2 + 100 · 0.5 · 2 = 102 s; slices of 10,
    10, 5 runs → 52 + 52 + 27 = 131 s."""
    cost = T.Cost(fixed=2.0, step=0.5, runs=10, steps=100)
    assert cost.seconds(20) == pytest.approx(102.0)
    assert cost.estimate([10, 10, 5], 20) == (pytest.approx(131.0), pytest.approx(102.0))


def test_measure_runs_a_short_pilot_elsewhere(tmp_path, monkeypatch):
    """The pilot runs the configs for a few steps (PILOT_STEPS) in a temporary folder, not in the working
    directory, and models the configs' own 30 steps."""
    monkeypatch.chdir(tmp_path)
    cfgs = [config_from_overrides({**C._base_overrides(SIZE), "method": "grpo", "seed": s}) for s in (0, 1)]
    seen = []
    cost = T.measure(cfgs, 1, lambda dirs: seen.append([len(list(d.iterdir())) > 0 for d in dirs]))
    assert (cost.runs, cost.steps, cost.pilot) == (2, 30, T.PILOT_STEPS) and cost.step > 0 and cost.fixed >= 0
    assert seen == [[True, True]] and list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------------------- the command itself
def test_estimate_is_said_before_the_fit_and_progress_follows(probe, tmp_path, capsys):
    """On stderr (not a terminal here): first the estimate line, then the fit's lines up to 100 % of its 2
    settings, then the sweep's up to 100 % of its runs: grpo once and o1, c2 at each of 2 W, 1 seed = 5 — the run
    folders the sweep wrote. The results stay on stdout."""
    assert _cli(probe, tmp_path / "cal") == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert re.fullmatch(r"calibrate: 2 settings × 2 seeds, about \d+ s on this machine \(fit \d+ s, W sweep of 5 "
                        rf"runs \d+ s; measured over {T.PILOT_STEPS} steps of 4 runs; --grid KNOB=V1,V2,\.\.\. to "
                        r"shrink it, --max-minutes M to cap it\)", err[0]), err[0]
    fit = [ln for ln in err if ln.startswith("calibrate fit: ")]
    sweep = [ln for ln in err if ln.startswith("calibrate W sweep: ")]
    assert 1 <= len(fit) <= 10 and fit[-1].startswith("calibrate fit: 100% (2/2 settings)")
    assert 1 <= len(sweep) <= 10 and sweep[-1].startswith("calibrate W sweep: 100% (5/5 runs)")
    assert err.index(fit[0]) < err.index(sweep[0])
    runs = [p for p in (tmp_path / "cal" / "sweep").rglob("seed0") if p.is_dir()]
    assert len(runs) == 5
    assert "critical W (o1, calibrated)" in captured.out and "calibrate fit" not in captured.out
    assert json.loads((tmp_path / "cal" / "fit.json").read_text())["partial"] is None


def test_max_minutes_refuses_before_anything_runs(probe, tmp_path, capsys):
    """An estimate over --max-minutes is one line naming both, and nothing is written — a previous calibration in
    OUT stays as it was even with --overwrite; a budget that is no positive number is a one-line error too."""
    out = tmp_path / "cal"
    out.mkdir()
    (out / "calibration.json").write_text('{"kind": "calibrated"}')
    assert _cli(probe, out, "--max-minutes", "0.0001", "--overwrite") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert re.search(r"error: 2 settings × 2 seeds, about \d+ s on this machine .*\), over --max-minutes "
                     r"0\.0001: nothing was run;", err), err
    assert sorted(p.name for p in out.iterdir()) == ["calibration.json"]
    for bad, msg in (("0", "--max-minutes=0.0 must be a number > 0"),
                     ("soon", "--max-minutes='soon' must be a number")):
        assert _cli(probe, tmp_path / "other", "--max-minutes", bad) == 1
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "other").exists()
    with pytest.raises(ConfigError, match=r"--max-minutes=-1 must be a number > 0"):
        C.calibrate([probe], tmp_path / "other", max_minutes=-1)


def _until(n):
    """A Budget.fits answering True to the first ``n`` questions, then False."""
    asked = []

    def fits(budget, seconds):
        asked.append(seconds)
        return len(asked) <= n
    return fits


def test_max_minutes_stops_between_slices_with_the_partial_fit_named(probe, tmp_path, capsys, monkeypatch):
    """Slices of one setting (MIN_RUNS_PER_WORKER 1: ⌈0.1 · 2⌉ = 1): the estimate passes, the second slice would
    not fit → exit 1 with one line, fit.json holds the first setting alone and names itself partial (1 of 2, before
    a fit slice); no sweep, no calibration.json; a later calibrate says it stopped part-way."""
    monkeypatch.setattr(T, "MIN_RUNS_PER_WORKER", 1)
    monkeypatch.setattr(T.Budget, "fits", _until(1))
    out = tmp_path / "cal"
    assert _cli(probe, out, "--max-minutes", "60") == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("calibrate")]
    assert len(err) == 1 and "stopped at --max-minutes 60" in err[0] and "after 1 of 2 fit settings" in err[0], err
    fit = json.loads((out / "fit.json").read_text())
    assert fit["partial"] == {"max_minutes": 60.0, "stopped_before": "a fit slice", "settings_done": 1,
                              "settings_total": 2}
    assert [s["knobs"]["reward_coupling"] for s in fit["settings"]] == [0.6]
    assert not (out / "calibration.json").exists() and not (out / "sweep").exists()
    monkeypatch.setattr(T.Budget, "fits", lambda self, s: True)
    assert _cli(probe, out) == 1
    assert "holds a calibration that stopped before its calibration.json" in capsys.readouterr().err


def test_max_minutes_stops_before_the_sweep(probe, tmp_path, capsys, monkeypatch):
    """The estimate and the fit fit, the sweep would not: fit.json is the whole fit (2 of 2) named partial before
    the W sweep, and the line says where it is."""
    monkeypatch.setattr(T.Budget, "fits", _until(1))  # one slice: only the estimate is asked before the sweep
    out = tmp_path / "cal"
    assert _cli(probe, out, "--max-minutes", "60") == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("calibrate")]
    assert len(err) == 1 and "before the W sweep" in err[0] and str(out / "fit.json") in err[0], err
    fit = json.loads((out / "fit.json").read_text())
    assert fit["partial"]["stopped_before"] == "the W sweep" and fit["partial"]["settings_done"] == 2
    assert len(fit["settings"]) == 2 and not (out / "calibration.json").exists()


def test_help_says_it_is_a_research_tool(capsys):
    """calibrate --help says what to act on instead and names the budget flag."""
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A research tool: the W to act on comes from an auto run of the model (methods o1-auto / c2-auto) or a " \
           "W sweep" in text
    assert "a known 10 % verifier noise was fitted as 0" in text and "%%" not in text
    assert "--max-minutes M" in text
