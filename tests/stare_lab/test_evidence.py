"""stare_lab.platform.evidence: the one check of a run's record (metrics parse, complete against its config and its
sweep, summary.json recomputable from the rows), on run directories written here with known contents."""

from __future__ import annotations

import json

from stare_lab.platform.evidence import EVIDENCE_KEYS, check_run, summary_disagreement, sweep_plan
from stare_lab.platform.runs import RunWriter, read_run
from stare_lab.platform.summary import run_summary, summary_settings

ROW = dict(reward=0.5, gate_on=0, stare_w=1.0, stare_m=1.0, pred_entropy_change=None, entropy_change=None)


def _run(path, steps=4, config_steps=4, summary=True):
    """Rows 1 … steps with entropy 1.0, 0.9, …; config asking for ``config_steps``; the writer's summary.json."""
    rows = [{**ROW, "step": s, "entropy": h} for s, h in zip(range(1, steps + 1), (1.0, 0.9, 0.8, 0.7, 0.6, 0.5))]
    cfg = {"source": "simulator", "method": "grpo", "seed": 0, "steps": config_steps,
           "loss": {"stare": {"target_entropy": 0.3}}}
    with RunWriter(path, cfg) as w:
        for r in rows:
            w.log(r)
        if summary:
            w.write_summary(run_summary(rows, **summary_settings(w.config)))
    return path


def _check(path):
    return check_run(read_run(path, log=False))


def test_a_finished_run_is_sound_and_its_summary_is_recomputed(tmp_path):
    ev = _check(_run(tmp_path / "r"))
    assert ev.sound and ev.problems == () and ev.warnings == ()
    # the rows' own statistics (by hand: first entropy 1.0, last 0.7, 4 rows)
    assert (ev.summary["initial_entropy"], ev.summary["final_entropy"], ev.summary["steps"]) == (1.0, 0.7, 4)
    assert _check(_run(tmp_path / "nosum", summary=False)).sound  # no summary.json: nothing to disagree with


def test_a_last_line_cut_short_is_a_warning_a_damaged_middle_is_a_problem(tmp_path):
    run = _run(tmp_path / "r")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "entropy": 0.')  # a crash mid-write: at most one row lost
    ev = _check(run)
    assert ev.sound and ev.warnings == ("metrics.jsonl: its last line (5) is cut short; skipped",)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text(lines[0] + "\x00garbage\n" + "".join(lines[1:4]))
    assert _check(run).problems == ("metrics.jsonl is damaged: 1 of its 5 lines are not JSON rows (the first, "
                                    "line 2: not valid JSON (truncated write?))",)


def test_empty_and_binary_metrics(tmp_path):
    run = _run(tmp_path / "r", summary=False)
    (run / "metrics.jsonl").write_text("")
    assert _check(run).problems == ("metrics.jsonl has no rows",)
    (run / "metrics.jsonl").write_bytes(bytes(range(256)) * 8)
    (problem,) = _check(run).problems
    assert problem.startswith("metrics.jsonl is damaged: 9 of its 9 lines are not JSON rows (the first, line 1")


def test_unfinished_against_its_config_and_its_sweep(tmp_path):
    assert _check(_run(tmp_path / "a", steps=3, config_steps=4, summary=False)).problems == ("stopped at step 3 of 4",)
    sweep = tmp_path / "sw"
    run = _run(sweep / "grpo" / "seed0", steps=4, config_steps=4)
    (sweep / "summary.json").write_text(json.dumps({"methods": {"grpo": {"run_dirs": {"seed0": "grpo/seed0"}}},
                                                   "config": {"grpo/seed0": {"steps": 6}}}))
    assert sweep_plan(run) == 6
    assert _check(run).problems == ("ran 4 steps, its sweep planned 6",)


def test_a_summary_the_rows_do_not_reproduce(tmp_path):
    """A summary.json left from the finished run after the rows were cut to 2: the keys that differ, both values
    (by hand: steps 4 / 2; final entropy 0.7 / 0.9; mean |H - 0.3| over the second half (0.5 + 0.4)/2 = 0.45 /
    0.6; the rest agree)."""
    run = _run(tmp_path / "r", steps=4, config_steps=None)
    (run / "metrics.jsonl").write_text("".join((run / "metrics.jsonl").read_text().splitlines(keepends=True)[:2]))
    (problem,) = _check(run).problems
    assert problem == ("summary.json does not match its metrics.jsonl: steps 4 there, 2 from the rows; "
                       "final_entropy 0.7 there, 0.9 from the rows (and 1 more)")
    assert summary_disagreement({"held": True, "other": 1}, {"held": False}) == ["held true there, false from the rows"]
    assert summary_disagreement({"steps": 4}, {"steps": 4.0 + 1e-13}) == []  # JSON keeps floats: only rounding
    assert "held" in EVIDENCE_KEYS


def test_an_unreadable_config_is_a_problem(tmp_path):
    run = _run(tmp_path / "r")
    (run / "config.yaml").write_text("- a\n- b\n")
    assert _check(run).problems == ("config.yaml is not a mapping (a YAML list)",)
    (run / "config.yaml").unlink()
    assert _check(run).problems == ("config.yaml is missing",)


def test_a_step_logged_twice_is_a_problem(tmp_path):
    """A resume that kept the rows past its checkpoint logs steps 3 and 4 twice: the statistics would count them
    twice (its summary.json cannot be told from the rows: none is written here)."""
    run = _run(tmp_path / "r", summary=False)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines + lines[2:]))
    assert _check(run).problems == ("metrics.jsonl repeats 2 step(s) (a resume that did not drop the rows past its "
                                    "checkpoint?)",)
