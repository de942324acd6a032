"""The per-step STARE controller: the entropy gate and the W/M schedules (docs/theory.md §4 step 3, §9).

:class:`STAREController` is called once per optimizer step, before the update, with the batch token-mean entropy
H̄ (nats, reduced over ranks), and decides the step's gate and W/M:

* gate: ``"entropy"`` → on iff H̄ < H_tgt (the paper's); ``"always"`` / ``"never"`` force it;
* fixed W/M (``adaptive`` false): the configured ``reweight_w`` / ``reweight_m``;
* the paper's schedule (``adaptive``, ``schedule="paper"``): W ← clip(W + α·sgn(H_tgt − H̄), [1, w_max]),
  M ← clip(M − α·sgn(H_tgt − H̄), [m_min, 1]);
* the auto schedule (``adaptive``, ``schedule="auto"``): the balance controller below.

The auto schedule (docs/theory.md §9). Near the target the entropy moves as ΔH ≈ D_GRPO + u·D_push per step, with
u = gate·(W − 1) the applied push; the band holds where the mean push cancels the drift. The controller reads only
the H̄ of each step (what every consumer already measures) and acts on x = ln(W − 1), so that a W of 1.1 and one of
10 are found equally fast:

* before the first crossing of H_tgt it does nothing (the gate is off anyway);
* from the crossing on, every step: e = (H_tgt − H̄)/b, the error in units of the held band b = min(0.05,
  H_tgt/4) (docs/theory.md §7), clipped to ±:data:`AUTO_ERROR_CLIP`; the integral x ← x + k_i·e and
  W = 1 + exp(x + k_p·e), clipped to [1, auto_w_max]; C2 applies M = 1/W.

The integral term is what holds the band: it moves W until the mean error is zero, so the mean push over the hold
equals the drift, whatever the model: 1 + mean gate·(W − 1) over the hold is the W this model needed (the run's
``balance_w``). The gains are fixed constants (:data:`AUTO_KI`, :data:`AUTO_KP`), chosen once on the validation panel
(docs/benchmarks.md), not per task.
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

__all__ = ["STAREController", "AUTO_KI", "AUTO_KP", "AUTO_ERROR_CLIP", "AUTO_X_MIN", "auto_band"]

#: integral gain of the auto schedule: ln(W − 1) moves by AUTO_KI per band of error per step
AUTO_KI = 0.1
#: proportional gain of the auto schedule (ln(W − 1) per band of error)
AUTO_KP = 0.2
#: the error (in bands) the auto schedule acts on at most, per step
AUTO_ERROR_CLIP = 3.0
#: the floor of x = ln(W − 1): W ≥ 1 + e^AUTO_X_MIN ≈ 1.0001 (W − 1 stays positive so that x can rise again)
AUTO_X_MIN = math.log(1e-4)
import os as _os  # EXPERIMENT
_EXP = {k: float(_os.environ.get("STARE_AUTO_" + k, d)) for k, d in
        {"KI": AUTO_KI, "KP": AUTO_KP, "LATCH": 0, "OFFSET": 0, "W0": -1, "KG": 0, "PSTAR": 0.8, "KUP": 0, "DEAD": 1, "BAL": 0, "KAPPA": 1.25, "KB": 0.05, "NB": 20, "KACQ": 0}.items()}


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
        auto_x: the auto schedule's integral state x = ln(W − 1) (NaN before the crossing, or without it).
    """

    _STATE_KEYS = (
        "gate_on",
        "reweight_w",
        "reweight_m",
        "last_entropy",
        "num_updates",
        "num_skipped",
        "last_update_skipped",
        "crossed_at",
        "auto_x",
    )
    #: keys a checkpoint written before the auto schedule lacks: restored as their initial values
    _OPTIONAL_KEYS = ("crossed_at", "auto_x")

    def __init__(self, config: STAREConfig | None = None) -> None:
        self.config = STAREConfig() if config is None else config
        self.gate_on = self.config.gate == "always"
        self.reweight_w = float(self.config.reweight_w)
        self.reweight_m = float(self.config.reweight_m)
        if self._auto:
            self.reweight_m = self._auto_m(self.reweight_w)
        self.last_entropy = float("nan")
        self.num_updates = 0
        self.num_skipped = 0
        self.last_update_skipped = False
        self.crossed_at = 0
        self.auto_x = float("nan")

    @property
    def _auto(self) -> bool:
        return self.config.adaptive and self.config.schedule == "auto"

    def _auto_m(self, w: float) -> float:
        """C2 under the auto schedule: M = 1/W (the paper's pairs 1.1/0.9 and 1.05/0.95 within 1 %); O1: M as set."""
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
        if self._auto and self.crossed_at and _EXP["LATCH"] and cfg.gate == "entropy":
            self.gate_on = True
        if not cfg.adaptive:
            return self.gate_on
        if self._auto:
            self._auto_update(h)
        else:
            diff = cfg.target_entropy - h
            sign = (diff > 0) - (diff < 0)
            self.reweight_w = min(max(self.reweight_w + cfg.alpha * sign, 1.0), cfg.w_max)
            self.reweight_m = min(max(self.reweight_m - cfg.alpha * sign, cfg.m_min), 1.0)
        return self.gate_on

    def _auto_update(self, h: float) -> None:
        """One step of the auto schedule (module docstring)."""
        cfg = self.config
        if not self.crossed_at:
            return
        if math.isnan(self.auto_x):  # the crossing step: start from the configured W
            w0 = _EXP["W0"] if _EXP["W0"] > 0 else float(cfg.reweight_w)
            self.auto_x = math.log(max(w0 - 1.0, math.exp(AUTO_X_MIN)))
        e = (cfg.target_entropy - _EXP["OFFSET"] * auto_band(cfg.target_entropy) - h) / auto_band(cfg.target_entropy)
        e = min(max(e, -AUTO_ERROR_CLIP), AUTO_ERROR_CLIP)
        x_max = math.log(cfg.auto_w_max - 1.0)
        up = _EXP["KUP"] * max(0.0, e - _EXP["DEAD"]) if _EXP["KUP"] > 0 else _EXP["KI"] * e
        if _EXP["BAL"]:
            # realized push of the previous step (gate and W as applied then)
            if not hasattr(self, "_bal"):
                self._bal, self._nbal, self._back = 0.0, 0, False
            lam = 1.0 - 1.0 / _EXP["NB"]
            if h >= cfg.target_entropy:
                self._back = True
            if not self._back and _EXP["KACQ"] > 0:
                up = _EXP["KACQ"] * e
            xt = self.auto_x + up
            if self._back and self._nbal >= _EXP["NB"] and self._bal > 0:
                xt += _EXP["KB"] * (math.log(_EXP["KAPPA"] * self._bal) - xt)
            self.auto_x = min(max(xt, AUTO_X_MIN), x_max)
        else:
            self.auto_x = min(max(self.auto_x + up + _EXP["KG"] * (float(self.gate_on) - _EXP["PSTAR"]), AUTO_X_MIN), x_max)
        x = min(max(self.auto_x + _EXP["KP"] * e, AUTO_X_MIN), x_max)
        self.reweight_w = min(1.0 + math.exp(x), float(cfg.auto_w_max))
        self.reweight_m = self._auto_m(self.reweight_w)
        if _EXP["BAL"]:
            lam = 1.0 - 1.0 / _EXP["NB"]
            self._bal = lam * self._bal + (1 - lam) * (float(self.gate_on) * (self.reweight_w - 1.0))
            self._nbal += 1

    def state_dict(self) -> dict[str, Any]:
        """The resumable state as plain Python values (JSON/YAML/torch.save friendly)."""
        return {key: getattr(self, key) for key in self._STATE_KEYS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (one written before the auto schedule existed, without
        ``crossed_at`` / ``auto_x``, restores them as their initial values).

        Raises:
            DataError: if a key is missing or unknown, or a value has the wrong type.
        """
        state = {**{k: getattr(STAREController(self.config), k) for k in self._OPTIONAL_KEYS
                    if k not in state}, **state}
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
        for key in ("num_updates", "num_skipped", "crossed_at"):
            if isinstance(state[key], bool) or not isinstance(state[key], int) or state[key] < 0:
                raise DataError(f"STAREController state: {key}={state[key]!r} must be a non-negative integer")
        for key in ("reweight_w", "reweight_m", "last_entropy", "auto_x"):
            if isinstance(state[key], bool) or not isinstance(state[key], numbers.Real):
                raise DataError(f"STAREController state: {key}={state[key]!r} must be a number")
        if not 1.0 <= float(state["reweight_w"]) < math.inf:
            raise DataError(f"STAREController state: reweight_w={state['reweight_w']!r} must be finite and >= 1")
        if not 0.0 < float(state["reweight_m"]) <= 1.0:
            raise DataError(f"STAREController state: reweight_m={state['reweight_m']!r} must be in (0, 1]")
        for key in self._STATE_KEYS:
            value = state[key]
            setattr(self, key, float(value) if key in ("reweight_w", "reweight_m", "last_entropy", "auto_x") else value)
