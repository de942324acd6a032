"""The per-step STARE controller: the entropy gate and the W/M schedules (docs/theory.md §4 step 3, §9).

:class:`STAREController` is called once per optimizer step, before the update, with the batch token-mean entropy
H̄ (nats, reduced over ranks), and decides the step's gate and W/M:

* gate: ``"entropy"`` → on iff H̄ < H_tgt (the paper's); ``"always"`` / ``"never"`` force it;
* fixed W/M (``adaptive`` false): the configured ``reweight_w`` / ``reweight_m``;
* the paper's schedule (``adaptive``, ``schedule="paper"``): W ← clip(W + α·sgn(H_tgt − H̄), [1, w_max]),
  M ← clip(M − α·sgn(H_tgt − H̄), [m_min, 1]);
* the auto schedule (``adaptive``, ``schedule="auto"``): the balance controller below.

**The auto schedule** (docs/theory.md §9). Near the target the entropy moves by ΔH ≈ D_GRPO + u·D_push per step,
with u = gate·(W − 1) the push applied; the band holds where the mean push cancels the drift, and 1 + that mean push
is the W this model needs (the run's ``balance_w``). The gate stays the paper's (STARE acts only below H_tgt), so
any W above the critical one holds the band; the controller's job is to get there fast, then to bring W down to
just above the push that holds, where the realised balance is the model's critical W rather than an overshoot's (a
pushed step is clipped and saturates, so a large W's balance overstates the W that is needed). It reads only H̄ and
acts on x = ln(W − 1), so a W of 1.1 and one of 10 are found equally fast. With e = (H_tgt − H̄)/b, the error in
held bands b = min(0.05, H_tgt/4) (docs/theory.md §7), clipped to ±:data:`AUTO_ERROR_CLIP`:

* before the first crossing of H_tgt: nothing (the gate is off); at the crossing, W = :data:`AUTO_W0`;
* *acquire* (from the crossing until H̄ is back at H_tgt): x ← x + :data:`AUTO_K_ACQUIRE`·e while H̄ still falls
  (H̄ below the previous step's); once the fall is arrested W stays, so the lag of the entropy behind W (Adam's
  momentum in a model) does not carry W past the push that arrested it;
* *hold* (from then on): the realised push p̂, an exponential mean of gate·(W − 1) over ~:data:`AUTO_WINDOW` steps,
  is what holds the band, so x relaxes towards ln(κ·p̂) at rate :data:`AUTO_K_BALANCE` per step, κ =
  :data:`AUTO_MARGIN` (W − 1 a tenth above the push that held: the gate opens on ~90 % of the steps); and while
  H̄ is more than :data:`AUTO_DEADBAND` band below the target (the drift grew, or W came down too far)
  x ← x + :data:`AUTO_K_RESCUE`·(e − :data:`AUTO_DEADBAND`);
* W = 1 + eˣ, clipped to [1, auto_w_max]; C2 applies M = 1/W (the paper's pairs 1.1/0.9 and 1.05/0.95 within 1 %).

The constants were chosen once, on the validation panel of docs/benchmarks.md, not per task.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Mapping

from torch import Tensor

from stare_lab.config import STAREConfig
from stare_lab.errors import DataError

logger = logging.getLogger(__name__)

__all__ = ["STAREController", "auto_band", "AUTO_W0", "AUTO_K_ACQUIRE", "AUTO_K_BALANCE", "AUTO_MARGIN",
           "AUTO_WINDOW", "AUTO_K_RESCUE", "AUTO_DEADBAND", "AUTO_ERROR_CLIP", "AUTO_X_MIN"]

#: W at the first crossing of H_tgt (the acquisition starts from it)
AUTO_W0 = 2.0
#: acquire only while the entropy still falls (the fall arrested, W holds until H̄ is back at the target)
AUTO_ACQUIRE_WHILE_FALLING = True
#: acquisition gain: ln(W − 1) per band of error per step, from the crossing until H̄ is back at H_tgt
AUTO_K_ACQUIRE = 0.2
#: hold: the rate per step at which ln(W − 1) relaxes towards ln(AUTO_MARGIN · the realised push)
AUTO_K_BALANCE = 0.1
#: hold: W − 1 is kept this factor above the realised push (the gate then opens on ~1/AUTO_MARGIN of the steps): W
#: stays near the smallest W that holds, whose balance is the critical W (a larger W's pushed steps saturate, and its
#: balance overstates the W needed: docs/theory.md §9)
AUTO_MARGIN = 1.1
#: hold: steps of the exponential mean of the realised push (and steps of hold before it is used)
AUTO_WINDOW = 20
#: hold: rescue gain, ln(W − 1) per band of error beyond the dead band per step
AUTO_K_RESCUE = 0.3
#: hold: the dead band of the rescue, in bands below H_tgt
AUTO_DEADBAND = 1.0
#: the error (in bands) the auto schedule acts on at most, per step
AUTO_ERROR_CLIP = 3.0
#: the floor of x = ln(W − 1): W ≥ 1 + e^AUTO_X_MIN ≈ 1.0001 (W − 1 stays positive so that x can rise again)
AUTO_X_MIN = math.log(1e-4)

_FLOAT_KEYS = ("reweight_w", "reweight_m", "last_entropy", "auto_push", "auto_x")
_COUNT_KEYS = ("num_updates", "num_skipped", "crossed_at", "auto_hold_steps")


def auto_band(target_entropy: float) -> float:
    """The error unit b (nats) of the auto schedule: the held band's half-width min(0.05, H_tgt/4)
    (docs/theory.md §7; :func:`stare_lab.platform.summary.held_band` at the default band)."""
    return max(min(0.05, 0.25 * float(target_entropy)), 1e-6)


class STAREController:
    """The per-step STARE state: the entropy gate and the W/M schedule (module docstring).

    Call :meth:`update` once per training step, before the update, with the batch token-mean entropy H̄ (nats,
    all-reduced across ranks), then pass ``gate_on``, ``reweight_w`` and ``reweight_m`` to the weights / loss.
    A non-finite H̄ (NaN/±inf) leaves the whole state unchanged; it is logged as a warning, counted in
    ``num_skipped`` and flagged in ``last_update_skipped`` (True until the next finite update). Before the first
    finite update ``gate_on`` is False for gate ``"entropy"`` (no entropy measured yet: plain GRPO), True for
    ``"always"``, False for ``"never"``.

    Attributes:
        gate_on: the current gate decision.
        reweight_w: current W (≥ 1).
        reweight_m: current M (∈ (0, 1]).
        last_entropy: the last finite H̄ seen (NaN before the first).
        num_updates: number of finite updates applied.
        num_skipped: number of non-finite updates ignored.
        last_update_skipped: whether the most recent :meth:`update` call was ignored.
        crossed_at: the update (1-based count of finite updates) at which H̄ first fell below H_tgt; 0 before.
        auto_x: the auto schedule's x = ln(W − 1); None before the crossing (and without the auto schedule).
        auto_push: the auto schedule's exponential sum behind :meth:`realised_push` (0 before the hold).
        auto_hold_steps: updates since the auto schedule entered its hold (0 while acquiring).
    """

    _STATE_KEYS = ("gate_on", "reweight_w", "reweight_m", "last_entropy", "num_updates", "num_skipped",
                   "last_update_skipped", "crossed_at", "auto_x", "auto_push", "auto_hold_steps")
    #: keys a checkpoint written before the auto schedule lacks: restored as their initial values
    _OPTIONAL_KEYS = ("crossed_at", "auto_x", "auto_push", "auto_hold_steps")

    def __init__(self, config: STAREConfig | None = None) -> None:
        self.config = STAREConfig() if config is None else config
        self.gate_on = self.config.gate == "always"
        self.reweight_w = float(self.config.reweight_w)
        self.reweight_m = float(self.config.reweight_m)
        self.last_entropy = float("nan")
        self.num_updates = 0
        self.num_skipped = 0
        self.last_update_skipped = False
        self.crossed_at = 0
        self.auto_x: float | None = None
        self.auto_push = 0.0
        self.auto_hold_steps = 0
        if self._auto:
            self.reweight_w = min(AUTO_W0, float(self.config.auto_w_max))
            self.reweight_m = self._auto_m(self.reweight_w)

    @property
    def _auto(self) -> bool:
        return self.config.adaptive and self.config.schedule == "auto"

    def _auto_m(self, w: float) -> float:
        """M under the auto schedule: 1/W for C2; O1 keeps the configured M (which it never applies)."""
        return 1.0 / w if self.config.variant == "C2" else float(self.config.reweight_m)

    def update(self, batch_entropy: float | Tensor) -> bool:
        """Apply one step's batch token-mean entropy H̄ (nats); return the gate decision for this step.

        Raises:
            DataError: if ``batch_entropy`` is not a real number (e.g. a string or a multi-element tensor).
        """
        if isinstance(batch_entropy, Tensor):
            if batch_entropy.numel() != 1:
                raise DataError(f"batch_entropy must be a scalar, got a tensor of shape {tuple(batch_entropy.shape)}")
            batch_entropy = batch_entropy.item()
        if isinstance(batch_entropy, bool) or not isinstance(batch_entropy, numbers.Real):
            raise DataError(f"batch_entropy={batch_entropy!r} must be a real number (nats)")
        h = float(batch_entropy)
        previous = self.last_entropy
        if not math.isfinite(h):
            self.num_skipped += 1
            self.last_update_skipped = True
            logger.warning("STAREController.update: batch entropy %r is not finite; state left unchanged", h)
            return self.gate_on
        cfg = self.config
        self.last_update_skipped = False
        self.last_entropy = h
        self.num_updates += 1
        if cfg.gate == "entropy":
            self.gate_on = h < cfg.target_entropy
        else:
            self.gate_on = cfg.gate == "always"
        if not self.crossed_at and h < cfg.target_entropy:
            self.crossed_at = self.num_updates
        if not cfg.adaptive:
            return self.gate_on
        if self._auto:
            self._auto_update(h, previous)
        else:
            diff = cfg.target_entropy - h
            sign = (diff > 0) - (diff < 0)
            self.reweight_w = min(max(self.reweight_w + cfg.alpha * sign, 1.0), cfg.w_max)
            self.reweight_m = min(max(self.reweight_m - cfg.alpha * sign, cfg.m_min), 1.0)
        return self.gate_on

    def _auto_update(self, h: float, previous: float) -> None:
        """One step of the auto schedule (module docstring)."""
        cfg = self.config
        if not self.crossed_at:
            return
        e = min(max((cfg.target_entropy - h) / auto_band(cfg.target_entropy), -AUTO_ERROR_CLIP), AUTO_ERROR_CLIP)
        if self.auto_x is None:  # the crossing step
            x = math.log(self.reweight_w - 1.0)
        elif self.auto_hold_steps == 0 and e > 0:  # acquiring: below the target ever since the crossing
            falling = not (AUTO_ACQUIRE_WHILE_FALLING and math.isfinite(previous) and h > previous)
            x = self.auto_x + AUTO_K_ACQUIRE * e * falling
        else:
            self.auto_hold_steps += 1
            x = self.auto_x + AUTO_K_RESCUE * max(0.0, e - AUTO_DEADBAND)
            if self.auto_hold_steps > AUTO_WINDOW and self.auto_push > 0:
                x += AUTO_K_BALANCE * (math.log(AUTO_MARGIN * self.realised_push()) - x)
        x_cap = math.log(cfg.auto_w_max - 1.0)
        self.auto_x = min(max(x, AUTO_X_MIN), x_cap)
        # at the cap W is auto_w_max exactly (1 + exp(ln(w_max − 1)) can round below it)
        self.reweight_w = float(cfg.auto_w_max) if self.auto_x >= x_cap else 1.0 + math.exp(self.auto_x)
        self.reweight_m = self._auto_m(self.reweight_w)
        if self.auto_hold_steps:
            decay = 1.0 - 1.0 / AUTO_WINDOW
            self.auto_push = decay * self.auto_push + (1.0 - decay) * float(self.gate_on) * (self.reweight_w - 1.0)

    def realised_push(self) -> float:
        """p̂: the mean push gate·(W − 1) of the hold so far, exponentially weighted over ~AUTO_WINDOW steps (the
        bias-corrected exponential mean of ``auto_push``); 0 before the hold."""
        if not self.auto_hold_steps:
            return 0.0
        return self.auto_push / (1.0 - (1.0 - 1.0 / AUTO_WINDOW) ** self.auto_hold_steps)

    def state_dict(self) -> dict[str, Any]:
        """The resumable state as plain Python values (JSON/YAML/torch.save friendly)."""
        return {key: getattr(self, key) for key in self._STATE_KEYS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (one written before the auto schedule existed, without the
        auto keys, restores them as their initial values).

        Raises:
            DataError: if a key is missing or unknown, or a value has the wrong type.
        """
        fresh = STAREController(self.config)
        state = {**{k: getattr(fresh, k) for k in self._OPTIONAL_KEYS if k not in state}, **state}
        missing = [key for key in self._STATE_KEYS if key not in state]
        unknown = sorted(set(state) - set(self._STATE_KEYS))
        if missing or unknown:
            raise DataError(
                f"STAREController state: missing keys {missing}, unknown keys {unknown}; "
                f"expected exactly {list(self._STATE_KEYS)}"
            )
        for key in ("gate_on", "last_update_skipped"):
            if not isinstance(state[key], bool):
                raise DataError(f"STAREController state: {key}={state[key]!r} must be a bool")
        for key in _COUNT_KEYS:
            if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
                raise DataError(f"STAREController state: {key}={state[key]!r} must be a non-negative integer")
        for key in _FLOAT_KEYS:
            if key == "auto_x" and state[key] is None:
                continue
            if isinstance(state[key], bool) or not isinstance(state[key], numbers.Real):
                raise DataError(f"STAREController state: {key}={state[key]!r} must be a number")
        if not 1.0 <= float(state["reweight_w"]) < math.inf:
            raise DataError(f"STAREController state: reweight_w={state['reweight_w']!r} must be finite and >= 1")
        if not 0.0 < float(state["reweight_m"]) <= 1.0:
            raise DataError(f"STAREController state: reweight_m={state['reweight_m']!r} must be in (0, 1]")
        for key in self._STATE_KEYS:
            value = state[key]
            setattr(self, key, float(value) if key in _FLOAT_KEYS and value is not None else value)
