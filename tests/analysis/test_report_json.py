"""report.json: a simulator sweep (``stare-lab simulate``) and a trainer-format run directory (its summary.json
written by ``trainer.run.runlog.summary_from_rows``) are summarised by the one core function, so the per-run numbers of
``stare-lab analyze``'s report.json equal each run's summary.json number for number (exact equality, null for
null); the tables' numbers are there too."""

from __future__ import annotations

import json

import pytest

from stare_lab.cli import main
from stare_lab.config import LossConfig, STAREConfig, to_dict
from stare_lab.platform.runs import RunWriter, read_run
from stare_lab.platform.summary import SUMMARY_KEYS

SMALL = ["num_prompts=8", "seq_len=2", "vocab_size=4", "threshold=2"]


def _trainer_run(path, seed):
    """A run directory as the trainer writes it: source trainer, steps from 1, a skipped step (entropy null),
    measured entropy change on some steps only, accuracy, timings; summary.json from summary_from_rows."""
    from trainer.run.runlog import summary_from_rows

    cfg = {"source": "trainer", "method": "o1", "seed": seed,
           "loss": to_dict(LossConfig(loss_mode="stare", stare=STAREConfig(target_entropy=0.8)))}
    rows = []
    for step in range(1, 25):
        h = None if step == 7 else 1.5 * 0.93 ** step + 0.01 * seed
        rows.append({"step": step, "entropy": h, "reward": 0.03 * step + 0.1 * seed, "gate_on": int(h is not None
                     and h < 0.8), "stare_w": 1.1, "stare_m": 0.9, "pred_entropy_change": None,
                     "entropy_change": (-0.02 - 0.001 * step) if step % 3 else None, "accuracy": 0.02 * step,
                     "skipped": int(h is None), "time/step_s": 0.25 + 0.01 * step})
    with RunWriter(path, cfg) as w:
        for r in rows:
            w.log(r)
        w.write_summary(summary_from_rows(read_run(path).metrics, len(rows), 0, config=cfg))


def test_report_json_equals_every_summary_json(tmp_path):
    sweep = tmp_path / "sweep"
    assert main(["simulate", "--methods", "grpo,c2", "--seeds", "2", "--steps", "12", "--out", str(sweep),
                 "--no-plots", *SMALL]) == 0
    for seed in (0, 1):
        _trainer_run(tmp_path / "trainer" / f"seed{seed}", seed)
    out = tmp_path / "report"
    assert main(["analyze", str(sweep), str(tmp_path / "trainer"), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    runs = {(r["source"], r["method"], r["seed"]): r for r in report["runs"]}
    assert set(runs) == {("simulator", m, s) for m in ("grpo", "c2") for s in (0, 1)} | {
        ("trainer", "o1", 0), ("trainer", "o1", 1)}
    compared = 0
    for entry in runs.values():
        summary = json.loads((tmp_path.joinpath(entry["path"]) / "summary.json").read_text())
        assert set(entry["summary"]) == set(SUMMARY_KEYS)
        for key in SUMMARY_KEYS:
            assert entry["summary"][key] == summary[key], (entry["path"], key)
            compared += summary[key] is not None
    assert compared > 6 * 12  # most statistics are defined (not a comparison of nulls)
    # the trainer runs: a target, a band and a measured change on some steps, so these are real numbers
    t0 = runs[("trainer", "o1", 0)]["summary"]
    assert t0["time_in_band"] is not None and t0["final_accuracy"] == pytest.approx((0.46 + 0.48) / 2)
    # the summary table carries the same per-run definitions (one seed aggregate per group)
    table = {(row["method"], row["source"]): row for row in report["tables"]["summary"]}
    for method, source in (("grpo", "simulator"), ("o1", "trainer")):
        finals = [runs[(source, method, s)]["summary"]["final_entropy"] for s in (0, 1)]
        assert table[method, source]["final_entropy"]["mean"] == pytest.approx(sum(finals) / 2, rel=1e-12)
        assert table[method, source]["final_entropy"]["n"] == 2
    assert {t["group"] for t in report["tables"]["runs"]} == {row["group"] for row in table.values()}
    assert report["settings"]["band_half_width"] == 0.05


def test_a_sweep_table_summaries_and_report_agree(tmp_path, capsys):
    """A sweep with a grid (layout OUT/<method>/<point>/seed<k>): simulate's table, the sweep's summary.json, each
    run's summary.json and analyze's report.json carry the same numbers — per run exactly, per group the table's
    cells are the seed means of the runs' summary.json values (as printed), and the report's verdict has the
    headline's numbers (labels aside: simulate writes ``[W=1.5]``, analyze ``(reweight_w=1.5)``)."""
    import re

    sweep = tmp_path / "sweep"
    assert main(["simulate", "--methods", "grpo,c2", "--seeds", "2", "--steps", "30", "--out", str(sweep),
                 "--sweep", "stare.reweight_w=1.5,3", "--no-plots", *SMALL]) == 0
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((sweep / "summary.json").read_text())
    out = tmp_path / "report"
    assert main(["analyze", str(sweep), "--out", str(out), "--group-by", "loss.stare.reweight_w"]) == 0
    report = json.loads((out / "report.json").read_text())
    by_path = {r["path"]: r["summary"] for r in report["runs"]}
    assert len(by_path) == 2 + 2 * 2  # grpo × 2 seeds, c2 × 2 W × 2 seeds
    for label, group in summary["methods"].items():
        runs = {}
        for seed, rel in group["run_dirs"].items():
            own = json.loads((sweep / rel / "summary.json").read_text())
            assert rel.count("/") == (2 if group["point"] else 1)  # c2/W=1.5/seed0, grpo/seed0
            for key in SUMMARY_KEYS:
                assert group["runs"][seed][key] == own[key], (label, seed, key)  # sweep summary = run summary
                assert by_path[str(sweep / rel)][key] == own[key], (label, seed, key)  # report.json = run summary
            runs[seed] = own
        table = printed[next(i for i, line in enumerate(printed) if line.startswith("method")):]
        row = next(line for line in table if line.startswith(label + " "))
        mean = lambda key: sum(r[key] for r in runs.values()) / len(runs)  # noqa: E731
        cells = row[len(label):].split()
        assert cells[0] == f"{mean('initial_entropy'):.3f}" and cells[1] == f"{mean('final_entropy'):.3f}"
        assert f"{mean('final_reward'):.3f}" in cells and f"{mean('mean_abs_dev_second_half'):.3f}" in cells
        assert group["mean"]["final_entropy"] == pytest.approx(mean("final_entropy"), rel=1e-12)
    numbers = lambda text: re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", re.sub(r"[\[(][^\])]*=[^\])]*[\])]", "", text))  # noqa: E731
    assert numbers(report["verdict"]) == numbers(summary["headline"].split("; recommended W")[0])
    assert len(numbers(report["verdict"])) >= 6
