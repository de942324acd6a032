"""One batched step of the tabular simulator — the mode's update plus the diagnostics every mode shares (first order,
D terms, push ratio) — and the engine that advances a batch of runs for :func:`simulators.driver.drive` (see
:mod:`simulators.tabular.runner` for the logged keys).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS
from stare_lab.loss.entropy import entropy_from_logits
from stare_lab.errors import RunError

from simulators.run_stats import step_observables
from simulators.tabular.expected import expected_parts
from simulators.tabular.sampled import sampled_parts
from simulators.tabular.step import Policy, TabularBatch, TabularState, policy_tables

__all__ = ["MODES", "Pending", "clip_factors", "batch_step", "finish_rows", "check_update", "TabularEngine"]

#: mode → its step (``parts(batch, pol, h_before, step) -> StepParts``)
MODES = {"sampled": sampled_parts, "expected": expected_parts}


@dataclasses.dataclass
class Pending:
    """What a step's rows still need from the entropy after the update (:func:`finish_rows`): per run ``[R]``
    float64 the entropy before, H(z + the variant that is not the step) (``h_other``; for a run whose step is not
    plain also ``h_push`` = H(z + Δz_GRPO + push)), and the ``plain`` / ``applied`` flags."""

    h_before: torch.Tensor
    h_other: torch.Tensor
    h_push: torch.Tensor
    plain: torch.Tensor
    applied: torch.Tensor

    def select(self, keep: list[int]) -> "Pending":
        idx = torch.tensor(keep, dtype=torch.long)
        return Pending(*(getattr(self, f.name)[idx] for f in dataclasses.fields(self)))


def clip_factors(batch: TabularBatch, parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The gradient-norm clip of each run's step (``clip_rel``, :class:`~simulators.tabular.config.TabularSimConfig`)
    from the step's ``parts [4, R, S, L, V]`` (:class:`~simulators.tabular.step.StepParts`): ``([R] factor,
    [R] ratio)`` float64 with ratio = ‖Δz‖/‖Δz_GRPO‖ (Euclidean norms over all states and tokens of the run, before
    the clip; NaN when ‖Δz_GRPO‖ = 0) and factor = min(1, clip_rel/ratio) (1 for a run without the clip, a zero
    step or a zero GRPO step); ``None`` when no run of the batch clips."""
    rel = [c.clip_rel for c in batch.configs]
    if all(r is None for r in rel):
        return None
    norm = torch.linalg.vector_norm(parts[:2].flatten(2), dim=-1)  # [2, R]: the step, its GRPO update
    ratio = torch.where(norm[1] > 0, norm[0] / norm[1], torch.full_like(norm[0], float("nan")))
    limit = torch.tensor([float("inf") if r is None else float(r) for r in rel], dtype=torch.float64)
    factor = torch.where((norm[0] > 0) & (norm[1] > 0), (limit * norm[1] / norm[0]).clamp(max=1.0),
                         torch.ones_like(ratio))
    return factor, ratio


def batch_step(
    batch: TabularBatch, pol: Policy | None = None, step: int = 1
) -> tuple[torch.Tensor, list[dict[str, Any]], Pending]:
    """Step number ``step`` (from 1; it seeds the losses' step generator) of every run of ``batch`` from its policy
    tables ``pol`` (:func:`~simulators.tabular.step.policy_tables` of ``batch.logits``; computed if not given):
    returns (Δz ``[R, S, L, V]`` float64, one metrics row per run without ``step`` / ``time/step_s`` and without the
    keys that need the entropy after the update, the :class:`Pending` values that :func:`finish_rows` completes them
    with), nothing applied. The controllers are updated (once, by :func:`stare_lab.loss.step.prepare_step` /
    :func:`~stare_lab.loss.step.step_gate`) and the generators advanced."""
    t0 = time.perf_counter()
    tau = batch.base.temperature
    pol = policy_tables(batch.logits, tau) if pol is None else pol
    h_before = pol.entropy.mean((-1, -2))
    out = MODES[batch.base.mode](batch, pol, h_before, step)
    parts = out.parts
    wp, mp = batch.push_weights()
    m_loss = 1.0 + mp  # the loss's M, for W*(t)
    eff = batch.push_efficiency()
    if bool((eff != 1).any()):  # only a share e of the push is applied: Δz_GRPO + e·push (docs/calibration.md)
        cut = ((1.0 - eff) * out.applied.double()).view(-1, 1, 1, 1)
        parts = torch.cat([(parts[0] - cut * (wp.view(-1, 1, 1, 1) * parts[2] + mp.view(-1, 1, 1, 1) * parts[3]))
                           .unsqueeze(0), parts[1:]])
        wp, mp = wp * eff, mp * eff
    clip = clip_factors(batch, parts)
    if clip is not None:  # the whole step scaled: every first-order key below is of the clipped step
        parts = parts * clip[0].view(1, -1, 1, 1, 1)
        for key in [k for k in out.scalars if k.startswith("quadrant/") and k.endswith("/dH")]:
            out.scalars[key] = out.scalars[key] * clip[0]
    first = (pol.grad.unsqueeze(0) * parts).sum(-1).mean((-1, -2))  # [4, R] nats
    push_fo = wp * first[2] + mp * first[3]
    # the push's measured effect: H(z + Δz_GRPO + push) − H(z + Δz_GRPO). When the step is plain (it is Δz_GRPO, or
    # Δz_GRPO + push for a STARE run with the gate on: no other term), one of the two is the step itself, whose
    # entropy the next step's policy tables give; otherwise both are measured.
    with_push = parts[1] + wp.view(-1, 1, 1, 1) * parts[2] + mp.view(-1, 1, 1, 1) * parts[3]
    plain, applied = out.plain, out.applied
    other = torch.where((applied | ~plain).view(-1, 1, 1, 1), parts[1], with_push)
    variants = [other] + ([with_push] if not bool(plain.all()) else [])
    after = batch.logits.unsqueeze(0) + torch.stack(variants)
    ok = torch.isfinite(after).flatten(2).all(2)  # [n, R]: a diverging run is refused by the caller (check_update)
    after = torch.where(ok.view(*ok.shape, 1, 1, 1), after, batch.logits.unsqueeze(0))
    h_var = entropy_from_logits(after, temperature=tau).mean((-1, -2))
    h_var = torch.where(ok, h_var, torch.full_like(h_var, float("nan")))  # NaN → null in the row
    pending = Pending(h_before, h_var[0], h_var[-1], plain, applied)
    scalars = {
        "entropy": h_before,
        "pred_entropy_change": first[0],
        KEY_D_GRPO: first[1],
        KEY_D_LPLUS: first[2],
        KEY_D_LMINUS: first[3],
        "stare/push_first_order": push_fo,
        **out.scalars,
    }
    names = list(scalars)
    values = torch.stack([scalars[k].double() for k in names], dim=1).tolist()  # one host transfer
    elapsed = time.perf_counter() - t0
    rows = []
    for r, vals in enumerate(values):
        row = dict(zip(names, vals))
        row["gate_on"] = int(row["gate_on"])
        row["skipped"] = int(row["skipped"])
        row.update(out.rows[r])
        if clip is not None and batch.configs[r].clip_rel is not None:
            ratio = float(clip[1][r])
            row["clip/factor"], row["clip/norm_ratio"] = float(clip[0][r]), ratio if ratio == ratio else None
        # D_L+/|D_GRPO| and W*(t) (the run's current M for C2), docs/theory.md §8
        row.update(step_observables(row[KEY_D_GRPO], row[KEY_D_LPLUS], row[KEY_D_LMINUS], float(m_loss[r])))
        row["time/update_s"] = elapsed / batch.size
        rows.append(row)
    return parts[0], rows, pending


def finish_rows(rows: list[dict[str, Any]], pending: Pending, h_after: torch.Tensor) -> None:
    """Complete the rows of a step with the mean entropy after the update ``h_after [R]`` (the next step's
    ``entropy``): ``entropy_change``, ``stare/push_measured``, ``stare/push_ratio``, ``stare/grpo_measured``."""
    p = pending
    push = torch.where(p.plain, torch.where(p.applied, h_after - p.h_other, p.h_other - h_after), p.h_push - p.h_other)
    h_grpo = torch.where(p.plain & ~p.applied, h_after, p.h_other)
    values = torch.stack([h_after - p.h_before, push, h_grpo - p.h_before], dim=1).tolist()
    for row, (dh, pm, gm) in zip(rows, values):
        fo = row["stare/push_first_order"]
        row["entropy_change"] = dh
        row["stare/push_measured"] = pm
        row["stare/push_ratio"] = pm / fo if fo != 0 and pm == pm else None
        row["stare/grpo_measured"] = gm


def check_update(config: Any, step: int, delta: torch.Tensor, logits: torch.Tensor) -> None:
    """Refuse an update that diverges: Δz and the updated logits z + Δz (``[S, L, V]``) must be finite.

    Raises:
        RunError: ``lr=<lr> made the logits non-finite at step <step>; lower lr`` (a diverged run would otherwise
            fail later with an error that does not name the cause, or write NaN rows).
    """
    if not (bool(torch.isfinite(delta).all()) and bool(torch.isfinite(logits + delta).all())):
        raise RunError(f"lr={config.lr:g} made the logits non-finite at step {step}; lower lr")


class TabularEngine:
    """A :class:`~simulators.tabular.step.TabularBatch` advanced one batched step at a time
    (:class:`simulators.driver.Engine`). The policy tables of the logits after each update serve both the finished
    step's rows (entropy after) and the next step."""

    def __init__(self, batch: TabularBatch) -> None:
        self.batch = batch
        self.pol: Policy | None = None

    def advance(self, step: int) -> list[dict[str, Any] | RunError]:
        batch = self.batch
        tau = batch.base.temperature
        t0 = time.perf_counter()
        pol = self.pol if self.pol is not None else policy_tables(batch.logits, tau)
        delta, rows, pending = batch_step(batch, pol, step)
        finite = torch.isfinite(delta).flatten(1).all(1) & torch.isfinite(batch.logits + delta).flatten(1).all(1)
        results: list[dict[str, Any] | RunError] = list(rows)
        failed = []
        for j in (~finite).nonzero().flatten().tolist():
            try:
                check_update(batch.configs[j], step, delta[j], batch.logits[j])
            except RunError as err:
                results[j] = err
                failed.append(j)
        if failed:  # the failed runs leave the batch; the others' updates are applied
            keep = [j for j in range(batch.size) if j not in failed]
            if not keep:
                return results
            self.batch = batch = batch.select(keep)
            delta, rows, pending = delta[keep], [rows[j] for j in keep], pending.select(keep)
        batch.logits = batch.logits + delta
        self.pol = policy_tables(batch.logits, tau)
        finish_rows(rows, pending, self.pol.entropy.mean((-1, -2)))
        wall = (time.perf_counter() - t0) / batch.size
        for row in rows:
            row["time/step_s"] = wall
        return results

    def payload(self, j: int) -> dict[str, Any]:
        """Logits, correct sets, RNG state and controller of active run ``j`` (:func:`simulators.tabular.runner.restore_state` reads it back)."""
        b = self.batch
        ctl = b.controllers[j]
        return {"logits": b.logits[j].clone(), "correct": b.correct[j].clone(), "rng": b.generators[j].get_state(),
                "controller": None if ctl is None else ctl.state_dict()}

    def state(self, j: int) -> TabularState:
        return self.batch.state(j)
