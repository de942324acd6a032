"""`stare-lab analyze` end to end on synthetic sweeps: figures, report.md, a self-contained report.html, the paper
comparison and every kind of damaged input (warnings, never a crash; a clear error when nothing can be read)."""

from __future__ import annotations

import base64
import importlib
import io
import json
import math
import os
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from analysis.synthetic import write_synthetic_run, write_synthetic_sweep
from stare_lab.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _need(module: str):
    """Import ``module``; skip if missing, but fail under CI=true (tests must not skip silently there)."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.srcs.append(dict(attrs).get("src", ""))


def _html_images(path: Path) -> tuple[list[bytes], list[str], list[str]]:
    p = _Images()
    p.feed(path.read_text(encoding="utf-8"))
    datas, mimes = [], []
    for src in p.srcs:
        assert src.startswith("data:"), f"image not embedded: {src[:60]}"
        head, b64 = src.split(",", 1)
        mimes.append(head[5:].split(";")[0])
        datas.append(base64.b64decode(b64, validate=True))
    return datas, mimes, p.tags


def _assert_png(data: bytes) -> tuple[int, int]:
    """A valid PNG: signature, then decodable by matplotlib (returns height, width)."""
    mpimg = _need("matplotlib.image")
    assert data[:8] == PNG_MAGIC
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img[..., :3].std() > 0.01  # not a blank canvas
    return img.shape[:2]


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    """A 3-method × 2-seed synthetic sweep plus one trainer run, a non-run folder, a damaged run; analysed once."""
    _need("matplotlib")
    root = tmp_path_factory.mktemp("sweep")
    write_synthetic_sweep(root, methods=("grpo", "o1", "c2"), seeds=(0, 1), steps=120)
    write_synthetic_run(root / "trainer_o1", method="o1", seed=0, steps=50, source="trainer", initial_entropy=2.0)
    (root / "notes").mkdir()  # not a run
    (root / "notes" / "readme.txt").write_text("not a run")
    grpo1 = root / "grpo" / "seed1" / "metrics.jsonl"  # a shorter run (crashed at step 100)
    grpo1.write_text("".join(grpo1.read_text().splitlines(keepends=True)[:100]))
    with open(root / "c2" / "seed1" / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 120, "entropy": 0.1, "rew')  # crash mid-write
    (root / "o1" / "seed0" / "eval.json").write_text(json.dumps(
        {"model": "Qwen2.5-Math-7B", "benchmarks": {"aime24": {"avg@k": 0.5, "pass@k": 0.8},
                                                    "math500": {"avg@k": 0.9}}, "average": 0.7}))
    paper = root.parent / "table2.csv"
    paper.write_text(
        "setting,model,method,aime24,aime25,amc23,math500,minerva,olympiadbench,avg,source\n"
        "short_cot,Qwen2.5-Math-7B,STARE-O1,44.2,23.8,83.4,86.1,44.2,44.7,54.4,rerun\n"
        "short_cot,Qwen2.5-Math-7B,GRPO-ds,37.1,17.7,,82.7,39.4,42.6,,rerun\n"
        "short_cot,Other-Model,STARE-O1,1.0,2.0,3.0,4.0,5.0,6.0,3.5,rerun\n"
    )
    out = root / "figures"
    rc = main(["analyze", str(root), "--out", str(out), "--paper", str(paper), "--metric", "accuracy"])
    assert rc == 0
    return root, out


def test_figures_exist_and_are_valid_pngs(sweep_report):
    _, out = sweep_report
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == ["cross_source.png", "dynamics.png", "metrics.png", "prediction.png", "quadrants.png"]
    for p in out.glob("*.png"):
        _assert_png(p.read_bytes())


def test_report_html_is_self_contained(sweep_report):
    _, out = sweep_report
    datas, mimes, tags = _html_images(out / "report.html")
    assert len(datas) == 5 and set(mimes) == {"image/png"}
    for d in datas:
        _assert_png(d)
    assert "table" in tags and "h2" in tags
    # the embedded images are the files themselves
    assert sorted(datas) == sorted(p.read_bytes() for p in out.glob("*.png"))


def test_report_markdown_reads_top_to_bottom(sweep_report):
    root, out = sweep_report
    md = (out / "report.md").read_text()
    order = ["## Runs", "## 1. Entropy dynamics", "## 2. Predicted vs measured", "## 3. Four quadrants",
             "## 4. Summary per method", "## 5. Across sources", "## 6. Paper comparison", "## Extra metrics",
             "## Notes and warnings"]
    pos = [md.index(h) for h in order]
    assert pos == sorted(pos)
    for name in ("dynamics.png", "prediction.png", "quadrants.png", "cross_source.png", "metrics.png"):
        assert f"]({name})" in md
    # groups: mixed sources → labelled by source; KNOWN_METHODS order
    assert md.index("| grpo [simulator] |") < md.index("| o1 [simulator] |") < md.index("| c2 [simulator] |")
    assert "| o1 [trainer] |" in md
    # the damaged run and the different lengths are reported, not fatal
    assert "not valid JSON (truncated write?)" in md
    # one note per group and reason, naming the series (not one note per series, no internal cache names)
    assert "grpo [simulator]: series differ in length (100, 120 points)" in md
    assert "; for entropy, reward, " in md and "share of tokens in quadrant pos_high" in md
    assert "/share/1" not in md
    assert "`pred/grad_dot`" in md and "`pass@8`" in md and "`accuracy`" in md


def test_paper_comparison_side_by_side_and_empty_cells_stay_empty(sweep_report):
    _, out = sweep_report
    md = (out / "report.md").read_text()
    section = md[md.index("## 6. Paper comparison"):md.index("## Extra metrics")]
    assert "restricted to model Qwen2.5-Math-7B" in section  # named in eval.json
    assert "Other-Model" not in section
    # reported rows, verbatim from the CSV; GRPO-ds has no grpo-ds group here → not listed
    assert "| STARE-O1 | reported (rerun) | short_cot | Qwen2.5-Math-7B | 44.2 | 23.8 | 83.4 | 86.1 | 44.2 | 44.7 | 54.4 |" in section
    assert "GRPO-ds" not in section
    # measured: eval.json fractions ×100; unmeasured benchmarks and the avg (2 of 6 measured) stay empty
    assert "| o1 [simulator] | measured (1 run) |  | Qwen2.5-Math-7B | 50 |  |  | 90 |  |  |  |" in section
    assert "measured avg left empty (2 of 6 benchmarks measured)" in section


def _minimal_sweep(root: Path, seeds=(0, 1)) -> Path:
    """Runs with only the required keys: no measured ΔH, no quadrants, no target; seed s has 10 + s steps."""
    from stare_lab.platform.runs import RunWriter

    for s in seeds:
        with RunWriter(root / "grpo" / f"seed{s}", {"method": "grpo", "seed": s}) as w:
            for i in range(10 + s):
                w.log({"step": i, "entropy": 1.0 / (i + 1), "reward": None, "gate_on": 0, "stare_w": 1.0,
                       "stare_m": 1.0, "pred_entropy_change": None, "entropy_change": None})
    return root


@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_vector_formats_still_embed_viewable_images(tmp_path, fmt):
    _need("matplotlib")
    run = _minimal_sweep(tmp_path / "sw", seeds=(0,))
    out = tmp_path / "out"
    assert main(["analyze", str(run), "--out", str(out), "--format", fmt]) == 0
    files = sorted(p.name for p in out.glob(f"*.{fmt}"))
    assert files == ["dynamics." + fmt]
    datas, mimes, _ = _html_images(out / "report.html")
    assert len(datas) == 1
    if fmt == "svg":
        assert set(mimes) == {"image/svg+xml"} and all(d.lstrip().startswith(b"<?xml") for d in datas)
    else:  # a PDF cannot be an <img>: the HTML embeds PNG renders
        assert set(mimes) == {"image/png"}
        for d in datas:
            _assert_png(d)
        assert all(p.read_bytes().startswith(b"%PDF") for p in out.glob("*.pdf"))
    md = (out / "report.md").read_text()
    if fmt == "pdf":  # Markdown cannot show a PDF inline: a link, not an image
        assert "](dynamics.pdf)" in md and "![" not in md
    else:
        assert "![" in md and "](dynamics.svg)" in md


def test_default_out_and_minimal_runs(tmp_path, capsys):
    """Runs with only the required keys (no predictions measured, no quadrants, no target): report still renders."""
    _need("matplotlib")
    _minimal_sweep(tmp_path / "sw")
    assert main(["analyze", str(tmp_path / "sw")]) == 0
    out = tmp_path / "sw" / "figures"
    assert sorted(p.name for p in out.glob("*.png")) == ["dynamics.png"]
    md = (out / "report.md").read_text()
    assert "nothing to compare" in md and "No run logs `quadrant/…` keys." in md
    assert "aggregated on the 10 points common to all 2" in md
    assert "stare-lab analyze: 2 runs, 1 groups" in capsys.readouterr().out


def test_clear_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["analyze", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "error: no runs found under" in err and "Traceback" not in err
    write_synthetic_run(tmp_path / "r", steps=5)
    assert main(["analyze", str(tmp_path / "r"), str(tmp_path / "empty")]) == 1
    assert "pass --out DIR" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["analyze", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--paper", str(bad)]) == 1
    assert "lacks column(s) setting, model, method" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # a failed analyze leaves no (empty) output folder
    assert main(["analyze", str(tmp_path / "r"), "--paper", str(tmp_path / "missing.csv")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r" / "figures").exists()
    good = tmp_path / "good.csv"
    good.write_text("setting,model,method,aime24,aime25,amc23,math500,minerva,olympiadbench,avg,source\n"
                    "short_cot,M,GRPO,1,2,3,4,5,6,3.5,x\nlong_cot,M,GRPO,1,2,3,4,5,6,3.5,x\n")
    assert main(["analyze", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--paper", str(good),
                 "--paper-setting", "nope"]) == 1
    assert "paper setting 'nope' is not in the paper table; its settings: long_cot, short_cot" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--paper-setting", "short_cot"]) == 1
    assert "--paper-setting='short_cot' needs --paper CSV" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # bad numbers: one line and exit 1 (not argparse's usage text and exit 2)
    for opt, val, msg in [("--band", "-1", "--band=-1 is not allowed"), ("--band", "x", "--band='x' is not a number"),
                          ("--threshold", "nan", "--threshold=nan is not allowed"), ("--dpi", "0", "--dpi=0")]:
        assert main(["analyze", str(tmp_path / "r"), "--out", str(tmp_path / "o"), opt, val]) == 1
        cap = capsys.readouterr()
        assert msg in cap.err and "usage:" not in cap.err and len(cap.err.strip().splitlines()) == 1
    assert main(["analyze", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--group-by", "nope.key"]) == 1
    assert "group_by key 'nope.key' is in no run's config.yaml" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_same_runs_same_report(tmp_path, fmt):
    """Determinism: no timestamps or random ids; analysing the same runs twice gives byte-identical outputs."""
    _need("matplotlib")
    sw = _minimal_sweep(tmp_path / "sw")
    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert main(["analyze", str(sw), "--out", str(out), "--format", fmt]) == 0
        outs.append({p.name: p.read_bytes() for p in out.iterdir()})
    assert outs[0].keys() == {"dynamics." + fmt, "report.md", "report.html", "report.json"}
    assert outs[0] == outs[1]


def test_degenerate_runs_do_not_crash(tmp_path, capsys):
    """A one-step run, a run whose entropy is always null, a non-numeric config, a bad config.yaml: rc 0, warned."""
    _need("matplotlib")
    from stare_lab.platform.runs import RunWriter

    base = {"reward": 0.1, "gate_on": 0, "stare_w": 1.0, "stare_m": 1.0, "pred_entropy_change": 0.1,
            "entropy_change": 0.2}
    with RunWriter(tmp_path / "one", {"method": "grpo", "seed": 0, "source": "simulator"}) as w:
        w.log({"step": 0, "entropy": 0.5, **base})
    with RunWriter(tmp_path / "null", {"method": "o1", "seed": 0, "source": "trainer"}) as w:
        for i in range(3):
            w.log({"step": i, "entropy": None, **base})
    bad = tmp_path / "badcfg"
    bad.mkdir()
    (bad / "config.yaml").write_text("method: [unclosed")
    (bad / "metrics.jsonl").write_text(json.dumps({"step": 0, "entropy": 1.0, **base}) + "\n")
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "no finite 'entropy' values" in md
    assert "config.yaml: not valid YAML at line 1, column 18" in md and "<unicode string>" not in md
    assert "3 of 3 metrics rows have a non-numeric or non-finite 'entropy' (first: None)" in md
    assert "fewer than 2 steps" in md  # the one-step run cannot be put on normalised axes
    for p in out.glob("*.png"):
        _assert_png(p.read_bytes())
    assert "3 runs" in capsys.readouterr().out


def test_terminal_counts_notes_and_warnings_like_the_report(tmp_path, capsys):
    """The terminal line counts what the report's 'Notes and warnings' lists (singular/plural right)."""
    _need("matplotlib")
    sw = _minimal_sweep(tmp_path / "sw")  # seeds of different length: 1 note (grouped per reason)
    out = tmp_path / "out"
    assert main(["analyze", str(sw), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    md = (out / "report.md").read_text()
    items = [ln for ln in md.split("## Notes and warnings", 1)[1].splitlines() if ln.startswith("- ")]
    n_warn = sum("config.yaml" in i or "no valid 'source'" in i for i in items)
    counts = {"warning": n_warn, "note": len(items) - n_warn}
    for word, n in counts.items():
        if n:
            assert f"{n} {word}{'s' * (n != 1)}" in line, (line, items)


def test_mixed_experiments_split_end_to_end(tmp_path, capsys):
    """Review finding 1: tabular and transformer c2 runs are two groups with their own target band, not averaged."""
    _need("matplotlib")
    from stare_lab.platform.runs import RunWriter

    for kind, w, target, seeds in (("tabular", 1.1, 0.956, (0, 1)), ("transformer", 5.0, 0.7, (0,))):
        for s in seeds:
            cfg = {"source": "simulator", "simulator": kind, "method": "c2", "seed": s,
                   "loss": {"stare": {"reweight_w": w, "target_entropy": target}}}
            with RunWriter(tmp_path / kind / "c2" / f"seed{s}", cfg) as wr:
                for i in range(5):
                    wr.log({"step": i, "entropy": 1.0, "reward": 0.5, "stare_w": w, "stare_m": 0.9, "gate_on": 1,
                            "pred_entropy_change": None, "entropy_change": None})
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path / "tabular"), str(tmp_path / "transformer"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    # the Runs table: one row per kind, each with its own target (the merged mean 0.871 must not appear)
    assert "| c2 [tabular] | c2 | simulator | 2 | 0, 1 | 5 | 0.956 |" in md
    assert "| c2 [transformer] | c2 | simulator | 1 | 0 | 5 | 0.7 |" in md
    assert "Not averaged together: c2:" in md and "0.871" not in md
    assert main(["analyze", str(tmp_path / "tabular"), str(tmp_path / "transformer"), "--out", str(out),
                 "--merge"]) == 0
    md = (out / "report.md").read_text()
    assert "| c2 | c2 | simulator | 3 | 0, 0, 1 | 5 |" in md  # merged on request; target mean (0.956·2+0.7)/3
    assert "0.871" in md and "are averaged together (--merge)" in md


def test_seed_bands_are_cut_to_the_possible_values(tmp_path):
    """Review finding: 3 seeds gave 'in band 0.577 ± 1.1' and 'wall time 6.89 ± 34 s'. Three c2 seeds with constant
    entropy 0.4 (= H_tgt), 0.05, 0.05 and step times 0.01, 0.01, 1 s over 20 steps: in band 1, 0, 0 → mean 1/3,
    half-width 4.3027·0.5774/√3 = 1.434 → shown [0, 1]; wall time 0.2, 0.2, 20 s → mean 6.8, s = 11.43, half-width
    28.39 → [0, 35.19]; the entropy band 0.1667 ∓ 0.502 is drawn from 0, never below."""
    _need("matplotlib")
    from stare_lab.platform.runs import RunWriter

    t975 = 4.302652729911275
    for seed, h, dt in ((0, 0.4, 0.01), (1, 0.05, 0.01), (2, 0.05, 1.0)):
        cfg = {"source": "simulator", "method": "c2", "seed": seed,
               "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "target_entropy": 0.4}}}
        with RunWriter(tmp_path / "runs" / "c2" / f"seed{seed}", cfg) as w:
            for i in range(20):
                w.log({"step": i, "entropy": h, "reward": 0.5, "gate_on": 1, "stare_w": 1.1, "stare_m": 0.9,
                       "pred_entropy_change": None, "entropy_change": None, "time/step_s": dt})
    out = tmp_path / "out"
    assert main(["analyze", str(tmp_path / "runs"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| c2 | 3 |"))
    wall_sd = float(np.std([0.2, 0.2, 20.0], ddof=1))
    wall_hi = 6.8 + t975 * wall_sd / math.sqrt(3)
    assert "| 0.333 [0, 1] |" in row and f"| 6.8 [0, {wall_hi:.2g}] |" in row, row
    assert "cut to the values the statistic can take" in md
    cell = {e["group"]: e for e in json.loads((out / "report.json").read_text())["tables"]["summary"]}["c2"]
    assert cell["frac_in_band"]["low"] == 0.0 and cell["frac_in_band"]["high"] == 1.0
    assert cell["frac_in_band"]["ci95"] == pytest.approx(t975 * math.sqrt(1 / 3) / math.sqrt(3), rel=1e-9)
    assert cell["wall_time_s"]["low"] == 0.0 and cell["wall_time_s"]["high"] == pytest.approx(wall_hi, rel=1e-9)

    from analysis.compare import compare
    from analysis.plots import plot_dynamics

    from analysis.figstyle import SEED_BAND

    ax_h = plot_dynamics(compare(tmp_path / "runs")).axes[0]
    edges = [line for line in ax_h.get_lines() if line.get_gid() == SEED_BAND]  # the band: two edge lines
    h_hi = 1 / 6 + t975 * float(np.std([0.4, 0.05, 0.05], ddof=1)) / math.sqrt(3)
    assert len(edges) == 2 and [float(np.min(e.get_ydata())) for e in edges] == [0.0, pytest.approx(h_hi, rel=1e-9)]
