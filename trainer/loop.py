"""The training loop (docs/design.md §3): one SPMD program, the same at every scale.

Per step: (1) take prompts from the deterministic cursor → (2) generate ``rollout.n`` responses per prompt →
(3) rewards (``trainer.rewards``; math-verify on the last ``\\boxed{}``, in the main thread) → (4) dynamic sampling
(``stare_lab.advantages.filter_groups``) for at most ``algorithm.max_gen_rounds`` rounds, then continue with what
was kept (logged) → (5) advantages (``group_advantages``) → (6) old log-probs + entropies (chunked, temperature
scaled) → (7) ``STAREController.update`` with the all-reduced token-mean entropy (every rank takes the same gate
decision), and ω = ``stare_token_weights`` over the *global* batch: every rank all-gathers the (surprisal,
advantage, mask) rows of all ranks, computes ω identically and keeps its own rows → (8) update with global
normalisers → (9) bucketed weight sync to the rollout engine → (10) metrics row, periodic checkpoint, then the
periodic evaluation (its ``eval/…`` metrics are added to the step's row afterwards; a failing evaluation is
recorded and never loses the step). Steps are numbered from 1 (row N = the N-th optimizer update); the simulators
number from 0. Timing and throughput are under ``time/`` (``time/<phase>_s``, ``time/rollout_tokens_per_s``), so
every other key is reproducible across a resume.

Steps 1–4 are :class:`trainer.collect.Collector`'s. Data parallelism: the ``train_batch_size`` prompts of a round
are split over data-parallel groups (``dp_rank``); with tensor-parallel vLLM (``tp > 1``) the ranks of a TP group
generate the same prompts with the same seed, rewards are graded once per TP group and broadcast, every count is
taken once per TP group, and each rank then keeps a disjoint share of the groups for the update. The memory
transitions around the rollout engine (sleep right after generation, staged wake-up, optional DeepSpeed offload,
the weight-version check) are :class:`trainer.memory.ColocatedSchedule`'s; the engine's log-probs are checked and
compared with the trainer's by :mod:`trainer.importance`.

Tool use (``cfg.tool`` set): the engine is wrapped in :class:`trainer.tool_rollout.ToolUseEngine`; each response's
``response_mask`` is multiplied by its ``loss_mask``, so interpreter tokens are left out of the loss, the entropy
statistics (``entropy``, the controller's H̄) and the STARE surprisal selection; rewards grade the model's own text
(``model_text``, interpreter output excluded); ``tool/…`` metrics (:func:`trainer.tool_rollout.tool_metrics`, over
every generated response of the step) go into the row.

Defined behaviours: an all-filtered (or all-masked) batch skips the update (row with ``skipped=1``, entropy null, the
controller untouched); a reward function that raises gives reward 0 for that batch and is logged and counted
(``reward.on_error=zero``) or stops the run with a :class:`~stare_lab.errors.DataError` (``raise``). The measured
``entropy_change`` (token-mean entropy on the step's batch after the update minus before, nats) is logged with
``schedule.measure_entropy_change=true`` (one extra no-grad forward) and is null otherwise; the first-order
prediction ``pred_entropy_change`` (∇θH̄·Δθ) is null in the trainer: under ZeRO-3 it would need the entropy gradient
outside DeepSpeed's gradient buffers and a copy of the pre-update parameters.

Test hooks: ``STARE_LAB_FAULT=STEP:PHASE`` (PHASE ∈ rollout, update, logged, eval) makes the process exit with code
137 at that point, as a kill would (``STEP:eval_error`` makes the periodic evaluation of STEP raise instead);
``STARE_LAB_DUMP_PARAMS=PREFIX`` makes every rank save its gathered final parameters to ``PREFIX.rank<R>.pt``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from stare_lab.errors import ConfigError, DataError

from .collect import Collector, compute_rewards, group_runner, step_seed  # noqa: F401 - re-exported
from .config import TrainerConfig

logger = logging.getLogger(__name__)

__all__ = ["train", "compute_rewards", "step_seed", "group_runner"]


def _fault(step: int, phase: str) -> None:
    spec = os.environ.get("STARE_LAB_FAULT")
    if spec and spec == f"{step}:{phase}":
        logger.error("STARE_LAB_FAULT=%s: exiting as if killed", spec)
        os._exit(137)


class _Trainer:
    """Holds the step's collaborators; :meth:`step` is docs/design.md §3 steps 1–9."""

    def __init__(self, cfg: TrainerConfig, resume_from: Path | None = None) -> None:
        from transformers import AutoTokenizer

        from stare_lab.stare import STAREController

        from .checkpoint import load_checkpoint, load_rng
        from .data import DataCursor, PromptEncoder, load_records
        from .launch import init_distributed
        from .memory import ColocatedSchedule, PhaseMemory
        from .policy import PolicyEngine
        from .rollout import make_engine

        self.cfg = cfg
        self.dist = init_distributed(cfg.rollout.tensor_parallel_size)
        if cfg.optim.train_batch_size % self.dist.dp_size:
            raise ConfigError(f"optim.train_batch_size={cfg.optim.train_batch_size} is not divisible by the number "
                              f"of data-parallel groups {self.dist.dp_size}")
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        tok_dir = cfg.model.tokenizer or cfg.model.path
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
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
            from .tool_rollout import ToolUseEngine

            self.engine = ToolUseEngine(self.engine, self.tokenizer, cfg.tool, runner=self._tool_runner())
        self.controller = STAREController(cfg.loss.stare)
        self.eos = {self.tokenizer.eos_token_id}
        self.schedule = ColocatedSchedule(self.engine, self.policy, bucket_bytes=cfg.rollout.sync_bucket_mb * 2**20,
                                          offload_during_rollout=offload, offloaded=offload)
        self.collector = Collector(cfg, self.dist, self.engine, self.encoder, self.records, self.cursor, self.policy,
                                   tp_group=self.tp_group, check_fresh=self.schedule.before_generation)
        self.memory = PhaseMemory()
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
        tensor-parallel vLLM, :func:`group_runner` so that the ranks of a TP group see identical tool outputs."""
        if self.dist.tp == 1:
            return None
        from .sandbox import run_many

        sandbox_cfg = self.cfg.tool.sandbox
        return group_runner(lambda codes: run_many(codes, sandbox_cfg), self.tp_group, self.dist.dp_rank * self.dist.tp)

    # -- phases ---------------------------------------------------------------------------------------------------

    def _batch(self, kept: list[dict[str, Any]], step: int):
        """Step 5: advantages per group (core), overlong masking, this rank's TrainBatch (its share of the TP
        group's groups). Raises DataError when the engine returned no (or bad) log-probs for a response."""
        from stare_lab.advantages import group_advantages

        from .importance import engine_logprobs
        from .policy import TrainBatch

        cfg, dist = self.cfg, self.dist
        if dist.tp > 1:
            kept = kept[dist.tp_rank::dist.tp]
        prompt_ids, resp, mask, advs, rlp = [], [], [], [], []
        n_trunc = 0
        for gi, g in enumerate(kept):
            adv = group_advantages(torch.tensor(g["rewards"], dtype=torch.float32), group_size=cfg.rollout.n,
                                   estimator=cfg.algorithm.advantage_estimator, eps=cfg.algorithm.adv_eps,
                                   quantile_k=cfg.algorithm.quantile_k).tolist()
            for j, (o, a) in enumerate(zip(g["outputs"], adv)):
                lps = engine_logprobs(o, f"step {step}, group {gi}, sample {j}")
                ids = list(o.token_ids) or [next(iter(self.eos))]
                truncated = o.finish_reason == "length"
                n_trunc += truncated
                m = 0.0 if (truncated and cfg.algorithm.overlong == "mask") or not o.token_ids else 1.0
                prompt_ids.append(list(o.prompt_token_ids))
                resp.append(ids)
                row_mask = [m] * len(ids)  # eos included: the mask comes from lengths, never from pad ids
                loss_mask = getattr(o, "loss_mask", None)
                if loss_mask and o.token_ids:  # tool use: interpreter tokens (loss_mask 0) leave the loss
                    if len(loss_mask) != len(ids):
                        raise DataError(f"rollout returned loss_mask of length {len(loss_mask)} for "
                                        f"{len(ids)} response tokens")
                    row_mask = [m * float(x) for x in loss_mask]
                mask.append(row_mask)
                advs.append(float(a))
                rlp.append(lps or [0.0])  # an empty response trains on one masked eos token (mask 0)
        return TrainBatch(prompt_ids, resp, mask, advs, rlp), n_trunc

    def _stare_weights(self, batch, old_lp) -> tuple[list[torch.Tensor] | None, dict[str, float]]:
        """Step 7b: ω once per step over the global batch (all-gathered; identical on every rank)."""
        from stare_lab.stare import stare_token_weights

        from .policy import pad_2d

        cfg = self.cfg
        if cfg.loss.loss_mode != "stare" or cfg.loss.stare.scope != "global":
            return None, {}
        mine = ([lp.tolist() for lp in old_lp], batch.advantages, batch.response_mask)
        parts = self.policy.all_gather_object(mine)
        lps = [r for p in parts for r in p[0]]
        advs = [a for p in parts for a in p[1]]
        masks = [m for p in parts for m in p[2]]
        width = max((len(r) for r in lps), default=1)
        w, stats = stare_token_weights(pad_2d(lps, 0.0, torch.float32, width), torch.tensor(advs),
                                       pad_2d(masks, 0.0, torch.float32, width), cfg.loss.stare,
                                       gate_on=self.controller.gate_on, reweight_w=self.controller.reweight_w,
                                       reweight_m=self.controller.reweight_m)
        offset = sum(len(p[0]) for p in parts[: self.dist.rank])
        mine_w = [w[offset + i, : len(r)].clone() for i, r in enumerate(batch.response_ids)]
        return mine_w, {k: float(v) for k, v in stats.items()}

    def _global_loss_stats(self, step: int, batch, old_lp, old_ent, gate: bool) -> dict[str, Any]:
        """Whole-step statistics the losses need (so every loss is invariant to micro-batching and world size):
        the STARE gate/W/M, the token-mean log-prob and advantage (Clip-Cov / KL-Cov covariance), the forking-token
        entropy threshold (global quantile, all-gathered), and a seeded generator for Clip-Cov's random subset."""
        from stare_lab.losses import forking_entropy_threshold

        from .policy import pad_2d

        cfg = self.cfg
        extras: dict[str, Any] = {}
        mode = cfg.loss.loss_mode
        if mode == "stare":
            extras.update(gate_on=gate, reweight_w=self.controller.reweight_w, reweight_m=self.controller.reweight_m)
        if mode in ("clip_cov", "kl_cov"):
            lp_sum = sum(float((lp * torch.tensor(m)).sum()) for lp, m in zip(old_lp, batch.response_mask))
            adv_sum = sum(a * sum(m) for a, m in zip(batch.advantages, batch.response_mask))
            red = self.policy.all_reduce([lp_sum, adv_sum, sum(sum(m) for m in batch.response_mask)])
            extras.update(logprob_mean=red[0] / max(red[2], 1.0), advantage_mean=red[1] / max(red[2], 1.0))
            gen = torch.Generator(device=self.policy.device).manual_seed(step_seed(cfg.seed, step, 0, self.dist.rank))
            extras["generator"] = gen
        if mode == "forking_tokens":
            parts = self.policy.all_gather_object(([e.tolist() for e in old_ent], batch.response_mask))
            ents = [r for p in parts for r in p[0]]
            masks = [r for p in parts for r in p[1]]
            width = max((len(r) for r in ents), default=1)
            thr = forking_entropy_threshold(pad_2d(ents, 0.0, torch.float32, width),
                                            pad_2d(masks, 0.0, torch.float32, width), cfg.loss.top_entropy_quantile)
            extras["entropy_threshold"] = float(thr)
        return extras

    def _entropy_after(self, batch, g_tok: float) -> float:
        """Token-mean entropy (nats) of the updated policy on ``batch`` — the same tokens, masks, temperature and
        float32 row sums as the pre-update H̄, so the difference is the update's effect alone. Collective."""
        t0 = time.perf_counter()
        _, ent = self.policy.compute_logprobs(batch)
        total = sum(float((e * torch.tensor(m)).sum()) for e, m in zip(ent, batch.response_mask))
        self.t["entropy_after"] = time.perf_counter() - t0
        return self.policy.all_reduce([total])[0] / g_tok

    def _row(self, step: int, batch, old_lp, old_ent, n_trunc: int, info: dict[str, float]) -> dict[str, Any]:
        """The step's metrics row before the update (docs/design.md §4 keys, rollout and engine-vs-trainer statistics;
        every rank-summed count taken once per TP group). Collective. ``entropy`` is filled in by the caller."""
        from .importance import rollout_diagnostics

        ent_sum = sum(float((e * torch.tensor(m)).sum()) for e, m in zip(old_ent, batch.response_mask))
        diag = rollout_diagnostics(old_lp, batch.rollout_logprobs, batch.response_mask)
        n_tok = sum(sum(m) for m in batch.response_mask)
        lengths = [len(r) for r in batch.response_ids]
        shared = self.collector.shared_totals()
        red = self.policy.all_reduce([ent_sum, n_tok, len(batch), n_trunc, sum(lengths), diag["ratio_sum"],
                                      diag["n_ratio"], diag["diff_sum"]])
        mx = self.policy.all_reduce([diag["diff_max"], max(lengths, default=0)], op="max")
        n_seq = red[2]
        self.sums = {"ent": red[0], "tok": red[1], "seq": n_seq, "gen_tokens": red[4]}
        row: dict[str, Any] = {"step": step, "entropy": None, "reward": info["reward"], "gate_on": int(
            self.controller.gate_on), "stare_w": self.controller.reweight_w, "stare_m": self.controller.reweight_m,
            "pred_entropy_change": None, "entropy_change": None}
        row.update({"accuracy": shared["accuracy"] / max(shared["n_gen"], 1), "reward/errors": shared["reward/errors"],
                    "gen_rounds": info["gen_rounds"], "kept_group_fraction": info["kept_group_fraction"],
                    "num_generated": info["num_generated"], "num_sequences": n_seq, "num_tokens": red[1],
                    "truncation_rate": red[3] / max(n_seq, 1), "response_length/mean": red[4] / max(n_seq, 1),
                    "response_length/max": mx[1], "rollout/logprob_diff_max": mx[0],
                    "rollout/logprob_diff_mean": red[7] / max(red[1], 1), "rollout/ratio_mean": red[5] / max(red[6], 1),
                    "prompts_truncated": shared["prompts_truncated"]})
        row.update(self.collector.round_stats())
        return row

    def step(self, step: int) -> dict[str, Any]:
        """One optimizer step (collective); returns its metrics row. The memory transitions around the engine are
        :class:`trainer.memory.ColocatedSchedule`'s (sleep right after generation, wake the weights, sync, wake
        the KV cache); ``memory/<phase>_peak_gib`` are logged on a GPU."""
        cfg, sch, mem = self.cfg, self.schedule, self.memory
        self.t = {k: 0.0 for k in ("rollout", "reward", "old_logprob", "update", "sync")}
        t_step = time.perf_counter()
        mem.start("rollout")
        kept, info = self.collector.collect(step)
        mem.stop("rollout")
        self.t.update(self.collector.timers)
        sch.after_generation()
        _fault(step, "rollout")
        batch, n_trunc = self._batch(kept, step)
        mem.start("old_logprob")
        t0 = time.perf_counter()
        old_lp, old_ent = self.policy.compute_logprobs(batch)
        self.t["old_logprob"] = time.perf_counter() - t0
        mem.stop("old_logprob")
        row = self._row(step, batch, old_lp, old_ent, n_trunc, info)
        g_tok, g_seq = self.sums["tok"], self.sums["seq"]
        if g_tok <= 0:
            logger.warning("step %d: no trainable tokens (all groups filtered or all responses masked); "
                           "skipping the update", step)
            row["skipped"] = 1
            sch.skipped_update()
        else:
            h_bar = self.sums["ent"] / g_tok
            row["entropy"] = h_bar
            gate = self.controller.update(h_bar) if cfg.loss.loss_mode == "stare" else False
            row.update(gate_on=int(gate), stare_w=self.controller.reweight_w, stare_m=self.controller.reweight_m)
            weights, wstats = self._stare_weights(batch, old_lp)
            row.update(wstats)
            _fault(step, "update")
            mem.start("update")
            t0 = time.perf_counter()
            extras = self._global_loss_stats(step, batch, old_lp, old_ent, gate)
            row.update(self.policy.update(batch, old_logprobs=old_lp, old_entropy=old_ent, token_weights=weights,
                                          loss_config=cfg.loss, global_num_tokens=g_tok, global_num_sequences=g_seq,
                                          loss_extras=extras))
            self.t["update"] = time.perf_counter() - t0
            mem.stop("update")
            sch.after_update()
            if cfg.schedule.measure_entropy_change:
                row["entropy_change"] = self._entropy_after(batch, g_tok) - h_bar
            mem.start("sync")
            t0 = time.perf_counter()
            sch.sync()
            self.t["sync"] = time.perf_counter() - t0
            mem.stop("sync")
            row["skipped"] = 0
        row.update(mem.row())
        for k, v in self.t.items():
            row[f"time/{k}_s"] = v
        row["time/step_s"] = time.perf_counter() - t_step
        row["time/rollout_tokens_per_s"] = self.sums["gen_tokens"] / max(self.t["rollout"], 1e-9)
        return row

    def evaluate(self, step: int, out: Path, ecfg: Any) -> dict[str, float]:
        """Periodic evaluation with the (just synced) rollout engine: ``trainer.evaluate.evaluate_engine`` with
        ``ecfg`` (:func:`trainer.preflight.load_eval_config`); returns the ``eval/...`` metrics. Every rank runs it
        (TP groups need all their ranks in ``generate``): each data-parallel group evaluates its share of the
        problems, rank 0 gathers them and writes ``OUT/eval/step_<N>/``; every rank gets the same metrics."""
        from .evaluate import evaluate_engine, flat_metrics

        _fault(step, "eval")
        if os.environ.get("STARE_LAB_FAULT") == f"{step}:eval_error":
            raise RuntimeError("STARE_LAB_FAULT: injected evaluation error")
        t0 = time.perf_counter()
        res = evaluate_engine(self.engine, self.tokenizer, ecfg,
                              out_dir=out / "eval" / f"step_{step}" if self.dist.is_main else None,
                              model_name=self.cfg.model.path, dist=self.dist)
        return {**flat_metrics(res), "time/eval_s": time.perf_counter() - t0}

    def state(self, step: int) -> dict[str, Any]:
        return {"step": step, "cursor": self.cursor.state_dict(), "controller": self.controller.state_dict(),
                "n_records": len(self.records)}


def _safe_evaluate(tr: _Trainer, step: int, out: Path, ecfg: Any) -> dict[str, Any]:
    """Run the periodic evaluation of ``step`` AFTER its metrics row and checkpoint are on disk. A failure never
    loses the step and does not stop training: it is logged, appended to ``OUT/eval/errors.jsonl`` (step, error
    type, message) and recorded as ``eval/failed=1`` in the step's row. (Failures are assumed to happen on every
    rank alike — same engine inputs; a failure inside a collective on one rank only cannot be recovered here.)"""
    import json

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
    (:meth:`trainer.runlog.RunLogger.amend`; a failed evaluation is recorded, see :func:`_safe_evaluate`). Step
    numbers count optimizer updates from 1 (row N = the N-th update; its ``entropy`` is measured before it). At the
    end the last checkpoint's HF export is published as ``OUT/final_model`` (weights, config, tokenizer). A run
    directory whose checkpoint is already at ``total_steps`` is not rebuilt: its summary is recomputed from
    metrics.jsonl and ``final_model`` published if missing.

    Raises:
        ConfigError: bad config (missing model / data, indivisible batch, nothing to resume with resume=must,
            prompt + response budgets beyond the model's positions or the engine, a resume with other data/method
            settings, see :data:`trainer.preflight.RESUME_KEYS`).
        DataError: bad data records, a prompt too long with ``data.truncation=error``, a failing reward function
            with ``reward.on_error=raise``, unreadable benchmark data of the periodic evaluation.
        RunError: run directory not creatable, or already holds a finished or foreign run and resume is ``never``.
    """
    from stare_lab.errors import RunError

    from . import preflight
    from .checkpoint import latest_checkpoint, save_checkpoint
    from .launch import cpu_env_defaults
    from .memory import WeightVersions
    from .runlog import RunLogger, export_final_model, read_rows, summary_from_rows

    cpu_env_defaults()
    cfg.require_model_and_data()
    out = Path(cfg.out_dir)
    preflight.check_out_dir(out)
    ecfg = preflight.load_eval_config(cfg)
    preflight.check_lengths(cfg, preflight.model_max_positions(cfg.model.path), ecfg)
    preflight.check_training(cfg)
    ckpt_root = out / "checkpoint"
    latest = latest_checkpoint(ckpt_root)
    s = cfg.schedule
    if s.resume == "must" and latest is None:
        raise ConfigError(f"schedule.resume=must but {str(ckpt_root)!r} holds no complete checkpoint")
    if s.resume == "never" and ((out / "metrics.jsonl").exists() or latest is not None):
        raise RunError(f"{str(out)!r} already holds a run and schedule.resume=never")
    if s.resume == "auto" and latest is None and (out / "metrics.jsonl").exists():
        raise RunError(f"{str(out)!r} holds a run without a checkpoint to resume from; choose another out_dir")
    if latest is not None:
        preflight.check_resume_compatible(out, cfg)
        import json

        done = int(json.loads((latest / "trainer_state.json").read_text())["step"])
        if done >= s.total_steps:  # nothing to do: never rebuild engines for a finished run
            if int(os.environ.get("RANK", "0")) == 0:
                rows = read_rows(out)
                old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
                summary = summary_from_rows(rows, done, int(old.get("resumed_from", 0)))
                (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
                if not (out / "final_model" / "config.json").is_file():
                    export_final_model(latest, out)
            logger.info("%s already holds the finished run (%d steps); nothing to do", out, done)
            return out
    preflight.make_out_dir(out)
    tr = _Trainer(cfg, resume_from=latest)
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
        _fault(step, "logged")
        if (s.save_freq and step % s.save_freq == 0) or step == s.total_steps:
            ckpt = save_checkpoint(ckpt_root, step, tr.policy, tr.state(step), tr.tokenizer, s.keep_checkpoints)
        if ecfg is not None and (step % s.eval_freq == 0 or step == s.total_steps):
            log.amend(step, _safe_evaluate(tr, step, out, ecfg))
    dump = os.environ.get("STARE_LAB_DUMP_PARAMS")  # tests: each rank writes its gathered final parameters
    if dump:
        torch.save(tr.policy.full_state_dict(), f"{dump}.rank{tr.dist.rank}.pt")
    if tr.dist.is_main:
        summary = summary_from_rows(read_rows(out), s.total_steps, start)
        log.close(summary)
        path = export_final_model(ckpt, out)
        logger.info("final model: %s", path)
    return out
