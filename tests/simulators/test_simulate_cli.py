"""`stare-lab simulate` end to end: layout, summary, table, determinism, resume, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stare_lab.cli import main

SMALL = ["num_prompts=8", "seq_len=2", "vocab_size=4", "threshold=2"]


def simulate(*args: str) -> int:
    return main(["simulate", *args])


def rows(path):
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if not k.startswith("time/")})
    return out


def test_layout_summary_and_table(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "5", "--out", str(out), "--no-plots", *SMALL) == 0
    text = capsys.readouterr().out
    for method in ("grpo", "o1"):
        assert method in text
        for seed in (0, 1):
            run_dir = out / method / f"seed{seed}"
            assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
            r = rows(run_dir)
            assert [x["step"] for x in r] == list(range(5))
            for key in ("step", "entropy", "reward", "gate_on", "stare_w", "stare_m", "pred_entropy_change",
                        "entropy_change"):
                assert key in r[0]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"grpo", "o1"}
    assert len(summary["methods"]["o1"]["runs"]) == 2
    assert summary["methods"]["grpo"]["mean"]["initial_entropy"] > 0
    for col in ("H0", "H_end", "collapse@", "reward", "in_band"):
        assert col in text


def test_overrides_reach_the_config(tmp_path):
    import yaml

    out = tmp_path / "o"
    assert simulate("--methods", "c2", "--seeds", "1", "--steps", "2", "--out", str(out), "--no-plots",
                    "stare.reweight_w=1.7", "loss.stare.reweight_m=0.6", "lr=0.5", *SMALL) == 0
    cfg = yaml.safe_load((out / "c2" / "seed0" / "config.yaml").read_text())
    assert cfg["loss"]["stare"]["reweight_w"] == 1.7 and cfg["loss"]["stare"]["reweight_m"] == 0.6
    assert cfg["lr"] == 0.5 and cfg["loss"]["loss_mode"] == "stare" and cfg["source"] == "simulator"


def test_same_command_same_numbers_and_resume(tmp_path):
    """Determinism (two sweeps with the same seeds) and resume (6 steps, then --resume to 12 = a 12-step sweep)."""
    common = ["--methods", "grpo,o1-adaptive", "--seeds", "1", "--no-plots", "checkpoint_every=4", *SMALL]
    assert simulate(*common, "--steps", "12", "--out", str(tmp_path / "a")) == 0
    assert simulate(*common, "--steps", "12", "--out", str(tmp_path / "b")) == 0
    assert simulate(*common, "--steps", "6", "--out", str(tmp_path / "c")) == 0
    assert simulate(*common, "--steps", "12", "--out", str(tmp_path / "c"), "--resume") == 0
    for method in ("grpo", "o1-adaptive"):
        a = rows(tmp_path / "a" / method / "seed0")
        assert a == rows(tmp_path / "b" / method / "seed0")
        assert a == rows(tmp_path / "c" / method / "seed0")


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib") if os.environ.get("CI") != "true" else None
    out = tmp_path / "p"
    assert simulate("--methods", "grpo,c2", "--seeds", "2", "--steps", "4", "--out", str(out), *SMALL) == 0
    pngs = list((out / "figures").glob("*.png"))
    assert len(pngs) >= 2


def test_fallback_plots(tmp_path):
    """The sweep's own minimal plots (used when `stare-lab analyze` is unavailable)."""
    pytest.importorskip("matplotlib") if os.environ.get("CI") != "true" else None
    from simulators.sweep import fallback_plots

    out = tmp_path / "f"
    assert simulate("--methods", "grpo", "--seeds", "2", "--steps", "4", "--out", str(out), "--no-plots", *SMALL) == 0
    summary = json.loads((out / "summary.json").read_text())
    paths = fallback_plots(out, summary)
    assert [p.name for p in paths] == ["dynamics.png", "pred_vs_measured.png"] and all(p.stat().st_size for p in paths)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope"], "preset='nope' is not one of"),
        (["--methods", "grpo,ppo"], "method 'ppo' is not one of"),
        (["--seeds", "0"], "seeds=0"),
        (["--steps", "-3"], "steps=-3"),
        (["num_prompts=0"], "num_prompts=0"),
        (["group_size=-1"], "group_size=-1"),
        (["stare.top_p_ratio=1.5"], "loss.stare.top_p_ratio=1.5 is outside [0, 1]"),
        (["stare.top_p_ratio=-0.1"], "loss.stare.top_p_ratio=-0.1"),
        (["stare.reweight_w=0.9"], "loss.stare.reweight_w=0.9"),
        (["stare.reweight_m=1.1"], "loss.stare.reweight_m=1.1"),
        (["bogus_key=1"], "unknown config key bogus_key"),
        (["seed=3"], "--seeds"),
        (["lr"], "must look like key=value"),
    ],
)
def test_bad_input_is_one_clean_line_and_leaves_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    assert simulate("--out", str(out), "--no-plots", *args) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_unwritable_output(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert simulate("--out", str(blocker / "sub"), "--no-plots") == 1
    assert "not a directory" in capsys.readouterr().err
    # /proc refuses new entries even for root (os.access would say yes): the real probe catches it
    assert simulate("--out", "/proc/stare_lab_cannot_write_here", "--no-plots") == 1
    assert "not writable" in capsys.readouterr().err


def test_existing_runs_are_not_overwritten_silently(tmp_path, capsys):
    out = tmp_path / "x"
    base = ["--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(out), "--no-plots", *SMALL]
    assert simulate(*base) == 0
    before = (out / "grpo" / "seed0" / "metrics.jsonl").read_text()
    assert simulate(*base) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert (out / "grpo" / "seed0" / "metrics.jsonl").read_text() == before
    assert simulate(*base, "--overwrite") == 0


def test_console_script_error_has_no_traceback(tmp_path):
    """Through the real console script: exit code 1, one line on stderr, no traceback, nothing created."""
    out = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, "-m", "stare_lab.cli", "simulate", "--preset", "nope", "--out", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_list_presets(capsys):
    assert simulate("--list-presets") == 0
    text = capsys.readouterr().out
    for name in ("collapse", "random-reward", "theory"):
        assert name in text


def test_resume_with_another_config_is_refused_up_front(tmp_path, capsys):
    out = tmp_path / "r"
    base = ["--methods", "grpo,o1", "--seeds", "1", "--out", str(out), "--no-plots"]
    assert simulate(*base, "--steps", "3", *SMALL) == 0
    before = {m: (out / m / "seed0" / "metrics.jsonl").read_text() for m in ("grpo", "o1")}
    assert simulate(*base, "--steps", "6", "--resume", *SMALL, "stare.reweight_w=1.3") == 1
    err = capsys.readouterr().err
    assert "cannot resume" in err and "loss.stare.reweight_w" in err
    assert {m: (out / m / "seed0" / "metrics.jsonl").read_text() for m in ("grpo", "o1")} == before
