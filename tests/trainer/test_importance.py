"""Importance correction (trainer.step.importance, the loss-side TIS options of stare_lab.loss.losses): missing or bad engine
log-probs are errors, every logged ratio is finite, TIS with a filtered sampling support is refused, and the
token / sequence / mask variants give the hand-computed weights."""

from __future__ import annotations

import math

import pytest
import torch

from stare_lab.errors import ConfigError, DataError
from stare_lab.loss.losses import LOG_RATIO_CLAMP, PolicyLossInputs, compute_policy_loss
from trainer.config import load_trainer_config
from trainer.step.importance import check_importance_config, engine_logprobs, rollout_diagnostics
from trainer.engines.rollout import RolloutOutput


def _out(lps, n=3):
    return RolloutOutput(prompt_index=0, prompt_token_ids=[1], token_ids=list(range(n)), logprobs=lps, text="",
                         finish_reason="stop")


def test_missing_engine_logprobs_is_an_error():
    with pytest.raises(DataError, match="step 2, group 0, sample 1: the rollout engine returned no log-probs"):
        engine_logprobs(_out(None), "step 2, group 0, sample 1")
    with pytest.raises(DataError, match="returned 2 log-probs for 3 response tokens"):
        engine_logprobs(_out([-1.0, -1.0]), "x")
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(DataError, match="token 1"):
            engine_logprobs(_out([-1.0, bad, -2.0]), "x")
    lp = engine_logprobs(_out([-1, -2, -3]), "x")
    assert lp.dtype == torch.float32 and lp.tolist() == [-1.0, -2.0, -3.0]


def test_the_loop_refuses_a_response_without_engine_logprobs():
    """trainer.step.batch.build_rollout_batch (step 5) on a group whose second sample came back without log-probs."""
    from trainer.step.batch import build_rollout_batch

    cfg = load_trainer_config({"method": "grpo", "rollout": {"n": 2}})
    group = {"outputs": [_out([-1.0, -1.0, -1.0]), _out(None)], "rewards": [1.0, 0.0]}
    with pytest.raises(DataError, match="step 4, group 0, sample 1: the rollout engine returned no log-probs"):
        build_rollout_batch([group], cfg, 0, 4)


def test_logged_ratios_are_finite_for_any_gap():
    """A 100-nat gap (the case where the old unclamped exp gave inf): the ratio is exp(20), the max gap 20."""
    old = torch.tensor([[-101.0, -1.0], [-1.0, 0.0]])  # padded [B, T]: row 2 has one token
    eng = torch.tensor([[-1.0, -1.0], [-1.5, 0.0]])
    d = {k: float(v) for k, v in rollout_diagnostics(old, eng, torch.tensor([[True, True], [True, False]])).items()}
    assert all(math.isfinite(v) for v in d.values())
    assert d["diff_max"] == LOG_RATIO_CLAMP
    assert d["diff_sum"] == pytest.approx(LOG_RATIO_CLAMP + 0.0 + 0.5)
    # sequence 1: token-mean of (e^-20, e^0); sequence 2: e^0.5
    assert d["ratio_sum"] == pytest.approx((math.exp(-20) + 1) / 2 + math.exp(0.5))
    assert d["n_ratio"] == 2
    masked = rollout_diagnostics(torch.tensor([[-1.0]]), torch.tensor([[-5.0]]), torch.tensor([[False]]))
    assert masked["n_ratio"] == 0 and masked["diff_max"] == 0 and masked["diff_sum"] == 0  # masked out


@pytest.mark.parametrize("over", [{"rollout.top_p": 0.7}, {"rollout.top_k": 20}])
def test_tis_with_a_filtered_support_is_refused(over):
    cfg = load_trainer_config({"method": "grpo", "loss": {"tis_cap": 2.0}}, [f"{k}={v}" for k, v in over.items()])
    with pytest.raises(ConfigError, match="renormalised over the top-p/top-k set"):
        check_importance_config(cfg)
    check_importance_config(load_trainer_config({"method": "grpo", "loss": {"tis_cap": 2.0}}))  # top_p 1: fine
    check_importance_config(load_trainer_config({"method": "grpo"}, [f"{k}={v}" for k, v in over.items()]))


def test_train_with_top_p_and_tis_fails_in_a_second(tmp_path, capsys):
    """The CLI refuses before building anything (preflight.check_training), with one line."""
    from stare_lab.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"max_position_embeddings": 4096}')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {tmp_path / 'm'}}}\ndata: {{train_files: [{data}]}}\nout_dir: {tmp_path / 'out'}\n")
    rc = main(["train", str(cfg), "loss.tis_cap=2.0", "rollout.top_p=0.9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "loss.tis_cap=2.0 with rollout.top_p=0.9" in err[0]
    assert not (tmp_path / "out").exists()


def _tis(old, rollout, mask, **cfg):
    """The GRPO loss on-policy (ratio 1) with Â = 1, token-mean: −Σ w / N, so the weights are read off the loss."""
    old_t = torch.tensor(old)
    inp = PolicyLossInputs(old_t.clone().requires_grad_(True), old_t, torch.tensor([1.0] * len(old)),
                           torch.tensor(mask), rollout_logprobs=torch.tensor(rollout))
    return compute_policy_loss("grpo", inp, cfg)


def test_tis_token_sequence_and_mask_modes_by_hand():
    ln = math.log
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    # token log-ratios: row 0: ln 3, ln 1/2; row 1: ln 1.5, 0 (second token masked out)
    rollout = [[-1.0 - ln(3.0), -1.0 + ln(2.0)], [-1.0 - ln(1.5), -1.0]]
    mask = [[True, True], [True, False]]
    # token, truncate at 2: weights 2, 0.5, 1.5 → loss −(2 + 0.5 + 1.5)/3
    loss, m = _tis(old, rollout, mask, tis_cap=2.0)
    assert loss.item() == pytest.approx(-4.0 / 3, rel=1e-6)
    # sequence level: row 0 ratio 3 · 1/2 = 1.5 for both tokens; row 1: 1.5 (masked token excluded) → −4.5/3
    loss, m = _tis(old, rollout, mask, tis_cap=2.0, tis_level="sequence")
    assert loss.item() == pytest.approx(-4.5 / 3, rel=1e-6)
    assert m["loss/tis_weight_mean"] == pytest.approx(1.5, rel=1e-6)
    # mask mode, token level, C = 2: ρ = 3 is outside [1/2, 2] → 0; 0.5 and 1.5 kept → −(0 + 0.5 + 1.5)/3
    loss, m = _tis(old, rollout, mask, tis_cap=2.0, tis_mode="mask")
    assert loss.item() == pytest.approx(-2.0 / 3, rel=1e-6)
    assert m["loss/tis_masked_frac"] == pytest.approx(1 / 3, rel=1e-6)
    # mask mode, sequence level, C = 1.4: both sequences have ρ = 1.5 > 1.4 → every weight 0
    loss, m = _tis(old, rollout, mask, tis_cap=1.4, tis_level="sequence", tis_mode="mask")
    assert loss.item() == 0.0 and m["loss/tis_masked_frac"] == 1.0


def test_tis_options_are_validated():
    with pytest.raises(ConfigError, match="loss.tis_level='seq' is not one of"):
        load_trainer_config({"loss": {"tis_level": "seq"}})
    with pytest.raises(ConfigError, match="tis_cap=0.5 must be >= 1 with loss.tis_mode=mask"):
        load_trainer_config({"loss": {"tis_cap": 0.5, "tis_mode": "mask"}})
