"""What a training run holds across steps, built once per process (collective): the distributed layout, data,
tokenizer, policy (DeepSpeed), rollout engine (vLLM / HF, optionally wrapped for tool use), STARE controller, the
memory schedule around the engine, the collector of steps 1–4 and the :class:`trainer.step.runner.StepRunner`
that runs a step. Also the periodic evaluation and the trainer state saved with checkpoints.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from stare_lab.errors import ConfigError

from trainer.step.collect import Collector, group_runner
from trainer.config import TrainerConfig
from trainer.faults import fault

logger = logging.getLogger(__name__)

__all__ = ["Session"]


class Session:
    """The run's collaborators (see the module docstring). Collective: every rank builds one.

    Args:
        cfg: the resolved :class:`trainer.config.TrainerConfig`.
        resume_from: a complete checkpoint directory to restore the policy (and, last, the RNGs) from, or None.

    Raises:
        ConfigError: ``optim.train_batch_size`` not divisible by the number of data-parallel groups.
    """

    def __init__(self, cfg: TrainerConfig, resume_from: Path | None = None) -> None:
        from transformers import AutoTokenizer

        from stare_lab.loss.stare import STAREController

        from trainer.run.checkpoint import load_checkpoint, load_rng
        from trainer.engines.comm import Comm
        from trainer.data import DataCursor, PromptEncoder, load_records
        from trainer.engines.launch import init_distributed
        from trainer.engines.memory import ColocatedSchedule, PhaseMemory
        from trainer.engines.policy import PolicyEngine
        from trainer.engines.rollout import make_engine
        from trainer.step.runner import StepRunner

        self.cfg = cfg
        self.dist = init_distributed(cfg.rollout.tensor_parallel_size)
        if cfg.optim.train_batch_size % self.dist.dp_size:
            raise ConfigError(f"optim.train_batch_size={cfg.optim.train_batch_size} is not divisible by the number "
                              f"of data-parallel groups {self.dist.dp_size}")
        self.comm = Comm()
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)
        if cfg.model.chat_template:
            self.tokenizer.chat_template = cfg.model.chat_template
        d = cfg.data
        self.records = load_records(d.train_files, d.prompt_key, d.answer_key, d.max_samples, d.answer_pattern)
        self.encoder = PromptEncoder(self.tokenizer, d.prompt_template, d.use_chat_template, d.max_prompt_length,
                                     d.truncation)
        self.cursor = DataCursor(len(self.records), cfg.seed, d.shuffle)
        self.policy = PolicyEngine(cfg, cfg.model.path, self.dist)
        # resume before anything else claims memory: DeepSpeed loads into its own (resident) states
        self.resume_state = load_checkpoint(resume_from, self.policy) if resume_from is not None else None
        offload = cfg.deepspeed.offload_during_rollout and torch.cuda.is_available()
        if offload:  # off the GPU before vLLM sizes its pool to the free memory
            self.policy.offload_states()
        self.engine = make_engine(cfg, cfg.model.path, world_size=self.dist.world_size)
        self.tp_group = self._tp_group()
        if cfg.tool is not None:  # multi-turn tool use: interpreter turns come back with loss_mask 0
            from trainer.tools.tool_rollout import ToolUseEngine

            self.engine = ToolUseEngine(self.engine, self.tokenizer, cfg.tool, runner=self._tool_runner())
        self.controller = STAREController(cfg.loss.stare)
        self.schedule = ColocatedSchedule(self.engine, self.policy, bucket_bytes=cfg.rollout.sync_bucket_mb * 2**20,
                                          offload_during_rollout=offload, offloaded=offload)
        self.collector = Collector(cfg, self.dist, self.engine, self.encoder, self.records, self.cursor, self.comm,
                                   tp_group=self.tp_group, check_fresh=self.schedule.before_generation)
        self.runner = StepRunner(cfg, self.dist, self.comm, self.policy, self.collector, self.controller,
                                 self.schedule, PhaseMemory(), eos_id=self.tokenizer.eos_token_id)
        if resume_from is not None:  # building the engines may draw from (or reseed) the RNGs: restore them last
            load_rng(resume_from, self.dist.rank)

    def _tp_group(self) -> Any:
        """This rank's tensor-parallel process group (``None`` when ``tp == 1``). Collective when ``tp > 1``: every
        rank creates every TP group, as ``new_group`` requires."""
        dist = self.dist
        if dist.tp == 1:
            return None
        import torch.distributed as tdist

        groups = [tdist.new_group(list(range(g * dist.tp, (g + 1) * dist.tp))) for g in range(dist.dp_size)]
        return groups[dist.dp_rank]

    def _tool_runner(self) -> Callable[[list[str]], list[Any]] | None:
        """The sandbox runner of the tool-use engine: the default (``None``) on one rank per TP group; with
        tensor-parallel vLLM, :func:`trainer.step.collect.group_runner` so that the ranks of a TP group see identical
        tool outputs."""
        if self.dist.tp == 1:
            return None
        from trainer.tools.sandbox import run_many

        sandbox_cfg = self.cfg.tool.sandbox
        return group_runner(lambda codes: run_many(codes, sandbox_cfg), self.tp_group, self.dist.dp_rank * self.dist.tp)

    def step(self, step: int) -> dict[str, Any]:
        """One optimizer step (collective): :meth:`trainer.step.runner.StepRunner.step`."""
        return self.runner.step(step)

    def evaluate(self, step: int, out: Path, ecfg: Any) -> dict[str, float]:
        """Periodic evaluation with the (just synced) rollout engine: ``trainer.evaluation.evaluate.evaluate_engine`` with
        ``ecfg`` (:func:`trainer.run.preflight.load_eval_config`); returns the ``eval/...`` metrics. Every rank runs it
        (TP groups need all their ranks in ``generate``): each data-parallel group evaluates its share of the
        problems, rank 0 gathers them and writes ``OUT/eval/step_<N>/``; every rank gets the same metrics."""
        from trainer.evaluation.evaluate import evaluate_engine, flat_metrics

        fault(step, "eval")
        if os.environ.get("STARE_LAB_FAULT") == f"{step}:eval_error":
            raise RuntimeError("STARE_LAB_FAULT: injected evaluation error")
        t0 = time.perf_counter()
        res = evaluate_engine(self.engine, self.tokenizer, ecfg,
                              out_dir=out / "eval" / f"step_{step}" if self.dist.is_main else None,
                              model_name=self.cfg.model.path, dist=self.dist)
        return {**flat_metrics(res), "time/eval_s": time.perf_counter() - t0}

    def state(self, step: int) -> dict[str, Any]:
        """The trainer state saved with a checkpoint: step, data cursor, controller, number of records."""
        return {"step": step, "cursor": self.cursor.state_dict(), "controller": self.controller.state_dict(),
                "n_records": len(self.records)}
