"""The small-transformer simulator: GRPO / STARE on a tiny causal LM and a synthetic verifiable task.

Reads top to bottom:

1. **Model** — a ``transformers`` Qwen2 (or Llama) causal LM with tiny dimensions (default: vocab 14, hidden 64,
   FFN 256, 2 layers, 2 heads, 1 KV head ≈ 124k parameters, fp32), random init from the seed. Log-probs and entropy
   of sampled tokens come from :mod:`stare_lab.loss.entropy`, the same code path the trainer uses.
2. **Task** — :mod:`simulators.transformer.tasks` (``pick``: several correct answers per prompt; ``sort``: one), prompts from
   the seed, disjoint train / held-out splits, a checker giving 0/1 rewards (optionally a noisy verifier for
   training, ``task.reward_noise``; accuracy and evaluation always use the exact verdicts).
3. **Warm start** — a short supervised phase on noisy demonstrations (AdamW, ``warm_start.lr``) so the initial
   policy is partly right and has real entropy. The warm-started weights depend only on (task, model, warm_start,
   seed); they are cached in ``warm_start.cache_dir`` (default: ``<run_dir>/../../warm_start_cache``, i.e. ``OUT/``
   of the CLI's ``OUT/<method>/seed<k>`` layout) so the methods of one sweep reuse them — each method's RL phase
   is genuine and starts from bit-identical weights.
4. **RL** — per step (numbered from 1 by the simulators' one run driver, :mod:`simulators.driver`):
   ``prompts_per_step`` train prompts × ``group_size`` responses sampled at ``temperature`` (a KV-cache sampling
   loop with a seeded ``torch.Generator``), rewards from the checker, optional dynamic sampling (the simulators' one
   rule, :mod:`simulators.dynamic_sampling`: a step where no group survives skips its update, ``skipped=1``),
   advantages from :func:`stare_lab.loss.advantages.group_advantages`, the core's step preparation
   (:func:`stare_lab.loss.step.prepare_step`: the STARE gate and W/M from :class:`stare_lab.loss.stare.STAREController`, ω
   over the step's batch, the token counts and the global statistics the loss declares), the method's policy loss
   from the core registry (:func:`stare_lab.loss.losses.compute_policy_loss` on ``PreparedStep.inputs``), AdamW (``lr``,
   default 1e-3, optional linear warm-up ``lr_warmup_steps``; ``adam_beta1/2``, ``adam_eps``; grad-norm clip
   ``grad_clip``). Every forward computes a group's shared prompt once and runs its G responses on that KV cache
   (:func:`response_logits`). ``updates_per_batch = 1`` is the paper's one on-policy update (ratio ≡ 1); more
   updates make clipping matter.
5. **Measurement** — per step the batch token-mean entropy H̄ before the update, the measured change
   ``entropy_change`` = H̄(θ_new) − H̄(θ_old) recomputed on the *same* prompts, sampled responses and token
   positions, and the predictions:

   * ``pred_entropy_change`` = ``pred/grad_dot`` = ∇θH̄(θ_old) · Δθ with Δθ the actual parameter change of the step
     (all its updates); exact to first order in Δθ for any model and optimizer (docs/theory.md §2, last line).
   * ``pred/logit_first_order`` = token-mean over positions of Σ_k ∂H_t/∂z_{t,k} · Δz_{t,k} with Δz the actual
     change of the logits at each position (:func:`stare_lab.theory.first_order.predicted_entropy_change`): exact to first
     order in the logit change; its gap to ``entropy_change`` is the second-order part.
   * ``pred/phi_tokens`` = (1/N) Σ_t ω_t Â_t Φ_t — the token-level Φ decomposition (docs/theory.md §2): the sum over
     the N valid tokens of the first-order entropy change that token's *own* policy-gradient logit step
     Δz_t = η ω_t Â_t (e_{a_t} − π_t) would cause at its own position, as if positions were independent (free
     logits), with Φ_t = :func:`stare_lab.theory.first_order.entropy_sensitivity` at the sampled token and η = 1 (a unit
     logit step; the token-mean's 1/N included). Its scale is therefore arbitrary: compare it by R² and the fitted
     slope (= the effective per-token logit step), which ``summary.json`` reports.
   * ``pred/d_grpo``, ``pred/d_lplus`` (``pred/d_lminus`` for C2), with ``measure_decomposition`` (default on):
     D_X = ∇θH̄(θ_old) · (−P ⊙ g_X), the part of the first update's AdamW step that the gradient g_X of the GRPO
     objective (ω ≡ 1) or of the selected L+ (L−) tokens' surrogate carries, P the step's AdamW preconditioner
     (:mod:`stare_lab.theory.decomposition`, the trainer's split too). W*(t) = 1 − D_GRPO/D_L+ (docs/theory.md §7) and
     the predicted critical W are in ``summary.json`` (:func:`stare_lab.theory.critical.decomposition_summary`). Next
     to them, the calibration observables of docs/theory.md §8 (``stare-lab calibrate``): ``pred/d_ratio`` =
     D_L+/|D_GRPO|, ``pred/w_star`` = W*(t) (with the step's M for C2) and ``pred/lplus_above_sstar``, the share of
     the L+ tokens' probability mass whose surprisal is above their position's critical surprisal s*
     (:func:`stare_lab.theory.first_order.share_above_critical`).

   Quadrants (``quadrant/{pos,neg}_{high,low}/{count,dH}``): tokens by sign of Â and by surprisal above / below the
   critical surprisal s* (equivalently Φ_t > 0 / ≤ 0, docs/theory.md §2), dH = their summed ``pred/phi_tokens`` term.
   Every ``eval_every`` steps (and at the last step) the held-out accuracy (mean over ``eval_samples`` samples per
   prompt, T = ``temperature``) and pass@k (k = ``eval_samples``) of the updated policy.

Public API: :data:`PRESETS`, :data:`PRESET_DESCRIPTIONS`, :data:`PRESET_SWEEPS`, :class:`ModelConfig`,
:class:`WarmStartConfig`, :class:`TransformerSimConfig`, :func:`config_from_preset` (all from
:mod:`simulators.transformer.config`), :func:`build_model`, :func:`sample_responses`, :func:`response_logits` (from
:mod:`simulators.transformer.model`),
:func:`summarize`, :func:`run`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from stare_lab.loss.advantages import group_advantages
from stare_lab.config import to_dict
from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS, KEY_LPLUS_ABOVE
from stare_lab.theory.decomposition import grpo_objective, part_objective, selected_parts
from stare_lab.loss.entropy import entropy_from_logits, logprobs_from_logits
from stare_lab.theory.adam_linear import adam_preconditioner, linearised_entropy_change, param_dot
from stare_lab.theory.first_order import (
    critical_surprisal,
    entropy_sensitivity,
    predicted_entropy_change,
    share_above_critical,
)
from stare_lab.loss.losses import compute_policy_loss, loss_needs
from stare_lab.loss.stare import STAREController
from stare_lab.loss.step import StepBatch, prepare_step, step_gate

from simulators.driver import drive
from simulators.dynamic_sampling import select_groups
from simulators.run_stats import fit_line, run_stats, step_observables
from simulators.transformer.model import build_model, response_logits, sample_responses
from simulators.transformer.tasks import Task, make_splits, make_task
from simulators.transformer.config import (
    PRESET_DESCRIPTIONS,
    PRESET_SWEEPS,
    PRESETS,
    ModelConfig,
    TransformerSimConfig,
    WarmStartConfig,
    config_from_preset,
)

logger = logging.getLogger(__name__)

__all__ = [
    "PRESETS",
    "PRESET_DESCRIPTIONS",
    "PRESET_SWEEPS",
    "ModelConfig",
    "WarmStartConfig",
    "TransformerSimConfig",
    "config_from_preset",
    "build_model",
    "sample_responses",
    "run",
]

def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1.0)


# ------------------------------------------------------------------------------------------------ simulation
class _Simulation:
    """State of one run (model, optimizer, controller, RNG, data cursor) and its step functions."""

    def __init__(self, config: TransformerSimConfig, run_dir: Path) -> None:

        self.cfg = config
        self.loss_cfg = config.loss
        self.needs = loss_needs(config.loss.loss_mode, config.loss)
        self.task: Task = make_task(config.task)
        self.train_prompts, self.eval_prompts = make_splits(self.task, config.seed)
        self.model = build_model(config.model, config.seed)
        self.step = 0
        self.warm_info = self._warm_start(run_dir)
        self.params = [p for p in self.model.parameters()]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.controller = STAREController(self.loss_cfg.stare)
        self.generator = torch.Generator().manual_seed(1_000_003 * config.seed + 1)  # RL sampling stream
        self.cursor = [0, 0]  # (epoch, position) in the epoch's permutation of the train prompts

    # -------------------------------------------------------------------------------------------- data cursor
    def _next_prompts(self, n: int) -> torch.Tensor:
        out = []
        while n > 0:
            epoch, pos = self.cursor
            g = torch.Generator().manual_seed(7_777_777 * self.cfg.seed + epoch)
            perm = torch.randperm(len(self.train_prompts), generator=g)
            take = perm[pos : pos + n]
            out.append(self.train_prompts[take])
            n -= len(take)
            self.cursor = [epoch + 1, 0] if pos + len(take) >= len(perm) else [epoch, pos + len(take)]
        return torch.cat(out)

    # --------------------------------------------------------------------------------------------- warm start
    def _warm_key(self) -> str:
        ws, cfg = self.cfg.warm_start, self.cfg
        blob = json.dumps(
            {"task": to_dict(cfg.task), "model": to_dict(cfg.model), "seed": cfg.seed, "steps": ws.steps,
             "batch_size": ws.batch_size, "lr": ws.lr, "temperature": cfg.temperature, "k": cfg.eval_samples},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _warm_start(self, run_dir: Path) -> dict[str, float]:
        """Supervised warm start on noisy demonstrations (cached); returns its held-out entropy and accuracy."""

        ws = self.cfg.warm_start
        cache_dir = Path(ws.cache_dir) if ws.cache_dir else Path(run_dir).resolve().parent.parent / "warm_start_cache"
        cache_path = cache_dir / f"warm_{self._warm_key()}.pt"
        if ws.cache and cache_path.is_file():
            blob = torch.load(cache_path, weights_only=True)
            self.model.load_state_dict(blob["model"])
            logger.info("warm start loaded from %s", cache_path)
            return dict(blob["info"])
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(2_000_003 * self.cfg.seed + 2)
        opt = torch.optim.AdamW(self.model.parameters(), lr=ws.lr, weight_decay=0.0)
        for _ in range(ws.steps):
            idx = torch.randint(0, len(self.train_prompts), (ws.batch_size,), generator=g)
            prompts = self.train_prompts[idx]
            demos = self.task.demonstrations(prompts, g)
            logits = response_logits(self.model, prompts, demos)
            nll = -logprobs_from_logits(logits, demos, temperature=self.cfg.temperature).mean()
            opt.zero_grad(set_to_none=True)
            nll.backward()
            opt.step()
        ev = self.evaluate(seed_offset=-1)
        info = {
            "warm_start/entropy": ev["eval/entropy"],
            "warm_start/accuracy": ev["eval/accuracy"],
            f"warm_start/pass@{self.cfg.eval_samples}": ev[f"eval/pass@{self.cfg.eval_samples}"],
            "warm_start/time_s": time.perf_counter() - t0,
        }
        logger.info("warm start: %s", info)
        if ws.cache:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_suffix(f".tmp{os.getpid()}")
            torch.save({"model": self.model.state_dict(), "info": info}, tmp)
            os.replace(tmp, cache_path)
        return info

    # --------------------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, seed_offset: int = 0) -> dict[str, float]:
        """Held-out accuracy (mean 0/1 reward over ``eval_samples`` samples per prompt), pass@k (k =
        ``eval_samples``: fraction of prompts with at least one correct sample), token-mean entropy (nats) and
        mean response length. Its sampling stream is seeded by (seed, step): it never disturbs training."""

        k = self.cfg.eval_samples
        g = torch.Generator().manual_seed(3_000_017 * self.cfg.seed + 7919 * (self.step + 2) + seed_offset)
        prompts = self.eval_prompts.repeat_interleave(k, dim=0)
        responses, mask = sample_responses(self.model, prompts, self.task.max_response_len, self.cfg.temperature, g)
        rewards = self.task.check(prompts, responses)
        ent = entropy_from_logits(response_logits(self.model, prompts, responses), temperature=self.cfg.temperature)
        return {
            "eval/accuracy": float(rewards.mean()),
            f"eval/pass@{k}": float((rewards.view(-1, k).max(dim=1).values > 0).float().mean()),
            "eval/entropy": float(_masked_mean(ent, mask)),
            "eval/response_length": float(mask.sum(dim=1).float().mean()),
        }

    # ------------------------------------------------------------------------------------------------ rollout
    def _rollout(self) -> tuple[tuple[torch.Tensor, ...] | None, dict[str, float]]:
        """The step's batch ``(prompts, responses, mask, rewards)`` and its stats; with dynamic sampling the groups
        the simulators' one rule keeps (:func:`simulators.dynamic_sampling.select_groups`), None when none survives.
        ``reward``, ``accuracy`` (the true verdicts), ``pass@G`` and ``frac_zero_var_groups`` (of the rewards
        trained on) are over every group sampled in the step (all rounds), like the trainer's ``reward``."""
        cfg, G = self.cfg, self.cfg.group_size
        drawn: list[tuple[torch.Tensor, ...]] = []

        def rewards_of_round(i: int) -> torch.Tensor:
            prompts = self._next_prompts(cfg.prompts_per_step).repeat_interleave(G, dim=0)
            responses, mask = sample_responses(
                self.model, prompts, self.task.max_response_len, cfg.temperature, self.generator
            )
            correct = self.task.check(prompts, responses)
            rewards = correct
            if cfg.task.reward_noise > 0:  # noisy verifier: the verdict flipped with probability reward_noise
                flip = torch.rand(correct.shape, generator=self.generator) < cfg.task.reward_noise
                rewards = torch.where(flip, 1.0 - correct, correct)
            drawn.append((prompts, responses, mask, rewards, correct))
            return rewards

        if cfg.dynamic_sampling:
            sel = select_groups(rewards_of_round, G, cfg.prompts_per_step, cfg.ds_max_rounds)
            picks = sel.picks
        else:
            rewards_of_round(0)
            picks = [(0, torch.arange(cfg.prompts_per_step))]
        rewards = torch.cat([d[3] for d in drawn])
        correct = torch.cat([d[4] for d in drawn])
        stats: dict[str, float] = {
            "reward": float(rewards.mean()),
            "accuracy": float(correct.mean()),
            f"pass@{G}": float((correct.view(-1, G).max(dim=1).values > 0).float().mean()),
            "frac_zero_var_groups": float((rewards.view(-1, G).std(dim=1) == 0).float().mean()),
        }
        if cfg.dynamic_sampling:
            stats.update({"ds/rounds": sel.rounds, "ds/kept_groups": sel.num_kept})
            if sel.skip:
                return None, stats
        rows = [(idx[:, None] * G + torch.arange(G)).reshape(-1) for _, idx in picks]
        batch = tuple(torch.cat([drawn[i][k][r] for (i, _), r in zip(picks, rows)]) for k in range(4))
        return batch, stats

    # --------------------------------------------------------------------------------------------------- step
    def rl_step(self, step: int) -> dict[str, Any]:
        """RL step number ``step`` (from 1): rollout, the core's step preparation (gate, W/M, ω, counts, the loss's
        global statistics), update(s), measurement; returns the metrics row (without ``step``). A step where
        dynamic sampling kept no group skips the update (``skipped=1``; entropy and its changes null, the
        controller left as it is), as in the trainer."""

        cfg, tau = self.cfg, self.cfg.temperature
        self.step = step
        t0 = time.perf_counter()
        batch, row = self._rollout()
        t_sample = time.perf_counter() - t0
        if batch is None:
            gate_on, w, m = step_gate(self.loss_cfg, self.controller, None, needs=self.needs)
            row.update(skipped=1, entropy=None, entropy_change=None, pred_entropy_change=None, gate_on=int(gate_on),
                       stare_w=w, stare_m=m)
            return self._finish_row(row, t0, t_sample, 0.0)
        prompts, responses, mask, rewards = batch
        advantages = group_advantages(rewards, group_size=cfg.group_size, estimator=cfg.adv_estimator)
        lr = cfg.lr * min(1.0, self.step / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # θ_old as differentiable copies: the first update's forward runs through them, so its graph (kept for
        # ∇θH̄ at θ_old) survives the optimizer's in-place parameter update; gradients still reach the parameters.
        theta_old = {n: p.clone() for n, p in self.model.named_parameters()}
        n_valid = int(mask.sum())
        for update in range(cfg.updates_per_batch):
            logits = response_logits(self.model, prompts, responses, theta_old if update == 0 else None)
            logprobs = logprobs_from_logits(logits, responses, temperature=tau)
            entropy = entropy_from_logits(logits, temperature=tau)
            if update == 0:
                old_logprobs, logits_old = logprobs.detach(), logits.detach()
                h_bar_old = _masked_mean(entropy, mask)  # with its graph, for pred/grad_dot
                h_before = float(h_bar_old.detach())
                step_batch = StepBatch(mask, advantages, old_logprobs,
                                       entropy=entropy.detach() if self.needs.entropy else None)
                prep = prepare_step(step_batch, self.loss_cfg, controller=self.controller, step=step, seed=cfg.seed,
                                    batch_entropy=h_before)
                row.update(prep.metrics())
                d_grads = {}
                if cfg.measure_decomposition:
                    d_grads, lplus = self._decomposition_grads(step_batch, prep, logprobs, entropy, theta_old)
                    # share of the L+ probability mass above s* (docs/theory.md §8)
                    row[KEY_LPLUS_ABOVE] = share_above_critical(
                        -old_logprobs, critical_surprisal(logits_old, temperature=tau), lplus.bool() & mask)
                weights = prep.token_weights if prep.token_weights is not None else torch.ones_like(old_logprobs)
                # token-level Φ decomposition and quadrants (module docstring)
                phi = entropy_sensitivity(logits_old, responses, temperature=tau)
                adv_tok = advantages[:, None].expand_as(phi) if advantages.dim() == 1 else advantages
                contrib = torch.where(mask, weights * adv_tok * phi, torch.zeros_like(phi)) / max(n_valid, 1)
                row["pred/phi_tokens"] = float(contrib.sum())
                for sign_name, sign in (("pos", adv_tok > 0), ("neg", adv_tok < 0)):
                    for side, sel in (("high", phi > 0), ("low", phi <= 0)):
                        q = mask & sign & sel
                        row[f"quadrant/{sign_name}_{side}/count"] = int(q.sum())
                        row[f"quadrant/{sign_name}_{side}/dH"] = float(contrib[q].sum())
            loss, loss_metrics = compute_policy_loss(self.loss_cfg.loss_mode, prep.inputs(logprobs, entropy=entropy),
                                                     self.loss_cfg)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward(retain_graph=update == 0)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
            self.optimizer.step()
            if update == 0:
                precond = self._preconditioner(lr, float(grad_norm)) if d_grads else None
                row["loss/value"] = float(loss.detach())
                row["grad_norm"] = float(grad_norm)
                row.update({k if "/" in k else f"loss/{k}": _num(v) for k, v in loss_metrics.items()})
        t_update = time.perf_counter() - t0 - t_sample
        self.last_batch = (prompts, responses, mask, {n: t.detach() for n, t in theta_old.items()})  # for tests
        row.update(self._measure(prompts, responses, mask, theta_old, logits_old, h_bar_old, d_grads, precond))
        if d_grads:  # D_L+/|D_GRPO| and W*(t), with the step's M for C2 (docs/theory.md §8)
            c2 = self.loss_cfg.loss_mode == "stare" and self.loss_cfg.stare.variant == "C2"
            row.update(step_observables(row.get(KEY_D_GRPO), row.get(KEY_D_LPLUS), row.get(KEY_D_LMINUS),
                                        float(row["stare_m"]) if c2 else 1.0))
        row.update(skipped=0, entropy=h_before, response_length=float(mask.sum(dim=1).float().mean()))
        return self._finish_row(row, t0, t_sample, t_update)

    def _finish_row(self, row: dict[str, Any], t0: float, t_sample: float, t_update: float) -> dict[str, Any]:
        """The periodic held-out evaluation (every ``eval_every`` steps and at the last) and the timings."""
        if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
            row.update(self.evaluate())
        row["time/sample_s"], row["time/update_s"] = t_sample, t_update
        row["time/step_s"] = time.perf_counter() - t0
        return row

    def _decomposition_grads(self, step_batch, prep, logprobs, entropy, theta_old) -> tuple[dict[str, list], torch.Tensor]:
        """The gradients at θ_old of the GRPO objective and of the L+ (L−) parts (:mod:`stare_lab.theory.decomposition`),
        through the first update's graph (kept), and the L+ indicator ``[B, T]`` (0/1)."""
        params = list(theta_old.values())
        inputs = prep.inputs(logprobs, entropy=entropy)
        grad = lambda obj: torch.autograd.grad(obj, params, retain_graph=True, allow_unused=True)  # noqa: E731
        grads = {KEY_D_GRPO: grad(grpo_objective(inputs, self.loss_cfg))}
        parts = selected_parts(step_batch, self.loss_cfg)
        for key, indicator in parts.items():
            grads[key] = grad(part_objective(inputs, indicator, self.loss_cfg))
        return grads, parts[KEY_D_LPLUS]

    def _preconditioner(self, lr: float, grad_norm: float) -> list[torch.Tensor]:
        """AdamW's P of the update just taken (first update of the step), in the order of ``named_parameters``."""
        cfg, state = self.cfg, self.optimizer.state
        params = [p for _, p in self.model.named_parameters()]
        clip = min(1.0, cfg.grad_clip / (grad_norm + 1e-6)) if math.isfinite(grad_norm) else 1.0
        # a parameter AdamW has no state for got no gradient and no update: v = inf gives it P = 0
        v = [state[p]["exp_avg_sq"] if p in state else torch.full_like(p, math.inf) for p in params]
        step = next(float(state[p]["step"]) for p in params if p in state)
        return adam_preconditioner(v, lr=lr, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, eps=cfg.adam_eps,
                                   step=step, clip=clip)

    def _measure(self, prompts, responses, mask, theta_old, logits_old, h_bar_old, d_grads, precond
                 ) -> dict[str, float]:
        """Measured ΔH on the same positions, the ∇θH̄·Δθ and logit-space first-order predictions and the D terms.
        ``theta_old``: the differentiable copies of θ_old the first forward ran through; ``h_bar_old``: H̄(θ_old)
        with that graph; ``d_grads`` / ``precond``: :meth:`_decomposition_grads` and :meth:`_preconditioner` (empty /
        None when not measured)."""
        tau = self.cfg.temperature
        h_before = float(h_bar_old.detach())
        with torch.no_grad():
            logits_new = response_logits(self.model, prompts, responses)
            h_after = float(_masked_mean(entropy_from_logits(logits_new, temperature=tau), mask))
            logit_pred = predicted_entropy_change(logits_old, logits_new - logits_old, temperature=tau)
        # ∇θH̄ at θ_old dotted with the actual Δθ of the step (all its updates): docs/theory.md §2, last line.
        names = list(theta_old)
        current = dict(self.model.named_parameters())
        deltas = [current[n].detach() - theta_old[n].detach() for n in names]
        grad_h = torch.autograd.grad(h_bar_old, [theta_old[n] for n in names], allow_unused=True)
        grad_dot = param_dot(grad_h, deltas)
        out = {
            "entropy_change": h_after - h_before,
            "pred_entropy_change": grad_dot,
            "pred/grad_dot": grad_dot,
            "pred/logit_first_order": float(_masked_mean(logit_pred, mask)),
            "entropy_after": h_after,
        }
        out.update({key: linearised_entropy_change(grad_h, precond, g) for key, g in d_grads.items()})
        return out

    # --------------------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, controller, RNG and data cursor (the driver adds the step and the config)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "controller": self.controller.state_dict(),
            "generator": self.generator.get_state(),
            "cursor": list(self.cursor),
        }

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Restore :meth:`state_dict` after ``step`` completed steps."""
        self.step = int(step)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.controller.load_state_dict(state["controller"])
        self.generator.set_state(state["generator"])
        self.cursor = list(state["cursor"])


def _num(v: Any) -> Any:
    return float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v


def summarize(rows: list[dict[str, Any]], warm_info: dict[str, float], config: TransformerSimConfig) -> dict:
    """Summary of a run from its metrics rows (recomputable from ``metrics.jsonl``): the shared per-run statistics
    (:func:`simulators.run_stats.run_stats`: initial / final entropy, ``steps_to_collapse`` = first step below 10 %
    of the initial entropy, band statistics around H_tgt, fit of ``pred_entropy_change``), the warm-start numbers,
    the last held-out evaluation, and the fit (slope, R², relative error; :func:`simulators.run_stats.fit_line`)
    of each predictor ``pred/<name>`` to the measured ΔH under ``fit/<name>/…``."""
    k = config.eval_samples
    evals = [r for r in rows if "eval/accuracy" in r]
    out: dict[str, Any] = {"method": config.method, "seed": config.seed, **warm_info}
    st = config.loss.stare
    c2 = config.loss.loss_mode == "stare" and st.variant == "C2"
    # D terms summed over 5 % of the run per window (sampled runs), as the trainer and analyze do
    out.update(run_stats(rows, st.target_entropy, reweight_m=st.reweight_m if c2 else 1.0,
                         window=max(1, len(rows) // 20), w_max=st.w_cap, variant=st.variant,
                         schedule=st.schedule if st.w_cap is not None else None))
    out.update({
        "initial_accuracy": rows[0]["accuracy"] if rows else None,
        "final_accuracy": rows[-1]["accuracy"] if rows else None,
        "eval/accuracy": evals[-1]["eval/accuracy"] if evals else None,
        f"eval/pass@{k}": evals[-1][f"eval/pass@{k}"] if evals else None,
    })
    meas = [r.get("entropy_change") for r in rows]
    for name in ("grad_dot", "logit_first_order", "phi_tokens"):
        fit = fit_line([r.get(f"pred/{name}") for r in rows], meas)
        out.update({f"fit/{name}/{key}": fit[key] for key in ("r2", "slope", "rel_err")})
    return out


# ------------------------------------------------------------------------------------------------------- run
class _OneRun:
    """One :class:`_Simulation` as a :class:`simulators.driver.Engine` (transformer runs are not batched)."""

    def __init__(self, sim: _Simulation) -> None:
        self.sim = sim

    def advance(self, step: int) -> list[dict[str, Any]]:
        row = self.sim.rl_step(step)
        if step % 10 == 0:
            cfg = self.sim.cfg
            logger.info("%s seed %d step %d: H=%s acc=%.3f", cfg.method, cfg.seed, step,
                        "-" if row["entropy"] is None else f"{row['entropy']:.3f}", row["accuracy"])
        return [row]

    def payload(self, j: int) -> dict[str, Any]:
        return self.sim.state_dict()

    def state(self, j: int) -> _Simulation:
        return self.sim


class TransformerSimulator:
    """The transformer simulator as the run driver sees it (:class:`simulators.driver.Simulator`)."""

    @staticmethod
    def _resolved(config: TransformerSimConfig) -> dict[str, Any]:
        return {"source": "simulator", "simulator": "transformer", **to_dict(config)}

    def fresh(self, config: TransformerSimConfig, run_dir: Path) -> tuple[_Simulation, dict[str, Any]]:
        return _Simulation(config, run_dir), self._resolved(config)

    def restore(self, config: TransformerSimConfig, run_dir: Path, saved: dict[str, Any]):
        sim = _Simulation(config, run_dir)
        sim.load_state_dict(saved["state"], saved["step"])
        return sim, self._resolved(config)

    def group(self, config: TransformerSimConfig) -> int:
        return id(config)  # every run alone

    def engine(self, configs: list[TransformerSimConfig], states: list[_Simulation]) -> _OneRun:
        return _OneRun(states[0])

    def summarize(self, config: TransformerSimConfig, rows: list[dict[str, Any]], sim: _Simulation) -> dict:
        return summarize(rows, sim.warm_info, config)


def run(config: TransformerSimConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Run one method × one seed and write one run directory (docs/design.md §4); returns the summary dict.

    Through the simulators' one run driver (:func:`simulators.driver.drive`): steps numbered from 1,
    ``run_dir/checkpoint/state.pt`` (model, optimizer, controller, RNG, data cursor) every ``checkpoint_every`` steps
    and at the end; with ``resume=True`` the run continues from it, bit-identical to an uninterrupted run (metrics
    rows past the checkpoint are dropped; only ``steps`` / ``checkpoint_every`` may differ); without a checkpoint it
    starts afresh. torch runs with ``$OMP_NUM_THREADS`` threads (1 if unset: on a busy 2-core machine 2 threads
    were 10–40× slower).

    Raises:
        ConfigError: invalid config. RunError: ``run_dir`` already holds a run and ``resume`` is False, or the
            checkpoint was written with another config or its rows up to it are not all there
            (:func:`simulators.driver.check_resume`).
    """
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    return drive(TransformerSimulator(), [config], [run_dir], resume=resume)[0]
