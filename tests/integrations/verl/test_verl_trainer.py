"""The STARE v1 trainer's glue (stare_lab.integrations.verl_trainer) with a real Ray + TransferQueue: what verl's
``_update_actor`` hands the workers after the STARE step, seen through verl's own worker-side conversion
(``_meta_to_realdata``); the run-directory row; the controller state in a checkpoint folder. verl's full ``fit`` does
not run here (its rollout needs a vLLM/SGLang server: docs/integrations-verl.md "What runs on CPU"), so the actor
worker group is a stand-in that runs the real worker loss on what it receives."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.transferqueue_utils import _meta_to_realdata

from stare_lab.errors import ConfigError
from stare_lab.integrations.verl import GATE_KEY, M_KEY, W_KEY, WEIGHTS_KEY, STAREStep, loss_config_from_actor, \
    stare_ppo_loss
from stare_lab.integrations.verl_trainer import STATE_FILE, STARETrainer
from stare_lab.platform.runs import read_run

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import STARE_OVERRIDES, brute_force_weights, compose, make_batch  # noqa: E402

PROMPTS = [3, 5, 2, 4, 6, 1]


@pytest.fixture(scope="module")
def transfer_queue():
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


def _nested(x, lengths):
    return torch.nested.as_nested_tensor([x[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)


class ActorGroup:
    """Stands in for ``actor_rollout_wg``: receives the batch like a worker (TransferQueue → TensorDict with the
    batch's ``extra_info``) and runs the real worker loss on it as one micro-batch, on-policy (log π = log π_old)."""

    def __init__(self, actor_config):
        self.actor_config, self.seen, self.loss = actor_config, None, None

    def update_actor(self, batch):
        data = _meta_to_realdata(batch)
        self.seen = data
        full = []
        for p, lp in zip(data["prompts"].unbind(), data["old_log_probs"].unbind()):
            full.append(torch.cat([torch.full((p.numel() - 1,), -0.5), lp, torch.full((1,), -0.5)]))
        n_tok = int(data["response_mask"].values().sum())
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tok, global_batch_size=len(full))
        self.loss, _ = stare_ppo_loss(config=self.actor_config, model_output={
            "log_probs": torch.nested.as_nested_tensor(full, layout=torch.jagged)}, data=data)
        return {"metrics": {"mfu": [0.0], "pg_loss": [float(self.loss)]}}


def _trainer(tmp_path, actor_config, **stare):
    cfg = compose(STARE_OVERRIDES)
    OmegaConf.update(cfg, "trainer.default_local_dir", str(tmp_path / "ckpt"))
    trainer = STARETrainer.__new__(STARETrainer)  # verl's __init__ builds datasets and Ray pools: not needed here
    trainer.config = cfg
    loss = loss_config_from_actor(cfg.actor_rollout_ref.actor)
    trainer.stare = STAREStep(dataclasses.replace(loss, stare=dataclasses.replace(loss.stare, **stare)))
    trainer.stare_run, trainer._stare_prepared, trainer.global_steps, trainer._stare_resume_step = None, None, 1, 0
    trainer.actor_rollout_wg = ActorGroup(actor_config)
    return trainer


def test_update_actor_ships_gate_w_m_and_omega_to_the_workers(transfer_queue, tmp_path, actor_config, monkeypatch):
    """Scope global, gate forced on, C2 P 0.25 W 1.1 M 0.9: the worker receives the gate, W, M and, row by row, the ω
    of a brute-force selection over the whole batch; its on-policy loss is the closed form −Σ ω·Â / N (ρ ≡ 1, so
    no clip binds); verl's step metrics get ``stare/…``; ``_compute_metrics`` writes the run row."""
    tq = transfer_queue
    global_actor = dataclasses.replace(actor_config, policy_loss=dataclasses.replace(actor_config.policy_loss,
                                                                                     scope="global"),
                                       global_batch_info={})
    trainer = _trainer(tmp_path, global_actor, scope="global", gate="always")
    b = make_batch(seed=7)
    entropy = torch.rand(b.old_log_prob.shape, generator=torch.Generator().manual_seed(1)) * b.response_mask
    keys = [f"k{i}" for i in range(len(b.lengths))]
    fields = {"prompts": torch.nested.as_nested_tensor([torch.ones(p, dtype=torch.long) for p in PROMPTS],
                                                        layout=torch.jagged),
              "responses": _nested(torch.ones_like(b.response_mask, dtype=torch.long), b.lengths),
              "response_mask": _nested(b.response_mask.long(), b.lengths),
              "old_log_probs": _nested(b.old_log_prob, b.lengths), "advantages": _nested(b.advantages, b.lengths),
              "entropy": _nested(entropy, b.lengths)}
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict(fields, batch_size=len(keys)),
                            tags=[{"is_padding": False} for _ in keys])
    batch.extra_info["temperature"] = 1.0
    metrics: dict = {}
    trainer._update_actor(batch, metrics)

    seen = trainer.actor_rollout_wg.seen
    assert tu.get(seen, GATE_KEY) is True and tu.get(seen, W_KEY) == 1.1 and tu.get(seen, M_KEY) == 0.9
    assert tu.get(seen, "temperature") == 1.0  # verl's own extra_info survives
    omega = brute_force_weights(b.old_log_prob, b.advantages, b.response_mask, 0.25, 1.1, 0.9)
    got = seen[WEIGHTS_KEY].to_padded_tensor(1.0)
    mask = b.response_mask
    assert torch.equal(got[mask], omega[mask])
    want = -(omega * b.advantages)[mask].double().sum() / mask.sum()
    assert float(trainer.actor_rollout_wg.loss) == pytest.approx(float(want), rel=1e-6)
    assert metrics["stare/gate_on"] == 1.0 and metrics["stare/num_pos_selected"] == 9

    monkeypatch.setattr(PPOTrainerSync, "_compute_metrics",
                        lambda self, batch, metrics, *a, **k: metrics.update({"critic/score/mean": 0.5}))
    trainer._compute_metrics(batch, metrics, {"step": 2.0}, global_steps=1, epoch=0)
    trainer.stare_run.close()
    run = read_run(tmp_path / "ckpt" / "stare_run")
    assert [r["step"] for r in run.metrics] == [1] and run.metrics[0]["reward"] == 0.5
    assert run.metrics[0]["gate_on"] == 1 and run.metrics[0]["time/step_s"] == 2.0
    with pytest.raises(Exception, match="already holds a run"):  # a new run never overwrites one
        _trainer(tmp_path, global_actor).on_train_begin()
    resumed = _trainer(tmp_path, global_actor)
    resumed._stare_resume_step = 1  # resumed from a checkpoint at step 1: its row stays
    resumed.on_train_begin()
    resumed.stare_run.close()
    assert [r["step"] for r in read_run(tmp_path / "ckpt" / "stare_run").metrics] == [1]


def test_checkpoint_holds_the_controller(tmp_path, actor_config, monkeypatch):
    """``_save_checkpoint`` writes the controller state into ``global_step_N/`` (before verl's own save) and
    ``_load_checkpoint`` restores it; a checkpoint folder without it is refused with one line."""
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    trainer = _trainer(tmp_path, actor_config, adaptive=True, target_entropy=5.0)
    trainer.stare.controller.update(0.2)  # below the target: gate on, W + α, M − α
    trainer.global_steps = 4
    trainer._save_checkpoint()
    assert (tmp_path / "ckpt" / "global_step_4" / STATE_FILE).is_file()

    def fake_load(self):
        self.global_steps = 4

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", fake_load)
    other = _trainer(tmp_path, actor_config, adaptive=True, target_entropy=5.0)
    other._load_checkpoint()
    assert other.stare.controller.state_dict() == trainer.stare.controller.state_dict()
    assert other._stare_resume_step == 4
    os.remove(tmp_path / "ckpt" / "global_step_4" / STATE_FILE)
    with pytest.raises(Exception, match="stare_state.json is missing"):
        other._load_checkpoint()


def test_trainer_refuses_a_config_it_cannot_run():
    """One-line ConfigErrors before verl builds anything: a policy loss other than ``stare``, and more than one
    update batch per step (one controller update per step)."""
    vanilla = compose([o for o in STARE_OVERRIDES if "loss_mode" not in o and "_target_" not in o
                       and not o.startswith("+")])
    with pytest.raises(ConfigError, match="loss_mode=stare"):
        STARETrainer(vanilla)
    multi = compose(STARE_OVERRIDES + ["+trainer.v1.sync.parameter_sync_step=2"])
    with pytest.raises(ConfigError, match="parameter_sync_step=2"):
        STARETrainer(multi)
