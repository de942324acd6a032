"""simulate's --out at the sweep's level (stare_lab.platform.outdir, simulators.sweep): what --resume may continue and what
a sweep never writes over."""

from __future__ import annotations

import subprocess
import sys

from stare_lab.cli import main

SMALL = ["num_prompts=8", "seq_len=2", "vocab_size=4", "threshold=2"]


def simulate(*args: str) -> int:
    return main(["simulate", *args])


def test_resume_must_cover_the_sweep_and_out_must_be_a_sweep(tmp_path, capsys):
    """The one --out policy at the sweep's level (stare_lab.platform.outdir): --resume with fewer runs than the sweep in
    --out would drop the others from its summary, so it is refused and touches nothing; the same request with every
    run resumes. A simulate sweep never goes into a trainer run's directory, whatever the options."""
    out = tmp_path / "rs"
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "3", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    before = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "3", "--out", str(out), "--resume",
                    "--no-plots", *SMALL) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a sweep with 3 run(s) this request leaves out (e.g. grpo/seed1)" in err[0], err
    assert (out / "summary.json").read_bytes() == before
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "3", "--out", str(out), "--resume",
                    "--no-plots", *SMALL) == 0
    run = tmp_path / "trainer_run"
    run.mkdir()
    (run / "config.yaml").write_text("source: trainer\n")
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(run), "--no-plots",
                        *SMALL, *extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "holds a trainer run (config.yaml), not a simulate sweep" in err[0], err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_resume_does_not_shorten_a_run(tmp_path, capsys):
    """--resume with fewer steps than a run has done would leave config.yaml (the new steps) disagreeing with its
    rows (the old ones): refused, naming both numbers; nothing changes."""
    out = tmp_path / "short"
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "6", "--out", str(out), "--no-plots", *SMALL) == 0
    before = {p.name: p.read_bytes() for p in (out / "grpo" / "seed0").iterdir() if p.is_file()}
    capsys.readouterr()
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "4", "--out", str(out), "--resume",
                    "--no-plots", *SMALL) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 6 steps done, more than steps=4" in err[0], err
    assert {p.name: p.read_bytes() for p in (out / "grpo" / "seed0").iterdir() if p.is_file()} == before


def test_resume_of_a_missing_out_says_so(tmp_path, capsys):
    """--resume on a path that does not exist starts the sweep there, and says so (a typo is visible)."""
    out = tmp_path / "typo"
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(out), "--resume",
                    "--no-plots", *SMALL) == 0
    assert f"note: --resume: {str(out)!r} does not exist yet; starting the sweep there" in capsys.readouterr().err
    assert (out / "grpo" / "seed0" / "metrics.jsonl").is_file()


def test_out_inside_another_output_is_refused(tmp_path, capsys):
    """A sweep written inside another sweep's method folder, or inside a run, would be counted by their readers as
    their own runs (analyze, promote): refused in one line, nothing written; a plain folder above is fine."""
    out = tmp_path / "demo"
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(out), "--no-plots", *SMALL) == 0
    capsys.readouterr()
    for inner, holder, kind in [(out / "grpo", out, "simulate sweep (summary.json)"),
                                (out / "grpo" / "seed0" / "x", out / "grpo" / "seed0", "simulator run (config.yaml)")]:
        assert simulate("--methods", "o1", "--seeds", "1", "--steps", "2", "--out", str(inner), "--no-plots",
                        *SMALL) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is inside {str(holder)!r}, which holds a {kind}; choose --out outside it" in err[0]
    assert not (out / "grpo" / "o1").exists() and not (out / "grpo" / "seed0" / "x").exists()
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(tmp_path / "a" / "b"),
                    "--no-plots", *SMALL) == 0


def test_resume_of_an_interrupted_sweep_must_cover_its_runs(tmp_path, capsys):
    """Fresh-user item: a sweep stopped before its summary.json, resumed with fewer seeds, exited 0 and left the
    other seed's runs unfinished beside the new summary. Its run directories now say what it holds: refused in one
    line; the full request resumes."""
    out = tmp_path / "intr"
    args = ["--methods", "grpo,o1", "--steps", "2", "--out", str(out), "--no-plots", *SMALL]
    assert simulate(*args, "--seeds", "2") == 0
    (out / "summary.json").unlink()  # as after Ctrl-C: the runs are there, the summary is not
    capsys.readouterr()
    assert simulate(*args, "--seeds", "1", "--resume") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 2 run(s) of an interrupted sweep this request leaves out (e.g. grpo/seed1)" in err[0]
    assert not (out / "summary.json").exists()
    assert simulate(*args, "--seeds", "2", "--resume") == 0 and (out / "summary.json").is_file()


def test_resume_under_another_config_before_the_first_checkpoint_is_refused(tmp_path, capsys):
    """Fresh-user item: a run interrupted before its first checkpoint is restarted by --resume, so under another
    config its rows were silently replaced; its config.yaml is now checked as a checkpointed run's is."""
    import shutil

    out = tmp_path / "r"
    args = ["--methods", "o1", "--seeds", "1", "--out", str(out), "--no-plots", *SMALL]
    assert simulate(*args, "--steps", "3") == 0
    shutil.rmtree(out / "o1" / "seed0" / "checkpoint")
    before = (out / "o1" / "seed0" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert simulate(*args, "--steps", "6", "--resume", "stare.reweight_w=1.3") == 1
    assert "loss.stare.reweight_w differs from the run's config.yaml" in capsys.readouterr().err
    assert (out / "o1" / "seed0" / "metrics.jsonl").read_text() == before


def _rows(run_dir) -> int:
    return len((run_dir / "metrics.jsonl").read_text().splitlines())


def test_resume_alone_continues_the_sweep_as_it_was_started(tmp_path, capsys):
    """Issue 29: a `--methods grpo --steps 5` sweep resumed with --resume alone became 4 methods x 600 steps (the
    preset's). --resume continues the sweep the folder holds (OUT/sweep.json): the same single method, seed and 5
    steps, its overrides, and nothing said about changes (there are none)."""
    import json

    out = tmp_path / "g5"
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "5", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    request = json.loads((out / "sweep.json").read_text())
    assert request["methods"] == ["grpo"] and request["seeds"] == [0] and request["steps"] == 5
    assert request["overrides"] == SMALL and request["grid"] == []
    capsys.readouterr()
    assert simulate("--out", str(out), "--resume", "--no-plots") == 0
    captured = capsys.readouterr()
    assert "note: --resume" not in captured.err, captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == ["grpo"] and summary["seeds"] == [0]
    assert summary["config"]["grpo/seed0"]["steps"] == 5 and summary["config"]["grpo/seed0"]["num_prompts"] == 8
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["grpo"] and _rows(out / "grpo" / "seed0") == 5


def test_resume_of_the_quickstart_sweep_adds_no_method(tmp_path, capsys):
    """Issue 29: the quickstart's `--preset collapse --methods grpo,o1,c2 --seeds 3` sweep, resumed as the quickstart
    does (`--preset collapse --out runs/collapse --resume`), added o1-adaptive (the preset's fourth method). It
    stays grpo, o1, c2 x 3 seeds; a sweep of an older version (no sweep.json) is read from its summary.json."""
    import json

    out = tmp_path / "collapse"
    assert simulate("--preset", "collapse", "--methods", "grpo,o1,c2", "--seeds", "3", "--steps", "3", "--out",
                    str(out), "--no-plots", *SMALL) == 0
    for older in (False, True):
        if older:
            (out / "sweep.json").unlink()
        assert simulate("--preset", "collapse", "--out", str(out), "--resume", "--no-plots", *SMALL) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert list(summary["methods"]) == ["grpo", "o1", "c2"] and summary["seeds"] == [0, 1, 2]
        assert not (out / "o1-adaptive").exists() and summary["config"]["c2/seed2"]["steps"] == 3
    assert "note: --resume" not in capsys.readouterr().err


def test_resume_says_what_it_adds_and_refuses_another_preset(tmp_path, capsys):
    """What a resumed command gives that extends the sweep is said on screen before anything runs (one note per
    change: a method, a seed, more steps); another preset than the sweep's is refused in one line."""
    import json

    out = tmp_path / "ext"
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "3", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    capsys.readouterr()
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "4", "--out", str(out), "--resume",
                    "--no-plots") == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note: --resume")]
    assert len(notes) == 3, notes
    assert "adds method(s) o1 (the sweep ran grpo)" in notes[0]
    assert "adds seed(s) 1 (the sweep ran 0)" in notes[1]
    assert "runs 1 run(s) on to 4 steps (they had 3" in notes[2]
    assert _rows(out / "grpo" / "seed0") == 4 and _rows(out / "o1" / "seed1") == 4
    assert json.loads((out / "sweep.json").read_text())["methods"] == ["grpo", "o1"]
    assert simulate("--preset", "bandit", "--out", str(out), "--resume", "--no-plots") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{str(out)!r} holds a sweep of preset 'demo', not 'bandit'" in err[0], err


def test_a_plugin_sweep_resumed_without_its_plugin_names_it(tmp_path):
    """Issue 29: a sweep of a plugin's method, resumed without --plugin, said only that the method is unknown. The
    one line now names the plugin the sweep was run with; given again, the sweep resumes."""
    plugin = tmp_path / "half.py"
    plugin.write_text("from stare_lab.loss.methods import register_method\n\nregister_method('half-grpo', 'grpo')\n")
    out = tmp_path / "plug"
    base = [sys.executable, "-m", "stare_lab.cli"]
    args = ["simulate", "--out", str(out), "--no-plots"]
    first = subprocess.run([*base, "--plugin", str(plugin), *args, "--preset", "collapse", "--methods",
                            "grpo,half-grpo", "--seeds", "1", "--steps", "2", *SMALL],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*base, *args, "--resume"], capture_output=True, text=True, timeout=300)
    err = again.stderr.strip().splitlines()
    assert again.returncode == 1 and len(err) == 1, again.stderr
    assert "method 'half-grpo' is not one of" in err[0]
    flag = f"--plugin {plugin}"
    assert f"was run with {flag}: give it again (stare-lab {flag} simulate ... --resume)" in err[0]
    ok = subprocess.run([*base, "--plugin", str(plugin), *args, "--resume"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
