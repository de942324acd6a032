"""analysis.paper: the Table-2 CSV and measured evaluation results side by side (numbers from the STARE paper)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.compare import compare
from analysis.load import load_run
from analysis.paper import BENCHMARKS, load_paper_table, measured_results, paper_comparison
from stare_lab.errors import DataError
from stare_lab.platform.runs import RunWriter

REPO = Path(__file__).resolve().parents[2]


def _paper_csv() -> Path:
    """The repository's copy of Table 2 (papers/stare_2606.19236/table2.csv; tracked, so never missing)."""
    return REPO / "papers" / "stare_2606.19236" / "table2.csv"


def test_load_real_table2():
    rows = load_paper_table(_paper_csv())
    by = {(r["setting"], r["model"], r["method"]): r for r in rows}
    o1 = by[("short_cot", "Qwen2.5-Math-7B", "STARE-O1")]
    # STARE Table 2 (docs/theory.md §5): 44.2 23.8 83.4 86.1 44.2 44.7, avg 54.4 = their plain mean
    assert [o1[b] for b in BENCHMARKS] == [44.2, 23.8, 83.4, 86.1, 44.2, 44.7] and o1["avg"] == 54.4
    assert sum(o1[b] for b in BENCHMARKS) / 6 == pytest.approx(54.4, abs=0.05)
    base = by[("short_cot", "Qwen2.5-14B-Instruct", "Base")]
    assert base["aime24"] == 12.1 and base["amc23"] is None and base["avg"] is None  # empty cells stay empty


def test_bad_tables(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_paper_table(p)
    p.write_text("setting,model,method,aime24\nshort_cot,M,GRPO,abc\n")
    assert load_paper_table(p)[0]["aime24"] is None  # a non-numeric cell is empty, never guessed


def _run(path, method, extra_rows=None, eval_json=None):
    with RunWriter(path, {"source": "trainer", "method": method, "seed": 0, "model": {"name_or_path": "x/M-7B"}}) as w:
        for i in range(2):
            row = {"step": i, "entropy": 0.5, "reward": 0.5, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
                   "pred_entropy_change": None, "entropy_change": None}
            row.update((extra_rows or {}).get(i, {}))
            w.log(row)
    if eval_json is not None:
        (path / "eval.json").write_text(json.dumps(eval_json))


def test_measured_from_metrics_and_eval_json(tmp_path):
    # metrics: eval/aime24/avg@32 logged at step 1 only (last finite value counts); eval.json overrides math500
    _run(tmp_path / "a", "o1", extra_rows={1: {"eval/aime24/avg@32": 0.25, "eval/math500/avg@4": 0.5}},
         eval_json={"benchmarks": {"math500": {"avg@k": 0.75, "pass@k": 0.9}, "unknown_bench": 0.1,
                                   "minerva": "bad"}, "average": 0.6})
    m = measured_results(load_run(tmp_path / "a"))
    assert m == {"aime24": 0.25, "math500": 0.75}  # no guesses: 'average' not used, bad entries ignored


def test_comparison_rows_all_six_measured(tmp_path):
    scores = dict(zip(BENCHMARKS, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]))
    _run(tmp_path / "c2", "c2", eval_json={"model": "M-7B", "benchmarks": {b: {"avg@k": v} for b, v in scores.items()}})
    _run(tmp_path / "clip", "clip_cov")  # no paper row, no results → not listed
    table = [
        {"setting": "s", "model": "M-7B", "method": "STARE-C2", "source": "rerun",
         **dict(zip(BENCHMARKS, [1.0, None, 3.0, 4.0, 5.0, 6.0])), "avg": None},
        {"setting": "s", "model": "Other", "method": "STARE-C2", "source": "rerun",
         **{b: 9.0 for b in BENCHMARKS}, "avg": 9.0},
    ]
    header, rows, notes = paper_comparison(table, compare(tmp_path))
    assert header[:4] == ["row", "kind", "setting", "model"] and header[-1] == "avg"
    assert any("restricted to model M-7B" in n for n in notes)
    assert rows[0] == ["STARE-C2", "reported (rerun)", "s", "M-7B", 1.0, None, 3.0, 4.0, 5.0, 6.0, None]
    # measured ×100 = 10 … 60 (percent); all six present → avg = mean = 35
    assert rows[1][0:2] == ["c2", "measured (1 run)"]
    assert rows[1][4:] == pytest.approx([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 35.0])
    assert len(rows) == 2
    _, rows_all, _ = paper_comparison(table, compare(tmp_path), model="Other")
    assert rows_all[0][3] == "Other" and rows_all[0][-1] == 9.0


def test_paper_rows_listed_once_per_method(tmp_path):
    """Two groups of one method (simulator and trainer): the paper row appears once, then both measured rows."""
    ev = {"benchmarks": {"aime24": {"avg@k": 0.5}}}
    _run(tmp_path / "t", "o1", eval_json=ev)
    with RunWriter(tmp_path / "s", {"source": "simulator", "method": "o1", "seed": 0}) as w:
        w.log({"step": 0, "entropy": 0.5, "reward": 0.5, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0,
               "pred_entropy_change": None, "entropy_change": None, "eval/aime24/avg@32": 0.25})
    table = [{"setting": "s", "model": "Z", "method": "STARE-O1", "source": "", **{b: 1.0 for b in BENCHMARKS},
              "avg": 1.0}]
    _, rows, _ = paper_comparison(table, compare(tmp_path))
    assert [r[:2] for r in rows] == [["STARE-O1", "reported"], ["o1 [simulator]", "measured (1 run)"],
                                     ["o1 [trainer]", "measured (1 run)"]]
    assert rows[1][4] == 25.0 and rows[2][4] == 50.0


def test_unknown_setting_or_model_is_an_error():
    from analysis.paper import check_paper_filters
    from stare_lab.errors import ConfigError

    table = [{"setting": "short_cot", "model": "A"}, {"setting": "long_cot", "model": "B"}]
    check_paper_filters(table, "SHORT_COT", "b")  # case-insensitive: fine
    with pytest.raises(ConfigError, match="paper setting 'nope' is not in the paper table; its settings: "
                                          "long_cot, short_cot"):
        check_paper_filters(table, "nope")
    with pytest.raises(ConfigError, match="its models: A, B"):
        check_paper_filters(table, None, "C")
