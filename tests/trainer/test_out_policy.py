"""`stare-lab train`'s --out: the one policy (refuse an existing run unless --resume / --overwrite; --overwrite
removes only a training run's outputs and never another kind of run), the directory's lock (a second writer is
refused naming the holder), and a run interrupted before its first checkpoint restarted with --resume."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stare_lab.cli import main as cli_main
from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE as GSM8K

_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

HOLD = """
import sys, time
from stare_lab.platform.runlock import lock_dir
with lock_dir(sys.argv[1], command="stare-lab train (test holder)"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _fake_run(out: Path, source: str = "trainer") -> dict[str, bytes]:
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(f"source: {source}\nmethod: c2\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "notes.txt").write_text("mine")
    return {p.name: p.read_bytes() for p in out.iterdir()}


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny-cpu", "--train-data", str(GSM8K), "--out", str(out), *extra]


def test_existing_run_refused_and_untouched(tmp_path, capsys):
    out = tmp_path / "run"
    before = _fake_run(out)
    assert cli_main(_train(out)) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"stare-lab train: error: --out {str(out)!r} already holds a run (config.yaml, metrics.jsonl); pass --resume "
        "to continue it or --overwrite to replace it, or choose another --out"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_never_removes_another_kind_of_run(tmp_path, capsys):
    out = tmp_path / "run"
    before = _fake_run(out, source="simulator")
    assert cli_main(_train(out, "--overwrite")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a simulator run (config.yaml), not a trainer run" in err[0], err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert cli_main(_train(out, "--overwrite", "--resume")) == 1
    assert "exclude each other" in capsys.readouterr().err


def test_no_command_writes_over_a_sweep_or_a_trainer_run(tmp_path, capsys):
    """train --overwrite into a simulate sweep's --out (a summary.json with preset and methods, no config.yaml) is
    refused and removes nothing; evaluate into a trainer run's directory likewise; simulate inside a directory that
    another live process is writing is refused (stare_lab.platform.outdir.check_kind, stare_lab.platform.runlock.live_holder_above)."""
    sweep = tmp_path / "sweep"
    (sweep / "grpo" / "seed0").mkdir(parents=True)
    (sweep / "summary.json").write_text(json.dumps({"preset": "demo", "methods": {"grpo": {}}}))
    before = sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*"))
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert cli_main(_train(sweep, *extra)) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "holds a simulate sweep (summary.json), not a trainer run" in err[0], err
    assert sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*")) == before
    run = tmp_path / "run"
    before = _fake_run(run)
    assert cli_main(["evaluate", "--model", str(run), "--benchmarks", "math500", "--out", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a trainer run (config.yaml), not an evaluation" in err[0], err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    busy = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(busy)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli_main(["simulate", "--methods", "grpo", "--seeds", "1", "--steps", "2", "--no-plots",
                         "--out", str(busy / "grpo")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is inside {str(busy)!r}, which pid {holder.pid}" in err[0], err
        assert sorted(p.name for p in busy.iterdir()) == [".stare_lab.lock"]
    finally:
        holder.kill()
        holder.wait()


def test_second_writer_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli_main(_train(out)) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by pid {holder.pid}" in err[0] and "(stare-lab train (test holder))" \
            in err[0], err
        assert sorted(p.name for p in out.iterdir()) == [".stare_lab.lock"]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_interrupted_before_first_checkpoint_restarts_with_resume(require, tmp_path):
    """Killed right after step 1 is logged (checkpoint only at step 3): no checkpoint, one row. Without a flag the
    directory is refused; with --resume the run restarts from step 0 (its row replaced) and finishes 3 steps; the
    rows equal those of an uninterrupted run with the same seed except wall-clock keys."""
    require("vllm", "deepspeed", "math_verify", "transformers")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "stare_lab.cli", *_train(out)]
    runs.run(cmd, cwd=tmp_path, rc=137, environ=runs.env(STARE_LAB_FAULT="1:logged"))
    assert len(runs.rows(out)) == 1 and not (out / "checkpoint" / "latest_complete").exists()
    proc = runs.run(cmd, cwd=tmp_path, rc=1)
    assert "already holds a run" in proc.stderr and "--resume" in proc.stderr
    proc = runs.run([*cmd, "--resume"], cwd=tmp_path)
    assert "restarting it from step 0" in proc.stderr
    rows = runs.rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    fresh = tmp_path / "fresh"
    runs.run([sys.executable, "-m", "stare_lab.cli", *_train(fresh)], cwd=tmp_path)

    def stable(r):
        return {k: v for k, v in r.items() if not k.startswith("time/")}

    assert [stable(r) for r in rows] == [stable(r) for r in runs.rows(fresh)]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


def test_an_analysis_report_is_a_kind(tmp_path, capsys):
    """Fresh-user item: `simulate --out` into a folder where `analyze` wrote its report (report.json and report.md)
    is refused with one line; analyze may write there again (its own kind)."""
    from stare_lab.cli import main
    from stare_lab.platform.outdir import REPORT, check_kind, held_kind

    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.json").write_text("{}")
    assert held_kind(rep) is None  # report.json alone: not recognised
    (rep / "report.md").write_text("# report\n")
    assert held_kind(rep) == (REPORT, "report.json")
    check_kind(rep, REPORT)
    assert main(["simulate", "--preset", "demo", "--methods", "grpo", "--seeds", "1", "--out", str(rep)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"stare-lab simulate: error: --out {str(rep)!r} holds an analysis report (report.json), not a "
                   "simulate sweep: it is not written over, resumed or removed; choose another --out")
    assert sorted(p.name for p in rep.iterdir()) == ["report.json", "report.md"]
