"""Steps 1–4 of a training step (docs/design.md §3): prompts from the cursor, generation, rewards, dynamic sampling.

:class:`Collector` runs rounds of generation until the batch is full or ``algorithm.max_gen_rounds`` rounds were
used. Data parallelism: the ``train_batch_size`` prompts of a round are split over data-parallel groups
(``dp_rank``); with tensor-parallel vLLM (``tp > 1``) the ranks of a TP group generate the same prompts with the
same seed, so they hold the same groups.

Tensor parallelism, counted once (issue 15). Everything a TP group holds in common — its kept groups, the number
of responses it generated, the grader's outcome counts, the truncated prompts — is contributed to the global sums
by the group's first rank only (:attr:`Collector.owner`), so no count is multiplied by ``tp`` and dynamic sampling
stops when the *distinct* kept groups fill the batch. Rewards are graded once per TP group, on its first rank, and
broadcast to the others as one tensor (:func:`broadcast_grades`; the tool outputs, text, by :func:`group_runner`): a timeout or a
grader error on one rank can never split a group's data.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from stare_lab.errors import DataError

from trainer.engines.rollout import RolloutOutput, SamplingConfig

logger = logging.getLogger(__name__)

__all__ = ["Collector", "compute_rewards", "step_seed", "group_runner", "on_group_source", "broadcast_grades",
           "COUNT_KEYS",
           "round_stat_keys"]

#: ``trainer.grading.rewards.math_reward`` status → metrics key (a count of responses per step, all rounds and ranks).
_GRADE_STATUS_KEYS = {"timeout": "reward/timeout", "no_answer": "reward/no_answer", "error": "reward/grade_error",
                      "rejected": "reward/rejected"}
#: Statistics of a generation round that are counts (summed); every other one is a per-response mean.
COUNT_KEYS = ("reward/errors", *_GRADE_STATUS_KEYS.values())
#: Tool metrics that are fractions of executed calls (weighted by calls, not by responses, when rounds and ranks
#: are combined); the other ``tool/…`` metrics are per-response means.
_PER_CALL_KEYS = ("tool/error_frac", "tool/timeout_frac")


def step_seed(seed: int, step: int, round_: int, dp_rank: int) -> int:
    """The sampling seed of one generation round (a function of the run seed, step, round and DP rank only, so a
    resumed run samples exactly what the uninterrupted one did)."""
    return int(np.random.SeedSequence([seed, step, round_, dp_rank]).generate_state(1)[0] & 0x7FFFFFFF)


def _reward_fn(kind: str) -> Callable[..., list[float]]:
    from trainer.grading import rewards

    return rewards.math_reward if kind == "math" else rewards.gsm8k_lenient_reward


def compute_rewards(cfg: Any, responses: Sequence[str], golds: Sequence[str],
                    fn: Callable[..., list[float]] | None = None) -> tuple[list[float], dict[str, float]]:
    """Rewards of ``responses`` against ``golds`` per :class:`trainer.config.RewardConfig` (the one place the
    trainer calls the reward code). Returns ``(rewards, stats)``: ``stats["reward/errors"]`` counts batches where
    the reward function raised; ``accuracy`` (and ``reward/format_rate`` when ``format_reward > 0``) are means over
    ``responses``; with ``kind="math"`` the grader's per-response outcomes are counted in
    ``reward/timeout`` (grading timed out), ``reward/no_answer`` (no ``\\boxed{}`` answer), ``reward/grade_error``
    (the grader raised on that item) and ``reward/rejected`` (answer too large to evaluate safely) — all graded 0.

    Raises:
        DataError: the reward function raised and ``on_error="raise"``, or it returned a wrong number of values or
            a non-finite value.
    """
    from trainer.grading import rewards as rw

    fn = fn or _reward_fn(cfg.kind)
    stats: dict[str, float] = {"reward/errors": 0.0}
    grade: dict[str, int] = {}
    try:
        if cfg.kind == "math":
            base = fn(responses, golds, timeout_s=cfg.timeout_s, on_error=cfg.on_error, stats=grade)
        else:
            base = fn(responses, golds, timeout_s=cfg.timeout_s)
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - a broken reward function is a defined, logged behaviour
        if cfg.on_error == "raise":
            raise DataError(f"reward function {getattr(fn, '__name__', fn)!r} raised {type(err).__name__}: {err}") \
                from err
        logger.error("reward function raised %s: %s; this batch gets reward 0", type(err).__name__, err)
        base = [0.0] * len(responses)
        stats["reward/errors"] = 1.0
    base = [float(b) for b in base]
    if len(base) != len(responses) or not all(math.isfinite(b) for b in base):
        raise DataError(f"reward function returned {len(base)} values for {len(responses)} responses "
                        "(or a non-finite value)")
    if cfg.kind == "math":
        for status, key in _GRADE_STATUS_KEYS.items():
            stats[key] = float(grade.get(status, 0))
    stats["accuracy"] = float(np.mean(base)) if base else 0.0
    if cfg.format_reward > 0:
        fmt = rw.format_reward(responses)
        base = [b + cfg.format_reward * f for b, f in zip(base, fmt)]
        stats["reward/format_rate"] = float(np.mean(fmt)) if fmt else 0.0
    return base, stats


def on_group_source(fn: Callable[[], Any], group: Any, src: int) -> Any:
    """Run ``fn()`` on global rank ``src`` only and broadcast its (picklable) result to every rank of ``group``
    (``broadcast_object_list``). Collective over ``group``: each of its ranks must call it, in the same order.
    An exception raised by ``fn`` on ``src`` propagates there only (the other ranks then wait; the launcher
    stops the job when ``src`` exits)."""
    import torch.distributed as tdist

    box = [fn() if tdist.get_rank() == src else None]
    tdist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def broadcast_grades(fn: Callable[[], tuple[list[float], dict[str, float]]], group: Any, src: int, n: int,
                     keys: Sequence[str], device: Any = "cpu") -> tuple[list[float], dict[str, float]]:
    """Run the grader ``fn() -> (rewards, stats)`` on global rank ``src`` only and broadcast its result to every rank
    of ``group`` as ONE float64 tensor (``n`` rewards, then ``stats[k]`` for ``k`` in ``keys``: numbers, so no
    pickling). Collective over ``group``, like :func:`on_group_source`.

    Raises:
        RunError: on ``src``, when ``fn`` returned another number of rewards or other statistic names than announced
            (the other ranks could not know them).
    """
    import torch.distributed as tdist

    from stare_lab.errors import RunError

    buf = torch.empty(n + len(keys), dtype=torch.float64, device=device)
    if tdist.get_rank() == src:
        rewards, stats = fn()
        if len(rewards) != n or set(stats) != set(keys):
            raise RunError(f"grader returned {len(rewards)} rewards and statistics {sorted(stats)}; expected {n} "
                           f"and {sorted(keys)}")
        buf.copy_(torch.tensor(list(rewards) + [stats[k] for k in keys], dtype=torch.float64))
    tdist.broadcast(buf, src=src, group=group)
    values = buf.cpu().tolist()
    return values[:n], dict(zip(keys, values[n:]))


def group_runner(run: Callable[[list[str]], list[Any]], group: Any, src: int) -> Callable[[list[str]], list[Any]]:
    """A tool runner for the ranks of one tensor-parallel group: global rank ``src`` executes the code with ``run``
    and broadcasts the results (:func:`on_group_source`); the other ranks never execute it.

    Why: the ranks of a TP group must feed vLLM identical contexts in every round. Executing the code on each rank
    could give different outputs (a timeout on one rank only, randomness, the clock) and the group would diverge
    or hang. Collective over ``group``: its ranks call the runner the same number of times (they do, as their
    contexts are identical).
    """
    def runner(codes: list[str]) -> list[Any]:
        return on_group_source(lambda: run(codes), group, src)

    return runner


def round_stat_keys(cfg: Any) -> tuple[str, ...]:
    """The reward / tool statistics a generation round reports beyond the fixed ones, known from the config alone
    (so every rank reduces the same names without exchanging them): the grader's outcome counts with
    ``reward.kind=math``, ``reward/format_rate`` with ``reward.format_reward > 0``, the ``tool/…`` metrics with
    ``tool`` set (:data:`trainer.tools.tool_rollout.TOOL_METRIC_KEYS`)."""
    keys: list[str] = []
    if cfg.reward.kind == "math":
        keys += list(_GRADE_STATUS_KEYS.values())
    if cfg.reward.format_reward > 0:
        keys.append("reward/format_rate")
    if cfg.tool is not None:
        from trainer.tools.tool_rollout import TOOL_METRIC_KEYS

        keys += list(TOOL_METRIC_KEYS)
    return tuple(keys)


#: Per-step totals every round adds to (besides :func:`round_stat_keys`).
_FIXED = ("n_gen", "accuracy", "reward/errors", "prompts_truncated", "reward_sum", "groups")


class Collector:
    """Steps 1–4: rounds of generation + rewards + dynamic sampling, for one rank.

    Args:
        cfg: the :class:`trainer.config.TrainerConfig`.
        dist: the :class:`trainer.engines.launch.DistInfo`.
        engine: the rollout engine (``generate``).
        encoder, records, cursor: the prompt encoder, the training records and the data cursor.
        comm: the :class:`trainer.engines.comm.Comm` (named reductions over all ranks).
        tp_group: this rank's tensor-parallel process group (``None`` when ``tp == 1``).
        check_fresh: called before every generation round (the weight-version check of
            :class:`trainer.engines.memory.WeightVersions`); ``None`` = no check.

    After :meth:`collect`, :attr:`acc` holds the step's per-rank accumulators (see :meth:`accumulate`),
    :attr:`timers` the seconds spent in ``rollout`` and ``reward``; :meth:`local_sums` and :meth:`row` turn them
    into the step's row entries (the caller reduces the sums together with its own, in one collective).
    """

    def __init__(self, cfg: Any, dist: Any, engine: Any, encoder: Any, records: list[dict[str, Any]], cursor: Any,
                 comm: Any, tp_group: Any = None, check_fresh: Callable[[], None] | None = None) -> None:
        self.cfg, self.dist, self.engine = cfg, dist, engine
        self.encoder, self.records, self.cursor, self.comm = encoder, records, cursor, comm
        self.tp_group = tp_group
        self.check_fresh = check_fresh
        self.stat_keys = round_stat_keys(cfg)
        self.acc: dict[str, float] = {}
        self.rounds = 0
        self.timers: dict[str, float] = {"rollout": 0.0, "reward": 0.0}

    @property
    def owner(self) -> float:
        """1.0 on the first rank of a TP group (which contributes the group's shared counts), else 0.0."""
        return 1.0 if self.dist.tp_rank == 0 else 0.0

    def _grade(self, prompts: list[Any], flat: list[RolloutOutput]) -> tuple[list[float], dict[str, float]]:
        """Rewards (+ DAPO's soft overlong penalty) and the round's reward / tool statistics of ``flat``."""
        cfg, r = self.cfg, self.cfg.rollout
        golds = [prompts[o.prompt_index].answer for o in flat]
        # tool use: grade the model's own text (an answer printed by the interpreter does not count)
        rewards, stats = compute_rewards(cfg.reward, [getattr(o, "model_text", o.text) for o in flat], golds)
        if cfg.tool is not None and flat:
            from trainer.tools.tool_rollout import tool_metrics

            stats.update(tool_metrics(flat))  # per-response means; re-weighted by count in accumulate()
        a = cfg.algorithm
        if a.overlong_buffer_len > 0 and a.overlong_penalty_factor > 0:  # DAPO soft overlong penalty
            start = r.max_response_length - a.overlong_buffer_len
            rewards = [rw - a.overlong_penalty_factor * min(1.0, max(0.0, (len(o.token_ids) - start)
                                                                    / a.overlong_buffer_len))
                       for rw, o in zip(rewards, flat)]
        return rewards, stats

    def generate_round(self, step: int, rnd: int) -> list[dict[str, Any]]:
        """Generate + reward one round; returns this DP group's groups (dicts with ``outputs``, ``rewards``).
        Rewards are graded on the TP group's first rank and broadcast (collective over the TP group)."""
        cfg, dist = self.cfg, self.dist
        per_dp = cfg.optim.train_batch_size // dist.dp_size
        idx = self.cursor.take(cfg.optim.train_batch_size)[dist.dp_rank * per_dp:(dist.dp_rank + 1) * per_dp]
        prompts = [self.encoder.encode(self.records[i], i) for i in idx]
        r = cfg.rollout
        sampling = SamplingConfig(n=r.n, max_tokens=r.max_response_length, seed=step_seed(cfg.seed, step, rnd,
                                  dist.dp_rank), temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                  stop=list(r.stop))
        if self.check_fresh is not None:
            self.check_fresh()
        t0 = time.perf_counter()
        outs = self.engine.generate([p.token_ids for p in prompts], sampling)
        self.timers["rollout"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        flat: list[RolloutOutput] = [o for g in outs for o in g]
        if dist.tp > 1:
            keys = ("reward/errors", "accuracy", *self.stat_keys)  # what compute_rewards (+ tool_metrics) report
            rewards, stats = broadcast_grades(lambda: self._grade(prompts, flat), self.tp_group,
                                              dist.dp_rank * dist.tp, len(flat), keys, self.comm.device)
        else:
            rewards, stats = self._grade(prompts, flat)
        self.timers["reward"] += time.perf_counter() - t0
        self.accumulate(stats, len(flat))
        self._add("n_gen", len(flat))
        self._add("reward_sum", sum(rewards))
        self._add("groups", len(outs))
        self._add("prompts_truncated", sum(p.truncated for p in prompts))
        return [{"outputs": g, "rewards": rewards[gi * r.n:(gi + 1) * r.n]} for gi, g in enumerate(outs)]

    def _add(self, key: str, value: float) -> None:
        self.acc[key] = self.acc.get(key, 0.0) + float(value)

    def collect(self, step: int) -> list[dict[str, Any]]:
        """Rounds of generation with dynamic sampling; returns the kept groups of this DP group. Collective (one
        named reduction per round under dynamic sampling)."""
        from stare_lab.loss.advantages import filter_groups

        cfg = self.cfg
        self.acc, self.timers = {}, {"rollout": 0.0, "reward": 0.0}
        quota = cfg.optim.train_batch_size // self.dist.dp_size
        kept: list[dict[str, Any]] = []
        rnd = 0
        while True:
            rnd += 1
            groups = self.generate_round(step, rnd)
            if cfg.algorithm.dynamic_sampling:
                flat = [rw for g in groups for rw in g["rewards"]]
                keep = filter_groups(torch.tensor(flat, dtype=torch.float32), group_size=cfg.rollout.n).tolist()
                groups = [g for gi, g in enumerate(groups) if keep[gi * cfg.rollout.n]]
            kept.extend(groups[: max(0, quota - len(kept))])
            if not cfg.algorithm.dynamic_sampling:
                break
            # distinct groups: one rank per TP group
            total_kept = self.comm.sum({"kept_groups": len(kept) * self.owner})["kept_groups"]
            if total_kept >= cfg.optim.train_batch_size or rnd >= cfg.algorithm.max_gen_rounds:
                if total_kept < cfg.optim.train_batch_size and self.dist.is_main:  # the same on every rank
                    logger.warning("step %d: dynamic sampling kept %d of %d groups after %d rounds; continuing "
                                   "with what was kept", step, int(total_kept), cfg.optim.train_batch_size, rnd)
                break
        self.rounds = rnd
        self.acc["kept_groups"] = float(len(kept))
        return kept

    def accumulate(self, stats: dict[str, float], n: int) -> None:
        """Add one generation round's ``stats`` (over ``n`` responses) to the step's accumulators: counts add up;
        means are weighted by their number of responses (per-call fractions by their number of calls)."""
        for k, v in stats.items():
            if k in COUNT_KEYS:
                self._add(k, v)
                continue
            w = round(stats["tool/calls_per_response"] * n) if k in _PER_CALL_KEYS else n
            self._add(k, v * w)
            self._add(f"weight:{k}", w)

    def local_sums(self) -> dict[str, float]:
        """This rank's contributions to the step's collected totals, keyed ``collect/<name>`` (each TP group counted
        once: only its first rank contributes). Reduce them with :meth:`trainer.engines.comm.Comm.sum` (with any other
        sums of the step) and pass the result to :meth:`row`.

        Raises:
            RunError: an accumulated statistic is not one :func:`round_stat_keys` announced (the names must be
                known from the config on every rank).
        """
        from stare_lab.errors import RunError

        extra = sorted(k for k in self.acc if not k.startswith("weight:") and k not in _FIXED
                       and k not in ("kept_groups",) and k not in self.stat_keys)
        if extra:
            raise RunError(f"round statistics {extra} are not in round_stat_keys(cfg) {list(self.stat_keys)}")
        w = self.owner
        out = {f"collect/{k}": self.acc.get(k, 0.0) * w for k in (*_FIXED, "kept_groups")}
        for k in self.stat_keys:
            out[f"collect/{k}"] = self.acc.get(k, 0.0) * w
            out[f"collect/weight:{k}"] = self.acc.get(f"weight:{k}", 0.0) * w
        return out

    def row(self, red: dict[str, float]) -> dict[str, float]:
        """The step's row entries from the reduced :meth:`local_sums`: ``gen_rounds``, ``kept_group_fraction``,
        ``reward`` (mean over every generated response, filtered ones included), ``num_generated``, ``accuracy``,
        ``reward/errors``, ``prompts_truncated`` and the round statistics (counts summed, means weighted by their
        number of responses — per-call fractions by their number of calls; 0.0 when there was none)."""
        g = lambda k: red[f"collect/{k}"]  # noqa: E731
        n_gen = g("n_gen")
        out = {"gen_rounds": self.rounds, "kept_group_fraction": g("kept_groups") / max(g("groups"), 1),
               "reward": g("reward_sum") / max(n_gen, 1), "num_generated": n_gen,
               "accuracy": g("accuracy") / max(n_gen, 1), "reward/errors": g("reward/errors"),
               "prompts_truncated": g("prompts_truncated")}
        for k in self.stat_keys:
            total, weight = g(k), g(f"weight:{k}")
            out[k] = total if k in COUNT_KEYS else (total / weight if weight > 0 else 0.0)
        return out
