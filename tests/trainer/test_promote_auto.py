"""`stare-lab promote` from an auto run (issue 28): the evidence of kind "auto run" and what --schedule writes.

The source runs are written here, 20 rows each at the target entropy (so each holds the band), the gate on for
the first 5 rows of the second half (rows 10..14) at the seed's W and off after: over windows of max(5, 20 // 10)
= 5 rows the strongest stretch has mean gate·(W − 1) = W − 1, so each run's balance W over its strongest stretch is
its W; its mean balance W is 1 + 5·(W − 1)/10. Seeds at W 1.3, 1.4, 1.5 → the W the auto run found is the median,
1.4 (range 1.3–1.5).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stare_lab.config import LossConfig, STAREConfig, to_dict
from stare_lab.errors import ConfigError
from stare_lab.platform.runs import RunWriter
from stare_lab.platform.summary import run_summary, summary_settings
from trainer.config import load_trainer_config
from trainer.planning.promote import promote

TARGET = 0.5


def auto_run(path: Path, method: str, w: float, seed: int, variant: str = "O1", entropy: float = TARGET) -> Path:
    stare = STAREConfig(variant=variant, adaptive=True, schedule="auto", target_entropy=TARGET, auto_w_max=20.0)
    loss = to_dict(LossConfig(loss_mode="stare", stare=stare))
    rows = []
    for step in range(1, 21):
        gate = 1 if 11 <= step <= 15 else 0
        rows.append({"step": step, "entropy": entropy, "reward": 0.5, "gate_on": gate, "stare_w": w,
                     "stare_m": 1.0 / w, "pred_entropy_change": 0.0, "entropy_change": 0.0})
    with RunWriter(path, {"source": "simulator", "method": method, "seed": seed, "band": 0.05, "loss": loss}) as wr:
        for row in rows:
            wr.log(row)
        wr.write_summary(run_summary(rows, **summary_settings(wr.config)))
    return path


@pytest.fixture
def base(tmp_path):
    p = tmp_path / "base.yaml"
    p.write_text(yaml.safe_dump({"method": "grpo-ds", "model": {"path": "models/Qwen2.5-Math-7B"},
                                 "algorithm": {"dynamic_sampling": True},
                                 "loss": {"loss_mode": "grpo", "stare": {"target_entropy": 0.3}}}))
    return p


def sweep(root: Path, method: str = "o1-auto", variant: str = "O1", below: tuple[int, ...] = ()) -> Path:
    """Seeds 0, 1, 2 at W 1.3, 1.4, 1.5; the seeds in ``below`` sit at entropy 0.1 (they do not hold the band)."""
    for seed, w in enumerate((1.3, 1.4, 1.5)):
        auto_run(root / method / f"seed{seed}", method, w, seed, variant, 0.1 if seed in below else TARGET)
    return root


def test_the_auto_schedule_is_written_with_the_w_it_found_as_an_auto_run(tmp_path, base):
    """Default: the auto schedule (method o1-auto) with the W it found, 1.4, recorded as the source "auto run"."""
    text, prov, notices = promote([sweep(tmp_path / "s")], "o1-auto", base)
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.method == "o1-auto" and cfg.loss.stare.adaptive and cfg.loss.stare.schedule == "auto"
    assert cfg.loss.stare.auto_w_max == 20.0 and cfg.loss.stare.target_entropy == 0.3
    assert (prov["evidence_kind"], prov["schedule"]) == ("auto run", "auto")
    s = prov["strength"]
    assert (s["kind"], s["w"], s["low"], s["high"], s["lower_bound"]) == ("auto", pytest.approx(1.4), 1.3, 1.5, "")
    assert "# evidence: auto run; written: the auto schedule\n" in text
    assert "# critical W: 1.4 (auto: from an auto run: " in text
    assert "mean balance W 1.2 (range 1.15–1.25)" in s["source"]  # 1 + 5·0.4/10, from 1 + 5·0.3/10 to 1 + 5·0.5/10
    assert any("the W it found here, 1.4, is recorded, not applied" in n for n in notices)
    assert not any("lower bound" in w for w in prov["warnings"])


def test_schedule_fixed_writes_the_w_it_found_and_c2_its_m(tmp_path, base):
    """--schedule fixed: O1 → method o1, adaptive false, W 1.4; C2 → method c2, W 1.4 and M = 1/1.4 = 0.7143."""
    text, prov, _ = promote([sweep(tmp_path / "s")], "o1-auto", base, schedule="fixed")
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.method == "o1" and not cfg.loss.stare.adaptive and cfg.loss.stare.schedule == "paper"
    assert cfg.loss.stare.reweight_w == 1.4 and prov["schedule"] == "fixed"
    assert "# evidence: auto run; written: the fixed W it found\n" in text
    text, prov, _ = promote([sweep(tmp_path / "c", "c2-auto", "C2")], "c2-auto", base, schedule="fixed")
    cfg = load_trainer_config(yaml.safe_load(text))
    assert cfg.method == "c2" and cfg.loss.stare.variant == "C2" and not cfg.loss.stare.adaptive
    assert cfg.loss.stare.reweight_w == 1.4 and cfg.loss.stare.reweight_m == 0.7143
    assert prov["strength"]["m"] == pytest.approx(1 / 1.4) and prov["evidence_kind"] == "auto run"


def test_an_auto_run_that_did_not_hold_gives_at_least_and_a_warning(tmp_path, base):
    """Seed 2 (W 1.5) sits at 0.1 nats: not refused (no --force), but the W is the median of the held seeds' 1.3 and
    1.4, 1.35, and only a lower bound: the provenance, the header and a warning say "at least"."""
    text, prov, _ = promote([sweep(tmp_path / "s", below=(2,))], "o1-auto", base, schedule="fixed")
    s = prov["strength"]
    assert s["w"] == pytest.approx(1.35) and s["lower_bound"] == "the band did not hold on 1/3 seeds"
    assert load_trainer_config(yaml.safe_load(text)).loss.stare.reweight_w == 1.35
    warned = [w for w in prov["warnings"] if "only a lower bound" in w]
    assert len(warned) == 1 and warned[0].startswith("the auto run's W is only a lower bound, at least 1.35: the band "
                                                     "did not hold on 1/3 seeds")
    assert f"# WARNING: {warned[0]}" in text and "# critical W: at least 1.35 (auto: " in text
    assert not prov["forced"]


def test_schedule_needs_an_auto_method_and_excludes_a_calibration(tmp_path, base):
    src = sweep(tmp_path / "s")
    with pytest.raises(ConfigError, match=r"--schedule fixed chooses what an auto run's evidence becomes .*'o1'"):
        promote([src], "o1", base, schedule="fixed")
    with pytest.raises(ConfigError, match=r"--calibration promotes a calibrated fixed W; the evidence of --method "
                                          r"o1-auto is the W its own auto runs found"):
        promote([src], "o1-auto", base, calibration=tmp_path / "calibration.json")
    with pytest.raises(ConfigError, match=r"--schedule='sometimes' is not one of \{auto, fixed\}"):
        promote([src], "o1-auto", base, schedule="sometimes")
