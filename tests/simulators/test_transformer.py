"""Tests of simulators/transformer/runner.py on a tiny model (1 layer, width 32) and tiny sizes: config errors, sampling,
the ∇θH̄·Δθ predictor against finite differences, determinism, warm-start cache, gate-off ≡ GRPO, resume."""

import json
import os

import pytest
import torch

from stare_lab.loss.entropy import entropy_from_logits
from stare_lab.errors import ConfigError, RunError

try:
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("transformers is not installed", allow_module_level=True)

from simulators.transformer import runner as T  # noqa: E402
from simulators.transformer.tasks import EOS, PAD  # noqa: E402

torch.set_num_threads(1)

TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.num_kv_heads=1", "model.init_std=0.1",
    "task.num_digits=4", "task.answer_len=1", "task.train_size=256", "task.eval_size=16",
    "warm_start.steps=20", "warm_start.batch_size=32",
    "steps=4", "prompts_per_step=4", "group_size=4", "eval_every=2", "eval_samples=2", "checkpoint_every=2",
]


def _cfg(tmp_path, *extra, **fields):
    given = {e.split("=", 1)[0] for e in extra}  # a key given twice is refused: the extra value replaces TINY's
    over = [t for t in TINY if t.split("=", 1)[0] not in given] + [f"warm_start.cache_dir={tmp_path / 'cache'}", *extra]
    return T.config_from_preset(None, over, **fields)


def _rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_config_errors_name_key_value_and_allowed():
    with pytest.raises(ConfigError, match=r"task.name='add' is not one of \{'pick', 'sort'\}"):
        T.config_from_preset("transformer", ["task.name=add"])
    with pytest.raises(ConfigError, match=r"method='ppo' is not one of"):
        T.config_from_preset("transformer", method="ppo")
    with pytest.raises(ConfigError, match=r"group_size=1 is outside \[2, inf\)"):
        T.config_from_preset("transformer", ["group_size=1"])
    with pytest.raises(ConfigError, match=r"model.hidden_size=30 is not divisible by model.num_heads=4"):
        T.config_from_preset(None, ["model.hidden_size=30", "model.num_heads=4"])
    with pytest.raises(ConfigError, match=r"preset='huge' is not one of \{'transformer', 'transformer-long'"):
        T.config_from_preset("huge")
    with pytest.raises(ConfigError, match=r"unknown config key warm_start.epochs"):
        T.config_from_preset(None, ["warm_start.epochs=3"])
    with pytest.raises(ConfigError, match=r"loss.stare.reweight_w=0.5 is outside \[1, inf\)"):
        T.config_from_preset(None, ["loss.stare.reweight_w=0.5"], method="o1")


def test_presets_build_and_methods_map_to_registry():
    for name in T.PRESETS:
        for method in T.PRESET_SWEEPS[name]["methods"]:
            cfg = T.config_from_preset(name, method=method)
            assert cfg.loss.loss_mode == {"grpo": "grpo", "grpo-ds": "grpo"}.get(method, "stare")
    assert T.config_from_preset("transformer", method="c2").loss.stare.variant == "C2"
    assert T.config_from_preset("transformer", method="grpo-ds").dynamic_sampling is True
    assert T.config_from_preset("transformer", method="entropy_bonus").loss.entropy_coeff == 0.01


def test_sampling_is_seeded_and_stops_at_eos():
    model = T.build_model(T.ModelConfig(hidden_size=32, intermediate_size=64, num_layers=1), seed=0)
    prompts = torch.randint(0, 10, (64, 6), generator=torch.Generator().manual_seed(0))
    a = T.sample_responses(model, prompts, 5, 1.0, torch.Generator().manual_seed(1))
    b = T.sample_responses(model, prompts, 5, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    responses, mask = a
    for row, m in zip(responses.tolist(), mask.tolist()):
        if EOS in row:
            end = row.index(EOS)
            assert all(m[: end + 1]) and not any(m[end + 1 :])
            assert all(t == PAD for t in row[end + 1 :])
        else:
            assert all(m)


def test_shared_prompt_forward_equals_full_forward():
    """response_logits computes each run of equal prompts once and reuses its KV cache for the group's responses;
    the logits and their gradients must equal those of a plain full forward of prompt + response."""
    model = T.build_model(T.ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2), seed=3)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 10, (5, 6), generator=g).repeat_interleave(4, dim=0)  # 5 prompts x G = 4
    responses = torch.randint(0, 14, (20, 5), generator=g)
    full = model(input_ids=torch.cat([prompts, responses], 1), use_cache=False).logits[:, 5:-1]
    shared = T.response_logits(model, prompts, responses)
    assert shared.shape == (20, 5, 14)
    assert torch.allclose(shared, full, atol=1e-5)
    g_full = torch.autograd.grad(full.square().mean(), list(model.parameters()))
    g_shared = torch.autograd.grad(shared.square().mean(), list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_full, g_shared))
    params = {n: p.detach() * 1.01 for n, p in model.named_parameters()}
    ref = torch.func.functional_call(model, params, (torch.cat([prompts, responses], 1),), {"use_cache": False})
    assert torch.allclose(T.response_logits(model, prompts, responses, params), ref.logits[:, 5:-1], atol=1e-5)
    # distinct prompts (no sharing) and one-token responses take the same path
    assert torch.allclose(T.response_logits(model, prompts[::4], responses[::4]), full[::4], atol=1e-5)
    assert torch.allclose(T.response_logits(model, prompts, responses[:, :1]), full[:, :1], atol=1e-5)


def test_reward_noise_flips_training_rewards_only(tmp_path):
    """task.reward_noise flips the training verdicts; accuracy (exact verdicts) and reward then differ, and the
    flips come from the seeded RL stream (deterministic). Without noise, reward == accuracy."""
    T.run(_cfg(tmp_path, method="grpo"), tmp_path / "c")
    clean = _rows(tmp_path / "c")
    assert all(r["reward"] == pytest.approx(r["accuracy"]) for r in clean)
    T.run(_cfg(tmp_path, "task.reward_noise=0.4", method="grpo"), tmp_path / "n")
    T.run(_cfg(tmp_path, "task.reward_noise=0.4", method="grpo"), tmp_path / "n2")
    noisy = _rows(tmp_path / "n")
    assert noisy == _rows(tmp_path / "n2")
    assert any(abs(r["reward"] - r["accuracy"]) > 0.05 for r in noisy)
    with pytest.raises(ConfigError, match=r"task.reward_noise=0.5 is outside \[0, 0.5\)"):
        T.config_from_preset(None, ["task.reward_noise=0.5"])


def test_lr_warmup_and_adam_eps(tmp_path):
    """lr_warmup_steps = 4: step t runs at lr·t/4, then lr; adam_eps reaches the optimizer; bad values are named."""
    sim = T._Simulation(_cfg(tmp_path, "lr_warmup_steps=4", "adam_eps=1e-6", "lr=0.002"), tmp_path / "run")
    assert sim.optimizer.param_groups[0]["eps"] == 1e-6
    lrs = []
    for step in range(1, 6):
        sim.rl_step(step)
        lrs.append(sim.optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.0005, 0.001, 0.0015, 0.002, 0.002])
    with pytest.raises(ConfigError, match=r"lr_warmup_steps=-1"):
        T.config_from_preset(None, ["lr_warmup_steps=-1"])
    with pytest.raises(ConfigError, match=r"adam_eps=0"):
        T.config_from_preset(None, ["adam_eps=0"])


def test_grad_dot_prediction_equals_directional_finite_difference(tmp_path):
    """pred/grad_dot must be ∇θH̄(θ_old)·Δθ: compare with the central difference (H̄(θ0+εΔθ) − H̄(θ0−εΔθ))/(2ε)
    along the step's own Δθ, evaluated independently with functional_call (ε = 0.05; float32)."""
    cfg = _cfg(tmp_path, "steps=2")
    sim = T._Simulation(cfg, tmp_path / "run")
    for step in (1, 2):
        row = sim.rl_step(step)
        prompts, responses, mask, theta_old = sim.last_batch
        new = {n: p.detach().clone() for n, p in sim.model.named_parameters()}

        def h(eps):
            params = {n: theta_old[n] + eps * (new[n] - theta_old[n]) for n in theta_old}
            with torch.no_grad():
                ent = entropy_from_logits(T.response_logits(sim.model, prompts, responses, params))
            return float((ent * mask).sum() / mask.sum())

        eps = 0.05
        fd = (h(eps) - h(-eps)) / (2 * eps)
        assert row["pred/grad_dot"] == pytest.approx(fd, rel=0.03, abs=2e-5)
        assert row["pred_entropy_change"] == row["pred/grad_dot"]
        # the measured change is recomputed on the same positions: H̄(θ_new) − H̄(θ_old)
        assert row["entropy_change"] == pytest.approx(h(1.0) - h(0.0), abs=1e-5)


def test_run_is_deterministic_and_warm_start_cache_is_transparent(tmp_path):
    """Same seed ⇒ identical metrics (timings excluded), whether the warm start is trained or loaded from cache."""
    s1 = T.run(_cfg(tmp_path, method="o1"), tmp_path / "a")
    assert list((tmp_path / "cache").glob("warm_*.pt"))  # the first run filled the cache
    T.run(_cfg(tmp_path, method="o1"), tmp_path / "b")  # loads it
    T.run(_cfg(tmp_path, "warm_start.cache=false", method="o1"), tmp_path / "c")  # trains again, no cache
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b") == _rows(tmp_path / "c")
    T.run(_cfg(tmp_path, method="o1", seed=1), tmp_path / "d")
    assert _rows(tmp_path / "d") != _rows(tmp_path / "a")
    rows = _rows(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("entropy", "reward", "gate_on", "stare_w", "stare_m", "pred_entropy_change", "entropy_change",
                "pred/phi_tokens", "pred/logit_first_order", "response_length", "accuracy", "pass@4",
                "quadrant/pos_high/count", "quadrant/neg_low/dH"):
        assert all(isinstance(r[key], (int, float)) for r in rows), key
    assert "eval/accuracy" in rows[1] and "eval/pass@2" in rows[3] and "eval/accuracy" not in rows[0]
    # quadrant terms sum to the Φ prediction; counts sum to the valid tokens
    r = rows[0]
    quad = sum(r[f"quadrant/{a}_{b}/dH"] for a in ("pos", "neg") for b in ("high", "low"))
    assert quad == pytest.approx(r["pred/phi_tokens"], abs=1e-6)
    assert s1["method"] == "o1" and "warm_start/entropy" in s1 and "fit/grad_dot/r2" in s1


def test_gate_off_stare_equals_grpo_bit_for_bit(tmp_path):
    """docs/theory.md §6: with the gate off every step (H_tgt = 0 < H̄), STARE's trajectory equals GRPO's."""
    T.run(_cfg(tmp_path, method="grpo"), tmp_path / "g")
    T.run(_cfg(tmp_path, "loss.stare.target_entropy=0.0", method="c2"), tmp_path / "s")
    keys = ("entropy", "entropy_change", "pred_entropy_change", "reward", "eval/accuracy")
    g, s = _rows(tmp_path / "g"), _rows(tmp_path / "s")
    assert all(r["gate_on"] == 0 for r in s)
    assert [[r.get(k) for k in keys] for r in g] == [[r.get(k) for k in keys] for r in s]


def test_gate_always_changes_the_trajectory(tmp_path):
    """Control for the test above: with the gate forced on and W = 5 the run differs from GRPO."""
    T.run(_cfg(tmp_path, method="grpo"), tmp_path / "g")
    T.run(_cfg(tmp_path, "loss.stare.gate=always", "loss.stare.reweight_w=5.0", method="o1"), tmp_path / "s")
    assert [r["entropy"] for r in _rows(tmp_path / "g")][1:] != [r["entropy"] for r in _rows(tmp_path / "s")][1:]
    assert all(r["gate_on"] == 1 and r["stare_w"] == 5.0 for r in _rows(tmp_path / "s"))


@pytest.mark.parametrize("method, extra, cut", [
    ("c2", (), 2),
    # the auto schedule mid-acquisition at the checkpoint of step 3: H_tgt = 20 nats > ln V, so H̄ crosses it at
    # step 1 and the acquisition moves W on a step where H̄ falls (step 3 here: it rises at step 2); an evaluation
    # at step 3 in both runs (a run evaluates its last step)
    ("c2-auto", ("loss.stare.target_entropy=20", "checkpoint_every=3", "eval_every=3"), 3),
])
def test_resume_continues_bit_identically(tmp_path, method, extra, cut):
    """A run stopped at step ``cut`` (checkpoint) and resumed to step 4 writes the same rows as an uninterrupted run,
    and ends with the same controller state and parameters. For the auto schedule the checkpoint's controller is
    past the crossing, still acquiring, with the gate on and W moved since the crossing."""
    T.run(_cfg(tmp_path, *extra, method=method), tmp_path / "full")
    T.run(_cfg(tmp_path, *extra, f"steps={cut}", method=method), tmp_path / "part")
    if method.endswith("-auto"):
        ctl = torch.load(tmp_path / "part" / "checkpoint" / "state.pt", weights_only=False)["state"]["controller"]
        before = _rows(tmp_path / "part")
        assert ctl["num_updates"] == cut and ctl["crossed_at"] == 1 and ctl["auto_hold_steps"] == 0
        assert all(r["gate_on"] == 1 for r in before) and ctl["reweight_w"] == before[-1]["stare_w"]
        assert before[-1]["stare_w"] != before[0]["stare_w"] and ctl["reweight_m"] == 1.0 / ctl["reweight_w"]
    with pytest.raises(RunError, match="already holds a run"):
        T.run(_cfg(tmp_path, *extra, method=method), tmp_path / "part")
    T.run(_cfg(tmp_path, *extra, method=method), tmp_path / "part", resume=True)
    assert _rows(tmp_path / "part") == _rows(tmp_path / "full")
    a, b = (torch.load(tmp_path / d / "checkpoint" / "state.pt", weights_only=False)["state"] for d in ("full", "part"))
    assert a["controller"] == b["controller"]
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    with pytest.raises(RunError, match=f"method='o1' differs from the checkpoint's '{method}'"):
        T.run(_cfg(tmp_path, *extra, method="o1"), tmp_path / "part", resume=True)


def test_dynamic_sampling_keeps_only_informative_groups(tmp_path):
    T.run(_cfg(tmp_path, method="grpo-ds"), tmp_path / "ds")
    for r in _rows(tmp_path / "ds"):
        assert 1 <= r["ds/rounds"] <= 3 and 0 <= r["ds/kept_groups"]


@pytest.mark.slow
def test_transformer_preset_claims(tmp_path):
    """The `transformer` preset on seed 0 (issue 8). Measured (2026-11-29): GRPO's entropy 1.448 → below 10 % at
    step 133 (0.129 after step 200) while the sampled accuracy rose 0.20 → 0.98; the gated O1 run held the entropy
    near H_tgt = 0.7 (mean |H − H_tgt| over the second half 0.078). The exact first-order prediction ∇θH̄·Δθ fits
    the measured ΔH over all 200 RL steps with R² 0.978 (GRPO) and 0.996 (O1), slopes 0.99. Re-measured on
    2026-12-01 on another machine of the same kind: warm start 1.432 nats and O1's deviation 0.125 — 200 Adam steps
    amplify float-rounding differences between CPUs, so the band claim is asserted relative to GRPO's own deviation
    (O1's at most half of it; GRPO's is ≈ 0.55) with an absolute cap of H_tgt/3, not at one machine's value."""
    out = tmp_path / "sweep"
    g = T.run(T.config_from_preset("transformer", method="grpo"), out / "grpo" / "seed0")
    assert g["steps_to_collapse"] is not None and g["steps_to_collapse"] <= 200, g
    assert g["final_entropy"] < 0.1 * g["initial_entropy"], g
    assert g["final_accuracy"] > g["initial_accuracy"] + 0.5, g
    assert g["fit/grad_dot/r2"] >= 0.95 and 0.9 <= g["fit/grad_dot/slope"] <= 1.1, g
    o = T.run(T.config_from_preset("transformer", method="o1"), out / "o1" / "seed0")
    assert o["steps_to_collapse"] is None, o
    assert o["mean_abs_dev_second_half"] < min(0.5 * g["mean_abs_dev_second_half"], o["target_entropy"] / 3), (o, g)
    assert o["final_entropy"] > 0.5 * o["target_entropy"] and o["gate_on_frac"] > 0.2, o
    assert o["fit/grad_dot/r2"] >= 0.95, o


@pytest.mark.parametrize("method", ["o1", "c2"])
def test_decomposition_adds_up_to_the_first_adam_step(tmp_path, method):
    """On the run's first AdamW step (no momentum yet, no weight decay, one on-policy update) the applied update is
    exactly −P ⊙ g_applied and the STARE gradient is g_GRPO + (W − 1)·g_L+ (+ (M − 1)·g_L−), so
    D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L− must equal ∇θH̄·Δθ (pred_entropy_change, itself checked by finite
    differences above). The gate is forced on so the reweighting acts; W = 3 (and M = 0.5) make the parts count."""
    cfg = _cfg(tmp_path, "steps=1", "loss.stare.gate=always", "loss.stare.reweight_w=3.0",
               "loss.stare.reweight_m=0.5", method=method)
    row = T._Simulation(cfg, tmp_path / "run").rl_step(1)
    assert row["gate_on"] == 1 and row["stare_w"] == 3.0
    total = row["pred/d_grpo"] + 2.0 * row["pred/d_lplus"]
    if method == "c2":
        total += -0.5 * row["pred/d_lminus"]
    else:
        assert "pred/d_lminus" not in row
    assert row["pred/d_lplus"] != 0.0
    assert total == pytest.approx(row["pred_entropy_change"], rel=1e-4, abs=1e-9)


def test_decomposition_can_be_turned_off_and_errors(tmp_path):
    row = T._Simulation(_cfg(tmp_path, "steps=1", "measure_decomposition=false", method="o1"),
                        tmp_path / "run").rl_step(1)
    assert "pred/d_grpo" not in row and "pred_entropy_change" in row
    with pytest.raises(ConfigError, match=r"measure_decomposition=3 must be true or false"):
        T.config_from_preset(None, ["measure_decomposition=3"])
