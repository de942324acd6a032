"""Tabular softmax-policy simulator of GRPO / STARE entropy dynamics (docs/theory.md §2, §4, §6).

The policy is a table of free logits ``z[S, L, V]``: S prompts, L positions per response, V tokens; the token at
position l of a response to prompt p is drawn from softmax(z[p, l] / τ) independently of the other positions
(a *factored* sequence policy; ``task="bandit"`` is L = 1). Rewards come from a verifiable rule — each
(prompt, position) has ``num_correct`` correct tokens and a response earns 1 iff at least ``threshold`` of its
positions are correct — or are ``random`` (Bernoulli(p), independent of the tokens: the near-criticality case).

Two modes:

* ``sampled``: each step draws G responses per prompt, computes rewards, group advantages
  (``stare_lab.advantages``), optional dynamic sampling, the STARE gate/weights (``stare_lab.stare``) and the loss
  (``stare_lab.losses.compute_policy_loss``, the same code path as the trainer), backpropagates to the logits and
  takes one plain SGD step. **Learning-rate scaling**: the loss is a token-mean over the n·G·L tokens of the batch
  (n groups), so ∂loss/∂z[p, l] carries a factor 1/(n·G·L). The update is ``z ← z − lr · (n·L) · ∂loss/∂z``, which
  for GRPO at ρ = 1 is exactly docs/theory.md §2's group update Δz = (lr/G) Σ_i Â_i ω_i (e_{a_i} − π) at every state:
  ``lr`` means the same for every S, G and L.
* ``expected`` (:mod:`simulators.tabular_expected`): the mean-field limit G → ∞ of the same objective. Â → (r − p̄_p)/σ_p per prompt (p̄_p = P(r = 1),
  σ_p = sqrt(p̄_p(1 − p̄_p)), the G → ∞ limit of the unbiased group std), and the expected update at state (p, l) is
  Δz_k = (lr/τ) · π_k (B_k − Σ_j π_j B_j), B_k = E[ω Â | a_l = k] (Cui et al.'s expected PG; for GRPO B_k = A_k and
  the first-order entropy change is the covariance law −lr·Cov_π(log π, π A), docs/theory.md §2). The conditional
  reward law is exact (Poisson-binomial over the other positions). STARE's top-P selection becomes a threshold on
  surprisal: the fraction P of the probability mass of T+ (T−) with the highest surprisal gets W (M); the boundary
  token gets the fractional weight. Approximations, documented: finite-G effects (the sample std, all-equal groups
  with Â = 0, the max(1, ·) in k = max(1, ⌈P·|T±|⌉)) are dropped. Random rewards give B ≡ 0 for GRPO: the
  mean-field update is exactly zero (the near-criticality point), so collapse under random rewards is a pure
  sampling-noise effect that only ``sampled`` mode shows. ``expected`` supports the methods grpo, grpo-ds (≡ grpo in
  the limit: no group has zero variance), o1, c2, o1-adaptive and entropy_bonus.

Every step logs (besides ``stare_lab.runs.REQUIRED_KEYS``): ``entropy`` = mean entropy over all S·L states before
the update (for the batch of a step without dynamic sampling this is exactly the batch token-mean entropy, since
every response visits every position of its prompt); ``entropy_change`` = the same mean after minus before;
``pred_entropy_change`` = ``stare_lab.entropy.predicted_entropy_change(z, Δz)`` averaged the same way (the exact
first order of this step's Δz); ``pred/phi_tokens`` = Σ over sampled tokens of c·Φ(a) / (S·L), where c is the
token's coefficient in Δz = Σ c (e_a − π) (excludes the entropy-bonus term); quadrant counts and summed ΔH
contributions (Â sign × surprisal above/below ``critical_surprisal``); the STARE selected fractions; ``accuracy``
and ``pass@G`` (the verifiable rule without noise: task success, also under random rewards); ``reward`` (mean
reward of the step's first sampling round over all prompts); ``time/*`` timings. Checkpoints (logits, RNG state, controller state, step) make ``resume`` bit-exact.
"""

from __future__ import annotations

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

from .run_stats import run_stats
from .tabular_config import EXPECTED_METHODS, TabularSimConfig, resolve_target_entropy

logger = logging.getLogger(__name__)

__all__ = [
    "TabularSimConfig", "EXPECTED_METHODS", "TabularState", "run", "init_state", "sampled_step", "config_from_overrides",
]

CHECKPOINT_FILE = "state.pt"


# ----------------------------------------------------------------------------------------------------------------
# state
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TabularState:
    """The mutable state of a run: logits ``z [S, L, V]`` float64, ``correct [S, L, V]`` bool, the sampling
    ``generator``, the STARE ``controller`` (None for non-STARE methods) and the next ``step``."""

    logits: torch.Tensor
    correct: torch.Tensor
    generator: torch.Generator
    controller: Any
    step: int = 0


def init_state(config: TabularSimConfig) -> TabularState:
    """Initial state of a run: logits z ~ N(0, init_spread²) and the correct sets (K random tokens per state),
    both drawn from a ``torch.Generator`` seeded with ``init_seed`` (default ``seed``; same seed → same start for
    every method); the rollout generator is seeded with 2**32 + ``seed``.

    If ``config.target_entropy_frac`` is set, this resolves H_tgt = frac × initial mean entropy into
    ``config.loss.stare.target_entropy`` (mutating ``config``; :func:`run` passes a copy) before building the STARE
    controller, so the resolved target is what ``config.yaml`` records.
    """
    S, L, V = config.num_prompts, config.seq_len, config.vocab_size
    g_init = torch.Generator().manual_seed(config.seed if config.init_seed is None else config.init_seed)
    logits = config.init_spread * torch.randn(S, L, V, generator=g_init, dtype=torch.float64)
    ranks = torch.rand(S, L, V, generator=g_init).argsort(dim=-1).argsort(dim=-1)
    correct = ranks < config.num_correct
    g = torch.Generator().manual_seed(2**32 + config.seed)
    if config.target_entropy_frac is not None:
        config.loss.stare.target_entropy = config.target_entropy_frac * mean_entropy(logits, config.temperature)
    controller = None
    if config.is_stare:
        from stare_lab.stare import STAREController

        controller = STAREController(config.loss.stare)
    return TabularState(logits=logits, correct=correct, generator=g, controller=controller)


def mean_entropy(logits: torch.Tensor, temperature: float) -> float:
    """Mean over all states of the entropy (nats) of softmax(logits / τ) (``stare_lab.entropy``)."""
    from stare_lab.entropy import entropy_from_logits

    return float(entropy_from_logits(logits, temperature=temperature).double().mean())


# ----------------------------------------------------------------------------------------------------------------
# rewards and sampling
# ----------------------------------------------------------------------------------------------------------------


def _sample(
    config: TabularSimConfig, state: TabularState, prompts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw G responses for each prompt in ``prompts [n]`` → (tokens ``[n·G, L]`` long, rewards ``[n·G]`` float32,
    solved ``[n·G]`` float32 = the verifiable rule's verdict without noise, i.e. task accuracy, whatever the
    reward); responses of one prompt are contiguous (group_size layout)."""
    G, L, V = config.group_size, config.seq_len, config.vocab_size
    n = prompts.numel()
    probs = torch.softmax(state.logits[prompts] / config.temperature, dim=-1)  # [n, L, V]
    draws = torch.multinomial(probs.reshape(n * L, V), G, replacement=True, generator=state.generator)
    tokens = draws.reshape(n, L, G).permute(0, 2, 1).reshape(n * G, L)
    hits = state.correct[prompts].repeat_interleave(G, dim=0).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    solved = (hits.sum(-1) >= config.reward_threshold).float()
    if config.reward == "random":
        p = torch.full((n * G,), float(config.random_reward_p))
        rewards = torch.bernoulli(p, generator=state.generator).float()
    else:
        rewards = solved
        if config.reward_noise > 0:
            flip = torch.bernoulli(torch.full((n * G,), float(config.reward_noise)), generator=state.generator)
            rewards = (rewards - flip).abs()
    return tokens, rewards, solved


def _rollouts(config: TabularSimConfig, state: TabularState) -> dict[str, Any]:
    """One step's rollout batch: all S prompts once, or with dynamic sampling the groups with non-zero reward
    variance from up to ``ds_max_rounds`` rounds (at most S groups kept; if none survive, the batch is empty)."""
    from stare_lab.advantages import filter_groups

    S, G = config.num_prompts, config.group_size
    all_prompts = torch.arange(S)
    if not config.dynamic_sampling:
        tokens, rewards, solved = _sample(config, state, all_prompts)
        return {"prompts": all_prompts, "tokens": tokens, "rewards": rewards, "rounds": 1, "first": (rewards, solved)}
    kept_p, kept_t, kept_r, first = [], [], [], None
    n_kept, rounds = 0, 0
    while n_kept < S and rounds < config.ds_max_rounds:
        tokens, rewards, solved = _sample(config, state, all_prompts)
        first = (rewards, solved) if first is None else first
        rounds += 1
        keep = filter_groups(rewards, G).reshape(S, G)[:, 0]
        idx = keep.nonzero().squeeze(-1)[: S - n_kept]
        kept_p.append(all_prompts[idx])
        kept_t.append(tokens.reshape(S, G, -1)[idx].reshape(-1, tokens.shape[-1]))
        kept_r.append(rewards.reshape(S, G)[idx].reshape(-1))
        n_kept += idx.numel()
    return {
        "prompts": torch.cat(kept_p),
        "tokens": torch.cat(kept_t),
        "rewards": torch.cat(kept_r),
        "rounds": rounds,
        "first": first,
    }


# ----------------------------------------------------------------------------------------------------------------
# per-step diagnostics shared by both modes
# ----------------------------------------------------------------------------------------------------------------


def _quadrants(
    coef: torch.Tensor,
    adv: torch.Tensor,
    phi: torch.Tensor,
    high: torch.Tensor,
    n_states: int,
    count_weight: torch.Tensor | None = None,
) -> dict[str, float]:
    """Quadrant statistics (docs/theory.md §2, STARE Fig. 2) over tokens with advantage ``adv`` (Â>0 / Â<0) × surprisal
    above / below s* (``high``): the token count (``count_weight`` summed: expected counts in expected mode) and
    the summed first-order ΔH contribution ``coef·Φ / n_states`` (nats, on the scale of ``entropy_change``).
    ``coef`` is each token's coefficient c in Δz = Σ c (e_a − π); all tensors share one shape."""
    contrib = (phi * coef).reshape(-1) / n_states
    weight = (torch.ones_like(phi) if count_weight is None else count_weight).reshape(-1)
    # quadrant index: 0 pos_high, 1 pos_low, 2 neg_high, 3 neg_low, 4 Â = 0 (no quadrant)
    a, h = adv.reshape(-1), high.reshape(-1)
    idx = torch.where(a > 0, 0, torch.where(a < 0, 2, 4)) + torch.where((a != 0) & ~h, 1, 0)
    counts = torch.bincount(idx, weights=weight.double(), minlength=5).tolist()
    sums = torch.bincount(idx, weights=contrib.double(), minlength=5).tolist()
    out: dict[str, float] = {}
    for i, name in enumerate(("pos_high", "pos_low", "neg_high", "neg_low")):
        out[f"quadrant/{name}/count"] = int(round(counts[i])) if count_weight is None else counts[i]
        out[f"quadrant/{name}/dH"] = sums[i]
    return out


# ----------------------------------------------------------------------------------------------------------------
# sampled mode
# ----------------------------------------------------------------------------------------------------------------


def sampled_step(
    config: TabularSimConfig, state: TabularState, h_before: float | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One sampled GRPO/STARE step through the core: returns (Δz ``[S, L, V]`` float64, metrics row) without
    applying Δz. The controller (if any) is updated here, once, from the pre-update mean entropy ``h_before``
    (computed if not given). Draws from ``state.generator``."""
    from stare_lab.advantages import group_advantages
    from stare_lab.entropy import entropy_from_logits, entropy_sensitivity, logprobs_from_logits
    from stare_lab.losses import PolicyLossInputs, compute_policy_loss

    S, G, L = config.num_prompts, config.group_size, config.seq_len
    tau = config.temperature
    t0 = time.perf_counter()
    h_before = mean_entropy(state.logits, tau) if h_before is None else h_before
    gate_on, w, m = _gate(state, h_before)
    batch = _rollouts(config, state)
    t1 = time.perf_counter()
    first_r, first_solved = (x.reshape(S, G) for x in batch["first"])  # first round: all S prompts
    row: dict[str, Any] = {
        "entropy": h_before,
        "reward": float(first_r.mean()),
        "gate_on": int(gate_on),
        "stare_w": w,
        "stare_m": m,
        "accuracy": float(first_solved.mean()),
        f"pass@{G}": float((first_solved > 0).any(-1).float().mean()),
    }
    prompts, tokens, rewards = batch["prompts"], batch["tokens"], batch["rewards"]
    n = prompts.numel()
    if config.dynamic_sampling:
        row["ds/kept_groups"] = n
        row["ds/rounds"] = batch["rounds"]
    delta = torch.zeros_like(state.logits)
    if n == 0:  # dynamic sampling kept nothing: no update this step (documented)
        row.update({"pred_entropy_change": 0.0, "pred/phi_tokens": 0.0, "loss/pg_loss": 0.0})
        row["time/rollout_s"] = t1 - t0
        return delta, row
    z = state.logits.detach().clone().requires_grad_(True)
    zb = z[prompts].repeat_interleave(G, dim=0)  # [n·G, L, V]
    logprobs = logprobs_from_logits(zb, tokens, temperature=tau)
    logprobs.retain_grad()
    mask = torch.ones(n * G, L, dtype=torch.bool)
    adv = group_advantages(rewards, group_size=G, estimator=config.advantage_estimator)
    need_entropy = config.loss.entropy_coeff > 0 or config.loss.loss_mode == "forking_tokens"
    ent_b = entropy_from_logits(zb, temperature=tau) if need_entropy else None
    weights, stats = None, {}
    if config.is_stare:  # scope "global": ω once over the whole step's batch (docs/design.md §1)
        from stare_lab.stare import stare_token_weights

        weights, stats = stare_token_weights(
            logprobs.detach(), adv, mask, config.loss.stare, gate_on=gate_on, reweight_w=w, reweight_m=m
        )
    inputs = PolicyLossInputs(
        logprobs=logprobs,
        old_logprobs=logprobs.detach(),
        advantages=adv,
        response_mask=mask,
        entropy=ent_b,
        token_weights=weights,
        gate_on=gate_on if config.is_stare else None,
        reweight_w=w if config.is_stare else None,
        reweight_m=m if config.is_stare else None,
        generator=state.generator,
    )
    loss, metrics = compute_policy_loss(config.loss.loss_mode, inputs, config.loss)
    loss.backward()
    t2 = time.perf_counter()
    scale = config.lr * n * L  # token-mean over n·G·L tokens → per-state GRPO group update (module docstring)
    delta = -scale * z.grad
    check_update(config, state, delta)
    for key, value in metrics.items():
        row[key if "/" in key else f"loss/{key}"] = float(value)
    for key in ("frac_pos_selected", "frac_neg_selected", "num_pos_selected", "num_neg_selected"):
        if f"stare/{key}" in stats:
            row[f"stare/{key}"] = float(stats[f"stare/{key}"])
    # diagnostics: exact first order of Δz, and its token-level Φ decomposition Δz = Σ c (e_a − π)/τ
    n_states = S * L
    row["pred_entropy_change"] = float(predicted_entropy_change_mean(state.logits, delta, tau))
    coef = (-scale * logprobs.grad).detach()  # [n·G, L]
    zb_d = zb.detach()
    phi = entropy_sensitivity(zb_d, tokens, temperature=tau) / tau**2
    high = phi > 0  # ⇔ surprisal > s* (stare_lab.entropy.critical_surprisal: sign Φ(a) = sign(s_a − s*))
    adv_tok = adv.reshape(-1, 1).expand(-1, L) if adv.dim() == 1 else adv
    row["pred/phi_tokens"] = float((coef * phi).sum()) / n_states
    row.update(_quadrants(coef, adv_tok, phi, high, n_states))
    row["time/rollout_s"] = t1 - t0
    row["time/update_s"] = t2 - t1
    return delta, row


def check_update(config: TabularSimConfig, state: TabularState, delta: torch.Tensor) -> None:
    """Refuse an update that diverges: Δz ``[S, L, V]`` and the updated logits z + Δz must be finite.

    Raises:
        RunError: ``lr=<lr> made the logits non-finite at step <step>; lower lr`` (a diverged run would otherwise
            fail later with an error that does not name the cause, or write NaN rows).
    """
    if not (bool(torch.isfinite(delta).all()) and bool(torch.isfinite(state.logits + delta).all())):
        raise RunError(f"lr={config.lr:g} made the logits non-finite at step {state.step}; lower lr")


def _gate(state: TabularState, h_before: float) -> tuple[bool, float, float]:
    """Controller update for this step (docs/theory.md §4 step 3) → (gate_on, W, M); (False, 1, 1) without STARE."""
    if state.controller is None:
        return False, 1.0, 1.0
    gate_on = bool(state.controller.update(h_before))
    return gate_on, float(state.controller.reweight_w), float(state.controller.reweight_m)


def predicted_entropy_change_mean(logits: torch.Tensor, delta: torch.Tensor, temperature: float) -> float:
    """Mean over all states of ``stare_lab.entropy.predicted_entropy_change(z, Δz)`` (nats; same averaging as the
    ``entropy`` column, so it predicts ``entropy_change``)."""
    from stare_lab.entropy import predicted_entropy_change

    return float(predicted_entropy_change(logits, delta, temperature=temperature).mean())


# ----------------------------------------------------------------------------------------------------------------
# the run: loop, checkpoint / resume, summary
# ----------------------------------------------------------------------------------------------------------------

#: keys of the resolved config that may differ between a checkpoint and the resuming config
RESUMABLE_CHANGES = ("steps", "checkpoint_every")


def resolved_config_dict(config: TabularSimConfig, initial_entropy: float) -> dict[str, Any]:
    """What ``config.yaml`` holds: the resolved dataclass plus ``source``, ``simulator`` and ``initial_entropy``."""
    return {"source": "simulator", "simulator": "tabular", **to_dict(config), "initial_entropy": initial_entropy}


def _save_checkpoint(path: Path, state: TabularState, cfg_dict: dict[str, Any]) -> None:
    """Atomically write the resume state (logits, correct sets, RNG state, controller, next step, config)."""
    payload = {
        "step": state.step,
        "logits": state.logits,
        "correct": state.correct,
        "rng": state.generator.get_state(),
        "controller": None if state.controller is None else state.controller.state_dict(),
        "config": cfg_dict,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, config: TabularSimConfig) -> tuple[TabularState, dict[str, Any]]:
    """Rebuild the state from a checkpoint; the config must match the one it was written with (except
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
    current = resolved_config_dict(config, saved["initial_entropy"])
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
    controller = None
    if config.is_stare:
        from stare_lab.stare import STAREController

        controller = STAREController(config.loss.stare)
        controller.load_state_dict(ck["controller"])
    state = TabularState(logits=ck["logits"], correct=ck["correct"], generator=g, controller=controller, step=ck["step"])
    return state, current


def summarize(rows: list[dict[str, Any]], config: TabularSimConfig, final_entropy: float) -> dict[str, Any]:
    """The run's ``summary.json`` (recomputable from ``metrics.jsonl``): ``method``, ``seed``, ``mode`` and the
    statistics of :func:`simulators.run_stats.run_stats` (entropy, collapse, reward, band, first-order fit)."""
    stats = run_stats(
        rows, float(config.loss.stare.target_entropy), config.collapse_frac, config.band, final_entropy=final_entropy
    )
    return {"method": config.method, "seed": config.seed, "mode": config.mode, **stats}


def run(
    config: TabularSimConfig,
    run_dir: str | os.PathLike,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run one tabular simulation (one method, one seed) into ``run_dir`` and return its summary.

    Writes ``config.yaml`` (resolved config), ``metrics.jsonl`` (one row per step), ``summary.json`` and
    ``checkpoint/state.pt`` (every ``checkpoint_every`` steps and at the end). With ``resume=True`` and a checkpoint
    present, the run continues bit-exactly from it (rows past the checkpoint are dropped; ``steps`` may be raised
    to extend a finished run); without a checkpoint it starts afresh (overwriting any rows).

    Args:
        config: the run's config (not modified; a resolved copy is used).
        run_dir: the run directory (created).
        resume: continue from ``run_dir/checkpoint``.
        progress: called with the number of steps just completed (e.g. a tqdm ``update``).

    Raises:
        RunError: the directory already holds a run and ``resume`` is False, cannot be written, or its checkpoint
            does not match ``config``; or an update made the logits non-finite (:func:`check_update`). A run that
            started afresh and fails before completing a step removes what it wrote (``run_dir`` too, if then empty).
    """
    import copy

    from stare_lab.runs import read_run

    cfg = copy.deepcopy(config)
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoint" / CHECKPOINT_FILE
    if resume and ckpt.is_file():
        state, cfg_dict = _load_checkpoint(ckpt, cfg)
        (run_dir / "config.yaml").unlink(missing_ok=True)  # rewritten with the (possibly extended) steps
        writer = RunWriter(run_dir, cfg_dict, resume=True)
        writer.truncate_after(state.step - 1)
    else:
        state = init_state(cfg)
        cfg_dict = resolved_config_dict(cfg, mean_entropy(state.logits, cfg.temperature))
        writer = RunWriter(run_dir, cfg_dict, overwrite=resume)
    fresh_start = state.step
    if cfg.mode == "sampled":
        step_fn = sampled_step
    else:
        from .tabular_expected import expected_step as step_fn
    try:
        h = mean_entropy(state.logits, cfg.temperature)
        while state.step < cfg.steps:
            t0 = time.perf_counter()
            delta, row = step_fn(cfg, state, h)
            state.logits = state.logits + delta
            h_after = mean_entropy(state.logits, cfg.temperature)
            row["step"] = state.step
            row["entropy_change"] = h_after - h
            row["time/step_s"] = time.perf_counter() - t0
            writer.log(_ordered(row))
            h = h_after
            state.step += 1
            if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
                _save_checkpoint(ckpt, state, cfg_dict)
            if progress is not None:
                progress(1)
        writer.close()
        rows = read_run(run_dir).metrics
        summary = summarize(rows, cfg, h)
        writer.write_summary(summary)
    except BaseException:
        writer.close()
        if fresh_start == 0 and state.step == 0:  # nothing completed: leave no half-started run behind
            _remove_unfinished(run_dir)
        raise
    finally:
        writer.close()
    logger.debug(
        "%s seed %d: entropy %.3f -> %.3f nats, reward %.3f",
        cfg.method, cfg.seed, summary["initial_entropy"], summary["final_entropy"], summary["final_reward"],
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
    A ``loss.stare.target_entropy`` without ``target_entropy_frac`` switches the fraction off, as in
    ``stare-lab simulate`` (:func:`simulators.tabular_config.resolve_target_entropy`; both → ConfigError)."""
    import copy

    data = copy.deepcopy(overrides or {})
    stare = (data.get("loss") or {}).get("stare") if isinstance(data.get("loss"), dict) else None
    resolve_target_entropy(data, isinstance(stare, dict) and "target_entropy" in stare, "target_entropy_frac" in data)
    return from_dict(TabularSimConfig, data)
