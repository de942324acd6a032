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
several (those sharing :func:`~simulators.tabular.step.batch_key` advance together); both go through the simulators'
one run driver (:func:`simulators.driver.drive`: steps numbered from 1, checkpoint cadence, resume, interruption).

Two modes (one step each: :mod:`simulators.tabular.sampled`, :mod:`simulators.tabular.expected`; assembled by
:mod:`simulators.tabular.engine`):

* ``sampled``: each step draws G responses per prompt, rewards, group advantages (``stare_lab.loss.advantages``),
  optional dynamic sampling (:mod:`simulators.dynamic_sampling`), the core's step preparation
  (:func:`stare_lab.loss.step.prepare_step`: the STARE gate and W/M, ω, counts, the loss's declared statistics), and one
  plain SGD step on the logits. **Learning-rate scaling**: the
  update at every state is docs/theory.md §2's group update Δz = (lr/G) Σ_i Â_i ω_i (e_{a_i} − π)/τ, i.e.
  ``z ← z − lr·(n·L)·∂loss/∂z`` for the token-mean loss over the n·G·L tokens of n groups: ``lr`` means the same
  for every S, G and L. For ``grpo``/``o1``/``c2``/``o1-adaptive`` (token-mean, no entropy/KL term) the update is
  that closed form; every other loss (any registered one) calls the core's ``compute_policy_loss`` and chains its gradient with
  respect to the sampled log-probs through ∂log π_a/∂z = (e_a − π)/τ. Both are the gradient of the core loss
  (tested against autograd through ``compute_policy_loss`` and ``logprobs_from_logits``).
* ``expected``: the mean-field limit G → ∞ of the same objective (see :mod:`simulators.tabular.expected`); its gate
  and W/M come from the core's one gate rule (:func:`stare_lab.loss.step.step_gate`).

Every step logs, per run (besides ``stare_lab.platform.runs.REQUIRED_KEYS``): ``skipped`` (1 when dynamic sampling kept no
group: the update is skipped and the controller left as it is; the trainer's key); ``entropy`` = mean entropy over all S·L states
before the update (without dynamic sampling exactly the batch token-mean entropy, since every response visits every
position); ``entropy_change`` = the same mean after minus before; ``pred_entropy_change`` = the exact first order
⟨∂H/∂z, Δz⟩ of this step's Δz averaged the same way (∂H/∂z by autograd through ``stare_lab.loss.entropy``; equal to
``stare_lab.theory.first_order.predicted_entropy_change``); quadrant counts and summed first-order ΔH contributions (Â sign ×
surprisal above/below the critical surprisal s*, docs/theory.md §2); ``reward`` (mean reward), ``accuracy`` and
``pass@G`` (the verifiable rule without noise) over every response sampled in the step (all dynamic-sampling rounds,
as the trainer's ``reward``); ``time/*``; and the decomposition of docs/theory.md §7 (nats, same averaging):

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
* with a gradient-norm clip (``clip_rel``, :func:`simulators.tabular.engine.clip_factors`): ``clip/norm_ratio`` =
  ‖Δz‖/‖Δz_GRPO‖ of the step before the clip (null when the GRPO update is 0) and ``clip/factor`` = the scale
  min(1, clip_rel/ratio) applied to the whole step; every first-order key above (``pred_entropy_change``, the D
  terms, the push, the quadrants) is then of the clipped step, as a model's D terms are of its clipped update.

Checkpoints (logits, correct sets, RNG state, controller state; :mod:`simulators.driver`) make ``resume`` bit-exact.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Callable

import torch

from stare_lab.config import from_dict, to_dict
from stare_lab.loss.entropy import entropy_from_logits
from stare_lab.loss.stare import STAREController

from simulators.driver import drive
from simulators.run_stats import REGIME_RATIO, run_stats
from simulators.tabular.config import EXPECTED_METHODS, TabularSimConfig, resolve_target_entropy
from simulators.tabular.engine import TabularEngine, check_update
from simulators.tabular.step import BATCH_FIELDS, TabularBatch, TabularState, batch_key, stack_states
from simulators.tabular.tasks import init_tables, reward_optimal_entropy

logger = logging.getLogger(__name__)

__all__ = [
    "TabularSimConfig", "EXPECTED_METHODS", "TabularState", "TabularBatch", "init_state", "stack_states",
    "batch_key", "BATCH_FIELDS", "run", "run_batch", "config_from_overrides", "target_warning", "mean_entropy",
    "check_update", "TabularSimulator",
]

_WARNED: set[str] = set()


# ----------------------------------------------------------------------------------------------------------------
# state
# ----------------------------------------------------------------------------------------------------------------


def init_state(config: TabularSimConfig) -> TabularState:
    """Initial state of a run: logits and correct sets from :func:`simulators.tabular.tasks.init_tables` (seeded
    with ``init_seed``, default ``seed``: same seed → same start for every method); the rollout generator is seeded
    with 2**32 + ``seed``.

    If ``config.target_entropy_rel`` is set, this resolves H_tgt = rel × the reward-optimal entropy of the task
    (:func:`simulators.tabular.tasks.reward_optimal_entropy`) into ``config.loss.stare.target_entropy`` (mutating
    ``config``; :func:`run` passes a copy) before building the STARE controller, so the resolved target is what
    ``config.yaml`` records.
    """
    g_init = torch.Generator().manual_seed(config.seed if config.init_seed is None else config.init_seed)
    logits, correct = init_tables(config, g_init)
    g = torch.Generator().manual_seed(2**32 + config.seed)
    if config.target_entropy_rel is not None:
        config.loss.stare.target_entropy = config.target_entropy_rel * reward_optimal_entropy(config, correct)
    return TabularState(logits=logits, correct=correct, generator=g, controller=_controller(config))


def _controller(config: TabularSimConfig) -> STAREController | None:
    """The run's STARE controller, for a loss that uses the STARE gate and W/M (its declared needs)."""
    return STAREController(config.loss.stare) if config.is_stare else None


def target_warning(config: TabularSimConfig, h_opt: float) -> str | None:
    """A warning when the resolved target H_tgt (``loss.stare.target_entropy``) is above the reward-optimal
    entropy ``h_opt`` (nats, :func:`simulators.tabular.tasks.reward_optimal_entropy`), else ``None``.

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
    """Mean over all states of the entropy (nats) of softmax(logits / τ) (``stare_lab.loss.entropy``)."""
    return float(entropy_from_logits(logits, temperature=temperature).double().mean())


def resolved_config_dict(config: TabularSimConfig, initial_entropy: float, h_opt: float) -> dict[str, Any]:
    """What ``config.yaml`` holds: the resolved dataclass plus ``source``, ``simulator``, ``initial_entropy`` and
    ``reward_optimal_entropy`` (nats)."""
    return {
        "source": "simulator", "simulator": "tabular", **to_dict(config), "initial_entropy": initial_entropy,
        "reward_optimal_entropy": h_opt,
    }


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
        w_max=config.loss.stare.w_cap if config.is_stare else None,
        push_efficiency=1.0 if config.push_efficiency is None else float(config.push_efficiency),
        **_summary_keys(config),
    )
    return {"method": config.method, "seed": config.seed, "mode": config.mode, **stats}


def _summary_keys(config: TabularSimConfig) -> dict[str, Any]:
    """``variant`` and ``schedule`` for the run summary, as :func:`stare_lab.platform.summary.summary_settings` reads
    them from the run's ``config.yaml`` (the summary must be recomputable from the run directory)."""
    st = config.loss.stare
    return {"variant": st.variant, "schedule": st.schedule if config.is_stare and st.w_cap is not None else None}


def critical_window(config: TabularSimConfig) -> int:
    """Steps per window of the D terms in the critical-W estimates (:mod:`stare_lab.theory.critical`): 1 in expected mode
    (the exact mean-field series), 5 % of the run in sampled mode (sums over windows average the sampling noise)."""
    return 1 if config.mode == "expected" else max(1, config.steps // 20)


class TabularSimulator:
    """The tabular simulator as the run driver sees it (:class:`simulators.driver.Simulator`): runs sharing
    :func:`~simulators.tabular.step.batch_key` advance in one :class:`~simulators.tabular.engine.TabularEngine`."""

    def fresh(self, config: TabularSimConfig, run_dir: Path) -> tuple[TabularState, dict[str, Any]]:
        state = init_state(config)
        h_opt = reward_optimal_entropy(config, state.correct)
        warn = target_warning(config, h_opt) if config.is_stare else None
        if warn and warn not in _WARNED:  # once per process and message (a sweep has many such runs)
            _WARNED.add(warn)
            logger.warning("%s: %s", config.method, warn)
        return state, resolved_config_dict(config, mean_entropy(state.logits, config.temperature), h_opt)

    def restore(self, config: TabularSimConfig, run_dir: Path, saved: dict[str, Any]) -> tuple[TabularState, dict]:
        old = saved["config"]
        config.loss.stare.target_entropy = old["loss"]["stare"]["target_entropy"]  # resolved when the run began
        st = saved["state"]
        g = torch.Generator()
        g.set_state(st["rng"])
        controller = _controller(config)
        if controller is not None:
            controller.load_state_dict(st["controller"])
        state = TabularState(logits=st["logits"], correct=st["correct"], generator=g, controller=controller)
        return state, resolved_config_dict(config, old["initial_entropy"], old.get("reward_optimal_entropy"))

    def group(self, config: TabularSimConfig) -> tuple:
        return batch_key(config)

    def engine(self, configs: list[TabularSimConfig], states: list[TabularState]) -> TabularEngine:
        return TabularEngine(stack_states(configs, states))

    def summarize(self, config: TabularSimConfig, rows: list[dict[str, Any]], state: TabularState) -> dict[str, Any]:
        summary = summarize(rows, config, mean_entropy(state.logits, config.temperature))
        logger.debug("%s seed %d: entropy %.3f -> %.3f nats, reward %.3f", config.method, config.seed,
                     summary["initial_entropy"], summary["final_entropy"], summary["final_reward"])
        ratio = summary.get("push_ratio")
        if ratio is not None and ratio < REGIME_RATIO:
            what = "STARE's push acted" if config.is_stare and summary.get("gate_on_frac") else \
                "a probe push (W - 1 on the L+ tokens, not applied) would act"
            logger.warning(
                "%s seed %d (lr=%g): %s at %.0f%% of its first-order size (median over steps): the step size is "
                "outside the first-order regime; lower lr", config.method, config.seed, config.lr, what, 100 * ratio,
            )
        return summary


def run(
    config: TabularSimConfig,
    run_dir: str | os.PathLike,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run one tabular simulation (one method, one seed) into ``run_dir`` and return its summary
    (:func:`run_batch` with one run).

    Writes ``config.yaml`` (resolved config), ``metrics.jsonl`` (one row per step, steps 1 … ``steps``),
    ``summary.json`` and ``checkpoint/state.pt`` (every ``checkpoint_every`` steps and at the end). With
    ``resume=True`` and a checkpoint present, the run continues bit-exactly from it (rows past the checkpoint are
    dropped; ``steps`` may be raised to extend a finished run); without a checkpoint it starts afresh (overwriting
    any rows). :func:`simulators.driver.drive` has the details.

    Raises:
        RunError: the directory already holds a run and ``resume`` is False, cannot be written, or its checkpoint
            does not match ``config`` or its rows (a row up to the checkpoint missing:
            :func:`simulators.driver.check_resume`); or an update made the logits non-finite
            (:func:`~simulators.tabular.engine.check_update`). A run that started afresh and fails before
            completing a step removes what it wrote (``run_dir`` too, if then empty).
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

    Configs that do not share :func:`~simulators.tabular.step.batch_key`, or (on resume) checkpoints at different
    steps, are split into sub-batches run one after the other. ``progress(n)`` is called after each batched step
    with the number of runs it advanced. If a run's update diverges, that run stops (a fresh run without a completed
    step is removed) and the others finish; then the first such error is raised.

    Raises:
        RunError: as :func:`run`, for any of the runs.
    """
    return drive(TabularSimulator(), [copy.deepcopy(c) for c in configs], run_dirs, resume=resume, progress=progress)


def config_from_overrides(overrides: dict[str, Any] | None = None) -> TabularSimConfig:
    """Build a :class:`TabularSimConfig` from a nested dict of overrides (``from_dict``; errors name dotted keys).
    A ``loss.stare.target_entropy`` without ``target_entropy_rel`` switches the relative target off, as in
    ``stare-lab simulate`` (:func:`simulators.tabular.config.resolve_target_entropy`; both → ConfigError)."""
    data = copy.deepcopy(overrides or {})
    stare = (data.get("loss") or {}).get("stare") if isinstance(data.get("loss"), dict) else None
    resolve_target_entropy(data, isinstance(stare, dict) and "target_entropy" in stare, "target_entropy_rel" in data)
    return from_dict(TabularSimConfig, data)
