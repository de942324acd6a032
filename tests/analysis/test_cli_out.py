"""``stare-lab analyze --out R``: R is the report's own folder — another command's output (a sweep, a run, an
evaluation, a calibration) is refused, and a regenerated report leaves no figure or report file of the previous
one behind (``simulate``'s report folder too)."""

from __future__ import annotations

import importlib
import os

import pytest

from analysis.report import report_outputs
from analysis.synthetic import write_synthetic_run
from stare_lab.cli import main

TINY = ["num_prompts=8", "seq_len=2", "vocab_size=4", "threshold=2"]



def _need(module: str):
    """Import ``module``; skip if missing, but fail under CI=true (tests must not skip silently there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def _simulate(out, *extra):
    return main(["simulate", "--preset", "demo", "--seeds", "1", "--steps", "3", "--out", str(out), *extra, *TINY])


def _snapshot(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_another_commands_folder_is_refused(tmp_path, capsys):
    _need("matplotlib")
    run = write_synthetic_run(tmp_path / "r", steps=5)
    sweep = tmp_path / "sweep"
    assert _simulate(sweep, "--methods", "grpo", "--no-plots") == 0
    ev, cal = tmp_path / "ev", tmp_path / "cal"
    ev.mkdir()
    (ev / "eval.json").write_text("{}")
    cal.mkdir()
    (cal / "calibration.json").write_text("{}")
    trainer = tmp_path / "trainer"
    trainer.mkdir()
    (trainer / "config.yaml").write_text("source: trainer\n")
    capsys.readouterr()
    for d, kind in ((sweep, "a simulate sweep (summary.json)"), (trainer, "a trainer run (config.yaml)"),
                    (ev, "an evaluation (eval.json)"), (cal, "a calibration (calibration.json)")):
        before = _snapshot(d)
        assert main(["analyze", str(run), "--out", str(d)]) == 1
        err = capsys.readouterr().err.strip()
        assert f"holds {kind}, not an analysis report" in err and len(err.splitlines()) == 1, err
        assert _snapshot(d) == before


def test_regenerated_report_holds_only_the_current_report(tmp_path):
    """A sweep over W (phase.png) analysed into R, then a single run into R: the phase figure and any other
    report file of the earlier report are gone (also in another format), a foreign file stays."""
    _need("matplotlib")
    sweep = tmp_path / "sw"
    assert _simulate(sweep, "--methods", "grpo,o1", "--no-plots", "--sweep", "stare.reweight_w=1.5,3") == 0
    out = tmp_path / "R"
    assert main(["analyze", str(sweep), "--out", str(out)]) == 0
    assert (out / "phase.png").is_file()
    (out / "cross_source.svg").write_text("<svg/>")  # an earlier report in another format
    (out / "mine.txt").write_text("keep")
    run = write_synthetic_run(tmp_path / "push", steps=5)
    assert main(["analyze", str(run), "--out", str(out)]) == 0
    left = {p.name for p in out.iterdir()}
    assert "phase.png" not in left and "cross_source.svg" not in left and "mine.txt" in left
    assert left - {"mine.txt"} <= set(report_outputs()) and {"report.md", "report.html", "report.json"} <= left


def test_simulate_overwrite_drops_the_previous_phase_figure(tmp_path):
    _need("matplotlib")
    d = tmp_path / "D"
    assert _simulate(d, "--methods", "grpo,o1", "--sweep", "stare.reweight_w=1.5,3") == 0
    assert (d / "figures" / "phase.png").is_file()
    assert _simulate(d, "--methods", "grpo", "--overwrite") == 0
    assert not (d / "figures" / "phase.png").exists() and (d / "figures" / "dynamics.png").is_file()
