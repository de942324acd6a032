"""`stare-lab promote` accepts simulate's shorthand `stare.KEY=V` for `loss.stare.KEY=V` (it used to say
"unknown config key stare"); the promoted YAML carries the value given either way. A source directory whose name
holds `=` (a sweep's `W=1.3`) is a source, not an override."""

from __future__ import annotations

import yaml

from stare_lab.cli import main as cli_main
from stare_lab.config import LossConfig, STAREConfig, expand_shorthand, split_paths, to_dict
from stare_lab.platform.runs import RunWriter
from stare_lab.platform.summary import run_summary, summary_settings

ROW = dict(step=1, entropy=0.96, reward=0.5, gate_on=1, stare_w=1.3, stare_m=0.8, pred_entropy_change=0.0,
           entropy_change=0.0)


def write_runs(root):
    stare = {"variant": "C2", "reweight_w": 1.3, "reweight_m": 0.8, "target_entropy": 0.95}
    for seed in (0, 1):
        loss = to_dict(LossConfig(loss_mode="stare", stare=STAREConfig(**stare)))
        with RunWriter(root / f"seed{seed}",
                       {"source": "simulator", "method": "c2", "seed": seed, "band": 0.05, "loss": loss}) as w:
            w.log(ROW)
            w.write_summary(run_summary([ROW], **summary_settings(w.config)))  # as every writer: from the rows
    base = root.parent / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"path": "models/Qwen2.5-Math-7B"}, "loss": {"stare": {
        "target_entropy": 0.3}}}))
    return base


def test_shorthand_equals_the_full_key(tmp_path, capsys):
    base = write_runs(tmp_path / "sw" / "c2")
    outs = []
    for i, item in enumerate(["stare.reweight_w=1.5", "loss.stare.reweight_w=1.5"]):
        out = tmp_path / f"p{i}.yaml"
        assert cli_main(["promote", str(tmp_path / "sw"), item, "--method", "c2", "--base", str(base), "--out",
                         str(out)]) == 0, capsys.readouterr().err
        outs.append(yaml.safe_load(out.read_text()))
    assert outs[0]["loss"]["stare"]["reweight_w"] == 1.5 and outs[0] == outs[1]
    assert expand_shorthand(["stare.x=1", "loss.stare.x=1", "optim.lr=2"]) == ["loss.stare.x=1", "loss.stare.x=1",
                                                                              "optim.lr=2"]


def test_a_source_named_like_an_override(tmp_path, capsys):
    """`sw/c2/W=1.3` exists, so it is a source; `stare.reweight_w=1.5` does not, so it is an override (before,
    both were overrides and promote said "no SWEEP_OR_RUN directory given")."""
    src = tmp_path / "sw" / "c2" / "W=1.3"
    base = write_runs(src)
    assert split_paths([str(src), "stare.reweight_w=1.5", "runs"]) == ([str(src), "runs"], ["stare.reweight_w=1.5"])
    out = tmp_path / "p.yaml"
    assert cli_main(["promote", str(src), "stare.reweight_w=1.5", "--method", "c2", "--base", str(base), "--out",
                     str(out)]) == 0, capsys.readouterr().err
    assert yaml.safe_load(out.read_text())["loss"]["stare"]["reweight_w"] == 1.5
