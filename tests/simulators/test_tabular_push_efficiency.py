"""The tabular simulator's push efficiency ``push_efficiency`` (simulators/tabular/config.py, engine.batch_step): a
step with the gate on applies Δz_GRPO + e·((W − 1)·Δz_L+ + (M − 1)·Δz_L−); the D terms and W*(t) stay the loss's."""

from __future__ import annotations

import json
import re

import pytest
import torch

from simulators.tabular.engine import batch_step
from simulators.tabular.runner import config_from_overrides, init_state, run, run_batch, stack_states
from stare_lab.errors import ConfigError

TINY = {
    "num_prompts": 4, "group_size": 4, "seq_len": 3, "vocab_size": 5, "num_correct": 2, "threshold": 2,
    "reward_noise": 0.0, "steps": 6,
}
#: a target far above the initial entropy (ln 5 = 1.61 at most): the gate is on from the first step
GATE_ON = {"target_entropy": 5.0, "reweight_w": 10.0, "reweight_m": 0.2}
#: a target far below it: the gate is off on the first steps
GATE_OFF = {"target_entropy": 0.01, "reweight_w": 10.0, "reweight_m": 0.2}


def tiny(**kw):
    return config_from_overrides({**TINY, **kw})


def rows_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def first_step(config):
    return batch_step(stack_states([config], [init_state(config)]))


@pytest.mark.parametrize("value, msg", [
    (0.0, "push_efficiency=0 is outside (0, 1]"),
    (1.5, "push_efficiency=1.5 is outside (0, 1]"),
    (float("nan"), "push_efficiency=nan must be a number"),
])
def test_bad_push_efficiency_names_the_key(value, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        tiny(push_efficiency=value)


@pytest.mark.parametrize("method", ["o1", "c2"])
def test_step_is_grpo_plus_a_share_of_the_push(method):
    """First step, same seed (same tables and rollouts): the GRPO run's Δz is Δz_GRPO and the whole-push run's is
    Δz_GRPO + push, so e = 0.3 must give Δz_GRPO + 0.3·(Δz − Δz_GRPO); the D terms and W*(t) are the loss's (as
    with e = 1) and the push's first-order entropy change is 0.3 of it."""
    grpo, _, _ = first_step(tiny(method="grpo"))
    full, rows_full, _ = first_step(tiny(method=method, loss={"stare": GATE_ON}))
    part, rows, _ = first_step(tiny(method=method, push_efficiency=0.3, loss={"stare": GATE_ON}))
    assert rows[0]["gate_on"] == 1
    assert float((full - grpo).norm()) > float(grpo.norm())  # W 10: the push is not small
    # ω is float32 in the loss: M = 0.2 is not exact there, so C2's Δz equals Δz_GRPO + push to ~1e-9
    assert torch.allclose(part, grpo + 0.3 * (full - grpo), rtol=0, atol=1e-8)
    for key in ("pred/d_grpo", "pred/d_lplus", "pred/d_lminus", "pred/w_star", "pred/d_ratio"):
        assert rows[0][key] == pytest.approx(rows_full[0][key], rel=1e-12)
    assert rows[0]["stare/push_first_order"] == pytest.approx(0.3 * rows_full[0]["stare/push_first_order"], rel=1e-12)


def test_gate_off_and_full_efficiency_are_unchanged(tmp_path):
    """e = 1 gives the rows of no push_efficiency bit for bit; with the gate off a step has no push to scale."""
    run(tiny(method="c2", loss={"stare": GATE_ON}), tmp_path / "none")
    run(tiny(method="c2", push_efficiency=1.0, loss={"stare": GATE_ON}), tmp_path / "one")
    assert rows_of(tmp_path / "none") == rows_of(tmp_path / "one")
    off, rows_off, _ = first_step(tiny(method="o1", loss={"stare": GATE_OFF}))
    low, rows_low, _ = first_step(tiny(method="o1", push_efficiency=0.3, loss={"stare": GATE_OFF}))
    assert rows_low[0]["gate_on"] == 0 and torch.equal(off, low)


@pytest.mark.parametrize("mode", ["sampled", "expected"])
def test_push_efficiency_batched_equal_one_at_a_time(tmp_path, mode):
    """Runs with and without the knob in one batch give each run's rows bit for bit as run alone."""
    configs = [tiny(method=m, mode=mode, seed=i, push_efficiency=e, steps=4, loss={"stare": GATE_ON})
               for i, (m, e) in enumerate([("o1", 0.5), ("c2", None), ("c2", 0.25), ("grpo", 0.5)])]
    run_batch(configs, [tmp_path / "batch" / str(i) for i in range(len(configs))])
    for i, c in enumerate(configs):
        run(c, tmp_path / "single" / str(i))
        assert rows_of(tmp_path / "batch" / str(i)) == rows_of(tmp_path / "single" / str(i))
