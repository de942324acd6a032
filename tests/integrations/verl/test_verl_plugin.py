"""The verl plugin (stare_lab.integrations.verl) inside unmodified verl 0.9: found through verl's entry points, and
its loss through verl's real loss path (the policy-loss registry, ``get_policy_loss_fn``, ``ppo_loss``) against
verl's own ``vanilla`` loss and the core.

Expected values are never taken from the plugin: gate off must equal verl's ``vanilla`` bit for bit; gate on must
equal ``vanilla`` with ω passed as verl's per-token ``rollout_is_weights`` (which ``vanilla`` multiplies into each
token's loss: docs/theory.md §4 step 5, J = Σ ω·ℓ / N), with ω from a brute-force sort (conftest)."""

from __future__ import annotations

import hashlib
import base64
import importlib.metadata as md
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss

from stare_lab.errors import ConfigError, DataError
from stare_lab.integrations.verl import (GATE_KEY, M_KEY, W_KEY, WEIGHTS_KEY, StepContext, stare_ppo_loss,
                                         stare_step)
from stare_lab.loss.losses import PolicyLossInputs, compute_policy_loss
from stare_lab.integrations.verl import loss_config_from_actor

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import STARE_OVERRIDES, brute_force_weights, compose, make_batch, with_loss  # noqa: E402

AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _run(code: str, **env: str) -> str:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_plugin_is_found_through_verls_entry_points_in_unmodified_verl():
    """verl's own discovery (``verl.plugins`` group, ``VERL_USE_EXTERNAL_PLUGINS`` default ``auto``) loads the plugin
    at ``import verl``: the loss ``stare`` and the trainer ``stare`` exist; with discovery off they do not, and
    ``import stare_lab`` alone never imports verl. Every installed verl file still has the hash its wheel's RECORD
    lists, so nothing in verl was edited."""
    eps = {ep.name: ep.value for ep in md.entry_points(group="verl.plugins")}
    assert eps.get("stare") == "stare_lab.integrations.verl"
    assert eps.get("stare_trainer") == "stare_lab.integrations.verl_trainer"
    probe = """
        import sys
        import stare_lab, stare_lab.loss.losses, stare_lab.loss.step
        assert "verl" not in sys.modules
        import verl
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
        trainer = TRAINER_REGISTRY.get("stare")
        print("stare" in POLICY_LOSS_REGISTRY, None if trainer is None else trainer.__module__)
    """
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="auto") == "True stare_lab.integrations.verl_trainer"
    assert _run(probe, VERL_USE_EXTERNAL_PLUGINS="none") == "False None"
    dist = md.distribution("verl")
    checked = 0
    for f in dist.files:
        if f.hash is None or f.suffix == ".pyc":
            continue
        digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, f.read_binary()).digest()).rstrip(b"=").decode()
        assert digest == f.hash.value, f"verl file {f} differs from its wheel"
        checked += 1
    assert checked > 500


def _set_info(actor, batch, dp_size=1, scale=None):
    n_tok = int(batch.response_mask.sum())
    n_seq = int(batch.response_mask.any(-1).sum())
    actor.global_batch_info.update(dp_size=dp_size, batch_num_tokens=n_tok * dp_size, global_batch_size=n_seq * dp_size,
                                   loss_scale_factor=scale)


def _loss(name, actor, batch, weights=None, rollout_is_weights=None, agg="token-mean", dp_size=1):
    lp = batch.log_prob.clone().requires_grad_(True)
    _set_info(actor, batch, dp_size)
    fn = get_policy_loss_fn(name)
    loss, metrics = fn(batch.old_log_prob, lp, batch.advantages, batch.response_mask, agg, actor, rollout_is_weights)
    loss.backward()
    return loss.detach(), lp.grad, metrics


@pytest.mark.parametrize("agg", AGG_MODES)
def test_gate_off_is_verls_vanilla_loss_bit_for_bit(actor_config, agg):
    """Gate off: ω is never applied, so ``stare`` is verl's ``vanilla`` — same loss and gradient bits — with
    clip-higher (ε 0.2 / 0.28) and the dual clip (c = 3) binding on some tokens (verl's own clip fractions > 0)."""
    batch = make_batch()
    stare, vanilla = with_loss(actor_config, loss_agg_mode=agg), with_loss(actor_config, loss_mode="vanilla")
    with stare_step(StepContext(gate_on=False, reweight_w=1.1, reweight_m=0.9)):
        got, got_grad, got_m = _loss("stare", stare, batch, agg=agg)
    want, want_grad, want_m = _loss("vanilla", vanilla, batch, agg=agg)
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)
    assert want_m["actor/pg_clipfrac"] > 0 and want_m["actor/pg_clipfrac_lower"] > 0
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert got_m[key] == pytest.approx(want_m[key], rel=1e-6, abs=1e-7)


def test_gate_off_with_two_data_parallel_ranks_matches_vanilla(actor_config):
    """dp_size = 2: verl's token-mean is Σ/N_global·2 and the plugin's Σ/(N_global/2): equal to float rounding."""
    batch = make_batch(seed=3)
    with stare_step(StepContext(False, 1.1, 0.9)):
        got, got_grad, _ = _loss("stare", with_loss(actor_config), batch, dp_size=2)
    want, want_grad, _ = _loss("vanilla", with_loss(actor_config, loss_mode="vanilla"), batch, dp_size=2)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_gate_on_microbatch_scope_is_vanilla_times_brute_force_weights(actor_config, agg):
    """Gate on, scope microbatch (the reference's selection over the loss call's tokens), C2, P = 0.25, W 1.3, M 0.7:
    the loss and its gradient equal ``vanilla`` with ω (brute-force sort) as its per-token weights, and the core's
    ``compute_policy_loss("stare")`` on the same inputs."""
    batch = make_batch(seed=1)
    stare = with_loss(actor_config, loss_agg_mode=agg)
    with stare_step(StepContext(gate_on=True, reweight_w=1.3, reweight_m=0.7)):
        got, got_grad, metrics = _loss("stare", stare, batch, agg=agg)
    omega = brute_force_weights(batch.old_log_prob, batch.advantages, batch.response_mask, 0.25, 1.3, 0.7)
    # |T+| = 12 + 11 + 10 = 33 → k = ⌈8.25⌉ = 9; |T−| = 9 + 5 = 14 → ⌈3.5⌉ = 4; 54 valid tokens (make_batch)
    assert (omega == 1.3).sum() == 9 and (omega == 0.7).sum() == 4
    want, want_grad, _ = _loss("vanilla", with_loss(actor_config, loss_mode="vanilla"), batch, rollout_is_weights=omega,
                               agg=agg)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-9)
    cfg = loss_config_from_actor(stare, agg)
    core, _ = compute_policy_loss("stare", PolicyLossInputs(
        logprobs=batch.log_prob, old_logprobs=batch.old_log_prob, advantages=batch.advantages,
        response_mask=batch.response_mask, gate_on=True, reweight_w=1.3, reweight_m=0.7), cfg)
    torch.testing.assert_close(got, core, rtol=0, atol=0)
    assert metrics["actor/stare/frac_pos_selected"] == pytest.approx(9 / 54)
    assert metrics["actor/stare/frac_neg_selected"] == pytest.approx(4 / 54)


def test_gate_on_global_scope_applies_the_steps_weights(actor_config):
    """Scope global: the loss multiplies the ω the trainer selected over the whole step (here an arbitrary one, to
    show it is used as given), and refuses ω of another shape."""
    batch = make_batch(seed=2)
    omega = torch.where(torch.rand(batch.old_log_prob.shape, generator=torch.Generator().manual_seed(5)) > 0.7,
                        1.5, 1.0)
    stare = with_loss(actor_config, scope="global")
    with stare_step(StepContext(True, 1.5, 1.0, token_weights=omega)):
        got, got_grad, _ = _loss("stare", stare, batch)
    want, want_grad, _ = _loss("vanilla", with_loss(actor_config, loss_mode="vanilla"), batch, rollout_is_weights=omega)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-9)
    with stare_step(StepContext(True, 1.5, 1.0, token_weights=omega[:, :5])), pytest.raises(DataError, match="shape"):
        _loss("stare", stare, batch)


def test_rollout_correction_weights_multiply_each_token_like_vanilla(actor_config):
    """verl's ``rollout_is_weights`` w ≥ 0 (some 0): ``stare`` with the gate off equals ``vanilla`` with the same w;
    a negative weight is refused."""
    batch = make_batch(seed=4)
    w = torch.rand(batch.old_log_prob.shape, generator=torch.Generator().manual_seed(9)) * 2
    w[0, :3] = 0.0
    with stare_step(StepContext(False, 1.1, 0.9)):
        got, got_grad, _ = _loss("stare", with_loss(actor_config), batch, rollout_is_weights=w)
        with pytest.raises(DataError, match="negative"):
            _loss("stare", with_loss(actor_config), batch, rollout_is_weights=w - 1.0)
    want, want_grad, _ = _loss("vanilla", with_loss(actor_config, loss_mode="vanilla"), batch, rollout_is_weights=w)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-9)


def _worker_micro_batch(batch, prompt_lens, weights=None, extra=None):
    """A micro-batch as verl's workers hand it to the loss (v1 trainer, remove-padding): jagged prompts, responses
    and per-token fields, model log-probs over prompt + response (shifted left by one token), the global counts and
    the trainer's ``extra_info`` as non-tensor data. Returns (data, model_output, the response log-prob leaf)."""
    def nested(x, lengths):
        return torch.nested.as_nested_tensor([x[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)

    lengths = batch.lengths
    leaf = batch.log_prob.clone().requires_grad_(True)
    full = []
    for i, (p, n) in enumerate(zip(prompt_lens, lengths)):
        # token j of the response is predicted at position p - 1 + j
        full.append(torch.cat([torch.full((p - 1,), -0.5), leaf[i, :n], torch.full((1,), -0.5)]))
    log_probs = torch.nested.as_nested_tensor(full, layout=torch.jagged)
    fields = {
        "prompts": torch.nested.as_nested_tensor([torch.ones(p, dtype=torch.long) for p in prompt_lens],
                                                 layout=torch.jagged),
        "responses": nested(torch.ones_like(batch.response_mask, dtype=torch.long), lengths),
        "response_mask": nested(batch.response_mask.long(), lengths),
        "old_log_probs": nested(batch.old_log_prob, lengths),
        "advantages": nested(batch.advantages, lengths),
    }
    if weights is not None:
        fields[WEIGHTS_KEY] = nested(weights, lengths)
    data = TensorDict(fields, batch_size=len(lengths))
    n_tok = int(batch.response_mask.sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tok, global_batch_size=len(lengths))
    for key, value in (extra or {}).items():
        tu.assign_non_tensor_data(data, key, value)
    return data, {"log_probs": log_probs}, leaf


@pytest.mark.parametrize("gate_on", [False, True])
def test_worker_loss_reads_the_step_from_the_batch_through_ppo_loss(actor_config, gate_on):
    """The workers' loss :func:`stare_ppo_loss` on a jagged micro-batch carrying the trainer's ``extra_info`` (gate,
    W, M) and ω field, through verl's ``ppo_loss`` (real dispatch by loss_mode): gate off gives verl's ``ppo_loss``
    with ``vanilla`` bit for bit; gate on gives it with ω as ``rollout_is_weights``."""
    batch = make_batch(seed=6)
    prompts = [3, 5, 2, 4, 6, 1]
    omega = brute_force_weights(batch.old_log_prob, batch.advantages, batch.response_mask, 0.25, 1.2, 0.8)
    extra = {GATE_KEY: gate_on, W_KEY: 1.2, M_KEY: 0.8}
    data, out, leaf = _worker_micro_batch(batch, prompts, weights=omega if gate_on else None, extra=extra)
    loss, metrics = stare_ppo_loss(config=with_loss(actor_config, scope="global"), model_output=out, data=data)
    loss.backward()
    if gate_on:
        ref_data, ref_out, ref_leaf = _worker_micro_batch(batch, prompts)
        ref_data["rollout_is_weights"] = torch.nested.as_nested_tensor(
            [omega[i, :n] for i, n in enumerate(batch.lengths)], layout=torch.jagged)
    else:
        ref_data, ref_out, ref_leaf = _worker_micro_batch(batch, prompts)
    ref, ref_metrics = ppo_loss(config=with_loss(actor_config, loss_mode="vanilla"), model_output=ref_out,
                                data=ref_data)
    ref.backward()
    if gate_on:
        torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-6, atol=1e-9)
    else:
        assert torch.equal(loss, ref) and torch.equal(leaf.grad, ref_leaf.grad)
    assert metrics["actor/stare/gate_on"].values == [float(gate_on)]  # a verl Metric of this micro-batch


def test_clear_errors(actor_config):
    """One-line ConfigErrors: the entropy gate without the STARE trainer, token-sum aggregation, a policy loss config
    that is not STARE's, a bad STARE value in the launch overrides (naming verl's key)."""
    batch = make_batch()
    with pytest.raises(ConfigError, match=r"policy_loss\.gate='entropy' needs the STARE trainer"):
        _loss("stare", with_loss(actor_config), batch)  # no step in scope
    with stare_step(StepContext(False, 1.1, 0.9)), pytest.raises(ConfigError, match="token-sum"):
        _loss("stare", with_loss(actor_config), batch, agg="token-sum")
    with stare_step(StepContext(False, 1.1, 0.9)), pytest.raises(ConfigError, match="STAREPolicyLossConfig"):
        _loss("stare", with_loss(actor_config, loss_mode="vanilla"), batch)
    with pytest.raises(Exception, match=r"actor_rollout_ref\.actor\.policy_loss\.variant='C3' is not one of"):
        from verl.utils.config import omega_conf_to_dataclass

        bad = compose([o for o in STARE_OVERRIDES if "variant" not in o]
                      + ["+actor_rollout_ref.actor.policy_loss.variant=C3"])
        omega_conf_to_dataclass(bad.actor_rollout_ref.actor)
