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
from stare_lab.platform.runs import RunWriter
from stare_lab.platform.summary import run_summary, summary_settings
from trainer.config import load_trainer_config
from trainer.planning.promote import PROMOTED_KEYS, promote

ROW = dict(step=0, entropy=1.0, reward=0.5, gate_on=1, stare_w=1.3, stare_m=0.8, pred_entropy_change=0.0,
           entropy_change=0.0)


def sim_run(path: Path, method: str, stare: dict | None = None, loss_mode: str = "stare", dev: float | None = 0.01,
            band: float = 0.05, seed: int = 0) -> Path:
    """A finished run of two rows at entropy H_tgt + ``dev`` (so its mean |H - H_tgt| is ``dev``; ``dev`` None: no
    entropy logged), with the summary.json its writer would write (recomputed from the rows, as every source
    does: docs/design.md §4)."""
    loss = to_dict(LossConfig(loss_mode=loss_mode, stare=STAREConfig(**(stare or {}))))
    h = None if dev is None else loss["stare"]["target_entropy"] + dev
    rows = [{**ROW, "step": step, "entropy": h} for step in (1, 2)]
    with RunWriter(path, {"source": "simulator", "method": method, "seed": seed, "band": band, "loss": loss}) as w:
        for row in rows:
            w.log(row)
        w.write_summary(run_summary(rows, **summary_settings(w.config)))
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
    incomplete = sim_run(tmp_path / "r2", "o1", dev=None)  # no entropy: not sound evidence
    with pytest.raises(RunError, match="not measurable"):
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
    # O1 does not use M: an M 0.2 in its runs' config (a sweep's shared stare.reweight_m) is not warned about
    o1 = sim_run(tmp_path / "toy3" / "o1" / "seed0", "o1", {**C2, "variant": "O1", "reweight_w": 1.2,
                                                             "reweight_m": 0.2})
    assert not [w for w in promote([o1], "o1", b7)[1]["warnings"] if w.startswith("promoted M=")]


def d_run(path: Path, method: str, d_grpo: float, d_lplus: float, *, source: str = "simulator",
          mode: str | None = "expected", stare: dict | None = None, h_opt: float | None = 0.693,
          seed: int = 0) -> Path:
    """A run whose entropy falls 1.0, 0.8, 0.6, 0.35, 0.3 (first below H_tgt 0.4 at the 4th row) with the same D terms
    on every row, so D_L+/|D_GRPO| anywhere is d_lplus/|d_grpo|; a STARE run (``stare`` given) then holds 0.4 for
    five more rows (its second half is in the band), with the summary its writer would write."""
    loss = to_dict(LossConfig(loss_mode="stare" if stare is not None else "grpo",
                              stare=STAREConfig(**{"target_entropy": 0.4, **(stare or {})})))
    cfg = {"source": source, "method": method, "seed": seed, "band": 0.05, "loss": loss}
    if mode is not None:
        cfg["mode"] = mode
    if h_opt is not None:
        cfg["reward_optimal_entropy"] = h_opt
    entropies = (1.0, 0.8, 0.6, 0.35, 0.3) + ((0.4,) * 5 if stare is not None else ())
    rows = [{**ROW, "step": i, "entropy": h, "pred/d_grpo": d_grpo, "pred/d_lplus": d_lplus}
            for i, h in enumerate(entropies)]
    with RunWriter(path, cfg) as w:
        for row in rows:
            w.log(row)
        w.write_summary(run_summary(rows, **summary_settings(w.config)))
    return path


def test_regime_mismatch_is_warned_with_the_numbers(tmp_path, base):
    """Source: a mean-field toy (mode=expected) with D_GRPO = −0.05, D_L+ = 0.1 → D_L+/|D_GRPO| = 2 at its crossing,
    H_tgt 0.4 = 0.577 × its reward-optimal ln 2. Target: a trainer probe of the model with D_GRPO = −0.01, D_L+ = 0.2
    → 20 (10x apart, more than the factor 2) and sampled. Two regime warnings with both numbers; without a
    calibration promote proposes calibrating to the probe. A probe at 3 (1.5x from 2) raises no D warning."""
    src = d_run(tmp_path / "toy" / "o1" / "seed0", "o1", -0.05, 0.1, stare={"reweight_w": 1.3})
    d_run(tmp_path / "toy" / "o1" / "seed1", "o1", -0.05, 0.1, stare={"reweight_w": 1.3}, seed=1)
    probe = d_run(tmp_path / "probe", "grpo", -0.01, 0.2, source="trainer", mode=None, h_opt=None)
    text, prov, notices = promote([src.parent], "o1", base, probe=probe)
    d_warn, mode_warn = prov["warnings"]
    assert d_warn.startswith("regime: D_L+/|D_GRPO| is 2 in the source runs (at their H_tgt crossing) at H 0.35 nats "
                             f"and 20 in the target model's probe ({probe}) at H 0.61 nats")
    assert "mode=expected" in mode_warn and "sampling noise raises the critical W" in mode_warn
    assert f"# WARNING: {d_warn}" in text
    assert prov["regime"]["source"]["target_over_optimal"] == pytest.approx(0.4 / 0.693)
    assert any("the probe measured D_L+/|D_GRPO| = 20 on the target model" in n and "stare-lab calibrate" in n
               for n in notices)
    near = d_run(tmp_path / "probe3", "grpo", -0.01, 0.03, source="trainer", mode=None, h_opt=None)
    _, prov, _ = promote([src.parent], "o1", base, probe=near)
    assert [w for w in prov["warnings"] if "D_L+" in w] == []


def calibration(path: Path, **critical) -> Path:
    """A calibration.json of the schema stare-lab calibrate writes (stare_lab.theory.regime)."""
    data = {"kind": "calibrated",
            "probe": {"run": "runs/smol-probe", "source": "trainer", "model": "SmolLM2-135M", "steps": [1, 2, 3],
                      "entropy": 2.0, "d_ratio": 20.0, "lplus_above_sstar": 0.8, "target_entropy": None},
            "knobs": {"coupling": 0.1}, "preset": {"name": "llm", "overrides": {}},
            "fit": {"d_ratio": 18.0, "lplus_above_sstar": 0.78, "residual": 0.05},
            "critical": {"o1": {"w": 1.12, "low": 1.08, "high": 1.2},
                         "c2": {"w": 1.08, "m": 0.92, "low": 1.05, "high": 1.12}, "adaptive": {"w_max": 1.25},
                         **critical},
            "regime": {"d_ratio": 18.0, "target_over_optimal": 0.6, "mode": "sampled"}}
    path.write_text(json.dumps(data))
    return path


def test_calibrated_w_is_promoted_with_its_kind(sweep, base, tmp_path):
    """calibration.json: O1 1.12 (1.08–1.2), C2 1.08 at M 0.92. Promoting c2 takes W 1.08 and M 0.92 from it (the
    runs' 1.3 / 0.8 are not used), records kind 'calibrated' in the provenance, and the calibrated toy's regime
    (D ratio 18, sampled) matches its probe's (20): no regime warning. A calibration in a source folder is found
    without --calibration."""
    cal = calibration(tmp_path / "calibration.json")
    text, prov, notices = promote([sweep], "c2", base, calibration=cal)
    cfg = load_trainer_config(yaml.safe_load(text))
    assert (cfg.loss.stare.reweight_w, cfg.loss.stare.reweight_m) == (1.08, 0.92)
    assert cfg.loss.stare.top_p_ratio == 0.2  # the other settings still come from the source runs
    assert prov["strength"]["kind"] == "calibrated" and prov["strength"]["m"] == 0.92
    assert prov["calibration"] == str(cal) and not [w for w in prov["warnings"] if w.startswith("regime")]
    assert "# critical W: 1.08 at M=0.92 (calibrated: " in text
    assert any(n.startswith("W/M calibrated to the target model's probe (SmolLM2-135M): 1.08 at M=0.92")
               for n in notices)
    calibration(sweep / "calibration.json")
    _, prov, _ = promote([sweep], "c2", base)
    assert prov["strength"]["kind"] == "calibrated"


def test_a_calibration_to_a_toy_probe_is_not_called_the_target_model(sweep, tmp_path):
    """Fresh-user promote item: a calibration whose probe is a simulator run (a toy) is named as such, and its W 3
    (W-1 = 2, 20x the base's 0.1) is warned about like any promoted push; a trainer probe of another model than the
    base's is warned about by name."""
    b7 = tmp_path / "b7.yaml"
    b7.write_text(yaml.safe_dump({"model": {"path": "models/Qwen2.5-Math-7B"},
                                  "loss": {"stare": {"reweight_w": 1.1, "reweight_m": 0.9, "target_entropy": 0.3}}}))
    cal = calibration(tmp_path / "calibration.json", c2={"w": 3.0, "m": 0.9, "low": 1.5, "high": 3.0})
    data = json.loads(cal.read_text())
    data["probe"].update(source="simulator", model="tabular llm")
    cal.write_text(json.dumps(data))
    _, prov, notices = promote([sweep], "c2", b7, calibration=cal)
    assert any(n.startswith("W/M calibrated to a simulator probe (tabular llm), not a model the trainer ran: evidence "
                            "about that toy, not the target model: 3 ") for n in notices), notices
    assert [w for w in prov["warnings"] if w.startswith("promoted W=3 (W-1=2) is 20x the base config's W-1=0.1")]
    data["probe"].update(source="trainer", model="models/smollm2-135m-instruct/")
    cal.write_text(json.dumps(data))
    _, prov, notices = promote([sweep], "c2", b7, calibration=cal)
    assert ("the calibration's probe is of 'models/smollm2-135m-instruct/', the base config trains "
            "'models/Qwen2.5-Math-7B': its W is evidence about the probed model; probe the target model and calibrate "
            "again") in prov["warnings"]
    assert not [w for w in prov["warnings"] if w.startswith("promoted W=3")]  # a model's calibration: not warned


def test_a_calibration_folder_counts_with_its_sweep_runs(tmp_path, base):
    """Fresh-user item: promoting the folder `stare-lab calibrate` wrote listed every fit run (toys that lost the
    fit) as a source run; only the sweep's runs are the calibrated toy's."""
    cal = tmp_path / "cal"
    sim_run(cal / "fit" / "reward_coupling=0.8" / "seed0", "c2", C2)
    for seed in (0, 1):
        sim_run(cal / "sweep" / "c2" / f"seed{seed}", "c2", C2, seed=seed)
    calibration(cal / "calibration.json")
    _, prov, _ = promote([cal], "c2", base)
    assert prov["strength"]["kind"] == "calibrated"
    assert sorted(Path(r["path"]).relative_to(cal).as_posix() for r in prov["source_runs"]) == [
        "sweep/c2/seed0", "sweep/c2/seed1"]


def test_calibration_gives_o1_w_and_the_adaptive_cap(tmp_path, base):
    """o1-adaptive from a calibration: W 1.12 and w_max 1.25 (critical.adaptive.w_max); a calibrated toy whose
    D ratio (4) is 5x below its probe's (20) is warned about; a calibration without a finite W is refused."""
    run = sim_run(tmp_path / "toy" / "o1-adaptive" / "seed0", "o1-adaptive", {"adaptive": True, "w_max": 1.5})
    sim_run(tmp_path / "toy" / "o1-adaptive" / "seed1", "o1-adaptive", {"adaptive": True, "w_max": 1.5}, seed=1)
    cal = calibration(tmp_path / "cal.json")
    data = json.loads(cal.read_text())
    data["regime"]["d_ratio"] = 4.0
    cal.write_text(json.dumps(data))
    text, prov, _ = promote([run.parent], "o1-adaptive", base, calibration=cal)
    cfg = load_trainer_config(yaml.safe_load(text))
    assert (cfg.loss.stare.reweight_w, cfg.loss.stare.w_max) == (1.12, 1.25)
    (warn,) = [w for w in prov["warnings"] if w.startswith("regime")]
    assert "D_L+/|D_GRPO| is 4 in the calibrated toy" in warn and "and 20 in the target model's probe" in warn
    data["critical"] = {"o1": {"w": None}}
    cal.write_text(json.dumps(data))
    from stare_lab.errors import DataError

    with pytest.raises(DataError, match="no critical W"):
        promote([run.parent], "o1-adaptive", base, calibration=cal)


def test_measured_w_comes_from_a_w_sweep(tmp_path, base):
    """A W sweep (summary.json with critical.o1): W 1.1 failed its band on both seeds, 1.3 held → measured 1.3. The
    runs at 1.3 are promoted (W 1.3, kind 'measured', range (1.1, 1.3]); the failed 1.1 runs are not refused (they
    are not promoted). A sweep where no grid W held is refused, naming the largest W tried."""
    sw = tmp_path / "sw"
    for w, dev in ((1.1, 0.1), (1.3, 0.01)):
        for seed in (0, 1):
            sim_run(sw / "o1" / f"W={w:g}" / f"seed{seed}", "o1", {"reweight_w": w}, dev=dev, seed=seed)
    measured = {"kind": "measured", "w": 1.3, "m": None, "low": 1.1, "high": 1.3, "source": "o1 W sweep"}
    (sw / "summary.json").write_text(json.dumps({"methods": {}, "critical": {"o1": {
        "measured_w": 1.3, "slice": {}, "strengths": [measured]}}}))
    text, prov, _ = promote([sw], "o1", base)
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 1.3
    assert prov["strength"]["kind"] == "measured" and prov["strength"]["low"] == 1.1
    assert len(prov["source_runs"]) == 2 and all("W=1.3" in r["path"] for r in prov["source_runs"])
    (sw / "summary.json").write_text(json.dumps({"methods": {}, "critical": {"o1": {
        "measured_w": None, "slice": {}, "strengths": [{**measured, "w": None, "low": 1.3, "high": None}]}}}))
    with pytest.raises(ConfigError, match=r"found no grid W that held .* largest tried: 1.3"):
        promote([sw], "o1", base)


def _w_sweep(tmp_path: Path) -> Path:
    """An O1 W sweep whose measured critical W is 1.3 (the runs at 1.3 held on seeds 0 and 1)."""
    sw = tmp_path / "sw"
    for seed in (0, 1):
        sim_run(sw / "o1" / "W=1.3" / f"seed{seed}", "o1", {"reweight_w": 1.3}, seed=seed)
    (sw / "summary.json").write_text(json.dumps({"methods": {}, "critical": {"o1": {"measured_w": 1.3, "slice": {},
        "strengths": [{"kind": "measured", "w": 1.3, "m": None, "low": 1.1, "high": 1.3, "source": "o1 W sweep"}]}}}))
    return sw


def test_command_line_w_wins_over_the_evidence_and_is_warned(tmp_path, capsys):
    """Fresh-user promote item 1: `stare.reweight_w=7` over a W sweep measuring 1.3, base W 1.1 / M 0.9. The written
    W is 7; the header says the override wins over the evidence's W 1.3 (measured); W-1 = 6 is 60x the base's 0.1
    (> 3x): warned as a command-line value; the provenance keeps the override and names both values."""
    b7 = tmp_path / "b7.yaml"
    b7.write_text(yaml.safe_dump({"model": {"path": "models/Qwen2.5-Math-7B"},
                                  "loss": {"stare": {"reweight_w": 1.1, "reweight_m": 0.9, "target_entropy": 0.3}}}))
    out, sw = tmp_path / "o1.yaml", _w_sweep(tmp_path)
    assert cli_main(["promote", str(sw), "--method", "o1", "--base", str(b7), "--out", str(out),
                     "stare.reweight_w=7"]) == 0
    text, captured = out.read_text(), capsys.readouterr()
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 7.0
    note = ("override: W=7 from the command line (loss.stare.reweight_w) wins over the evidence, which recommends "
            "W=1.3 (the measured critical W); the written config has W=7")
    assert f"# note: {note}\n" in text and f"notice: {note}" in captured.out
    (warn,) = [w for w in captured.err.splitlines() if "W-1" in w]
    assert warn.startswith("warning: command-line W=7 (W-1=6) is 60x the base config's W-1=0.1 (W=1.1;")
    assert f"# WARNING: {warn[len('warning: '):]}" in text
    prov = json.loads((tmp_path / "o1.yaml.provenance.json").read_text())
    assert prov["overrides"] == ["loss.stare.reweight_w=7"]
    assert prov["overridden"] == {"reweight_w": {"value": 7.0, "evidence": 1.3}}
    # a mild command-line W (1.2: W-1 = 2x the base's) is named as an override but not warned about
    _, prov, notices = promote([sw], "o1", b7, overrides=["loss.stare.reweight_w=1.2"])
    assert not [w for w in prov["warnings"] if "W-1" in w] and notices[0].startswith("override: W=1.2 ")
    # ... but 1.2 is below the measured critical W 1.3 (a weaker push than the least that held): warned; 7 is not
    assert ("W=1.2 from the command line is a weaker push than the evidence's W=1.3, the least that held the band "
            "there: expect the entropy to fall below the target") in prov["warnings"]
    assert not [w for w in json.loads((tmp_path / "o1.yaml.provenance.json").read_text())["warnings"]
                if "weaker push" in w]


def test_empty_base_is_refused(sweep, tmp_path):
    """Fresh-user promote item 2: an empty base YAML (or comments only) is a one-line ConfigError, not the
    defaults."""
    for i, content in enumerate(["", "# nothing here\n"]):
        empty = tmp_path / f"empty{i}.yaml"
        empty.write_text(content)
        with pytest.raises(ConfigError, match=r"^--base .*empty\d\.yaml.*: the base config file is empty"):
            promote([sweep], "c2", empty)


def test_out_with_a_trailing_slash_is_refused(sweep, base, tmp_path, monkeypatch, capsys):
    """Fresh-user promote item 3: `--out dir/` (not existing) names a directory: one line, exit 1, nothing
    written."""
    monkeypatch.chdir(tmp_path)
    assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", "dir/"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stare-lab promote: error: --out='dir/' ends with a slash: --out names the output file "
                   "(e.g. c2_7b.yaml), not a directory"]
    assert not (tmp_path / "dir").exists()


def test_out_inside_a_run_or_sweep_is_refused_even_with_overwrite(sweep, base, tmp_path, capsys):
    """Fresh-user item: `promote ... --out runs/tiny/config.yaml --overwrite` replaced a trainer run's own config
    (and `--out SWEEP/summary.json` a sweep's summary). A file inside a folder that holds a run, a sweep or an
    evaluation is refused whatever the options, and left as it was."""
    run = tmp_path / "tiny"
    run.mkdir()
    (run / "config.yaml").write_text("source: trainer\nmethod: c2\n")
    before = (run / "config.yaml").read_bytes()
    other = tmp_path / "other_sweep"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({"preset": "demo", "methods": {}}))
    for target, kind in ((run / "config.yaml", "trainer run (config.yaml)"),
                         (other / "summary.json", "simulate sweep (summary.json)")):
        snapshot = target.read_bytes()
        assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(target),
                         "--overwrite"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"which holds a {kind}" in err[0], err
        assert target.read_bytes() == snapshot
    assert (run / "config.yaml").read_bytes() == before


def test_verl_format_writes_its_provenance(sweep, base, tmp_path, capsys):
    """Fresh-user promote item 4: --format verl writes Hydra override lines (not YAML) and the provenance JSON
    beside them, as the YAML format does; a .yaml name for them gets a notice proposing .overrides."""
    out = tmp_path / "c2_7b.overrides"
    assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(out),
                     "--format", "verl"]) == 0
    lines = [ln for ln in out.read_text().splitlines() if ln and not ln.startswith("#")]
    assert "trainer.v1.trainer_mode=stare" in lines and all("=" in ln and ": " not in ln for ln in lines)
    prov = json.loads((tmp_path / "c2_7b.overrides.provenance.json").read_text())
    assert prov["format"] == "verl" and prov["method"] == "c2" and len(prov["source_runs"]) == 2
    assert "holds Hydra override" not in capsys.readouterr().out
    assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out",
                     str(tmp_path / "v.yaml"), "--format", "verl"]) == 0
    assert "notice: v.yaml holds Hydra override lines for verl, not YAML: a name such as v.overrides says so" in \
        capsys.readouterr().out


def test_runs_without_a_w_sweep_are_not_labelled_measured(sweep, base):
    """Fresh-user promote item 5: runs of one setting (W 1.3, M 0.8; both seeds held) with no W sweep and no
    calibration: W is the runs' own setting, no critical strength of any kind (not 'measured': that needs a W
    sweep), an upper bound of the critical W; with a W sweep the header keeps its measured line."""
    text, prov, _ = promote([sweep], "c2", base)
    assert prov["strength"] is None and prov["evidence"] == []
    header = [ln for ln in text.splitlines() if ln.startswith("# W: ") or ln.startswith("# critical W")]
    assert header == [f"# W: 1.3 at M=0.8, the source runs' own setting, not a critical W (no W sweep and no "
                      f"calibration under {sweep}; c2 held the band on 2/2 runs at it: an upper bound of the critical "
                      "W)"]
    assert "measured" not in text and prov["w_from"] == header[0][len("# W: "):]


def finished_run(path: Path, steps: int, seed: int = 0) -> Path:
    """An o1 run of ``steps`` rows (1 … steps) that held the band (H = H_tgt 0.3 + 0.01 throughout), its config
    asking for ``steps`` steps, with the summary.json its writer would write."""
    loss = to_dict(LossConfig(loss_mode="stare", stare=STAREConfig(reweight_w=1.3)))
    rows = [{**ROW, "step": s, "entropy": 0.31} for s in range(1, steps + 1)]
    cfg = {"source": "simulator", "method": "o1", "seed": seed, "band": 0.05, "steps": steps, "loss": loss}
    with RunWriter(path, cfg) as w:
        for row in rows:
            w.log(row)
        w.write_summary(run_summary(rows, **summary_settings(w.config)))
    return path


def test_a_run_whose_metrics_are_random_bytes_is_refused(tmp_path, base, capsys):
    """Issue 29, item 2: metrics.jsonl replaced by random bytes (its old summary.json says it held): exit 0 and a
    config "held the band on 1/1 runs" before. Now one line naming the run and why, exit 1, nothing written; with
    --force the run is left out, and with no other run there is nothing to promote."""
    import random

    run = finished_run(tmp_path / "sw" / "o1" / "seed0", 600)
    assert promote([run], "o1", base)[1]["source_runs"][0]["summary"]["held"] is True  # sound before the damage
    (run / "metrics.jsonl").write_bytes(random.Random(0).randbytes(20000))
    out = tmp_path / "o.yaml"
    args = ["promote", str(run), "--method", "o1", "--base", str(base), "--out", str(out)]
    assert cli_main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run {run}: metrics.jsonl is damaged" in err[0] and "not sound evidence" in err[0], err
    assert not out.exists()
    with pytest.raises(RunError, match="no sound run of method 'o1'"):
        promote([run], "o1", base, force=True)


def test_a_run_cut_to_301_of_600_rows_is_refused_or_left_out(tmp_path, base):
    """Issue 29, item 2: a run cut to 301 of its 600 rows (summary.json still the finished run's). Refused, naming
    the step it stopped at and the summary that does not match; with --force it is left out (recorded) and the
    other seed is promoted."""
    sw = tmp_path / "sw"
    cut = finished_run(sw / "o1" / "seed0", 600)
    finished_run(sw / "o1" / "seed1", 600, seed=1)
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text("".join(lines[:301]))
    with pytest.raises(RunError, match=r"run .*seed0: stopped at step 301 of 600; summary.json does not match its "
                                       r"metrics.jsonl: steps 600 there, 301 from the rows"):
        promote([sw], "o1", base)
    text, prov, notices = promote([sw], "o1", base, force=True)
    assert [Path(r["path"]).name for r in prov["source_runs"]] == ["seed1"]
    assert prov["forced"] and len(prov["left_out"]) == 1 and "stopped at step 301 of 600" in prov["left_out"][0]
    assert any(n.startswith("left out with --force, not sound evidence: run ") for n in notices)
    assert "on 1/1 runs" in prov["w_from"]


def test_a_cut_run_of_a_sweep_is_refused_against_the_sweeps_steps(tmp_path, base):
    """A run whose own config lacks `steps` is complete against what its sweep's summary.json planned for it
    (stare_lab.platform.evidence.sweep_plan): 301 of the 600 planned rows is refused."""
    sw = tmp_path / "sw"
    run = sim_run(sw / "o1" / "seed0", "o1", {"reweight_w": 1.3})  # 2 rows, no `steps` in its config
    (sw / "summary.json").write_text(json.dumps({"methods": {"o1": {"run_dirs": {"seed0": "o1/seed0"}}},
                                                 "config": {"o1/seed0": {"steps": 600}}}))
    with pytest.raises(RunError, match=rf"run {run}: stopped at step 2 of 600"):
        promote([sw], "o1", base)


def test_measured_w_wins_over_a_calibration_that_disagrees(tmp_path, base):
    """Issue 29, item 3: a W sweep measured 1.3 (W 1.1 held on 0 of 3 seeds: range (1.1, 1.3]) and a calibration
    gives 1.05 with a poor fit (residual 0.74 > 0.5): 1.05 lies outside the measured range, so the two disagree and
    the measured W is written; the header says so with both numbers and the residual. A calibrated W inside the
    range (1.2) agrees with the sweep and is promoted as before."""
    sw = _w_sweep(tmp_path)
    cal = calibration(tmp_path / "cal.json", o1={"w": 1.05, "low": 1.0, "high": 1.05})
    data = json.loads(cal.read_text())
    data["fit"]["residual"] = 0.74
    cal.write_text(json.dumps(data))
    text, prov, _ = promote([sw], "o1", base, calibration=cal)
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 1.3
    assert prov["strength"]["kind"] == "measured"
    (warn,) = [w for w in prov["warnings"] if "disagree" in w]
    assert "measured a critical W of 1.3 (range (1.1, 1.3]" in warn and "gives 1.05" in warn
    assert "residual 0.74 > 0.5" in warn and "the measured W 1.3 is promoted" in warn
    assert f"# WARNING: {warn}" in text
    assert prov["evidence_conflict"]["residual"] == 0.74 and prov["evidence_conflict"]["poor_fit"] is True
    inside = calibration(tmp_path / "cal2.json", o1={"w": 1.2, "low": 1.1, "high": 1.2})
    text, prov, _ = promote([sw], "o1", base, calibration=inside)
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 1.2
    assert prov["strength"]["kind"] == "calibrated" and prov["evidence_conflict"] is None


def test_promote_into_a_folder_it_cannot_write_is_one_line(sweep, base, tmp_path, monkeypatch, capsys):
    """Issue 29, item 7: --out in a read-only folder printed a 16-line traceback. The write fails as a read-only
    folder makes it fail for a user (EACCES; monkeypatched, as root may write anywhere): one line naming the file,
    exit 1, no file left behind."""
    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", denied)
    out = tmp_path / "o.yaml"
    assert cli_main(["promote", str(sweep), "--method", "c2", "--base", str(base), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab promote: error: cannot write {str(out)!r}: Permission denied"]
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "sweep"]


def test_an_unreadable_sweep_summary_is_named(tmp_path, base):
    """A W sweep whose summary.json is not JSON was taken for "no sweep" (its runs then looked ambiguous); the file
    is named."""
    sw = _w_sweep(tmp_path)
    (sw / "summary.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(RunError, match=r"summary\.json"):
        promote([sw], "o1", base)
