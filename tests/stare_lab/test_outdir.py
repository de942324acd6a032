"""The one --out policy (stare_lab.platform.outdir.claim_out): refuse an existing run unless --resume / --overwrite;
--overwrite removes only the outputs of this kind of run; never a run of another source."""

from __future__ import annotations

import pytest

from stare_lab.errors import ConfigError, RunError
from stare_lab.platform.outdir import claim_out

OUTPUTS = ("config.yaml", "metrics.jsonl", "checkpoint")


def _run_dir(tmp_path, source="trainer"):
    d = tmp_path / "out"
    (d / "checkpoint" / "step_1").mkdir(parents=True)
    (d / "checkpoint" / "step_1" / "w.bin").write_bytes(b"w")
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "config.yaml").write_text(f"source: {source}\n")
    (d / "notes.txt").write_text("mine")  # a file the user put there
    (d / "model").mkdir()
    return d


def test_empty_or_missing_out_is_new(tmp_path):
    assert claim_out(tmp_path / "nope", OUTPUTS, source="trainer", resume=False, overwrite=False) == "new"
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("y")  # foreign files alone are not a run
    assert claim_out(tmp_path / "x", OUTPUTS, source="trainer", resume=False, overwrite=False) == "new"


def test_existing_run_refused_without_a_choice(tmp_path):
    d = _run_dir(tmp_path)
    with pytest.raises(RunError, match=r"already holds a run \(config\.yaml, metrics\.jsonl, checkpoint\); pass "
                                        r"--resume to continue it or --overwrite to replace it"):
        claim_out(d, OUTPUTS, source="trainer", resume=False, overwrite=False)
    assert claim_out(d, OUTPUTS, source="trainer", resume=True, overwrite=False) == "resume"
    assert (d / "metrics.jsonl").is_file()
    with pytest.raises(ConfigError, match="exclude each other"):
        claim_out(d, OUTPUTS, source="trainer", resume=True, overwrite=True)


def test_overwrite_removes_only_this_kinds_outputs(tmp_path):
    d = _run_dir(tmp_path)
    assert claim_out(d, OUTPUTS, source="trainer", resume=False, overwrite=True, remove=("model",)) == "overwrite"
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


def test_overwrite_refuses_another_source(tmp_path):
    d = _run_dir(tmp_path, source="simulator")
    with pytest.raises(RunError, match="holds a simulator run \\(config.yaml\\), not a trainer run"):
        claim_out(d, OUTPUTS, source="trainer", resume=False, overwrite=True)
    assert (d / "metrics.jsonl").is_file() and (d / "checkpoint" / "step_1" / "w.bin").is_file()
