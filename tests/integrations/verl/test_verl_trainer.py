"""The STARE v1 trainer's own hooks (stare_lab.integrations.verl_trainer) one at a time, on a trainer built without
verl's ``__init__`` (``__new__``): the controller state in a checkpoint folder, the run directory on resume, the
configurations it refuses. Its real path — verl's ``__init__``, ``_setup``, ``fit`` with the FSDP2 actor worker,
checkpoints and a kill/resume — is tested in test_verl_real.py."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from stare_lab.errors import ConfigError
from stare_lab.integrations.verl import STAREStep, loss_config_from_actor
from stare_lab.integrations.verl_trainer import STATE_FILE, STARETrainer
from stare_lab.platform.runs import read_run

sys.path.insert(0, str(Path(__file__).parent))
from _verl_cases import STARE_OVERRIDES, compose  # noqa: E402


def _trainer(tmp_path, **stare):
    from omegaconf import OmegaConf

    cfg = compose(STARE_OVERRIDES)
    OmegaConf.update(cfg, "trainer.default_local_dir", str(tmp_path / "ckpt"))
    trainer = STARETrainer.__new__(STARETrainer)  # verl's __init__ builds datasets and Ray pools: not needed here
    trainer.config = cfg
    loss = loss_config_from_actor(cfg.actor_rollout_ref.actor)
    trainer.stare = STAREStep(dataclasses.replace(loss, stare=dataclasses.replace(loss.stare, **stare)))
    trainer.stare_run, trainer._stare_prepared, trainer._stare_reward = None, None, None
    trainer.global_steps, trainer._stare_resume_step = 1, 0
    return trainer


def test_resume_keeps_rows_up_to_the_checkpoint(tmp_path):
    """A new run refuses a run directory that already holds one; a run resumed from the checkpoint of step 2 keeps
    rows 1–2 and drops the rows written after it (a crash after step 3's row, before its checkpoint: step 3 is
    trained again and written once)."""
    first = _trainer(tmp_path)
    first._open_run()
    for step in (1, 2, 3):
        first.stare_run.log({"step": step, "entropy": 1.0, "reward": 0.0, "gate_on": 0, "stare_w": 1.1,
                             "stare_m": 0.9, "pred_entropy_change": None, "entropy_change": None})
    first.stare_run.close()
    with pytest.raises(Exception, match="already holds a run"):
        _trainer(tmp_path).on_train_begin()
    resumed = _trainer(tmp_path)
    resumed._stare_resume_step = 2
    resumed.on_train_begin()
    resumed.stare_run.close()
    assert [r["step"] for r in read_run(tmp_path / "ckpt" / "stare_run").metrics] == [1, 2]


def test_checkpoint_holds_the_controller(tmp_path, monkeypatch):
    """``_save_checkpoint`` writes the controller state into ``global_step_N/`` (before verl's own save) and
    ``_load_checkpoint`` restores it; a checkpoint folder without it is refused with one line."""
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    trainer = _trainer(tmp_path, adaptive=True, target_entropy=5.0)
    trainer.stare.controller.update(0.2)  # below the target: gate on, W + α, M − α
    trainer.global_steps = 4
    trainer._save_checkpoint()
    assert (tmp_path / "ckpt" / "global_step_4" / STATE_FILE).is_file()

    def fake_load(self):
        self.global_steps = 4

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", fake_load)
    other = _trainer(tmp_path, adaptive=True, target_entropy=5.0)
    other._load_checkpoint()
    assert other.stare.controller.state_dict() == trainer.stare.controller.state_dict()
    assert other._stare_resume_step == 4
    os.remove(tmp_path / "ckpt" / "global_step_4" / STATE_FILE)
    with pytest.raises(Exception, match="stare_state.json is missing"):
        other._load_checkpoint()


def test_trainer_refuses_a_config_it_cannot_run():
    """One-line ConfigErrors before verl builds anything: a policy loss other than ``stare``, more than one update
    batch per step (one controller update per step), and verl's rollout-correction bypass mode, in which verl
    copies the rollout's log-probs instead of running its old-log-prob pass and so computes no entropy (verl
    0.9.1 ``trainer_base.py`` ``_compute_old_log_prob``)."""
    vanilla = compose([o for o in STARE_OVERRIDES if "loss_mode" not in o and "_target_" not in o
                       and not o.startswith("+")])
    with pytest.raises(ConfigError, match="loss_mode=stare"):
        STARETrainer(vanilla)
    multi = compose(STARE_OVERRIDES + ["+trainer.v1.sync.parameter_sync_step=2"])
    with pytest.raises(ConfigError, match="parameter_sync_step=2"):
        STARETrainer(multi)
    bypass = compose(STARE_OVERRIDES + ["algorithm.rollout_correction.bypass_mode=True"])
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction\.bypass_mode=True: .*entropy"):
        STARETrainer(bypass)
    assert "\n" not in str(pytest.raises(ConfigError, STARETrainer, bypass).value)
