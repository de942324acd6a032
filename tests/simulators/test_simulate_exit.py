"""Issue 29: `stare-lab simulate` with figures wrote its results and then, once in about 14 runs, never exited. The
short form of the stress test tests/benchmarks/bench_simulate_exit.py (100 runs there, docs/benchmarks.md): a few
consecutive runs with figures, stderr on a pseudo-terminal (the progress bar draws), one beside a busy process; each
exits with 0 within 60 s of writing its summary.json."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and pseudo-terminals: Linux")]

_spec = importlib.util.spec_from_file_location(
    "bench_simulate_exit", Path(__file__).parents[1] / "benchmarks" / "bench_simulate_exit.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclass looks its module up
_spec.loader.exec_module(bench)


def test_simulate_exits_after_its_summary_run_after_run():
    results = bench.stress(runs=3, busy=1, limit=60.0, max_wall=300.0, echo=False)
    assert len(results) == 3 and sum(r.busy for r in results) == 1
    for r in results:
        assert not r.hang, r.hang
        assert r.returncode == 0 and r.after_summary_s is not None and r.after_summary_s < 60.0, r
