"""`stare-lab promote` accepts simulate's shorthand `stare.KEY=V` for `loss.stare.KEY=V` (it used to say
"unknown config key stare"); the promoted YAML carries the value given either way."""

from __future__ import annotations

import yaml

from stare_lab.cli import main as cli_main
from stare_lab.config import LossConfig, STAREConfig, expand_shorthand, to_dict
from stare_lab.runs import RunWriter

ROW = dict(step=1, entropy=1.0, reward=0.5, gate_on=1, stare_w=1.3, stare_m=0.8, pred_entropy_change=0.0,
           entropy_change=0.0)


def test_shorthand_equals_the_full_key(tmp_path, capsys):
    stare = {"variant": "C2", "reweight_w": 1.3, "reweight_m": 0.8, "target_entropy": 0.95}
    for seed in (0, 1):
        loss = to_dict(LossConfig(loss_mode="stare", stare=STAREConfig(**stare)))
        with RunWriter(tmp_path / "sw" / "c2" / f"seed{seed}",
                       {"source": "simulator", "method": "c2", "seed": seed, "band": 0.05, "loss": loss}) as w:
            w.log(ROW)
            w.write_summary({"mean_abs_dev_second_half": 0.01})
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"path": "models/Qwen2.5-Math-7B"}, "loss": {"stare": {
        "target_entropy": 0.3}}}))
    outs = []
    for i, item in enumerate(["stare.reweight_w=1.5", "loss.stare.reweight_w=1.5"]):
        out = tmp_path / f"p{i}.yaml"
        assert cli_main(["promote", str(tmp_path / "sw"), item, "--method", "c2", "--base", str(base), "--out",
                         str(out)]) == 0, capsys.readouterr().err
        outs.append(yaml.safe_load(out.read_text()))
    assert outs[0]["loss"]["stare"]["reweight_w"] == 1.5 and outs[0] == outs[1]
    assert expand_shorthand(["stare.x=1", "loss.stare.x=1", "optim.lr=2"]) == ["loss.stare.x=1", "loss.stare.x=1",
                                                                              "optim.lr=2"]
