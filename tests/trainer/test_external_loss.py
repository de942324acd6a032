"""A loss registered outside the package trains the tiny trainer with no other edit (issue 14).

This file is also the program that trains: run as a script it registers the toy loss and its method, then hands
its arguments to the trainer's own command line (``trainer.cli.main``). The toy loss (defined here, nowhere else):

    ℓ_t = −s · Â · ρ_t · (H_t − H̄_step)

with ``s = loss.params.scale``, H_t the old policy's entropy at token t and H̄_step the token-mean entropy of the
whole step — a global statistic the loss declares (``register_global_stat`` + ``LossNeeds(global_stats=...)``), so
the trainer must compute it over all micro-batches and ranks and hand it over; the loss also declares
``entropy=True``, so the trainer must pass the per-token entropies. Hand-predicted consequences, checked on the
tiny-cpu preset (HF engine, one step, the same seed): the loss is linear in s, so at s = 2 the step's gradient norm
and policy loss are exactly twice those at s = 1 (the rollouts of step 1 do not depend on s); the loss reports the
centre it received as ``loss/toy_centre``, which must be the step's ``entropy``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.trainer]
_spec = importlib.util.spec_from_file_location("_runs", Path(__file__).with_name("_runs.py"))
runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runs)

NAME = "toy_entropy_centred"


def register() -> None:
    """Register the toy loss, its global statistic and its method (what a user's own module would do)."""
    from stare_lab.loss.losses import LossNeeds, register_policy_loss
    from stare_lab.loss.methods import register_method
    from stare_lab.loss.step import TokenMean, register_global_stat

    register_global_stat(f"{NAME}/centre", TokenMean("entropy"))

    @register_policy_loss(NAME, needs=LossNeeds(entropy=True, global_stats=(f"{NAME}/centre",)),
                          metrics=("loss/toy_centre",))
    def toy(ctx, cfg):
        centre = ctx.inputs.global_stats[f"{NAME}/centre"]
        h = ctx.inputs.entropy.detach().float()
        scale = float(cfg.params.get("scale", 1.0))
        return -scale * ctx.adv * ctx.ratio * (h - centre), {"loss/toy_centre": float(centre)}

    register_method(NAME, NAME)


def _train(tmp: Path, data: Path, scale: float) -> dict:
    out = tmp / f"scale_{scale}"
    runs.run([sys.executable, __file__, "--preset", "tiny-cpu", "--train-data", str(data), "--out", str(out),
              f"method={NAME}", f"loss.loss_mode={NAME}", f"loss.params.scale={scale}", "rollout.engine=hf",
              "schedule.total_steps=1", "seed=3"])
    (row,) = runs.rows(out)
    assert json.loads((out / "summary.json").read_text())["steps"] == 1
    return row


def test_toy_loss_from_outside_trains_the_tiny_trainer(require, gsm8k_digits, tmp_path):
    require("deepspeed", "transformers", "math_verify")
    one, two = _train(tmp_path, gsm8k_digits, 1.0), _train(tmp_path, gsm8k_digits, 2.0)
    for row in (one, two):
        assert row["skipped"] == 0 and row["grad_norm"] > 0
        # the declared global statistic reached the loss: the step's token-mean entropy, over every micro-batch
        assert row["loss/toy_centre"] == pytest.approx(row["entropy"], abs=1e-6)
        assert "stare/num_pos_selected" not in row  # no STARE machinery for a loss that did not ask for it
    assert one["reward"] == two["reward"] and one["entropy"] == two["entropy"]  # the same rollouts
    assert two["grad_norm"] == pytest.approx(2 * one["grad_norm"], rel=1e-5)
    assert two["loss/pg_loss"] == pytest.approx(2 * one["loss/pg_loss"], rel=1e-5, abs=1e-9)
    assert abs(one["loss/pg_loss"]) > 0  # Σ Â (H_t − H̄) over the step is not 0 for these rollouts


if __name__ == "__main__":
    register()
    from trainer.cli import main

    sys.exit(main(sys.argv[1:]))
