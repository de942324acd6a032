"""``stare-lab calibrate`` and the one ``--out`` policy (stare_lab/platform/outdir.py): its lock for the whole run, another
kind of output refused, an ``--out`` inside another live writer's directory refused, a previous calibration
refused without ``--overwrite`` and, with it, only what a calibration writes removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stare_lab.cli import main
from stare_lab.errors import RunError
from stare_lab.platform.outdir import CALIBRATION, check_kind, held_kind
from stare_lab.platform.runlock import LOCK_FILE, read_holder
from stare_lab.platform.runs import RunWriter
from simulators import calibrate as C

HOLD = """
import sys, time
from stare_lab.platform.runlock import lock_dir
with lock_dir(sys.argv[1], command="stare-lab calibrate (test holder)"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _probe(path):
    config = {"source": "trainer", "method": "grpo", "seed": 0, "loss": {"stare": {"target_entropy": 0.6}}}
    with RunWriter(path, config) as w:
        for i, h in enumerate([1.0, 0.5]):
            w.log({"step": i + 1, "entropy": h, "reward": 0.5, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
                   "pred_entropy_change": None, "entropy_change": None, "pred/d_grpo": -1, "pred/d_lplus": 1,
                   "pred/lplus_above_sstar": 0.5})
    return path


def _snapshot(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _refused(capsys, argv, msg):
    assert main(["calibrate", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
    return err


def test_calibration_is_a_kind():
    """held_kind names a calibration by its calibration.json; check_kind refuses it for other commands."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "calibration.json").write_text("{}")
        assert held_kind(d) == (CALIBRATION, "calibration.json")
        check_kind(d, CALIBRATION)
        with pytest.raises(RunError, match=r"holds a calibration \(calibration.json\), not a simulate sweep"):
            check_kind(d, "simulate sweep")


def test_other_kinds_of_output_are_refused(tmp_path, capsys):
    """A simulate sweep (written by simulate), a trainer run and an evaluation as --out: one line naming the kind,
    even with --overwrite, and nothing in them changes."""
    probe = _probe(tmp_path / "probe")
    sweep = tmp_path / "sweep"
    assert main(["simulate", "--preset", "demo", "--methods", "grpo", "--seeds", "1", "--steps", "3", "--no-plots",
                 "--out", str(sweep), "num_prompts=8", "seq_len=2", "vocab_size=4", "threshold=2"]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("source: trainer\n")
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "eval.json").write_text("{}")
    for d, kind in ((sweep, "a simulate sweep (summary.json)"), (run, "a trainer run (config.yaml)"),
                    (ev, "an evaluation (eval.json)")):
        before = _snapshot(d)
        for extra in ([], ["--overwrite"]):
            _refused(capsys, [str(probe), "--out", str(d), *extra], f"holds {kind}, not a calibration")
        assert _snapshot(d) == before


def test_locked_out_and_out_inside_a_live_writer_are_refused(tmp_path, capsys):
    """Another process holds OUT (as a running calibrate does): a second calibrate into OUT is refused naming the
    holder, and one into OUT/fit (inside it) is refused naming OUT; nothing is written."""
    probe = _probe(tmp_path / "probe")
    out = tmp_path / "cal"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(out)
        _refused(capsys, [str(probe), "--out", str(out)], f"is in use by pid {holder.pid}")
        err = _refused(capsys, [str(probe), "--out", str(out / "fit")], f"is inside {str(out)!r}")
        assert f"pid {holder.pid}" in err
        assert _snapshot(out) == before and not (out / "fit").exists()
    finally:
        holder.kill()
        holder.wait()


def test_overwrite_removes_only_a_calibrations_outputs(tmp_path, monkeypatch):
    """A previous calibration is refused without overwrite (untouched); with it calibration.json, fit.json, fit/ and
    sweep/ go, a foreign file stays, and the run happens under OUT's lock held by this process."""
    probe = _probe(tmp_path / "probe")
    out = tmp_path / "cal"
    for name in ("fit", "sweep"):
        (out / name / "x").mkdir(parents=True)
    (out / "calibration.json").write_text("{}")
    (out / "fit.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    seen = {}

    def fake_run(probe_, out_, *args):
        seen["files"] = sorted(p.name for p in out_.iterdir())
        seen["holder"] = read_holder(out_)
        (out_ / "calibration.json").write_text(json.dumps({"kind": "calibrated"}))
        return {"kind": "calibrated"}

    monkeypatch.setattr(C, "_run", fake_run)
    before = _snapshot(out)
    with pytest.raises(RunError, match=r"already holds a calibration \(calibration.json\); pass --overwrite"):
        C.calibrate([probe], out)
    assert _snapshot(out) == before and not seen
    assert C.calibrate([probe], out, overwrite=True) == {"kind": "calibrated"}
    assert seen["files"] == [LOCK_FILE, "notes.txt"]
    assert seen["holder"] is not None and seen["holder"].pid == os.getpid()
    assert (out / "notes.txt").read_text() == "mine" and not (out / LOCK_FILE).exists()


def test_a_calibration_stopped_part_way_is_named_as_such(tmp_path):
    """Fresh-user item: Ctrl-C during the fit leaves fit runs but no calibration.json; the refusal says the
    calibration stopped before its result (not "already holds a calibration") and --overwrite starts again."""
    from simulators.sweep_out import claim_calibration_out

    out = tmp_path / "cal"
    (out / "fit" / "setting" / "seed0").mkdir(parents=True)
    outputs = ("calibration.json", "fit.json", "fit", "sweep")
    with pytest.raises(RunError, match=r"^--out '.*cal' holds a calibration that stopped before its calibration.json "
                                       r"\(fit\); pass --overwrite to start it again, or choose another --out$"):
        claim_calibration_out(out, False, outputs)
    claim_calibration_out(out, True, outputs)
    assert not (out / "fit").exists()
