"""Synthetic run directories with known dynamics, for tests, the benchmark and demos of the report.

Nothing here is a simulation: entropies follow closed-form curves (exponential collapse for GRPO-like methods,
relaxation to the target for STARE-like ones) plus seeded noise, so the analysis can be checked against known
values. Real runs come from ``stare-lab simulate`` and ``stare-lab train``.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from stare_lab.config import LossConfig, STAREConfig, to_dict
from stare_lab.errors import ConfigError
from stare_lab.platform.runs import RunWriter
from stare_lab.platform.summary import run_summary, summary_settings

__all__ = ["write_synthetic_run", "write_synthetic_sweep"]

_STARE = {"o1": "O1", "c2": "C2", "o1-adaptive": "O1"}


def write_synthetic_run(
    run_dir: str | os.PathLike,
    method: str = "grpo",
    seed: int = 0,
    steps: int = 200,
    source: str = "simulator",
    target_entropy: float = 0.3,
    initial_entropy: float = 0.6,
    noise: float = 0.002,
    noise_dh: float = 2e-4,
) -> Path:
    """Write one run directory whose entropy follows a closed form (nats):

    * STARE methods (``o1``, ``c2``, ``o1-adaptive``): H_t = H_tgt + (H_0 − H_tgt)·exp(−t/τ), τ = 150 (100 for c2);
    * every other method: H_t = H_0·exp(−t/200) + 0.01;

    plus N(0, noise²) per step. ``pred_entropy_change`` is the noiseless one-step change H_{t+1} − H_t and
    ``entropy_change`` that plus N(0, noise_dh²); ``pred/grad_dot`` is 0.9 × the prediction. Quadrant counts/ΔH,
    reward, accuracy, ``pass@8``, gate (on iff H_t < H_tgt for STARE methods), W/M and ``time/step_s`` = 0.01 s are
    logged too. Seeded by (``seed``, ``method``): same arguments ⇒ same file.

    Raises:
        ConfigError: if ``steps`` < 2.
    """
    if steps < 2:
        raise ConfigError(f"steps={steps} must be at least 2")
    rng = np.random.default_rng([seed, zlib.crc32(method.encode())])
    t = np.arange(steps + 1, dtype=np.float64)
    h0 = initial_entropy * (1 + 0.02 * rng.standard_normal())
    if method in _STARE:
        tau = 100.0 if method == "c2" else 150.0
        clean = target_entropy + (h0 - target_entropy) * np.exp(-t / tau)
    else:
        clean = h0 * np.exp(-t / 200.0) + 0.01
    h = clean + noise * rng.standard_normal(t.size)
    pred = np.diff(clean)
    meas = pred + noise_dh * rng.standard_normal(steps)
    stare = STAREConfig(variant=_STARE.get(method, "O1"), target_entropy=target_entropy)
    loss = LossConfig(loss_mode="stare" if method in _STARE else "grpo", stare=stare)
    config = {"source": source, "method": method, "seed": seed, "steps": steps, "loss": to_dict(loss)}
    counts = rng.poisson([40, 400, 40, 400], size=(steps, 4))
    rows = []
    with RunWriter(run_dir, config, overwrite=True) as w:
        for i in range(steps):
            gate = int(method in _STARE and h[i] < target_entropy)
            reward = 0.2 + 0.6 * (1 - np.exp(-i / 300.0)) + 0.05 * rng.standard_normal()
            row = {
                "step": i + 1,  # rows 1 … steps (docs/design.md §4)
                "entropy": h[i],
                "reward": reward,
                "gate_on": gate,
                "stare_w": stare.reweight_w if method in _STARE else 1.0,
                "stare_m": stare.reweight_m if method == "c2" else 1.0,
                "pred_entropy_change": pred[i],
                "entropy_change": meas[i],
                "pred/grad_dot": 0.9 * pred[i],
                "accuracy": reward,
                "pass@8": min(1.0, reward + 0.2),
                "time/step_s": 0.01,
            }
            for (q, sign), c in zip((("pos_high", 1), ("pos_low", -1), ("neg_high", -1), ("neg_low", 1)), counts[i]):
                row[f"quadrant/{q}/count"] = int(c)
                row[f"quadrant/{q}/dH"] = sign * 1e-4 * c
            w.log(row)
            rows.append(row)
        w.write_summary(run_summary(rows, **summary_settings(w.config)))  # as every writer: from the rows
    return Path(run_dir)


def write_synthetic_sweep(
    root: str | os.PathLike,
    methods: Sequence[str] = ("grpo", "o1", "c2"),
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 200,
    source: str = "simulator",
) -> Path:
    """Write ``root/<method>/seed<k>/`` run directories (the simulator's sweep layout) with
    :func:`write_synthetic_run`; returns ``root``."""
    root = Path(root)
    for m in methods:
        for s in seeds:
            write_synthetic_run(root / m / f"seed{s}", method=m, seed=s, steps=steps, source=source)
    return root
