"""Trainer config errors a new user hits: a group of one response, a method label that does not match the loss
config. Each is tried through the front door with its one-line message (exit code 1)."""

from __future__ import annotations

import pytest

from stare_lab.cli import main
from stare_lab.errors import ConfigError
from trainer.config import derive_method, load_trainer_config


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_group_of_one_is_refused(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  n: 1\n")
    assert main(["train", str(cfg)]) == 1
    assert _one_line(capsys) == ("stare-lab train: error: rollout.n=1 is below 2: group-relative advantages need at "
                                 "least 2 responses per prompt (a group of one gets advantage 0 and no gradient)")
    assert load_trainer_config(None, ["rollout.n=2"]).rollout.n == 2


def test_a_mistyped_method_label_is_refused(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("method: o2\nloss:\n  loss_mode: stare\n  stare: {variant: C2}\n")
    assert main(["train", str(cfg)]) == 1
    assert _one_line(capsys) == (
        "stare-lab train: error: method='o2' is not a known method (grpo, grpo-ds, o1, c2, o1-adaptive, o1-auto, "
        "c2-auto, clip_cov, "
        "kl_cov, entropy_bonus, forking_tokens); the loss settings amount to 'c2': omit method to use that, or write "
        "custom:NAME for a setup of your own")
    # a known label that contradicts the loss config: named with the key to change
    cfg.write_text("method: o1\nloss:\n  loss_mode: stare\n  stare: {variant: C2}\n")
    assert main(["train", str(cfg)]) == 1
    assert _one_line(capsys) == "stare-lab train: error: method='o1' needs loss.stare.variant='O1', got 'C2'"


@pytest.mark.parametrize("overrides, label", [
    ([], "grpo"),
    (["algorithm.dynamic_sampling=true"], "grpo-ds"),
    (["loss.entropy_coeff=0.01"], "entropy_bonus"),
    (["loss.loss_mode=stare"], "o1"),
    (["loss.loss_mode=stare", "loss.stare.adaptive=true"], "o1-adaptive"),
    (["loss.loss_mode=stare", "loss.stare.variant=C2", "algorithm.dynamic_sampling=true"], "c2"),
    (["loss.loss_mode=clip_cov"], "clip_cov"),
    (["loss.loss_mode=forking_tokens"], "forking_tokens"),
])
def test_an_omitted_label_is_derived_from_the_loss_config(overrides, label):
    cfg = load_trainer_config(None, overrides)
    assert cfg.method == label and cfg.to_dict()["method"] == label  # what config.yaml records
    assert derive_method(cfg.loss, cfg.algorithm.dynamic_sampling) == label


def test_custom_labels_are_explicit():
    assert load_trainer_config(None, ["method=custom:my-ablation"]).method == "custom:my-ablation"
    with pytest.raises(ConfigError, match="not a known method"):
        load_trainer_config(None, ["method=my-ablation"])


def test_a_probe_into_a_run_directory_that_holds_a_run_is_refused(tmp_path, capsys, tiny_model):
    """``train --probe`` (schedule.probe_only) writes a run directory of its own: into one that already holds a run
    it stops before building anything, with one line naming the directory and what to do instead."""
    from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {tiny_model}}}\n"
                   f"data: {{train_files: [{GSM8K_TRAIN_SAMPLE}], max_prompt_length: 256}}\n"
                   f"rollout: {{max_response_length: 32}}\nout_dir: {out}\n")
    assert main(["train", str(cfg), "--probe"]) == 1
    assert _one_line(capsys) == (  # the one --out policy of every command (stare_lab.platform.outdir)
        f"stare-lab train: error: --out {str(out)!r} already holds a run (metrics.jsonl); pass --resume to continue "
        "it or --overwrite to replace it, or choose another --out")
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched


def test_an_unknown_probe_tangent_is_refused(tmp_path, capsys):
    """schedule.probe_tangent takes auto, graph or jvp (trainer.config.ScheduleConfig): anything else is one line."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("schedule:\n  probe_tangent: forward\n")
    assert main(["train", str(cfg)]) == 1
    err = _one_line(capsys)
    assert err == "stare-lab train: error: schedule.probe_tangent='forward' is not one of {'auto', 'graph', 'jvp'}"
    assert load_trainer_config(None, ["schedule.probe_tangent=graph"]).schedule.probe_tangent == "graph"


def test_a_missing_trainer_dependency_is_one_line(tmp_path, capsys, monkeypatch):
    """Fresh-user item: `stare-lab train` in the lean demo install printed a 14-line traceback ending in
    ModuleNotFoundError: tokenizers. A missing third-party module is one line naming it and the install; a missing
    module of this project stays a bug (it is raised)."""
    import trainer.cli as tcli

    def missing(name):
        def run(args):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return run

    monkeypatch.setattr(tcli, "_run_train", missing("tokenizers"))
    assert main(["train", str(tmp_path / "c.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stare-lab train: error: stare-lab train needs the trainer's dependencies, and 'tokenizers' "
                   "cannot be imported: `make install`, or pip install -e '.[trainer]'"], err
    monkeypatch.setattr(tcli, "_run_train", missing("trainer.nothing"))
    with pytest.raises(ModuleNotFoundError):
        tcli._train_entry(None)
