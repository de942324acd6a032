"""Tabular softmax-policy simulator of GRPO / STARE entropy dynamics (docs/theory.md §2, §4, §6, §7), batched over runs.

The policy is a table of free logits ``z[S, L, V]``: S prompts, L positions per response, V tokens; the token at
position l of a response to prompt p is drawn from softmax(z[p, l] / τ) independently of the other positions
(a *factored* sequence policy; ``task="bandit"`` is L = 1). Rewards come from a verifiable rule — each
(prompt, position) has a set of correct tokens and a response earns 1 iff at least ``threshold`` of its positions
are correct — or are ``random`` (Bernoulli(p), independent of the tokens: the near-criticality case).

**Batched runs.** Every function here works on a :class:`TabularBatch` of R runs (methods × seeds × grid points of
a sweep) stacked into one ``[R, S, L, V]`` tensor and advanced together, one step at a time; each run keeps its own
rollout generator, STARE controller, learning rate, W/M and target, so a run's numbers do not depend on which other
runs share its batch (tested: batched == one run at a time, bit for bit). :func:`run` is one run, :func:`run_batch`
several that share the shapes of :func:`batch_key`.

Two modes (one step each: :mod:`simulators.tabular_sampled`, :mod:`simulators.tabular_expected`):

* ``sampled``: each step draws G responses per prompt, rewards, group advantages (``stare_lab.advantages``),
  optional dynamic sampling, the STARE gate (``stare_lab.stare.STAREController``) and selection
  (``stare_lab.stare.stare_token_weights``), and one plain SGD step on the logits. **Learning-rate scaling**: the
  update at every state is docs/theory.md §2's group update Δz = (lr/G) Σ_i Â_i ω_i (e_{a_i} − π)/τ, i.e.
  ``z ← z − lr·(n·L)·∂loss/∂z`` for the token-mean loss over the n·G·L tokens of n groups: ``lr`` means the same
  for every S, G and L. For ``grpo``/``o1``/``c2``/``o1-adaptive`` (token-mean, no entropy/KL term) the update is
  that closed form; every other method calls the core's ``compute_policy_loss`` and chains its gradient with
  respect to the sampled log-probs through ∂log π_a/∂z = (e_a − π)/τ. Both are the gradient of the core loss
  (tested against autograd through ``compute_policy_loss`` and ``logprobs_from_logits``).
* ``expected``: the mean-field limit G → ∞ of the same objective (see :mod:`simulators.tabular_expected`).

Every step logs, per run (besides ``stare_lab.runs.REQUIRED_KEYS``): ``entropy`` = mean entropy over all S·L states
before the update (without dynamic sampling exactly the batch token-mean entropy, since every response visits every
position); ``entropy_change`` = the same mean after minus before; ``pred_entropy_change`` = the exact first order
⟨∂H/∂z, Δz⟩ of this step's Δz averaged the same way (∂H/∂z by autograd through ``stare_lab.entropy``; equal to
``stare_lab.entropy.predicted_entropy_change``); quadrant counts and summed first-order ΔH contributions (Â sign ×
surprisal above/below the critical surprisal s*, docs/theory.md §2); ``accuracy`` and ``pass@G`` (the verifiable rule
without noise); ``reward`` (mean reward of the step's first sampling round); ``time/*``; and the decomposition of
docs/theory.md §7 (nats, same averaging):

* ``pred/d_grpo``: first-order entropy change of this step's update with ω ≡ 1 (the GRPO update of the same
  rollouts); ``pred/d_lplus`` / ``pred/d_lminus``: the parts of it carried by the tokens STARE selects as L+ / L−
  (the top-P surprisal tokens of Â > 0 / Â < 0, selected on every step whatever the gate, so GRPO runs log them
  too). With the gate on, the step's first order is D_GRPO + (W − 1)·D_L+ (+ (M − 1)·D_L− for C2).
* ``stare/push_first_order`` = (W − 1)·D_L+ + (M − 1)·D_L− at the run's current W and M (M = 1 for O1 and non-STARE
  runs, whose W is ``loss.stare.reweight_w``); ``stare/push_measured`` = H(z + Δz_GRPO + push) − H(z + Δz_GRPO), the
  measured one-step effect of that push on the same rollouts (for a STARE run with the gate on: its actual push;
  otherwise a probe that is not applied); ``stare/push_ratio`` = measured / first order (null when the first order
  is 0). A ratio well below 1 means the step size is outside the first-order regime (docs/theory.md §7).
* ``stare/grpo_measured``: the measured one-step entropy change of the ω ≡ 1 update of the same rollouts (first and
  higher orders: its difference from ``pred/d_grpo`` is the second-order, in sampled mode noise-driven, drift).
* under dynamic sampling ``stare/gate_entropy``: the token-mean entropy of the kept batch that the gate saw.

Checkpoints (logits, correct sets, RNG state, controller state, step) make ``resume`` bit-exact.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from stare_lab.config import from_dict, to_dict
from stare_lab.errors import RunError
from stare_lab.runs import RunWriter

from .run_stats import REGIME_RATIO, run_stats
from .tabular_config import EXPECTED_METHODS, TabularSimConfig, resolve_target_entropy
from .tabular_tasks import init_tables, reward_optimal_entropy

logger = logging.getLogger(__name__)

__all__ = [
    "TabularSimConfig", "EXPECTED_METHODS", "TabularState", "TabularBatch", "init_state", "stack_states",
    "batch_key", "run", "run_batch", "config_from_overrides", "target_warning", "mean_entropy", "check_update",
]

CHECKPOINT_FILE = "state.pt"
_WARNED: set[str] = set()


# ----------------------------------------------------------------------------------------------------------------
# state
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TabularState:
    """The mutable state of one run: logits ``z [S, L, V]`` float64, ``correct [S, L, V]`` bool, the rollout
    ``generator``, the STARE ``controller`` (None for non-STARE methods) and the next ``step``."""

    logits: torch.Tensor
    correct: torch.Tensor
    generator: torch.Generator
    controller: Any
    step: int = 0


def init_state(config: TabularSimConfig) -> TabularState:
    """Initial state of a run: logits and correct sets from :func:`simulators.tabular_tasks.init_tables` (seeded
    with ``init_seed``, default ``seed``: same seed → same start for every method); the rollout generator is seeded
    with 2**32 + ``seed``.

    If ``config.target_entropy_rel`` is set, this resolves H_tgt = rel × the reward-optimal entropy of the task
    (:func:`simulators.tabular_tasks.reward_optimal_entropy`) into ``config.loss.stare.target_entropy`` (mutating
    ``config``; :func:`run` passes a copy) before building the STARE controller, so the resolved target is what
    ``config.yaml`` records.
    """
    g_init = torch.Generator().manual_seed(config.seed if config.init_seed is None else config.init_seed)
    logits, correct = init_tables(config, g_init)
    g = torch.Generator().manual_seed(2**32 + config.seed)
    if config.target_entropy_rel is not None:
        config.loss.stare.target_entropy = config.target_entropy_rel * reward_optimal_entropy(config, correct)
    return TabularState(logits=logits, correct=correct, generator=g, controller=_controller(config))


def _controller(config: TabularSimConfig):
    if not config.is_stare:
        return None
    from stare_lab.stare import STAREController

    return STAREController(config.loss.stare)


def target_warning(config: TabularSimConfig, h_opt: float) -> str | None:
    """A warning when the resolved target H_tgt (``loss.stare.target_entropy``) is above the reward-optimal
    entropy ``h_opt`` (nats, :func:`simulators.tabular_tasks.reward_optimal_entropy`), else ``None``.

    docs/theory.md §7: the policy uniform over the K correct tokens of a position has entropy ln K; every reward-optimal
    policy has at most that entropy, so a band above it can only be held by keeping probability on wrong answers.
    """
    target = float(config.loss.stare.target_entropy)
    if not target > h_opt + 1e-12:
        return None
    return (
        f"stare.target_entropy={target:.3g} nats is above the reward-optimal entropy {h_opt:.3g} nats of this task "
        "(the mean over positions of ln K, K = correct tokens: the policy uniform over the correct tokens): holding "
        "entropy there means keeping probability on wrong answers, so STARE can only hold it at a lower reward; "
        "use a target below it (e.g. target_entropy_rel=0.6)"
    )


def mean_entropy(logits: torch.Tensor, temperature: float) -> float:
    """Mean over all states of the entropy (nats) of softmax(logits / τ) (``stare_lab.entropy``)."""
    from stare_lab.entropy import entropy_from_logits

    return float(entropy_from_logits(logits, temperature=temperature).double().mean())


@dataclasses.dataclass
class TabularBatch:
    """R runs advanced together: ``configs`` (resolved, one per run), ``logits [R, S, L, V]`` float64,
    ``correct [R, S, L, V]`` bool, one rollout ``generators[r]`` and ``controllers[r]`` (or None) per run, and the
    common next ``step``. Per-run scalars used by the steps are cached as ``[R]`` float64 tensors: ``lr``,
    ``reward_noise``, ``random_reward_p``, ``top_p`` (STARE's P), ``entropy_coeff``; and bool ``is_stare``,
    ``is_c2`` (variant C2)."""

    configs: list[TabularSimConfig]
    logits: torch.Tensor
    correct: torch.Tensor
    generators: list[torch.Generator]
    controllers: list[Any]
    step: int = 0

    def __post_init__(self) -> None:
        f64 = lambda name: torch.tensor([float(getattr(c, name)) for c in self.configs], dtype=torch.float64)  # noqa: E731
        self.lr = f64("lr")
        self.reward_noise = f64("reward_noise")
        self.random_reward_p = f64("random_reward_p")
        self.top_p = torch.tensor([float(c.loss.stare.top_p_ratio) for c in self.configs], dtype=torch.float64)
        self.entropy_coeff = torch.tensor([float(c.loss.entropy_coeff) for c in self.configs], dtype=torch.float64)
        self.is_stare = torch.tensor([c.is_stare for c in self.configs])
        self.is_c2 = torch.tensor([c.is_stare and c.loss.stare.variant == "C2" for c in self.configs])
        # the selection of both sets L+ and L− (variant C2, marker weights 2 / 0.5) with each run's P, for the D terms
        self.marker_stare = [dataclasses.replace(c.loss.stare, variant="C2") for c in self.configs]

    @property
    def size(self) -> int:
        """R, the number of runs."""
        return len(self.configs)

    @property
    def base(self) -> TabularSimConfig:
        """The first run's config (every run shares the fields of :func:`batch_key`)."""
        return self.configs[0]

    def select(self, keep: list[int]) -> "TabularBatch":
        """The batch of runs ``keep`` (indices into this batch), in that order."""
        idx = torch.tensor(keep, dtype=torch.long)
        return TabularBatch(
            [self.configs[i] for i in keep], self.logits[idx], self.correct[idx],
            [self.generators[i] for i in keep], [self.controllers[i] for i in keep], self.step,
        )

    def push_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``[R]`` float64 (W − 1, M − 1) of each run's push at its current W and M (docs/theory.md §7): the STARE
        controller's values, ``loss.stare.reweight_w`` for non-STARE runs, M − 1 = 0 unless the variant is C2."""
        w, m = [], []
        for c, ctl in zip(self.configs, self.controllers):
            w.append((ctl.reweight_w if ctl is not None else c.loss.stare.reweight_w) - 1.0)
            c2 = ctl is not None and c.loss.stare.variant == "C2"
            m.append((ctl.reweight_m - 1.0) if c2 else 0.0)
        return torch.tensor(w, dtype=torch.float64), torch.tensor(m, dtype=torch.float64)


def stack_states(configs: list[TabularSimConfig], states: list[TabularState]) -> TabularBatch:
    """One :class:`TabularBatch` from per-run states (all at the same step; configs share :func:`batch_key`).

    Raises:
        RunError: if the states are at different steps.
    """
    steps = {s.step for s in states}
    if len(steps) != 1:
        raise RunError(f"cannot batch runs at different steps {sorted(steps)}")
    return TabularBatch(
        list(configs), torch.stack([s.logits for s in states]), torch.stack([s.correct for s in states]),
        [s.generator for s in states], [s.controller for s in states], steps.pop(),
    )


#: the config fields every run of one batch must share (shapes, mode, schedule); everything else is per run
BATCH_FIELDS = (
    "mode", "task", "reward", "num_prompts", "group_size", "seq_len", "vocab_size", "threshold", "steps",
    "temperature", "checkpoint_every", "advantage_estimator", "ds_max_rounds",
)


def batch_key(config: TabularSimConfig) -> tuple:
    """The values of :data:`BATCH_FIELDS`: runs with equal keys can share one :class:`TabularBatch`."""
    return tuple(getattr(config, f) for f in BATCH_FIELDS)


def check_update(config: TabularSimConfig, step: int, delta: torch.Tensor, logits: torch.Tensor) -> None:
    """Refuse an update that diverges: Δz and the updated logits z + Δz (``[S, L, V]``) must be finite.

    Raises:
        RunError: ``lr=<lr> made the logits non-finite at step <step>; lower lr`` (a diverged run would otherwise
            fail later with an error that does not name the cause, or write NaN rows).
    """
    if not (bool(torch.isfinite(delta).all()) and bool(torch.isfinite(logits + delta).all())):
        raise RunError(f"lr={config.lr:g} made the logits non-finite at step {step}; lower lr")


# ----------------------------------------------------------------------------------------------------------------
# checkpoint / resume
# ----------------------------------------------------------------------------------------------------------------

#: keys of the resolved config that may differ between a checkpoint and the resuming config
RESUMABLE_CHANGES = ("steps", "checkpoint_every")


def resolved_config_dict(config: TabularSimConfig, initial_entropy: float, h_opt: float) -> dict[str, Any]:
    """What ``config.yaml`` holds: the resolved dataclass plus ``source``, ``simulator``, ``initial_entropy`` and
    ``reward_optimal_entropy`` (nats)."""
    return {
        "source": "simulator", "simulator": "tabular", **to_dict(config), "initial_entropy": initial_entropy,
        "reward_optimal_entropy": h_opt,
    }


def _save_checkpoint(path: Path, batch: TabularBatch, r: int, cfg_dict: dict[str, Any]) -> None:
    """Atomically write run ``r``'s resume state (logits, correct sets, RNG state, controller, next step, config)."""
    ctl = batch.controllers[r]
    payload = {
        "step": batch.step,
        "logits": batch.logits[r].clone(),
        "correct": batch.correct[r].clone(),
        "rng": batch.generators[r].get_state(),
        "controller": None if ctl is None else ctl.state_dict(),
        "config": cfg_dict,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, config: TabularSimConfig) -> tuple[TabularState, dict[str, Any]]:
    """Rebuild a run's state from its checkpoint; the config must match the one it was written with (except
    :data:`RESUMABLE_CHANGES`).

    Raises:
        RunError: unreadable checkpoint, or a config that differs in another key (named in the message).
    """
    try:
        ck = torch.load(path, weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a damaged checkpoint
        raise RunError(f"cannot read checkpoint {str(path)!r}: {err}") from None
    saved = ck["config"]
    config.loss.stare.target_entropy = saved["loss"]["stare"]["target_entropy"]
    current = resolved_config_dict(config, saved["initial_entropy"], saved.get("reward_optimal_entropy"))
    for key in sorted(set(saved) | set(current)):
        if key in RESUMABLE_CHANGES or key == "versions":
            continue
        if saved.get(key) != current.get(key):
            raise RunError(
                f"cannot resume {str(path.parent.parent)!r}: {key}={current.get(key)!r} differs from the "
                f"checkpoint's {saved.get(key)!r}"
            )
    g = torch.Generator()
    g.set_state(ck["rng"])
    controller = _controller(config)
    if controller is not None:
        controller.load_state_dict(ck["controller"])
    state = TabularState(logits=ck["logits"], correct=ck["correct"], generator=g, controller=controller, step=ck["step"])
    return state, current


# ----------------------------------------------------------------------------------------------------------------
# the runs
# ----------------------------------------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]], config: TabularSimConfig, final_entropy: float) -> dict[str, Any]:
    """A run's ``summary.json`` (recomputable from ``metrics.jsonl``): ``method``, ``seed``, ``mode`` and the
    statistics of :func:`simulators.run_stats.run_stats` (entropy, collapse, reward, band, first-order fit, push
    ratio, critical W)."""
    stats = run_stats(
        rows, float(config.loss.stare.target_entropy), config.collapse_frac, config.band, final_entropy=final_entropy,
        reweight_m=config.loss.stare.reweight_m if config.is_stare and config.loss.stare.variant == "C2" else 1.0,
        window=critical_window(config),
    )
    return {"method": config.method, "seed": config.seed, "mode": config.mode, **stats}


def critical_window(config: TabularSimConfig) -> int:
    """Steps per window of the D terms in the critical-W estimates (:mod:`stare_lab.critical`): 1 in expected mode
    (the exact mean-field series), 5 % of the run in sampled mode (sums over windows average the sampling noise)."""
    return 1 if config.mode == "expected" else max(1, config.steps // 20)


class _Run:
    """Bookkeeping of one run inside :func:`run_batch`: its directory, writer, resolved config dict and whether it
    started afresh."""

    def __init__(self, config: TabularSimConfig, run_dir: Path, resume: bool) -> None:
        self.config, self.dir = config, Path(run_dir)
        self.ckpt = self.dir / "checkpoint" / CHECKPOINT_FILE
        if resume and self.ckpt.is_file():
            self.state, self.cfg_dict = _load_checkpoint(self.ckpt, config)
            (self.dir / "config.yaml").unlink(missing_ok=True)  # rewritten with the (possibly extended) steps
            self.writer = RunWriter(self.dir, self.cfg_dict, resume=True)
            self.writer.truncate_after(self.state.step - 1)
        else:
            self.state = init_state(config)
            h_opt = reward_optimal_entropy(config, self.state.correct)
            warn = target_warning(config, h_opt) if config.is_stare else None
            if warn and warn not in _WARNED:  # once per process and message (a sweep has many such runs)
                _WARNED.add(warn)
                logger.warning("%s: %s", config.method, warn)
            self.cfg_dict = resolved_config_dict(config, mean_entropy(self.state.logits, config.temperature), h_opt)
            self.writer = RunWriter(self.dir, self.cfg_dict, overwrite=resume)
        self.fresh_start = self.state.step
        self.error: BaseException | None = None
        self.rows: list[dict[str, Any]] = []  # the rows this call wrote (the summary of a fresh run uses them)

    def abandon(self) -> None:
        """Close the writer; a fresh run that completed no step leaves nothing behind."""
        self.writer.close()
        if self.fresh_start == 0 and self.state.step == 0:
            _remove_unfinished(self.dir)


def run(
    config: TabularSimConfig,
    run_dir: str | os.PathLike,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run one tabular simulation (one method, one seed) into ``run_dir`` and return its summary
    (:func:`run_batch` with one run).

    Writes ``config.yaml`` (resolved config), ``metrics.jsonl`` (one row per step), ``summary.json`` and
    ``checkpoint/state.pt`` (every ``checkpoint_every`` steps and at the end). With ``resume=True`` and a checkpoint
    present, the run continues bit-exactly from it (rows past the checkpoint are dropped; ``steps`` may be raised
    to extend a finished run); without a checkpoint it starts afresh (overwriting any rows).

    Raises:
        RunError: the directory already holds a run and ``resume`` is False, cannot be written, or its checkpoint
            does not match ``config``; or an update made the logits non-finite (:func:`check_update`). A run that
            started afresh and fails before completing a step removes what it wrote (``run_dir`` too, if then empty).
    """
    return run_batch([config], [run_dir], resume=resume, progress=progress)[0]


def run_batch(
    configs: list[TabularSimConfig],
    run_dirs: list[str | os.PathLike],
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run R tabular simulations together, one batched tensor computation per step, each into its own directory
    (the layout and semantics of :func:`run`); returns their summaries in order.

    Configs that do not share :func:`batch_key`, or (on resume) checkpoints at different steps, are split into
    sub-batches run one after the other. ``progress(n)`` is called after each batched step with the number of runs
    it advanced. If a run's update diverges, that run stops (a fresh run without a completed step is removed) and
    the others finish; then the first such error is raised.

    Raises:
        RunError: as :func:`run`, for any of the runs.
    """
    if len(configs) != len(run_dirs):
        raise ValueError("configs and run_dirs must have the same length")
    cfgs = [copy.deepcopy(c) for c in configs]
    runs: list[_Run] = []
    try:
        for c, d in zip(cfgs, run_dirs):
            runs.append(_Run(c, Path(d), resume))
    except BaseException:
        for r in runs:
            r.abandon()
        raise
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault((batch_key(r.config), r.state.step), []).append(i)
    summaries: list[dict[str, Any] | None] = [None] * len(runs)
    try:
        for idx in groups.values():
            _advance([runs[i] for i in idx], progress)
            for i in idx:
                if runs[i].error is None:
                    summaries[i] = _finish(runs[i])
    except BaseException:
        for r in runs:
            r.abandon()
        raise
    errors = [r.error for r in runs if r.error is not None]
    if errors:
        raise errors[0]
    return summaries  # type: ignore[return-value]


def _advance(runs: list[_Run], progress: Callable[[int], None] | None) -> None:
    """Step the runs (one compatible group) to their ``steps``, writing rows and checkpoints. The policy tables
    of the logits after each update serve both the finished step's rows (entropy after) and the next step."""
    from .tabular_step import batch_step, finish_rows, policy_tables

    batch = stack_states([r.config for r in runs], [r.state for r in runs])
    active = list(range(len(runs)))
    steps, every, tau = batch.base.steps, batch.base.checkpoint_every, batch.base.temperature
    pol = policy_tables(batch.logits, tau) if batch.step < steps else None
    while batch.step < steps and active:
        t0 = time.perf_counter()
        delta, rows, pending = batch_step(batch, pol)
        finite = torch.isfinite(delta).flatten(1).all(1) & torch.isfinite(batch.logits + delta).flatten(1).all(1)
        failed = []
        for j in (~finite).nonzero().flatten().tolist():
            i = active[j]
            try:
                check_update(runs[i].config, batch.step, delta[j], batch.logits[j])
            except RunError as err:
                runs[i].error = err
                failed.append(j)
        if failed:
            for j in failed:
                runs[active[j]].abandon()
            keep = [j for j in range(len(active)) if j not in failed]
            active = [active[j] for j in keep]
            if not active:
                break
            batch, delta, rows, pending = batch.select(keep), delta[keep], [rows[j] for j in keep], pending.select(keep)
        batch.logits = batch.logits + delta
        pol = policy_tables(batch.logits, tau)
        finish_rows(rows, pending, pol.entropy.mean((-1, -2)))
        wall = (time.perf_counter() - t0) / len(active)
        for j, i in enumerate(active):
            row = rows[j]
            row["step"] = batch.step
            row["time/step_s"] = wall
            runs[i].writer.log(row := _ordered(row))
            runs[i].rows.append(row)
        batch.step += 1
        for j, i in enumerate(active):
            runs[i].state = TabularState(batch.logits[j], batch.correct[j], batch.generators[j], batch.controllers[j],
                                         batch.step)
            if batch.step % every == 0 or batch.step == steps:
                _save_checkpoint(runs[i].ckpt, batch, j, runs[i].cfg_dict)
        if progress is not None:
            progress(len(active))


def _finish(r: _Run) -> dict[str, Any]:
    from stare_lab.runs import read_run

    r.writer.close()
    # a fresh run's rows are exactly those this call wrote; a resumed one also has the rows before its checkpoint
    rows = r.rows if r.fresh_start == 0 else read_run(r.dir).metrics
    summary = summarize(rows, r.config, mean_entropy(r.state.logits, r.config.temperature))
    r.writer.write_summary(summary)
    logger.debug(
        "%s seed %d: entropy %.3f -> %.3f nats, reward %.3f", r.config.method, r.config.seed,
        summary["initial_entropy"], summary["final_entropy"], summary["final_reward"],
    )
    ratio = summary.get("push_ratio")
    if ratio is not None and ratio < REGIME_RATIO:
        what = "STARE's push acted" if r.config.is_stare and summary.get("gate_on_frac") else \
            "a probe push (W - 1 on the L+ tokens, not applied) would act"
        logger.warning(
            "%s seed %d (lr=%g): %s at %.0f%% of its first-order size (median over steps): the step size is outside "
            "the first-order regime; lower lr", r.config.method, r.config.seed, r.config.lr, what, 100 * ratio,
        )
    return summary


def _remove_unfinished(run_dir: Path) -> None:
    """Remove the files a fresh run wrote before its first step completed, then ``run_dir`` if it is empty."""
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        (run_dir / name).unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:  # something else is in it: leave it
        pass


def _ordered(row: dict[str, Any]) -> dict[str, Any]:
    """Required keys first (in :data:`stare_lab.runs.REQUIRED_KEYS` order), then the rest sorted."""
    from stare_lab.runs import REQUIRED_KEYS

    out = {k: row.get(k) for k in REQUIRED_KEYS}
    out.update({k: row[k] for k in sorted(row) if k not in out})
    return out


def config_from_overrides(overrides: dict[str, Any] | None = None) -> TabularSimConfig:
    """Build a :class:`TabularSimConfig` from a nested dict of overrides (``from_dict``; errors name dotted keys).
    A ``loss.stare.target_entropy`` without ``target_entropy_rel`` switches the relative target off, as in
    ``stare-lab simulate`` (:func:`simulators.tabular_config.resolve_target_entropy`; both → ConfigError)."""
    data = copy.deepcopy(overrides or {})
    stare = (data.get("loss") or {}).get("stare") if isinstance(data.get("loss"), dict) else None
    resolve_target_entropy(data, isinstance(stare, dict) and "target_entropy" in stare, "target_entropy_rel" in data)
    return from_dict(TabularSimConfig, data)

