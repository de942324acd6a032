"""Method table: registering a method for a loss defined outside the package (docs/design.md §1)."""

from __future__ import annotations

import pytest
import torch

from stare_lab.config import LossConfig, from_dict
from stare_lab.errors import ConfigError
from stare_lab.loss.losses import available_policy_losses, register_policy_loss, unregister_policy_loss
from stare_lab.loss.methods import METHODS, check_method, method_overrides, register_method, unregister_method


@pytest.fixture
def toy_method():
    """A toy loss ℓ = −params.scale · Â · ρ registered with a method of the same name; removed afterwards."""
    @register_policy_loss("toy_scaled_pg")
    def toy(ctx, cfg):
        return -float(cfg.params.get("scale", 1.0)) * ctx.adv * ctx.ratio, {}

    register_method("toy_scaled_pg", "toy_scaled_pg")
    yield "toy_scaled_pg"
    unregister_method("toy_scaled_pg")
    unregister_policy_loss("toy_scaled_pg")


def test_registered_method_resolves_and_checks(toy_method):
    spec = method_overrides(toy_method)
    assert spec == {"loss": {"loss_mode": "toy_scaled_pg"}, "dynamic_sampling": False}
    check_method(toy_method, LossConfig(loss_mode="toy_scaled_pg"))  # matches: no error
    with pytest.raises(ConfigError, match="needs loss.loss_mode='toy_scaled_pg'"):
        check_method(toy_method, LossConfig(loss_mode="grpo"))


def test_loss_params_reach_the_loss(toy_method):
    from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss

    cfg = from_dict(LossConfig, {"loss_mode": "toy_scaled_pg", "params": {"scale": 2.5}}, prefix="loss")
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    inputs = PolicyLossInputs(logprobs=lp, old_logprobs=lp.detach(), advantages=adv,
                              response_mask=torch.ones(2, 3, dtype=torch.bool))
    loss, _ = compute_policy_loss("toy_scaled_pg", inputs, cfg)
    loss.backward()
    # ρ = 1 at old = new; token-mean of −2.5·Â·ρ: mean(−2.5, −2.5, −2.5, 2.5, 2.5, 2.5) = 0; ∂/∂lp = −2.5·Â/6
    assert float(loss.detach()) == 0.0
    assert torch.allclose(lp.grad, torch.tensor([[-2.5 / 6] * 3, [2.5 / 6] * 3]))


@pytest.mark.parametrize(
    "args, message",
    [
        (("grpo", "grpo"), "already defined"),
        (("", "grpo"), "non-empty"),
        (("new_method", "no_such_loss"), "not a registered loss"),
    ],
)
def test_register_method_errors(args, message):
    with pytest.raises(ConfigError, match=message):
        register_method(*args)
    assert "new_method" not in METHODS


def test_register_method_unknown_stare_key():
    with pytest.raises(ConfigError, match="unknown loss.stare key 'bogus'"):
        register_method("new_method", "stare", stare={"bogus": 1})


@pytest.mark.parametrize("value", [{"a": {"nested": 1}}, {"": 1}])
def test_loss_params_must_be_plain(value):
    with pytest.raises(ConfigError, match="loss.params"):
        from_dict(LossConfig, {"params": value}, prefix="loss")


def test_unregister_removes_a_method_and_its_loss_in_that_order(toy_method):
    """The method, then its loss; built-ins never; a second unregister names what is missing."""
    unregister_method("toy_scaled_pg")
    assert "toy_scaled_pg" not in METHODS
    unregister_policy_loss("toy_scaled_pg")
    assert "toy_scaled_pg" not in available_policy_losses()
    with pytest.raises(ConfigError, match="method 'toy_scaled_pg' is not defined"):
        unregister_method("toy_scaled_pg")
    with pytest.raises(ConfigError, match="loss_mode='toy_scaled_pg' is not one of"):
        unregister_policy_loss("toy_scaled_pg")
    with pytest.raises(ConfigError, match="method 'c2' is built in"):
        unregister_method("c2")
    with pytest.raises(ConfigError, match="policy loss 'kl_cov' is built in"):
        unregister_policy_loss("kl_cov")
    # registered again under the same names (what a reloaded plugin does), so the fixture's teardown finds them
    register_policy_loss("toy_scaled_pg")(lambda ctx, cfg: (-ctx.adv * ctx.ratio, {}))
    register_method("toy_scaled_pg", "toy_scaled_pg")
