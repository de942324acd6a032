"""PolicyLossInputs.importance_weights: a caller's own detached per-token / per-sequence weights multiply the
per-token loss before aggregation (the seam the TRL integration uses for TRL's vLLM importance-sampling ratio)."""

from __future__ import annotations

import pytest
import torch

from stare_lab.config import LossConfig
from stare_lab.errors import DataError
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss


def _inputs(**kw) -> PolicyLossInputs:
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.2]], requires_grad=True)
    base = dict(logprobs=lp, old_logprobs=lp.detach().clone(), advantages=torch.tensor([2.0, -1.0]),
                response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
    return PolicyLossInputs(**{**base, **kw})


@pytest.mark.parametrize("shape", ["token", "sequence"])
def test_weights_multiply_the_per_token_loss_by_hand(shape):
    """On-policy ρ = 1, so GRPO's per-token loss is −Â; token-mean over the 5 valid tokens:
    L = Σ w·(−Â)·m / 5. Per token w = [[.5, 2, 9], [1, 0, 3]] → (−2·.5 − 2·2 + 1·1 + 0 + 1·3)/5 = −0.2;
    per sequence w = [[.5], [3]] → (−2·.5·2 + 1·3·3)/5 = 1.4. The gradient of L w.r.t. log π is w·(−Â)·m/5."""
    w = torch.tensor([[0.5, 2.0, 9.0], [1.0, 0.0, 3.0]]) if shape == "token" else torch.tensor([[0.5], [3.0]])
    inputs = _inputs(importance_weights=w)
    loss, _ = compute_policy_loss("grpo", inputs, LossConfig(loss_agg_mode="token-mean"))
    assert loss.item() == pytest.approx(-0.2 if shape == "token" else 1.4, abs=1e-6)
    loss.backward()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    expected = w.expand(2, 3) * -torch.tensor([[2.0], [-1.0]]) * mask / 5
    torch.testing.assert_close(inputs.logprobs.grad, expected)


def test_unit_weights_change_nothing_bit_for_bit():
    """w ≡ 1 gives exactly the loss without weights (x·1 = x in floating point)."""
    plain, _ = compute_policy_loss("grpo", _inputs(), LossConfig())
    weighted, _ = compute_policy_loss("grpo", _inputs(importance_weights=torch.ones(2, 3)), LossConfig())
    assert torch.equal(plain, weighted)


@pytest.mark.parametrize("weights, message", [
    (torch.ones(2, 2), "importance_weights must be a float tensor of shape [B, 1]=(2, 1) or [B, T]=(2, 3)"),
    (torch.ones(2, 3, dtype=torch.int64), "importance_weights must be a float tensor"),
    (torch.tensor([[1.0, float("nan"), 1.0], [1.0, 1.0, 1.0]]), "importance_weights[0, 1] = nan is not finite"),
])
def test_bad_weights_are_one_line_data_errors(weights, message):
    with pytest.raises(DataError) as err:
        compute_policy_loss("grpo", _inputs(importance_weights=weights), LossConfig())
    assert message in str(err.value) and "\n" not in str(err.value)
