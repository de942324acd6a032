"""The training loop (docs/design.md §3): one SPMD program, the same at every scale.

:func:`train` checks the config and the run directory (:mod:`trainer.run.preflight`), builds the run's collaborators
once (:class:`trainer.run.session.Session`), resumes from the latest complete checkpoint, and runs the steps
(:class:`trainer.step.runner.StepRunner`: collect → batch → old log-probs → prepare → update → sync → row). After
each step: the metrics row, the periodic checkpoint (model, optimizer, controller, data cursor, RNG), then the
periodic evaluation (its ``eval/…`` metrics are added to the step's row afterwards; a failing evaluation is
recorded and never loses the step). Steps are numbered from 1 (row N = the N-th optimizer update), as in the
simulators. Timing and throughput are under ``time/`` (``time/<phase>_s``, ``time/rollout_tokens_per_s``), so
every other key is reproducible across a resume.

Data parallelism: the ``train_batch_size`` prompts of a round are split over data-parallel groups (``dp_rank``);
with tensor-parallel vLLM (``tp > 1``) the ranks of a TP group generate the same prompts with the same seed,
rewards are graded once per TP group and broadcast, every count is taken once per TP group, and each rank then
keeps a disjoint share of the groups for the update. The memory transitions around the rollout engine are
:class:`trainer.engines.memory.ColocatedSchedule`'s; the engine's log-probs are checked and compared with the trainer's by
:mod:`trainer.step.importance`.

Tool use (``cfg.tool`` set): the engine is wrapped in :class:`trainer.tools.tool_rollout.ToolUseEngine`; each response's
``response_mask`` is multiplied by its ``loss_mask``, so interpreter tokens are left out of the loss, the entropy
statistics (``entropy``, the controller's H̄) and the STARE surprisal selection; rewards grade the model's own text
(``model_text``, interpreter output excluded); ``tool/…`` metrics (:func:`trainer.tools.tool_rollout.tool_metrics`, over
every generated response of the step) go into the row.

Defined behaviours: an all-filtered (or all-masked) batch skips the update (row with ``skipped=1``, entropy null, the
controller untouched); a reward function that raises gives reward 0 for that batch and is logged and counted
(``reward.on_error=zero``) or stops the run with a :class:`~stare_lab.errors.DataError` (``raise``). With
``schedule.measure_entropy_change=true`` every row also has the measured ``entropy_change`` (token-mean entropy on
the step's batch after the update minus before, nats) and the first-order predictions ``pred_entropy_change``
(∇θH̄·Δθ) and ``pred/d_grpo``, ``pred/d_lplus`` (``pred/d_lminus`` for C2) of :mod:`trainer.step.prediction`; they are
null otherwise. With ``schedule.probe_only=true`` no update is applied: each row carries the probe of its batch at
the unchanged weights, and no checkpoint or ``final_model`` is written. Test hooks: :mod:`trainer.faults`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from stare_lab.errors import ConfigError, RunError
from stare_lab.platform.outdir import existing_outputs
from stare_lab.platform.runlock import lock_dir

from trainer import paths
from trainer.run import preflight
from trainer.run.checkpoint import latest_checkpoint, save_checkpoint
from trainer.step.collect import compute_rewards, group_runner, step_seed  # noqa: F401 - re-exported
from trainer.config import TrainerConfig
from trainer.faults import fault
from trainer.engines.launch import cpu_env_defaults
from trainer.engines.memory import WeightVersions
from trainer.run.runlog import RUN_OUTPUTS, RunLogger, export_final_model, read_rows, summary_from_rows
from trainer.run.session import Session

logger = logging.getLogger(__name__)

__all__ = ["train", "compute_rewards", "step_seed", "group_runner"]


def _safe_evaluate(tr: Session, step: int, out: Path, ecfg: Any) -> dict[str, Any]:
    """Run the periodic evaluation of ``step`` AFTER its metrics row and checkpoint are on disk. A failure never
    loses the step and does not stop training: it is logged, appended to ``OUT/eval/errors.jsonl`` (step, error
    type, message) and recorded as ``eval/failed=1`` in the step's row. (Failures are assumed to happen on every
    rank alike — same engine inputs; a failure inside a collective on one rank only cannot be recovered here.)"""
    try:
        return {**tr.evaluate(step, out, ecfg), "eval/failed": 0}
    except Exception as err:  # noqa: BLE001 - a defined, logged behaviour (see docstring)
        logger.error("step %d: periodic evaluation failed (%s: %s); the step is saved, training continues",
                     step, type(err).__name__, err)
        if tr.dist.is_main:
            (out / "eval").mkdir(parents=True, exist_ok=True)
            with open(out / "eval" / "errors.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": step, "error": type(err).__name__, "message": str(err)}) + "\n")
        return {"eval/failed": 1}


def train(cfg: TrainerConfig) -> Path:
    """Run (or resume) training per ``cfg``; returns the run directory. Collective: every rank calls it.

    Order of a step's outputs: the metrics row, then the checkpoint (every ``schedule.save_freq`` steps and at the
    last step), then the periodic evaluation, whose ``eval/…`` metrics are added to that row afterwards
    (:meth:`trainer.run.runlog.RunLogger.amend`; a failed evaluation is recorded, see :func:`_safe_evaluate`). Step
    numbers count optimizer updates from 1 (row N = the N-th update; its ``entropy`` is measured before it). At the
    end the last checkpoint's HF export is published as ``OUT/final_model`` (weights, config, tokenizer). A run
    directory whose checkpoint is already at ``total_steps`` is not rebuilt: its summary is recomputed from
    metrics.jsonl and ``final_model`` published if missing; one beyond ``total_steps`` is refused (a resume does
    not shorten a run).

    The run directory (``OUT``) has one writer: rank 0 holds its lock (:func:`stare_lab.platform.runlock.lock_dir`) for the
    whole call, taken before anything in it is read for the resume decision, written or deleted. ``OUT`` holding
    a run (:data:`trainer.run.runlog.RUN_OUTPUTS`) is refused with ``schedule.resume=never`` (the default;
    ``stare-lab train --resume`` sets ``auto``, ``--overwrite`` removes the previous run first); with ``auto`` /
    ``must`` it is continued from its latest complete checkpoint, or — interrupted before its first checkpoint —
    restarted from step 0 (its rows are replaced), in both cases only if its config agrees on
    :data:`trainer.run.preflight.RESUME_KEYS`.

    Raises:
        ConfigError: bad config (missing model / data, indivisible batch, nothing to resume with resume=must,
            prompt + response budgets beyond the model's positions or the engine, a resume with other data/method
            settings, see :data:`trainer.run.preflight.RESUME_KEYS`).
        DataError: bad data records, a prompt too long with ``data.truncation=error``, a failing reward function
            with ``reward.on_error=raise``, unreadable benchmark data of the periodic evaluation.
        RunError: run directory not creatable, already holds a run and resume is ``never``, holds more steps than
            ``total_steps``, or is in use by another writer (:class:`stare_lab.platform.runlock.RunLockError`, naming it).
    """
    cpu_env_defaults()
    cfg.require_model_and_data()
    out = Path(cfg.out_dir)
    paths.check_out_dir(out)
    if int(os.environ.get("RANK", "0")) != 0:
        return _train(cfg, out)
    with lock_dir(out, command=f"stare-lab train (out_dir={out})"):
        return _train(cfg, out)


def _train(cfg: TrainerConfig, out: Path) -> Path:
    """:func:`train` after the lock."""
    ecfg = preflight.load_eval_config(cfg)
    preflight.check_lengths(cfg, paths.model_max_positions(cfg.model.path), ecfg)
    preflight.check_training(cfg)
    ckpt_root = out / "checkpoint"
    latest = latest_checkpoint(ckpt_root)
    s = cfg.schedule
    found = existing_outputs(out, RUN_OUTPUTS)
    if s.probe_only and found:
        raise ConfigError(f"schedule.probe_only=true writes a run directory of its own, but {str(out)!r} already "
                          "holds a run; give another out_dir, or --overwrite (to probe a checkpoint of that run, set "
                          "model.path to its checkpoint/step_N/hf)")
    if s.resume == "must" and not found:
        raise ConfigError(f"schedule.resume=must but {str(out)!r} holds no run to resume")
    if s.resume == "never" and found:
        raise RunError(f"{str(out)!r} already holds a run ({', '.join(found)}); pass --resume to continue it or "
                       "--overwrite to replace it (schedule.resume=never)")
    if found:
        preflight.check_resume_compatible(out, cfg)
    if found and latest is None and int(os.environ.get("RANK", "0")) == 0:
        # interrupted before its first checkpoint: the run restarts from step 0 and its rows are replaced
        logger.warning("%s holds a run without a complete checkpoint (interrupted before the first one): restarting "
                       "it from step 0", out)
        for name in ("metrics.jsonl", "summary.json"):
            (out / name).unlink(missing_ok=True)
    if latest is not None:

        done = int(json.loads((latest / "trainer_state.json").read_text())["step"])
        if done > s.total_steps:
            raise RunError(f"--resume: {str(out)!r} has {done} steps done, more than schedule.total_steps="
                           f"{s.total_steps}; a resume continues a run, it does not shorten it: give total_steps >= "
                           f"{done}, or --overwrite")
        if done == s.total_steps:  # nothing to do: never rebuild engines for a finished run
            if int(os.environ.get("RANK", "0")) == 0:
                rows = read_rows(out)
                old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
                summary = summary_from_rows(rows, done, int(old.get("resumed_from", 0)), config=cfg.to_dict())
                (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
                if not (out / "final_model" / "config.json").is_file():
                    export_final_model(latest, out)
            logger.info("%s already holds the finished run (%d steps); nothing to do", out, done)
            return out
    paths.make_out_dir(out)
    tr = Session(cfg, resume_from=latest)
    start = 0
    if latest is not None:
        state = tr.resume_state
        start = int(state["step"])
        if state.get("n_records") not in (None, len(tr.records)):
            raise ConfigError(f"{str(out)!r} was trained on {state['n_records']} records, data.train_files now "
                              f"holds {len(tr.records)}: the data changed; use another out_dir")
        tr.cursor.load_state_dict(state["cursor"])
        tr.controller.load_state_dict(state["controller"])
        tr.engine.sync_weights(tr.policy.iter_named_params(cfg.rollout.sync_bucket_mb * 2**20))
        tr.schedule.versions = WeightVersions(start)  # the policy restored at version `start`, the engine synced
        logger.info("resumed from %s (step %d)", latest, start)
    log = RunLogger(cfg, out, start, tr.dist.is_main)
    ckpt = latest
    for step in range(start + 1, s.total_steps + 1):
        row = tr.step(step)
        log.log(row)
        fault(step, "logged")
        if not s.probe_only and ((s.save_freq and step % s.save_freq == 0) or step == s.total_steps):
            ckpt = save_checkpoint(ckpt_root, step, tr.policy, tr.state(step), tr.tokenizer, s.keep_checkpoints)
        if ecfg is not None and (step % s.eval_freq == 0 or step == s.total_steps):
            log.amend(step, _safe_evaluate(tr, step, out, ecfg))
    dump = os.environ.get("STARE_LAB_DUMP_PARAMS")  # tests: each rank writes its gathered final parameters
    if dump:
        torch.save(tr.policy.full_state_dict(), f"{dump}.rank{tr.dist.rank}.pt")
    if tr.dist.is_main:
        summary = summary_from_rows(read_rows(out), s.total_steps, start, config=cfg.to_dict())
        log.close(summary)
        if not s.probe_only:  # a probe changes no weight: nothing to export
            path = export_final_model(ckpt, out)
            logger.info("final model: %s", path)
    return out
