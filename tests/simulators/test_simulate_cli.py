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
            assert [x["step"] for x in r] == list(range(1, 6))
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
    # the sweep's notes (printed on the terminal) are the report's too (fresh-user item: the report said "None")
    notes = json.loads((out / "summary.json").read_text())["notes"]
    report = json.loads((out / "figures" / "report.json").read_text())["notes"]
    assert notes and all(n.removeprefix("note: ") in report for n in notes)


def test_figures_come_from_one_call_of_the_analysis_function(tmp_path, monkeypatch, capsys):
    """simulate asks the analysis wing for its report once, through the entry point stare_lab.reports (no import of
    analysis in the simulators), with exactly the sweep's run directories and its summary.json; when no report
    function is installed the runs and summary stand and the line says why there are no figures."""
    import simulators.cli as cli

    assert callable(cli._report_function())  # installed: analysis.analyze.analyze
    calls = []

    def fake(paths, out, **kw):
        calls.append((list(paths), out, kw))
        raise SystemExit("not reached")  # the figures line is printed after the call; stop here

    monkeypatch.setattr(cli, "_report_function", lambda: fake)
    out = tmp_path / "f"
    with pytest.raises(SystemExit):
        simulate("--methods", "grpo,o1", "--seeds", "1", "--steps", "3", "--out", str(out), *SMALL)
    assert calls == [([str(out / "grpo" / "seed0"), str(out / "o1" / "seed0")], out / "figures",
                      {"summary": out / "summary.json", "group_by": []})]
    monkeypatch.setattr(cli, "_report_function", lambda: "no installed package provides it")
    capsys.readouterr()
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "3", "--out", str(out), "--overwrite",
                    *SMALL) == 0
    assert "figures: not written (no installed package provides it)" in capsys.readouterr().out
    assert (out / "summary.json").is_file() and not (out / "figures").exists()


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
        # review item 10: a group of one response has all-zero advantages
        (["group_size=1"], "group_size=1 is outside [2, inf)"),
        # review item 14: a non-integer --seeds is one line and exit 1, not argparse usage and exit 2
        (["--seeds", "1.5"], "--seeds='1.5' must be a count N >= 1 or a comma-separated list of seeds"),
        (["--seeds", "3,3"], "--seeds='3,3' lists a seed twice"),
        (["--seeds", "3,x"], "--seeds='3,x': every seed of the list must be an integer in [0, 2147483647] (2**31 - 1)"),
        (["--seeds", "3,"], "--seeds='3,': every seed of the list must be an integer in [0, 2147483647]"),
        (["--seed", "-1"], "--seed='-1' must be an integer in [0, 2147483647] (2**31 - 1)"),
        # fresh-user review: huge seed counts / values are one line naming the value and the allowed range
        (["--seeds", "100000000000000000000"],
         "--seeds=100000000000000000000 is more seeds than one sweep runs: give a count in [1, 10000]"),
        (["--seeds", "10001"], "--seeds=10001 is more seeds than one sweep runs: give a count in [1, 10000]"),
        (["--seed", "2147483648"], "--seed='2147483648' must be an integer in [0, 2147483647] (2**31 - 1)"),
        (["--seeds", "1,100000000000000000000"],
         "--seeds='1,100000000000000000000': every seed of the list must be an integer in [0, 2147483647]"),
        (["--seeds", "2", "--seed", "1"], "--seeds='2' and --seed='1' both choose the seeds: give one of them"),
        # issue 16: an error caused by a method's own defaults names the method
        (["--methods", "grpo,o1-adaptive", "stare.reweight_w=2"],
         "method 'o1-adaptive' (which sets loss.loss_mode=stare, loss.stare.variant=O1, loss.stare.adaptive=True, "
             "loss.stare.schedule=paper): "
         "loss.stare.w_max=1.5 is below loss.stare.reweight_w=2.0"),
        (["--steps", "two"], "--steps='two' must be an integer >= 1"),
        # review item 15: no silent fallback / silently ignored settings
        (["--methods", ""], "--methods='' names no method"),
        (["--methods", ","], "--methods=',' names no method"),
        (["--resume", "--overwrite"], "--resume and --overwrite exclude each other"),
        (["--steps", "5", "steps=7"], "override 'steps=7' and --steps 5 both set steps"),
        (["loss.loss_mode=grpo"], "loss.loss_mode is set by method 'grpo'; choose the method with --methods"),
        (["stare.variant=C2"], "loss.stare.variant is set by method 'o1'; choose the method with --methods"),
        (["--methods", "grpo-ds", "dynamic_sampling=false"], "dynamic_sampling is set by method 'grpo-ds'"),
        (["target_entropy_rel=-1"], "target_entropy_rel=-1 is outside (0, inf)"),
        (["target_entropy_rel=0"], "target_entropy_rel=0 is outside (0, inf)"),
        # fresh-user review: the printed range holds only accepted values, and lr has a documented bound
        (["lr=inf"], "lr=inf must be finite"),
        (["lr=1e308"], "lr=1e+308 is outside (0, 1000]"),
        # fresh-user review item 1: an explicit target and a relative one cannot both hold
        (["stare.target_entropy=0.5", "target_entropy_rel=0.4"],
         "loss.stare.target_entropy=0.5 and target_entropy_rel=0.4 both set the STARE target entropy"),
        (["--sweep", "lr"], "--sweep 'lr' must look like KEY=V1,V2"),
        (["--sweep", "stare.variant=O1,C2"], "--sweep loss.stare.variant: loss.stare.variant is set by method"),
        (["--sweep", "lr=1,2", "lr=3"], "lr is both overridden and swept"),
        (["--workers", "0"], "--workers=0 must be an integer >= 1"),
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
    # /proc refuses new entries even for root (os.access would say yes): the real probe catches it, and the message
    # names the directory it cannot create and the ancestor that refused (review item 16)
    assert simulate("--out", "/proc/stare_lab_cannot_write_here", "--no-plots") == 1
    err = capsys.readouterr().err
    assert "--out='/proc/stare_lab_cannot_write_here' cannot be created" in err and "'/proc' does not accept" in err


def test_existing_runs_are_not_overwritten_silently(tmp_path, capsys):
    out = tmp_path / "x"
    base = ["--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(out), "--no-plots", *SMALL]
    assert simulate(*base) == 0
    before = (out / "grpo" / "seed0" / "metrics.jsonl").read_text()
    assert simulate(*base) == 1
    assert "already holds a sweep" in capsys.readouterr().err
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


def test_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    """Review item 15: ``--out ""`` used to write ./runs/collapse; now one line, exit 1, nothing written."""
    monkeypatch.chdir(tmp_path)
    assert simulate("--out", "", "--no-plots") == 1
    assert "--out='' is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_override_of_a_key_the_method_leaves_alone_is_kept(tmp_path):
    """c2 does not set loss.stare.adaptive (stare_lab.loss.methods.METHODS), so the override is honoured, not refused."""
    import yaml

    out = tmp_path / "a"
    assert simulate("--methods", "c2", "--seeds", "1", "--steps", "2", "--out", str(out), "--no-plots",
                    "stare.adaptive=true", *SMALL) == 0
    assert yaml.safe_load((out / "c2" / "seed0" / "config.yaml").read_text())["loss"]["stare"]["adaptive"] is True


def test_divergence_names_lr_and_step_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """Review item 12: on the core-loss path the update is Δz = −lr·(n·L)·∂loss/∂z (simulators.tabular.runner docstring);
    with lr=1e308 and n·L = 16 the factor overflows to inf → RunError naming lr and the step; the started run
    directory (no completed step) and the sweep folders it created are removed. (grpo/o1/c2 take the closed form,
    which cannot overflow for a finite lr: tests/simulators/test_tabular.py.) lr=1e308 is above the allowed
    LR_MAX (refused up front, test_bad_input_is_one_clean_line_and_leaves_nothing): lifted here to reach the guard."""
    monkeypatch.setattr("simulators.tabular.config.LR_MAX", float("inf"))
    out = tmp_path / "d"
    assert simulate("--preset", "collapse", "--methods", "clip_cov", "--seeds", "1", "--steps", "3", "--out",
                    str(out), "--no-plots", "lr=1e308", *SMALL) == 1
    err = capsys.readouterr().err
    assert "lr=1e+308 made the logits non-finite at step 1; lower lr" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_check_update_refuses_overflowing_logits():
    """check_update (both modes): a finite Δz whose sum with the logits overflows (1e308 + 1e308 > 1.8e308, the
    float64 maximum) and a Δz holding NaN are refused, naming lr and the step; a finite one passes."""
    import torch

    from simulators.tabular.runner import TabularSimConfig, check_update
    from stare_lab.errors import RunError

    cfg = TabularSimConfig(num_prompts=2, seq_len=1, vocab_size=2, threshold=1, lr=0.5, mode="expected")
    logits = torch.full((2, 1, 2), 1e308, dtype=torch.float64)
    with pytest.raises(RunError, match=r"^lr=0.5 made the logits non-finite at step 7; lower lr$"):
        check_update(cfg, 7, torch.full_like(logits, 1e308), logits)
    with pytest.raises(RunError, match="at step 7"):
        check_update(cfg, 7, torch.full_like(logits, float("nan")), torch.zeros_like(logits))
    check_update(cfg, 7, torch.full_like(logits, 1e308), torch.zeros_like(logits))


def test_divergence_keeps_finished_runs(tmp_path):
    """A run that diverges leaves the sweep's other runs finished and removes only its own folders."""
    from simulators.sweep import plan_sweep, run_sweep
    from stare_lab.errors import RunError

    out = tmp_path / "k"
    plan = plan_sweep("collapse", ["grpo", "clip_cov"], 1, out, overrides=SMALL, steps=2, workers=1)
    plan.configs[("clip_cov", 0)].lr = 1e308  # only this run diverges
    with pytest.raises(RunError, match="lr=1e\\+308 made the logits non-finite at step 1"):
        run_sweep(plan)
    assert len(rows(out / "grpo" / "seed0")) == 2
    assert not (out / "clip_cov").exists()  # created by this sweep and left empty by the failed run: removed


def test_overwrite_with_fewer_runs_covers_exactly_the_new_runs(tmp_path, capsys):
    """Review item 2: a sweep of 2 methods × 2 seeds, then --overwrite with grpo × 1 seed: the previous sweep's
    other runs are removed, foreign files are kept, and summary.json, the table and the report cover exactly
    grpo/seed0."""
    out = tmp_path / "ow"
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "3", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    foreign = out / "mine" / "seed0"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert simulate("--methods", "grpo", "--seeds", "1", "--steps", "2", "--out", str(out), "--overwrite",
                    *SMALL) == 0
    text = capsys.readouterr().out
    assert not (out / "o1").exists() and not (out / "grpo" / "seed1").exists()
    assert (out / "grpo" / "seed0" / "metrics.jsonl").is_file() and (foreign / "notes.txt").read_text() == "keep me"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["methods"]) == ["grpo"] and list(summary["config"]) == ["grpo/seed0"]
    assert "o1" not in text.split("figures:")[0]
    report = out / "figures" / "report.md"
    if report.is_file():  # the analysis wing wrote the report: it saw exactly the one planned run
        assert "report: report.md" in text
        lines = [ln for ln in report.read_text().splitlines() if ln.startswith("| grpo |")]
        assert lines and "| o1 |" not in report.read_text()


def test_chosen_seeds(tmp_path, capsys):
    """--seeds A,B runs exactly those seeds (directories seed3, seed7; summary seeds [3, 7]); --seed S the one seed
    S; --seeds N is the count N (seeds 0..N-1). A chosen seed gives the same numbers as in any other sweep."""
    out = tmp_path / "s"
    assert simulate("--methods", "grpo", "--seeds", "3,7", "--steps", "3", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    assert "1 method(s) x 2 seed(s) [3,7]" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "grpo").iterdir()) == ["seed3", "seed7"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [3, 7] and list(summary["methods"]["grpo"]["runs"]) == ["seed3", "seed7"]
    one = tmp_path / "one"
    assert simulate("--methods", "grpo", "--seed", "7", "--steps", "3", "--out", str(one), "--no-plots", *SMALL) == 0
    assert rows(one / "grpo" / "seed7") == rows(out / "grpo" / "seed7")
    assert json.loads((one / "grpo" / "seed7" / "summary.json").read_text())["seed"] == 7
    count = tmp_path / "count"
    assert simulate("--methods", "grpo", "--seeds", "2", "--steps", "3", "--out", str(count), "--no-plots",
                    *SMALL) == 0
    assert sorted(p.name for p in (count / "grpo").iterdir()) == ["seed0", "seed1"]


def test_seed_range_edges(tmp_path, capsys):
    """Fresh-user review: the largest allowed seed 2**31 - 1 runs (the tabular streams 2**32 + seed and the initial
    tables fit torch's 64-bit seeds); one above it, and counts above 10000, are refused by the API (seed_list) and
    by both simulators' configs with the allowed range, never an OverflowError."""
    from simulators.sweep import seed_list
    from simulators.tabular.runner import config_from_overrides
    from simulators.transformer.config import TransformerSimConfig
    from stare_lab.errors import ConfigError

    top = 2**31 - 1
    assert simulate("--methods", "grpo", "--seed", str(top), "--steps", "2", "--out", str(tmp_path / "top"),
                    "--no-plots", *SMALL) == 0
    assert len(rows(tmp_path / "top" / "grpo" / f"seed{top}")) == 2
    assert seed_list(10_000, [0]) == list(range(10_000)) and seed_list([0, top], [0]) == [0, top]
    for bad, msg in [(10**20, r"seeds=100000000000000000000 must be a count in \[1, 10000\]"),
                     ([2**31], r"seed 2147483648 must be an integer in \[0, 2147483647\]"),
                     (list(range(10_001)), "10001 seeds: one sweep runs at most 10000")]:
        with pytest.raises(ConfigError, match=msg):
            seed_list(bad, [0])
    with pytest.raises(ConfigError, match=r"^seed=2147483648 must be an integer in \[0, 2147483647\]"):
        config_from_overrides({"seed": 2**31})
    with pytest.raises(ConfigError, match=r"^init_seed=10000000000 must be an integer in \[0, 2147483647\]"):
        config_from_overrides({"init_seed": 10**10})
    with pytest.raises(ConfigError, match=r"seed=2147483648 must be an integer in \[0, 2147483647\]"):
        TransformerSimConfig(seed=2**31)


def test_unknown_option_prints_the_subcommands_usage(capsys):
    from stare_lab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("usage: stare-lab simulate") and "--bogus" in err


def test_list_keys(capsys):
    """--list-keys: every override key of the preset with its value and its documented range; the keys a method
    sets are marked. Every key of every preset has a description (a new field without one fails here)."""
    from simulators.keys import preset_keys
    from simulators.presets import preset_names

    assert simulate("--list-keys") == 0
    lines = capsys.readouterr().out.splitlines()
    lr = next(ln for ln in lines if ln.startswith("lr "))
    assert lr.split()[:3] == ["lr", "float", "2"] and "SGD step size in (0, 1000]" in lr  # the demo preset's lr
    w = next(ln for ln in lines if ln.startswith("loss.stare.reweight_w "))
    assert w.split()[:3] == ["loss.stare.reweight_w", "float", "1.1"] and "W ≥ 1" in w
    assert "[set by the method" in next(ln for ln in lines if ln.startswith("loss.stare.variant "))
    assert simulate("--list-keys", "--preset", "transformer") == 0
    out = capsys.readouterr().out
    assert next(ln for ln in out.splitlines() if ln.startswith("steps ")).split()[:3] == ["steps", "int", "200"]
    assert "model.hidden_size" in out
    for preset in preset_names():
        assert [k.key for k in preset_keys(preset) if not k.doc] == [], preset


def test_headline_first_notes_after_the_table(tmp_path, capsys):
    """The headline is the first line, the notes (simulators.notes; their logic: test_notes.py) come after the
    table; on the demo preset's task (small, 60 steps) the paper's O1 does not hold the band and gets a note."""
    out = tmp_path / "n"
    assert simulate("--methods", "grpo,o1", "--seeds", "1", "--steps", "60", "--out", str(out), "--no-plots",
                    *SMALL) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("grpo ") and "not held: o1" in lines[0]
    table = next(i for i, ln in enumerate(lines) if ln.startswith("method"))
    notes = [i for i, ln in enumerate(lines) if ln.startswith("note: o1")]
    assert notes and notes[0] > table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"] == lines[0] and summary["notes"]


def test_explicit_target_entropy_replaces_the_presets_relative_target(tmp_path):
    """Fresh-user review item 1: the bandit preset sets target_entropy_rel=0.5 (H_tgt = 0.5 × ln 3); an explicit
    stare.target_entropy=0.5 switches it off, so config.yaml and the table carry 0.5. With target_entropy_rel=null
    given too it is accepted the same way."""
    import yaml

    for extra, name in (([], "a"), (["target_entropy_rel=null"], "b")):
        out = tmp_path / name
        assert simulate("--preset", "bandit", "--methods", "o1", "--seeds", "1", "--steps", "2", "--out", str(out),
                        "--no-plots", "stare.target_entropy=0.5", *extra) == 0
        cfg = yaml.safe_load((out / "o1" / "seed0" / "config.yaml").read_text())
        assert cfg["loss"]["stare"]["target_entropy"] == 0.5 and cfg["target_entropy_rel"] is None
        summary = json.loads((out / "summary.json").read_text())
        assert summary["methods"]["o1"]["mean"]["target_entropy"] == 0.5


def test_config_from_overrides_follows_the_same_target_rule():
    from simulators.tabular.runner import config_from_overrides
    from stare_lab.errors import ConfigError

    cfg = config_from_overrides({"target_entropy_rel": 0.5})
    assert cfg.target_entropy_rel == 0.5  # kept without an explicit target
    cfg = config_from_overrides({"loss": {"stare": {"target_entropy": 0.4}}})
    assert cfg.target_entropy_rel is None and cfg.loss.stare.target_entropy == 0.4
    with pytest.raises(ConfigError, match=r"^loss.stare.target_entropy=0.4 and target_entropy_rel=0.3 both set"):
        config_from_overrides({"target_entropy_rel": 0.3, "loss": {"stare": {"target_entropy": 0.4}}})


def test_target_above_the_reward_optimal_entropy_is_a_note(tmp_path, capsys):
    """docs/theory.md §7: on the collapse task (2 correct tokens per position) H_tgt = 0.9 nats is above ln 2."""
    assert simulate("--preset", "collapse", "--methods", "o1", "--seeds", "1", "--steps", "2", "--out",
                    str(tmp_path / "t"), "--no-plots", "stare.target_entropy=0.9") == 0
    text = capsys.readouterr().out
    assert "note: stare.target_entropy=0.9 nats is above the reward-optimal entropy 0.693 nats" in text


def test_sweep_grid_layout_and_critical(tmp_path, capsys):
    """--sweep: one run directory per (method, grid point, seed), GRPO once (W does not change it), summary with
    the grid and critical.o1 (measured / predicted keys), the critical line on the terminal."""
    out = tmp_path / "g"
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "20", "--out", str(out), "--no-plots",
                    "--sweep", "stare.reweight_w=1.1,2.0", "--workers", "2", *SMALL) == 0
    text = capsys.readouterr().out
    for d in ("grpo/seed0", "grpo/seed1", "o1/W=1.1/seed0", "o1/W=2/seed1"):
        assert (out / d / "metrics.jsonl").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sweep"]["grid"] == [["loss.stare.reweight_w", [1.1, 2.0]]]
    assert set(summary["methods"]) == {"grpo", "o1 [W=1.1]", "o1 [W=2]"}
    crit = summary["critical"]["o1"]
    for key in ("measured_w", "predicted_w", "predicted_w_grpo", "predicted_w_measured_drift", "deviation_by_w"):
        assert key in crit
    assert "; recommended W: O1 " in text.splitlines()[0]  # said once, in the headline
    block = summary["critical_strength"]
    assert block["rule"].startswith("measured > auto > calibrated > predicted > conservative")
    kinds = {d["kind"] for d in block["slices"][""]["strengths"]}
    assert "conservative" in kinds  # GRPO's crossing is always there; measured / predicted when a W held


def test_a_two_key_sweep_lists_every_slice(tmp_path, capsys):
    """Review finding: with two --sweep keys the terminal's critical-W line reported one slice only (and left
    lr=1 out). Every slice of W × lr gets its recommended W and kind, as summary.json has it: the preset's own
    (lr=2) in the headline, the other on a line of its own."""
    out = tmp_path / "g2"
    assert simulate("--preset", "demo", "--methods", "grpo,o1", "--seeds", "2", "--steps", "60", "--out", str(out),
                    "--no-plots", "--sweep", "stare.reweight_w=1.1,1.3", "--sweep", "lr=1,2", *SMALL) == 0
    text = capsys.readouterr().out.splitlines()
    lines = [ln for ln in text if ln.startswith("critical W")]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["critical"]["o1"]["by_slice"]) == {"lr=1", "lr=2"}
    assert [ln.split(":")[0] for ln in lines] == ["critical W at lr=1"]
    for ln, label, head in ((lines[0], "lr=1", "recommended W for O1: "),
                            (text[0], "lr=2", "recommended W at lr=2: O1 ")):
        rec = summary["critical_strength"]["slices"][label]["recommended"]["O1"]
        w = "above " + format(rec["low"], ".3g") if rec["w"] is None else format(rec["w"], ".3g")
        assert f"{head}{w} ({rec['kind']}" in ln, (label, ln)
    assert "every slice below" in text[0]


def test_workers_do_not_change_results(tmp_path):
    """The same sweep over 1 and 2 worker processes writes the same rows (each run's numbers do not depend on the
    batch it lands in)."""
    base = ["--methods", "grpo,o1,c2", "--seeds", "2", "--steps", "5", "--no-plots", *SMALL]
    assert simulate(*base, "--out", str(tmp_path / "one"), "--workers", "1") == 0
    assert simulate(*base, "--out", str(tmp_path / "two"), "--workers", "2") == 0
    for m in ("grpo", "o1", "c2"):
        for s in (0, 1):
            assert rows(tmp_path / "one" / m / f"seed{s}") == rows(tmp_path / "two" / m / f"seed{s}")


def _metrics_without(path, drop):
    return [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in rows(path)]


def test_kl_cov_note_and_identity_with_grpo(tmp_path, capsys):
    """Fresh-user review item 2: with one on-policy update per batch rho = 1, log rho = 0 and d|log rho| = 0 (torch's
    abs has gradient 0 at 0), so kl_cov takes GRPO's steps exactly (same seed: every metric equal, bar its own
    selected fraction); the CLI says so. (Aggregation seq-mean-token-mean — equal to token-mean here, every response
    has L tokens — puts grpo on the core-loss path too, so both take their steps through the same code.)"""
    out = tmp_path / "k"
    assert simulate("--preset", "collapse", "--methods", "grpo,kl_cov", "--seeds", "1", "--steps", "4", "--out",
                    str(out), "--no-plots", "loss.loss_agg_mode=seq-mean-token-mean", *SMALL) == 0
    text = capsys.readouterr().out
    notes = [ln for ln in text.splitlines() if ln.startswith("note: kl_cov")]
    assert len(notes) == 1 and "equals GRPO" in notes[0] and "updates_per_batch=N" in notes[0]
    drop = ("kl_cov",)
    assert _metrics_without(out / "kl_cov" / "seed0", drop) == _metrics_without(out / "grpo" / "seed0", drop)
    assert simulate("--preset", "collapse", "--methods", "grpo", "--seeds", "1", "--steps", "2", "--out",
                    str(tmp_path / "g"), "--no-plots", *SMALL) == 0
    assert "note: kl_cov" not in capsys.readouterr().out


def test_kl_cov_note_on_transformer_plans_depends_on_updates_per_batch(tmp_path):
    """The transformer simulator takes updates_per_batch updates per batch: the note is there for 1 (the default),
    not for 2 (then rho != 1 from the second update on). plan_sweep writes nothing, so no run is needed."""
    from simulators.notes import plan_notes
    from simulators.sweep import plan_sweep

    one = plan_notes(plan_sweep("transformer", ["grpo", "kl_cov"], 1, tmp_path / "t"))
    assert len(one) == 1 and one[0].startswith("note: kl_cov ran with one on-policy update per rollout batch")
    assert plan_notes(plan_sweep("transformer", ["kl_cov"], 1, tmp_path / "t", overrides=["updates_per_batch=2"])) == []
    assert not (tmp_path / "t").exists()


def test_gate_never_note(tmp_path, capsys):
    """Fresh-user review item 3: with stare.gate=never the STARE weights are never applied, so O1/C2 equal GRPO; the
    note names the disabled gate, not an entropy that stayed above H_tgt."""
    out = tmp_path / "gn"
    assert simulate("--methods", "grpo,o1,c2", "--seeds", "1", "--steps", "4", "--out", str(out), "--no-plots",
                    "stare.gate=never", *SMALL) == 0
    text = capsys.readouterr().out
    note = [ln for ln in text.splitlines() if ln.startswith("note:")]
    assert note == [f"note: {m} ended like GRPO because the gate is disabled (stare.gate=never: the STARE weights "
                    "are never applied); use stare.gate=entropy (the paper's gate) to see STARE act" for m in ("o1", "c2")]


def test_stare_overrides_without_a_stare_method_get_a_note(tmp_path, capsys):
    """Fresh-user review item 4: stare.* overrides change no update when no method uses the STARE loss."""
    base = ["--seeds", "1", "--steps", "2", "--no-plots", *SMALL]
    assert simulate("--methods", "grpo", "--out", str(tmp_path / "a"), *base, "stare.reweight_w=3") == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note:")]
    assert notes == ["note: stare.reweight_w=3 changes no update: none of the methods run (grpo) uses the STARE "
                     "loss; add one of o1,c2,o1-adaptive,o1-auto,c2-auto to --methods"]
    assert simulate("--methods", "grpo,o1", "--out", str(tmp_path / "b"), *base, "stare.reweight_w=3") == 0
    assert "changes no update" not in capsys.readouterr().out
    assert simulate("--methods", "grpo", "--out", str(tmp_path / "c"), *base) == 0
    assert "no update" not in capsys.readouterr().out


def test_resume_with_a_lost_final_row_is_one_line_up_front(tmp_path, capsys):
    """Fresh-user review: the last row of one run cut (its checkpoint at that step) → `--resume` refuses in one line
    naming the run, the checkpoint step, the last good row and --overwrite, before any run is touched (the other
    run's files are unchanged), instead of reporting done with a row fewer."""
    out = tmp_path / "t"
    args = ["--preset", "theory", "--methods", "grpo", "--seeds", "2", "--steps", "4", "--out", str(out),
            "--no-plots", *SMALL]
    assert simulate(*args) == 0
    capsys.readouterr()
    m = out / "grpo" / "seed1" / "metrics.jsonl"
    m.write_text("".join(x + "\n" for x in m.read_text().splitlines()[:-1]))
    other = {p.name: p.read_bytes() for p in (out / "grpo" / "seed0").iterdir() if p.is_file()}
    for extra in ([], ["--steps", "6"]):
        a = list(args)
        if extra:
            a[a.index("--steps") + 1] = "6"
        assert simulate(*a, "--resume") == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert (f"cannot resume {str(out / 'grpo' / 'seed1')!r}: its checkpoint is at step 4 but metrics.jsonl "
                "does not hold exactly the rows of steps 1..4 (last good row: step 3;") in err
        assert err.endswith("rerun with --overwrite to start the run afresh")
        assert {p.name: p.read_bytes() for p in (out / "grpo" / "seed0").iterdir() if p.is_file()} == other


def test_transformer_preset_without_transformers_is_one_line(tmp_path, monkeypatch, capsys):
    """With the demo's install only (no transformers), the transformer presets say what to install instead of a
    ModuleNotFoundError traceback (find_spec is made to miss transformers)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert simulate("--preset", "transformer", "--out", str(tmp_path / "tf")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "transformers is not installed" in err[0] and "make install" in err[0], err
    assert not (tmp_path / "tf").exists()


def _table_row(text: str, label: str) -> dict[str, str]:
    """Column → cell of ``label``'s row of simulate's end table (right-aligned under the header's names)."""
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("method "))
    header, line = lines[at], next(x for x in lines[at + 2:] if x.startswith(label + " "))
    cells, start = {}, len(header.split()[0])
    for name in header.split()[1:]:
        end = header.index(name, start) + len(name)
        cells[name] = line[start:end].strip()
        start = end
    return cells


def test_in_band_is_the_same_fraction_in_the_table_and_the_report(tmp_path, capsys):
    """Issue 29: in_band printed as 2 % in simulate's table and 0.03 in analyze's. Both print the fraction of steps
    in the band now: the table's cell is analysis' seed mean (analysis.compare, the report's number) to 2 places,
    as `stare-lab analyze` prints it."""
    from analysis.compare import compare

    out = tmp_path / "band"
    assert simulate("--methods", "grpo,o1", "--seeds", "2", "--steps", "30", "--out", str(out), "--no-plots",
                    *SMALL, "stare.target_entropy=0.9") == 0
    text = capsys.readouterr().out
    rows = {r["label"]: r for r in compare([str(out)]).summary_rows()}
    for label in ("grpo", "o1"):
        cell = _table_row(text, label)["in_band"]
        assert cell == f"{rows[label]['frac_in_band'][0]:.2f}", (cell, rows[label]["frac_in_band"])


def test_a_target_at_grpos_floor_is_said_once(tmp_path, capsys):
    """Issue 29: at H_tgt 0.2 on demo, GRPO was "collapsed 3/3" and "held 3/3" at once (its end point 0.163 lies in
    the band [0.15, 0.25] and below 10 % of its initial 1.74). The headline says the target sits at GRPO's floor,
    and the table counts the seed as held, not collapsed."""
    out = tmp_path / "floor"
    assert simulate("--methods", "grpo", "--seeds", "1", "--out", str(out), "--no-plots",
                    "stare.target_entropy=0.2") == 0
    text = capsys.readouterr().out
    head = text.splitlines()[0]
    assert head.startswith("grpo ended inside the band on 1/1 seeds (H ") and "collapsed" not in head
    assert "nats): the target sits at GRPO's floor: nothing to hold" in head
    cells = _table_row(text, "grpo")
    assert cells["collapse@"] == "- (0/1)" and cells["held"] == "1/1", cells
    assert "recommended W" not in text  # no critical W either: there is no drift to cancel
    assert "critical W: none: the target sits at GRPO's floor" in text


@pytest.mark.slow
def test_a_first_order_w_from_sampled_runs_is_a_lower_bound_on_collapse(tmp_path, capsys):
    """Issue 29: on `collapse` (G = 8 sampled responses) the screen said "try stare.reweight_w ≥ 1.32", and a sweep
    then held at 1.5 only. The first-order W is labelled a lower bound ("at least", why) where the recommendation is
    said (the headline), and the note offers a W sweep from it instead of a W that suffices."""
    out = tmp_path / "collapse"
    assert simulate("--preset", "collapse", "--methods", "grpo,o1", "--seeds", "2", "--steps", "400", "--out",
                    str(out), "--no-plots") == 0
    text = capsys.readouterr().out
    crit = text.splitlines()[0].partition("; recommended W: ")[2]
    assert crit.startswith("O1 at least ") and "a lower bound: sampled rollouts" in crit
    note = next(x for x in text.splitlines() if x.startswith("note: o1 did not hold the band"))
    assert "≥" not in note and "is only a lower bound here, not a W that suffices" in note
    assert "try a W sweep from " in note and "--sweep stare.reweight_w=" in note
    rec = json.loads((out / "summary.json").read_text())["critical_strength"]["recommended"]
    assert rec["lower_bound"].startswith("sampled rollouts")


def _rows_of(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_recommendation_is_said_once_and_auto_says_the_w_it_found(tmp_path, capsys):
    """Issue 28: the screen said the same critical-W sentence 3-4 times. The demo task with grpo, an o1 W sweep
    (1.1, 1.3) and o1-auto, seed 0: the recommendation (measured 1.3, the smallest W that held) is said once, in
    the headline; the note on o1 at W 1.1 refers to it; o1-auto's line gives the W it found — its balance W over
    the strongest stretch of the second half, 1 + the largest mean of gate·(W − 1) over 30 consecutive rows (max(5,
    300 // 10)), computed here from its rows — next to the measured 1.3."""
    out = tmp_path / "d"
    assert simulate("--preset", "demo", "--methods", "grpo,o1,o1-auto", "--seeds", "1", "--out", str(out),
                    "--no-plots", "--sweep", "stare.reweight_w=1.1,1.3") == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    rec = summary["critical_strength"]["recommended"]
    assert (rec["kind"], rec["w"], rec["low"]) == ("measured", 1.3, 1.1)
    said = "O1 1.3 (measured: range (1.1, 1.3]; o1 W sweep: grid 1.1, 1.3; 1 seeds)"
    assert text.count("recommended W:") == 1 and text.count(said) == 1 and said in lines[0]
    assert text.count("1.3 (measured") == 1  # no other line repeats it (with or without its source)
    note = next(ln for ln in lines if ln.startswith("note: o1 at W=1.1 did not hold the band"))
    assert "below the recommended W for O1 (first line)" in note and "(measured" not in note
    push = [r["gate_on"] * (r["stare_w"] - 1.0) for r in _rows_of(out / "o1-auto" / "seed0")[150:]]
    found = 1.0 + max(sum(push[i:i + 30]) / 30 for i in range(len(push) - 29))
    auto = next(ln for ln in lines if ln.startswith("o1-auto: "))
    assert auto.startswith(f"o1-auto: held 1/1 seeds; the W it found: {found:.3g} (")
    assert "from an auto run" in auto and auto.endswith("; measured critical W 1.3 (W sweep)")
    assert not any(d.name.startswith("W=") for d in (out / "o1-auto").iterdir())  # the auto schedule ran once


def test_an_auto_cap_that_binds_is_said_on_the_screen_and_in_the_summary(tmp_path, capsys):
    """o1-auto on the demo task with auto_w_max 1.35 (seed 0): W starts at the cap at the crossing and stays there
    while the schedule acquires; the summary's w_cap_share is the share of the rows from the first one below H_tgt
    on whose W is at 1.35 (computed here from the rows), > 0 although W is below the cap over the second half; the
    screen's o1-auto line says it with the same percentage."""
    out = tmp_path / "cap"
    assert simulate("--preset", "demo", "--methods", "grpo,o1-auto", "--seeds", "1", "--out", str(out), "--no-plots",
                    "stare.auto_w_max=1.35") == 0
    text = capsys.readouterr().out
    rows = _rows_of(out / "o1-auto" / "seed0")
    first = next(i for i, r in enumerate(rows) if r["entropy"] < 0.4)
    after = [r["stare_w"] for r in rows[first:]]
    share = sum(w >= 1.35 - 1e-9 for w in after) / len(after)
    assert 0 < share and not any(w >= 1.35 - 1e-9 for w in (r["stare_w"] for r in rows[150:]))
    run = json.loads((out / "o1-auto" / "seed0" / "summary.json").read_text())
    assert run["w_cap_share"] == pytest.approx(share) and run["balance_m"] is None  # O1 applies no M
    auto = next(ln for ln in text.splitlines() if ln.startswith("o1-auto: "))
    assert f"W at its cap auto_w_max=1.35 on {share:.0%} of the steps from the crossing on" in auto
