"""The STARE v1 trainer of verl 0.9 (``trainer.v1.trainer_mode=stare``; docs/integrations-verl.md), registered with
verl's ``register_trainer`` when verl loads stare_lab's ``verl.plugins`` entry point ``stare_trainer``.

It is verl's synchronous trainer (``PPOTrainerSync``: colocated rollout, one update per batch) plus, once per step,
between the advantages and the actor update (docs/theory.md §4 steps 2–4):

1. the step's ``response_mask``, ``old_log_probs``, ``advantages`` and ``entropy`` (computed by verl's old-log-prob
   pass, the source of ``actor/entropy``) are read from TransferQueue and padded into a :class:`verl.DataProto`;
2. :class:`~stare_lab.integrations.verl.STAREStep` updates the core's controller from H̄ and, for scope ``global``,
   selects ω over the whole step;
3. ω goes back to TransferQueue as the field ``stare_token_weights`` and the gate, W and M ride in the batch's
   ``extra_info``: the workers' loss (:func:`~stare_lab.integrations.verl.stare_ppo_loss`, installed once with
   ``actor_rollout_wg.set_loss_fn``) reads both;
4. the step's STARE metrics go to verl's logger (``stare/…``) and, at the end of :meth:`STARETrainer.step` — before
   verl's ``fit`` saves the step's checkpoint — one row to a stare_lab run directory (``metrics.jsonl``,
   :class:`~stare_lab.platform.runs.RunWriter`): ``trainer.stare_run_dir`` (default
   ``<trainer.default_local_dir>/stare_run``).

The controller's state is saved as ``stare_state.json`` in each ``global_step_N`` checkpoint folder (before verl
marks the checkpoint complete) and restored on resume, where the run directory keeps its rows up to that step and
drops later ones (they are trained again). Since a step's row is written before its checkpoint, a crash at any point
leaves every step with exactly one row after the resume (tests/integrations/verl/test_verl_real.py kills the run
with SIGKILL right after verl's checkpoint save).
"""

from __future__ import annotations

import json
import logging
import os
import time
from functools import partial
from typing import Any

from omegaconf import OmegaConf, open_dict
from tensordict import TensorDict

from stare_lab.errors import ConfigError, DataError
from stare_lab.integrations.verl import WEIGHTS_KEY, STAREStep, loss_config_from_actor, stare_ppo_loss
from stare_lab.platform.runs import RunWriter

logger = logging.getLogger(__name__)

try:  # verl's v1 stack; verl swallows a plugin's import error (at debug level), so say it here
    import transfer_queue as tq
    from verl import DataProto
    from verl.trainer.ppo.v1.trainer_base import register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.padding import response_to_nested
except ImportError as err:  # pragma: no cover - depends on the environment
    logger.warning("stare_lab: verl's v1 trainer cannot be imported (%s): trainer.v1.trainer_mode=stare is not "
                   "available (the policy loss 'stare' is); install stare-lab[verl]", err)
    raise

__all__ = ["STARETrainer", "TRAINER_MODE", "STATE_FILE"]

TRAINER_MODE = "stare"
STATE_FILE = "stare_state.json"


@register_trainer(TRAINER_MODE)
class STARETrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with STARE's once-per-step controller (module docstring).

    Raises:
        ConfigError: the policy loss is not ``stare`` with :class:`~stare_lab.integrations.verl.STAREPolicyLossConfig`,
            distillation is on, ``trainer.v1.sync.parameter_sync_step`` is not 1 (one controller update per step), or
            ``algorithm.rollout_correction.bypass_mode`` is on (verl then computes no entropy).
    """

    def __init__(self, config: Any) -> None:
        actor = config.actor_rollout_ref.actor
        mode = actor.policy_loss.get("loss_mode")
        if mode != "stare":
            raise ConfigError(f"trainer.v1.trainer_mode=stare needs actor_rollout_ref.actor.policy_loss.loss_mode="
                              f"stare, got {mode!r}")
        if config.get("distillation") is not None and config.distillation.get("enabled", False):
            raise ConfigError("trainer.v1.trainer_mode=stare does not support distillation.enabled=True")
        sync_step = config.trainer.v1.get("sync", {}).get("parameter_sync_step", 1)
        if sync_step != 1:
            raise ConfigError(f"trainer.v1.sync.parameter_sync_step={sync_step}: the STARE trainer updates its "
                              "controller once per step; allowed: 1")
        correction = config.algorithm.get("rollout_correction", None)
        if correction is not None and correction.get("bypass_mode", False):
            # verl's _compute_old_log_prob then copies rollout_log_probs and skips the pass that computes entropy
            raise ConfigError("algorithm.rollout_correction.bypass_mode=True: verl then skips its old-log-prob pass, "
                              "the only place it computes the token entropy, and the STARE trainer needs that entropy "
                              "every step (gate, controller, metrics); set bypass_mode=False")
        self.stare = STAREStep(loss_config_from_actor(actor))
        # verl's base reads the mode to pick the synchronous replay buffer and schedule: STARE runs that schedule
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        try:
            super().__init__(config)
        finally:
            with open_dict(config):
                config.trainer.v1.trainer_mode = TRAINER_MODE
        self.stare_run: RunWriter | None = None
        self._stare_prepared = None
        self._stare_reward: float | None = None
        self._stare_resume_step = 0  # the checkpoint step a resumed run continues from (0: a new run)

    # ---- setup: the workers' loss, the run directory
    def _setup(self) -> None:
        super()._setup()
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(stare_ppo_loss, config=actor_config))

    def _stare_run_dir(self) -> str:
        return str(self.config.trainer.get("stare_run_dir", None)
                   or os.path.join(self.config.trainer.default_local_dir, "stare_run"))

    def on_train_begin(self) -> None:
        """Open the run directory before the first step: a new run refuses a directory that already holds one
        (RunError, one line), a resumed run keeps its rows up to the checkpoint's step."""
        super().on_train_begin()
        self._open_run()

    def _open_run(self) -> RunWriter:
        if self.stare_run is None:
            cfg = self.stare.run_config(OmegaConf.to_container(self.config, resolve=True),
                                        seed=self.config.data.get("seed", None))
            resume = self._stare_resume_step > 0
            self.stare_run = RunWriter(self._stare_run_dir(), cfg, resume=resume)
            if resume:
                self.stare_run.truncate_after(self._stare_resume_step)
        return self.stare_run

    # ---- the step
    def step(self, metrics: dict, timing_raw: dict) -> Any:
        """verl's step (sample, old log-probs, advantages, the STARE step, the actor update), then the step's row in
        the run directory: ``fit`` saves the checkpoint right after this returns, so the row is on disk first.
        ``time/step_s`` is this call's wall time (rollout to update; not the checkpoint or validation)."""
        start = time.perf_counter()
        batch = super().step(metrics, timing_raw)
        if self._stare_prepared is not None:
            extra = {k: float(v) for k, v in metrics.items() if k.startswith("actor/") and isinstance(v, (int, float))}
            extra["time/step_s"] = time.perf_counter() - start
            self._open_run().log(self.stare.row(self._stare_prepared, self.global_steps, self._stare_reward, extra))
            self._stare_prepared, self._stare_reward = None, None
        return batch

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=[*STAREStep.FIELDS, "rm_scores"])
        response_mask = data["response_mask"]
        real = [not tag.get("is_padding", False) for tag in batch.tags]
        scores = data["rm_scores"].to_padded_tensor(0.0).sum(-1)[real]  # verl's critic/score/mean, computed here
        self._stare_reward = float(scores.mean()) if len(scores) else None
        prepared = self.stare.prepare(DataProto(batch=data.select(*STAREStep.FIELDS).to_padded_tensor()),
                                      step=self.global_steps)
        extra = dict(batch.extra_info)
        if prepared.token_weights is not None:
            weights = response_to_nested(prepared.token_weights, response_mask)
            batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                    fields=TensorDict({WEIGHTS_KEY: weights}, batch_size=len(batch.keys)))
            batch.extra_info.update(extra)
        batch.extra_info.update(self.stare.extra_info(prepared))
        metrics.update(self.stare.verl_metrics(prepared))
        self._stare_prepared = prepared
        return super()._update_actor(batch, metrics)

    # ---- checkpoint and resume
    def _save_checkpoint(self) -> None:
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.stare.state_dict(), fh)
        os.replace(tmp, os.path.join(folder, STATE_FILE))
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        self._stare_resume_step = max(int(self.global_steps), 0)
        if self.global_steps <= 0:
            return
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            folder = str(trainer.resume_from_path)
        else:
            folder = os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")
        path = os.path.join(folder, STATE_FILE)
        if not os.path.isfile(path):
            raise DataError(f"resuming step {self.global_steps}: {path} is missing (the checkpoint was not written by "
                            "the STARE trainer); start a new run or restore the file")
        with open(path, encoding="utf-8") as fh:
            self.stare.load_state_dict(json.load(fh))
        logger.info("STARE controller restored from %s", path)
