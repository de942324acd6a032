"""`stare-lab promote`: simulated STARE settings → trainer config (issue 6).

Expected values come from the synthetic source runs written here (their loss.stare settings) and from the base
config (target entropy); the size guidance halves the push |W-1|, |1-M| as the paper does for 14B/32B
(1.1 → 1.05, 0.9 → 0.95; docs/theory.md §4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stare_lab.cli import main as cli_main
from stare_lab.config import LossConfig, STAREConfig, to_dict
from stare_lab.errors import ConfigError, RunError
from stare_lab.runs import RunWriter
from trainer.config import load_trainer_config
from trainer.planning.promote import PROMOTED_KEYS, promote

ROW = dict(step=0, entropy=1.0, reward=0.5, gate_on=1, stare_w=1.3, stare_m=0.8, pred_entropy_change=0.0,
           entropy_change=0.0)


def sim_run(path: Path, method: str, stare: dict | None = None, loss_mode: str = "stare", dev: float | None = 0.01,
            band: float = 0.05, seed: int = 0) -> Path:
    loss = to_dict(LossConfig(loss_mode=loss_mode, stare=STAREConfig(**(stare or {}))))
    with RunWriter(path, {"source": "simulator", "method": method, "seed": seed, "band": band, "loss": loss}) as w:
        w.log(ROW)
        summary = {"initial_entropy": 1.7, "final_entropy": 0.9}
        if dev is not None:
            summary["mean_abs_dev_second_half"] = dev
        w.write_summary(summary)
    return path


C2 = {"variant": "C2", "top_p_ratio": 0.2, "reweight_w": 1.3, "reweight_m": 0.8, "scope": "global",
      "target_entropy": 0.95}


@pytest.fixture
def sweep(tmp_path):
    for seed in (0, 1):
        sim_run(tmp_path / "sweep" / "c2" / f"seed{seed}", "c2", C2, seed=seed)
        sim_run(tmp_path / "sweep" / "grpo" / f"seed{seed}", "grpo", loss_mode="grpo", seed=seed)
    return tmp_path / "sweep"


@pytest.fixture
def base(tmp_path):
    p = tmp_path / "base.yaml"
    p.write_text(yaml.safe_dump({
        "method": "grpo-ds", "model": {"path": "models/Qwen2.5-Math-7B"},
        "algorithm": {"dynamic_sampling": True},
        "loss": {"loss_mode": "grpo", "stare": {"target_entropy": 0.3}},
        "optim": {"lr": 1e-6},
    }))
    return p


def test_round_trip_yaml(sweep, base, tmp_path):
    text, prov, notices = promote([sweep], "c2", base)
    out = tmp_path / "o.yaml"
    out.write_text(text)
    cfg = load_trainer_config(out)
    # the promoted keys equal the source runs' settings ...
    for k in PROMOTED_KEYS:
        assert getattr(cfg.loss.stare, k) == {**to_dict(STAREConfig()), **C2}[k], k
    # ... the target entropy is the base's (0.3), never the toy's 0.95
    assert cfg.loss.stare.target_entropy == 0.3
    assert cfg.loss.loss_mode == "stare" and cfg.method == "c2"
    assert cfg.optim.lr == 1e-6 and cfg.algorithm.dynamic_sampling
    assert "from base config" in notices[0]
    assert len(prov["source_runs"]) == 2 and not prov["forced"]
    assert text.startswith("# Promoted by stare-lab promote")


def test_verl_format(sweep, base):
    """Mainline verl 0.9 plus stare_lab's plugin (docs/integrations-verl.md): the v1 trainer ``stare``, the plugin's
    policy-loss config class and every STARE key under ``+actor_rollout_ref.actor.policy_loss.`` with the source
    runs' values (C2 above) and the given target; no key of the STARE fork (``actor_rollout_ref.actor.stare.*``)."""
    text, _, _ = promote([sweep], "c2", base, fmt="verl", target_entropy=0.25)
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    kv = dict(ln.split("=", 1) for ln in lines)
    assert len(kv) == len(lines)
    assert kv["trainer.use_v1"] == "True" and kv["trainer.v1.trainer_mode"] == "stare"
    assert kv["actor_rollout_ref.actor.policy_loss._target_"] == "stare_lab.integrations.verl.STAREPolicyLossConfig"
    assert kv["actor_rollout_ref.actor.policy_loss.loss_mode"] == "stare"
    pl = "+actor_rollout_ref.actor.policy_loss."
    assert kv[pl + "variant"] == "C2" and kv[pl + "scope"] == "global" and kv[pl + "gate"] == "entropy"
    assert float(kv[pl + "top_p_ratio"]) == 0.2
    assert float(kv[pl + "reweight_w"]) == 1.3
    assert float(kv[pl + "reweight_m"]) == 0.8
    assert float(kv[pl + "target_entropy"]) == 0.25
    assert kv[pl + "adaptive"] == "False"
    assert not any(".actor.stare." in k for k in kv)
    assert all(k.startswith(("actor_rollout_ref.actor.", "+actor_rollout_ref.actor.", "trainer.")) for k in kv)


def test_verl_format_names_the_overrides_it_cannot_carry(sweep, base):
    """optim.lr has no verl line: it must be named in a warning (header and provenance), not dropped silently;
    a loss key it does carry is written and not warned about."""
    text, prov, _ = promote([sweep], "c2", base, fmt="verl", target_entropy=0.25,
                            overrides=["optim.lr=2e-6", "loss.clip_ratio_high=0.3"])
    warned = [w for w in prov["warnings"] if "not carried" in w]
    assert len(warned) == 1 and "optim.lr" in warned[0] and "clip_ratio_high" not in warned[0]
    assert f"# WARNING: {warned[0]}" in text
    assert "actor_rollout_ref.actor.clip_ratio_high=0.3" in text.splitlines()
    _, prov2, _ = promote([sweep], "c2", base, target_entropy=0.25, overrides=["optim.lr=2e-6"])
    assert not [w for w in prov2["warnings"] if "not carried" in w]  # the YAML carries every key


def test_size_guidance_and_user_override(sweep, base, tmp_path):
    data = yaml.safe_load(base.read_text())
    data["model"]["path"] = "models/Qwen2.5-32B-Base"
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(data))
    text, _, notices = promote([sweep], "c2", big)
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.loss.stare.reweight_w == pytest.approx(1.15) and cfg.loss.stare.reweight_m == pytest.approx(0.9)
    assert any("32B" in n for n in notices)
    text, _, notices = promote([sweep], "c2", big, overrides=["loss.stare.reweight_w=1.2"])
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.loss.stare.reweight_w == 1.2 and cfg.loss.stare.reweight_m == 0.8  # user override: no guidance
    assert not any("size guidance" in n for n in notices)


def test_target_entropy_from_probe(sweep, base, tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"initial_entropy": 0.6}))
    text, prov, notices = promote([sweep], "c2", base, target_entropy_frac=0.5, probe=probe)
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.target_entropy == pytest.approx(0.3)
    assert "probe" in prov["target_entropy"]["from"]
    with pytest.raises(ConfigError, match="needs --probe"):
        promote([sweep], "c2", base, target_entropy_frac=0.5)
    with pytest.raises(ConfigError, match="at most one"):
        promote([sweep], "c2", base, target_entropy=0.2, target_entropy_frac=0.5, probe=probe)


def test_errors(sweep, base, tmp_path):
    with pytest.raises(RunError, match="does not exist"):
        promote([tmp_path / "nope"], "c2", base)
    with pytest.raises(RunError, match="methods found: c2, grpo"):
        promote([sweep], "o1", base)
    with pytest.raises(ConfigError, match="no STARE settings"):
        promote([sweep], "grpo", base)
    with pytest.raises(ConfigError, match="not one of"):
        promote([sweep], "c2", base, fmt="json")
    # ambiguous: a second c2 setting in the same sweep
    sim_run(sweep / "c2-other" / "seed0", "c2", {**C2, "reweight_w": 1.5})
    with pytest.raises(ConfigError, match="ambiguous"):
        promote([sweep], "c2", base)
    # one run directory is not ambiguous
    text, _, _ = promote([sweep / "c2-other" / "seed0"], "c2", base)
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 1.5


def test_band_failure_refused_unless_forced(tmp_path, base):
    run = sim_run(tmp_path / "r", "o1", {"reweight_w": 1.1}, dev=0.3)
    with pytest.raises(ConfigError, match="failed its band criterion"):
        promote([run], "o1", base)
    text, prov, notices = promote([run], "o1", base, force=True)
    assert prov["forced"] and "FORCED" in text
    incomplete = sim_run(tmp_path / "r2", "o1", dev=None)
    with pytest.raises(ConfigError, match="no band result"):
        promote([incomplete], "o1", base)


def test_cli(sweep, base, tmp_path, capsys):
    out = tmp_path / "o.yaml"
    rc = cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(out), "optim.lr=3e-6"])
    assert rc == 0 and load_trainer_config(out).optim.lr == 3e-6
    assert json.loads((tmp_path / "o.yaml.provenance.json").read_text())["method"] == "c2"
    rc = cli_main(["promote", str(sweep), "--method", "grpo", "--base", str(base), "--out", str(tmp_path / "g.yaml")])
    assert rc == 1 and "no STARE settings" in capsys.readouterr().err
    rc = cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(tmp_path / "no" / "x")])
    assert rc == 1


def test_cli_never_replaces_an_existing_out_without_overwrite(sweep, base, tmp_path, capsys):
    """Review item 15: an existing --out is refused (one line, exit 1, file untouched) unless --overwrite."""
    out = tmp_path / "o.yaml"
    out.write_text("precious\n")
    args = ["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(out)]
    assert cli_main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab promote: error: --out={str(out)!r} already exists; pass --overwrite to replace it"]
    assert out.read_text() == "precious\n"
    assert cli_main(args + ["--overwrite"]) == 0
    assert load_trainer_config(out).method == "c2"
    assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("h0", [-1.5, 0.0, float("nan")])
def test_probe_with_non_positive_entropy_names_the_probe(sweep, base, tmp_path, h0):
    """Review item 16: entropy is >= 0 (nats), so a probe reporting -1.5 (or 0, NaN) is a bad probe; the error names
    the probe and its value instead of the derived loss.stare.target_entropy=-0.75."""
    from stare_lab.errors import DataError

    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"initial_entropy": h0}))
    with pytest.raises(DataError, match=r"--probe .*probe\.json.* initial entropy of (-1\.5|0|nan) nats"):
        promote([sweep], "c2", base, target_entropy_frac=0.5, probe=probe)


def test_promote_help_has_a_description(capsys):
    """Review item 22: `stare-lab promote --help` starts with a description of what the command does."""
    with pytest.raises(SystemExit):
        cli_main(["promote", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "Carry the STARE settings" in out and "target entropy is never copied" in out


def test_no_warnings_for_a_mild_push_over_several_seeds(sweep, base):
    """The fixture's c2 runs (seeds 0, 1) push W 1.3 / M 0.8 against the base's STAREConfig defaults 1.1 / 0.9:
    W-1 = 0.3 is exactly 3x 0.1 (not more) and 1-M = 0.2 is 2x 0.1 → no warning."""
    text, prov, _ = promote([sweep], "c2", base)
    assert prov["warnings"] == [] and "WARNING" not in text


def test_strong_push_from_a_single_seed_is_warned(tmp_path, base, capsys):
    """Fresh-user review item 5: a toy run's W 5 / M 0.2 against a 7B base with W 1.1 / M 0.9 → W-1 = 4 is 40x the
    base's 0.1 and 1-M = 0.8 is 8x its 0.1 (both > 3x), and the source is one seed: three warnings, in the
    provenance, the header and (CLI) on stderr; the promoted values themselves are unchanged."""
    data = yaml.safe_load(base.read_text())
    data["loss"]["stare"].update(reweight_w=1.1, reweight_m=0.9)
    b7 = tmp_path / "b7.yaml"
    b7.write_text(yaml.safe_dump(data))
    run = sim_run(tmp_path / "toy" / "c2" / "seed0", "c2", {**C2, "reweight_w": 5.0, "reweight_m": 0.2})
    text, prov, _ = promote([run], "c2", b7)
    w, m, seed = prov["warnings"]
    assert w.startswith("promoted W=5 (W-1=4) is 40x the base config's W-1=0.1 (W=1.1;")
    assert m.startswith("promoted M=0.2 (1-M=0.8) is 8x the base config's 1-M=0.1 (M=0.9;")
    assert seed.startswith("the promoted settings come from a single seed (seed 0, 1 run(s))")
    assert text.count("# WARNING: ") == 3
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.loss.stare.reweight_w == 5.0 and cfg.loss.stare.reweight_m == 0.2
    # just above the factor: W 1.31 → W-1 = 0.31 = 3.1x 0.1; a user-set W is not warned about (only M is)
    run2 = sim_run(tmp_path / "toy2" / "c2" / "seed0", "c2", {**C2, "reweight_w": 1.31, "reweight_m": 0.9})
    assert promote([run2], "c2", b7)[1]["warnings"][0].startswith("promoted W=1.31 (W-1=0.31) is 3.1x")
    _, prov, _ = promote([run], "c2", b7, overrides=["loss.stare.reweight_w=1.2"])
    assert len(prov["warnings"]) == 2 and prov["warnings"][0].startswith("promoted M=0.2 ")
    assert prov["warnings"][1].startswith("the promoted settings come from a single seed")
    out = tmp_path / "c2.yaml"
    assert cli_main(["promote", str(run), "--method", "c2", "--base", str(b7), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("warning: ") == 3 and "warning" not in captured.out
    assert len(json.loads((tmp_path / "c2.yaml.provenance.json").read_text())["warnings"]) == 3
