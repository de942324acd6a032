"""``stare-lab analyze --metric KEY``: a key no run logs is an error (one line, exit 1, no report written)."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from analysis.synthetic import write_synthetic_run
from stare_lab.cli import main



def _need(module: str):
    """Import ``module``; skip if missing, but fail under CI=true (tests must not skip silently there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def test_unknown_metric_is_an_error_naming_close_keys(tmp_path, capsys):
    _need("matplotlib")
    run = write_synthetic_run(tmp_path / "r", steps=5)
    logged = set(json.loads((run / "metrics.jsonl").read_text().splitlines()[0]))
    assert "reward" in logged and "rewrd" not in logged
    out = tmp_path / "o"
    assert main(["analyze", str(run), "--out", str(out), "--metric", "rewrd"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("stare-lab analyze: error: --metric 'rewrd' is not logged (as a number) by any of the 1 runs; "
                   "did you mean one of 'reward', 'stare_w'?")
    assert not out.exists()
    assert main(["analyze", str(run), "--out", str(out), "--metric", "zzzz/qqqq"]) == 1
    assert "; they log " in capsys.readouterr().err and not out.exists()
    # a key that is logged works, and the report lists it
    assert main(["analyze", str(run), "--out", str(out), "--metric", "reward"]) == 0
    assert "Extra metrics" in (out / "report.md").read_text()
