"""The STARE trainer's once-per-step logic (:class:`stare_lab.integrations.verl.STAREStep`) on a real verl
``DataProto`` batch: H̄ against verl's own ``actor/entropy`` formula, the controller's gate and adaptive W/M by hand
(docs/theory.md §4 step 3), ω against a brute-force sort, the workers' batch keys, the run-directory row, and the
controller state across a save/restore."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.errors import DataError
from stare_lab.integrations.verl import GATE_KEY, M_KEY, W_KEY, STAREStep, loss_config_from_actor
from stare_lab.platform.runs import REQUIRED_KEYS, RunWriter, read_run

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import brute_force_weights, make_batch  # noqa: E402


def _data(seed: int, entropy_shift: float = 0.0) -> DataProto:
    b = make_batch(seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    entropy = (torch.rand(b.old_log_prob.shape, generator=g) * 0.4 + 0.05 + entropy_shift) * b.response_mask
    return DataProto.from_dict(tensors={"response_mask": b.response_mask.long(), "old_log_probs": b.old_log_prob,
                                        "advantages": b.advantages, "entropy": entropy})


def _step(**stare) -> STAREStep:
    base = dict(variant="C2", top_p_ratio=0.25, reweight_w=1.2, reweight_m=0.8, target_entropy=0.3, adaptive=True,
                alpha=0.05, w_max=1.5, m_min=0.5, scope="global")
    return STAREStep(LossConfig(loss_mode="stare", stare=STAREConfig(**{**base, **stare})))


def test_step_updates_the_controller_and_selects_omega_over_the_whole_batch():
    """Step 1: H̄ (token-mean of the entropy field) equals verl's ``actor/entropy`` (agg_loss, token-mean) and is
    below the target 0.3 + 0.05 → gate on, W 1.2 + α = 1.25, M 0.8 − α = 0.75; ω = the brute-force selection with
    those W/M (|L+| = ⌈0.25·33⌉ = 9, |L−| = ⌈0.25·14⌉ = 4). Step 2: entropies raised by 0.3 → H̄ above the target →
    gate off, W/M step back to 1.2 / 0.8, no ω."""
    data = _data(0)
    b = data.batch
    h_bar = float((b["entropy"].double() * b["response_mask"]).sum() / b["response_mask"].sum())
    step = _step(target_entropy=h_bar + 0.05)
    prepared = step.prepare(data, step=1)
    verl_entropy = agg_loss(loss_mat=b["entropy"], loss_mask=b["response_mask"], loss_agg_mode="token-mean").item()
    assert prepared.entropy == pytest.approx(h_bar, abs=1e-7) and prepared.entropy == pytest.approx(verl_entropy,
                                                                                                     abs=1e-6)
    assert (prepared.gate_on, prepared.reweight_w, prepared.reweight_m) == (True, pytest.approx(1.25),
                                                                            pytest.approx(0.75))
    omega = brute_force_weights(b["old_log_probs"], b["advantages"], b["response_mask"].bool(), 0.25, 1.25, 0.75)
    mask = b["response_mask"].bool()
    assert torch.equal(prepared.token_weights[mask], omega[mask])
    assert STAREStep.extra_info(prepared) == {GATE_KEY: True, W_KEY: pytest.approx(1.25), M_KEY: pytest.approx(0.75)}
    m = STAREStep.verl_metrics(prepared)
    assert m["stare/gate_on"] == 1.0 and m["stare/num_pos_selected"] == 9 and m["stare/num_neg_selected"] == 4
    assert m["stare/num_tokens"] == 54 and m["stare/entropy"] == pytest.approx(h_bar, abs=1e-7)

    prepared2 = step.prepare(_data(0, entropy_shift=0.3), step=2)
    assert (prepared2.gate_on, prepared2.token_weights) == (False, None)
    assert (prepared2.reweight_w, prepared2.reweight_m) == (pytest.approx(1.2), pytest.approx(0.8))
    assert STAREStep.verl_metrics(prepared2)["stare/num_pos_selected"] == 0


def test_microbatch_scope_leaves_omega_to_the_workers():
    """Scope microbatch: the step decides the gate and W/M only (the workers select per micro-batch)."""
    data = _data(1)
    step = _step(scope="microbatch", target_entropy=10.0, adaptive=False)
    prepared = step.prepare(data, step=1)
    assert prepared.gate_on and prepared.token_weights is None and prepared.reweight_w == 1.2


def test_run_row_and_controller_state_survive_a_restart(tmp_path):
    """The row carries docs/design.md §4's required keys (RunWriter accepts it, read back equal); a fresh step object
    loaded with the saved state makes the same decision and ω on the next batch as the original."""
    step = _step(target_entropy=0.3)
    p1 = step.prepare(_data(2), step=1)
    writer = RunWriter(tmp_path / "run", step.run_config({"trainer": {"total_training_steps": 3}}, seed=7))
    writer.log(STAREStep.row(p1, 1, reward=0.25, extra={"time/step_s": 1.5}))
    writer.close()
    run = read_run(tmp_path / "run")
    row = run.metrics[0]
    assert set(REQUIRED_KEYS) <= set(row) and row["gate_on"] == int(p1.gate_on) and row["reward"] == 0.25
    assert row["stare_w"] == pytest.approx(p1.reweight_w) and row["entropy"] == pytest.approx(p1.entropy)
    assert run.config["source"] == "verl" and run.config["method"] == "c2" and run.config["seed"] == 7
    restored = _step(target_entropy=0.3)
    restored.load_state_dict(step.state_dict())
    a, b = step.prepare(_data(3), step=2), restored.prepare(_data(3), step=2)
    assert (a.gate_on, a.reweight_w, a.reweight_m) == (b.gate_on, b.reweight_w, b.reweight_m)
    assert (a.token_weights is None and b.token_weights is None) or torch.equal(a.token_weights, b.token_weights)
    with pytest.raises(DataError, match="controller"):
        restored.load_state_dict({"w": 1})


def test_a_batch_without_entropy_is_refused():
    data = _data(0)
    data.batch.pop("entropy")
    with pytest.raises(DataError, match=r"missing: \['entropy'\]"):
        _step().prepare(data, step=1)


def test_loss_config_from_the_launch_overrides(verl_config, actor_config):
    """The documented overrides give the core config they name, from the OmegaConf node (the driver) and from the
    dataclass (the workers) alike: C2, P 0.25, W 1.1, M 0.9, target 0.3, microbatch, ε 0.2 / 0.28, c 3."""
    for node in (verl_config.actor_rollout_ref.actor, actor_config):
        cfg = loss_config_from_actor(node)
        s = cfg.stare
        assert (cfg.loss_mode, cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.loss_agg_mode) == (
            "stare", 0.2, 0.28, 3.0, "token-mean")
        assert (s.variant, s.top_p_ratio, s.reweight_w, s.reweight_m, s.target_entropy, s.scope, s.gate) == (
            "C2", 0.25, 1.1, 0.9, 0.3, "microbatch", "entropy")


def test_promote_verl_format_composes_in_mainline_verl():
    """``stare-lab promote --format verl`` writes overrides that verl's own Hydra config accepts as they are, and the
    plugin reads back exactly the STARE and loss settings they were written from (C2, P 0.15, adaptive W/M,
    scope microbatch, clip 0.2 / 0.28, c 10)."""
    from types import SimpleNamespace

    from verl.utils.config import omega_conf_to_dataclass

    from _verl_cases import compose
    from trainer.planning.promote import _verl_lines

    stare = STAREConfig(variant="C2", top_p_ratio=0.15, reweight_w=1.2, reweight_m=0.85, target_entropy=0.4,
                        adaptive=True, alpha=0.02, w_max=1.4, m_min=0.6, scope="microbatch")
    loss = LossConfig(loss_mode="stare", clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, stare=stare)
    lines = _verl_lines(SimpleNamespace(loss=loss))
    cfg = compose(lines + ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert cfg.trainer.v1.trainer_mode == "stare" and cfg.trainer.use_v1
    back = loss_config_from_actor(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor))
    assert back.stare == stare
    assert (back.clip_ratio_low, back.clip_ratio_high, back.clip_ratio_c, back.loss_agg_mode) == (0.2, 0.28, 10.0,
                                                                                                  "token-mean")


def test_verls_own_file_logger_output_reads_as_a_run(tmp_path, monkeypatch):
    """The STARE metrics of two steps logged through verl's own ``Tracking`` file backend (as ``fit`` logs them) read
    back with ``stare-lab analyze``'s loader as a verl run: entropy = the step's H̄, gate and W/M as decided."""
    from verl.utils.tracking import Tracking

    from analysis.load import load_runs

    log = tmp_path / "verl_log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["file"], config={})
    step = _step(target_entropy=0.3, adaptive=False)
    prepared = [step.prepare(_data(0), step=1), step.prepare(_data(0, entropy_shift=0.3), step=2)]
    for t, p in enumerate(prepared, 1):
        tracking.log(data={**STAREStep.verl_metrics(p), "critic/score/mean": 0.1 * t, "timing_s/step": 3.0}, step=t)
    tracking.finish()
    (run,) = load_runs(log)
    assert (run.source, run.method, list(run.steps)) == ("verl", "stare", [1, 2])
    assert run.column("entropy").tolist() == pytest.approx([p.entropy for p in prepared], abs=1e-7)
    assert run.column("gate_on").tolist() == [1.0, 0.0] and run.column("stare_w").tolist() == [1.2, 1.2]
    assert run.column("reward").tolist() == pytest.approx([0.1, 0.2]) and run.column("time/step_s")[0] == 3.0
