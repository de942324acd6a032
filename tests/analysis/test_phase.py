"""analysis.phase and its hooks: a sweep directory that ``stare-lab analyze`` reads (headline at the top of the
report, phase diagram, measured vs predicted critical W) and the critical W of runs that log the D terms."""

from __future__ import annotations

import json
import re

import pytest

from analysis.phase import critical_rows, phase_figure, read_sweep_summary, run_critical_rows
from stare_lab.cli import main


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """A small W × lr sweep of the demo task (mean field: fast and deterministic)."""
    out = tmp_path_factory.mktemp("sweep") / "s"
    rc = main(["simulate", "--methods", "grpo,o1", "--seeds", "2", "--steps", "40", "--out", str(out), "--no-plots",
               "--sweep", "stare.reweight_w=1.1,1.5,2.0", "--sweep", "lr=1,2", "num_prompts=4", "seq_len=2",
               "vocab_size=4", "threshold=2"])
    assert rc == 0
    return out


def test_read_sweep_summary(sweep_dir, tmp_path):
    s = read_sweep_summary(sweep_dir)
    assert s is not None and s["headline"] and "critical" in s
    assert s["critical"]["o1"]["slice"] == {"lr": 2.0}  # the top level is the demo preset's own lr
    assert read_sweep_summary(sweep_dir / "grpo" / "lr=1" / "seed0") is None  # a run's own summary is no sweep
    bad = tmp_path / "summary.json"
    bad.write_text("{")
    warnings = []
    assert read_sweep_summary(tmp_path, warnings) is None and "unreadable sweep summary" in warnings[0]


def test_phase_figure_and_critical_rows(sweep_dir):
    s = read_sweep_summary(sweep_dir)
    fig = phase_figure(s)
    assert fig is not None and len(fig.axes) >= 1  # one panel (+ colour bar) for o1
    rows = critical_rows(s)
    assert {r[1] for r in rows} == {"lr=1", "lr=2"} and all(r[0] == "o1" for r in rows)
    assert phase_figure({"methods": {}, "sweep": {"grid": [["lr", [1]]]}}) is None


def test_analyze_a_sweep_directory(sweep_dir, tmp_path, capsys):
    """``stare-lab analyze SWEEP_DIR`` finds the sweep summary: the report opens with its verdict (printed too) and
    the sweep's critical W, and has the phase diagram and the critical-W table. The verdict has the sweep
    headline's clauses (same numbers; analyze labels groups ``(lr=1)`` where simulate writes ``[lr=1]``)."""
    out = tmp_path / "rep"
    assert main(["analyze", str(sweep_dir), "--out", str(out), "--group-by", "lr"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert f"verdict: {report['verdict']}" in printed
    md = (out / "report.md").read_text().splitlines()
    paras = [line for line in md[1:] if line.strip()]
    assert paras[0] == f"**Verdict:** {report['verdict']}"
    # the recommended W with its kind, the headline's slice (the preset's own lr 2) first, then every other slice
    assert paras[1].startswith("**Critical W:** recommended W at lr=2: O1 2 (measured: ") and "at lr=1: " in paras[1]
    headline = read_sweep_summary(sweep_dir)["headline"]
    numbers = lambda text: re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", re.sub(r"[\[(][^\])]*=[^\])]*[\])]", "", text))  # noqa: E731
    assert len(numbers(report["verdict"])) >= 6  # labels removed, the entropies etc. stay
    assert numbers(report["verdict"]) == numbers(headline.split("; recommended W")[0])
    assert report["tables"]["critical_strength"]["recommended"]["kind"] == "measured"
    text = "\n".join(md)
    assert "## Critical STARE strength" in text and (out / "phase.png").is_file()
    assert "| o1 | lr=1 |" in text


def test_summary_option_is_checked(sweep_dir, tmp_path, capsys):
    run = sweep_dir / "grpo" / "lr=1" / "seed0"
    assert main(["analyze", str(run), "--out", str(tmp_path / "x"), "--summary", str(run / "summary.json")]) == 1
    assert "is not a sweep summary.json" in capsys.readouterr().err


def test_run_critical_rows_use_the_core(sweep_dir):
    """Per group: the median over the held seeds of stare_lab.theory.critical.critical_w of each run's D terms (mean field:
    window 1), recomputed here from metrics.jsonl; a group that did not hold the band has no predicted W."""
    from analysis.compare import compare
    from stare_lab.theory import critical
    cmp = compare([str(sweep_dir)], group_by=["lr"])
    rows = {r[0]: r for r in run_critical_rows(cmp)}
    label = next(k for k in rows if k.startswith("o1") and "W=2" in k and "lr=1" in k)
    want = []
    for seed in (0, 1):
        lines = (sweep_dir / "o1" / "W=2,lr=1" / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
        r = [json.loads(x) for x in lines]
        want.append(critical.critical_w([x["pred/d_grpo"] for x in r], [x["pred/d_lplus"] for x in r]))
    assert rows[label][2] == "2/2"  # both seeds held the band: the predicted W is their median
    assert rows[label][3] == pytest.approx(sorted(want)[0] / 2 + sorted(want)[1] / 2)
    assert rows[next(k for k in rows if "W=1.1" in k and "lr=1" in k)][3] is None  # not held: no predicted W


def test_phase_curve_has_an_honest_log_axis():
    """Review finding: a symlog axis with a '0' tick drew 1e-3 nats just above '0'. The band deviation is on a log
    axis down to 1e-4 nats (the power of ten 2 decades below the 0.05-nats band); the deviations 0 and 5e-5 are
    drawn at that floor, whose tick reads '≤ 0.0001'; the band boundary is a line at 0.05; 1e-3 stays 1e-3."""
    pytest.importorskip("matplotlib")
    from analysis.phase import W_KEY

    devs = {1.1: [0.12, 0.1], 1.3: [1e-3, 1e-3], 1.5: [0.0, 0.0], 2.0: [5e-5, 5e-5]}
    summary = {"band": 0.05, "sweep": {"grid": [[W_KEY, sorted(devs)]]},
               "methods": {f"o1 [W={w:g}]": {"method": "o1", "point": {W_KEY: w},
                                             "runs": {str(i): {"mean_abs_dev_second_half": d} for i, d in enumerate(v)}}
                           for w, v in devs.items()}}
    ax = phase_figure(summary).axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "0" not in labels and labels[0] == "≤ 0.0001", labels
    curve = next(line for line in ax.get_lines() if line.get_label() == "o1")
    assert list(curve.get_ydata()) == pytest.approx([0.11, 1e-3, 1e-4, 1e-4])
    hollow = next(line for line in ax.get_lines() if "drawn at the floor" in line.get_label())
    assert list(hollow.get_xdata()) == [1.5, 2.0]
    assert any(list(line.get_ydata()) == [0.05, 0.05] for line in ax.get_lines())  # the band boundary
    lo, hi = ax.get_ylim()
    assert lo < 1e-4 and hi > 0.11


def test_analyze_prints_the_critical_w_line_of_the_report(sweep_dir, tmp_path, capsys):
    """Review finding: report.md had '**Critical W:** o1: measured …' but the terminal verdict left it out."""
    out = tmp_path / "rep"
    assert main(["analyze", str(sweep_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    crit = next(ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("**Critical W:** "))
    assert printed[1] == "critical W: " + crit[len("**Critical W:** "):] and printed[0].startswith("verdict: ")
    assert "recommended W at lr=2: O1 2 (measured: " in printed[1]


def test_a_calibration_is_its_own_slice():
    """A calibration.json (O1 1.12 in 1.08–1.2, for the probe of SmolLM2-135M) joins the report's strengths as the
    slice 'target model (SmolLM2-135M)', recommended as calibrated; the toy slice keeps its measured 1.3 (a
    calibration is about another system and never outranks the toy's own measurement there)."""
    from analysis.phase import add_calibration, strength_lines, strength_rows

    meas = {"kind": "measured", "w": 1.3, "m": None, "low": 1.1, "high": 1.3, "source": "o1 W sweep"}
    block = {"slice": {}, "slices": {"": {"point": {}, "strengths": [meas], "recommended": {"O1": meas}}}}
    cal = {"kind": "calibrated", "path": "cal/calibration.json", "probe": {"run": "runs/probe", "model": "SmolLM2-135M"},
           "critical": {"o1": {"w": 1.12, "low": 1.08, "high": 1.2}}}
    lines = strength_lines(add_calibration(block, cal))
    assert lines[0].startswith("recommended W: O1 1.3 (measured: range (1.1, 1.3]; o1 W sweep)")
    assert lines[1].startswith("at target model (SmolLM2-135M): recommended W for O1: 1.12 (calibrated: ")
    assert "range 1.08–1.2" in lines[1] and "cal/calibration.json, probe runs/probe" in lines[1]
    rows = strength_rows(add_calibration(block, cal))
    assert rows[1][:5] == ["target model (SmolLM2-135M)", "O1", "calibrated", 1.12, "1.08–1.2"]
    assert rows[1][6] == "recommended" and block["slices"].keys() == {""}  # the input block is left alone


def test_the_report_says_what_the_screen_says_of_an_auto_run(tmp_path, capsys):
    """grpo and o1-auto on the demo task (seed 0): ``stare-lab analyze`` of the two run directories alone (no sweep
    summary: the report computes from the runs) writes the screen's o1-auto line and its recommendation — the auto
    kind, from an auto run — word for word into report.md, and the same W into report.json."""
    out = tmp_path / "s"
    assert main(["simulate", "--preset", "demo", "--methods", "grpo,o1-auto", "--seeds", "1", "--out", str(out),
                 "--no-plots"]) == 0
    screen = capsys.readouterr().out.splitlines()
    auto = next(ln for ln in screen if ln.startswith("o1-auto: held 1/1 seeds; the W it found: "))
    clause = screen[0].partition("; recommended W: ")[2]
    assert clause.startswith("O1 ") and "(auto: from an auto run" in clause
    rep = tmp_path / "rep"
    assert main(["analyze", str(out / "grpo" / "seed0"), str(out / "o1-auto" / "seed0"), "--out", str(rep)]) == 0
    md = (rep / "report.md").read_text()
    assert f"**Auto schedule:** {auto}" in md and f"**Critical W:** recommended W: {clause}" in md
    block = json.loads((rep / "report.json").read_text())["tables"]["critical_strength"]
    swept = json.loads((out / "summary.json").read_text())["critical_strength"]
    assert block["recommended"]["kind"] == "auto" and block["recommended"]["w"] == swept["recommended"]["w"]
