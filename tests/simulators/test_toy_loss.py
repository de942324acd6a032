"""A loss registered from outside the package trains the tabular simulator with no other edit (issue 14).

The toy loss is the GRPO surrogate scaled by a hyperparameter β read from ``loss.params`` (ℓ = −β·Â·ρ per token,
token-mean), declaring that it reads the per-token entropy. Hand prediction: at the first step the toy run and a GRPO
run with the same seed draw the same rollouts from the same policy; at ρ = 1 the toy's gradient is β times GRPO's,
so its update — and the exact first order ⟨∂H/∂z, Δz⟩ of it — is β times GRPO's (to the float32 rounding of the
core's loss); its declared entropy reaches the loss (its metric equals the row's batch entropy). From then on the two
trajectories differ.
"""

from __future__ import annotations

import json

import pytest

from stare_lab.cli import main
from stare_lab.loss.losses import LossNeeds, register_policy_loss, unregister_policy_loss
from stare_lab.loss.methods import register_method, unregister_method

LOSS, METHOD = "toy_scaled_grpo", "toy"
SMALL = ["num_prompts=8", "seq_len=3", "vocab_size=6", "threshold=2", "lr=0.5"]


@pytest.fixture
def toy_method():
    """Register the toy loss and method as a user's own module would, and remove them again afterwards."""

    @register_policy_loss(LOSS, needs=LossNeeds(entropy=True), metrics=("loss/toy_beta", "loss/toy_entropy"))
    def toy_loss(ctx, cfg):
        beta = float(cfg.params.get("beta", 1.0))
        ent = ctx.inputs.entropy.float()
        entropy_mean = (ent * ctx.mask).sum() / ctx.mask.sum()
        return -beta * ctx.adv * ctx.ratio, {"loss/toy_beta": beta, "loss/toy_entropy": entropy_mean}

    register_method(METHOD, LOSS)
    yield
    unregister_method(METHOD)
    unregister_policy_loss(LOSS)


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_a_loss_registered_outside_trains_the_tabular_simulator(tmp_path, toy_method):
    beta = 2.5
    out = tmp_path / "sweep"
    assert main(["simulate", "--preset", "collapse", "--methods", f"grpo,{METHOD}", "--seeds", "1", "--steps", "4",
                 "--out", str(out), "--no-plots", *SMALL, f"loss.params.beta={beta}"]) == 0
    grpo, toy = _rows(out / "grpo" / "seed0"), _rows(out / METHOD / "seed0")
    assert [r["step"] for r in toy] == [1, 2, 3, 4]
    assert toy[0]["entropy"] == grpo[0]["entropy"] and toy[0]["reward"] == grpo[0]["reward"]  # same start, rollouts
    assert toy[0]["loss/toy_beta"] == beta  # the hyperparameter reached the loss through loss.params
    assert toy[0]["loss/toy_entropy"] == pytest.approx(toy[0]["entropy"], rel=1e-6)  # the declared entropy did too
    assert toy[0]["pred_entropy_change"] == pytest.approx(beta * grpo[0]["pred_entropy_change"], rel=1e-5)
    assert toy[0]["pred/d_grpo"] == toy[0]["pred_entropy_change"]  # no STARE: the step is its own ω ≡ 1 update
    assert toy[0]["gate_on"] == 0 and toy[0]["skipped"] == 0
    assert toy[1]["entropy"] != grpo[1]["entropy"]  # a different update, so a different trajectory
    config = (out / METHOD / "seed0" / "config.yaml").read_text()
    assert f"loss_mode: {LOSS}" in config and f"beta: {beta}" in config
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"][METHOD]["mean"]["initial_entropy"] == pytest.approx(grpo[0]["entropy"])


def test_the_toy_method_is_refused_in_expected_mode(tmp_path, toy_method, capsys):
    """The mean-field mode implements the dynamics of named methods only; a registered loss gets a one-line error."""
    assert main(["simulate", "--preset", "demo", "--methods", METHOD, "--out", str(tmp_path / "x"), "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert f"method='{METHOD}' has no expected-mode dynamics" in err and len(err.strip().splitlines()) == 1
