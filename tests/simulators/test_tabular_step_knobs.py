"""The tabular step's two knobs (simulators/tabular/config.py, engine.batch_step):

- the gradient-norm clip ``clip_rel`` (engine.clip_factors): each run's step Δz is scaled by
  min(1, clip_rel·‖Δz_GRPO‖/‖Δz‖), ‖Δz_GRPO‖ the norm of the ω ≡ 1 update of the same rollouts;
- the push efficiency ``push_efficiency`` e: a step with the gate on applies Δz_GRPO + e·((W − 1)·Δz_L+ +
  (M − 1)·Δz_L−); the D terms and W*(t) stay the loss's."""

from __future__ import annotations

import json
import re
import types

import pytest
import torch

from simulators.tabular.engine import batch_step, clip_factors
from simulators.tabular.runner import config_from_overrides, init_state, run, run_batch, stack_states
from stare_lab.errors import ConfigError

TINY = {
    "num_prompts": 4, "group_size": 4, "seq_len": 3, "vocab_size": 5, "num_correct": 2, "threshold": 2,
    "reward_noise": 0.0, "steps": 6,
}
#: a target far above the initial entropy (ln 5 = 1.61 at most): the O1 gate is on from the first step
GATE_ON = {"target_entropy": 5.0, "reweight_w": 10.0}
#: the same for C2 at M 0.2, and a target far below the initial entropy: the gate is off on the first steps
GATE_ON_M = {**GATE_ON, "reweight_m": 0.2}
GATE_OFF_M = {"target_entropy": 0.01, "reweight_w": 10.0, "reweight_m": 0.2}


def tiny(**kw):
    return config_from_overrides({**TINY, **kw})


def rows_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def first_step(config):
    return batch_step(stack_states([config], [init_state(config)]))


@pytest.mark.parametrize("value, msg", [
    (0.0, "clip_rel=0 is outside (0, inf)"),
    (-1.0, "clip_rel=-1 is outside (0, inf)"),
    (float("inf"), "clip_rel=inf must be finite"),
    (float("nan"), "clip_rel=nan must be a number"),
    ("big", "clip_rel='big' must be a number"),
    (False, "clip_rel=False must be a number or null (YAML reads off/on/no/yes as false/true: write null for none)"),
])
def test_bad_clip_rel_names_the_key(value, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        tiny(clip_rel=value)


def test_clip_factor_by_hand():
    """Δz = (3, 4) (norm 5), Δz_GRPO = (1, 0) (norm 1): clip_rel 2 → factor 2/5, ratio 5; clip_rel 6 → no clip
    (6·1 ≥ 5); no clip_rel → 1; a zero GRPO step → 1, ratio NaN."""
    parts = torch.zeros(4, 4, 1, 1, 2, dtype=torch.float64)
    parts[0, :, 0, 0] = torch.tensor([3.0, 4.0])
    parts[1, :3, 0, 0] = torch.tensor([1.0, 0.0])  # run 3: zero GRPO step
    batch = types.SimpleNamespace(configs=[types.SimpleNamespace(clip_rel=v) for v in (2.0, 6.0, None, 2.0)])
    factor, ratio = clip_factors(batch, parts)
    assert factor.tolist()[:3] == pytest.approx([0.4, 1.0, 1.0])
    assert factor[3] == 1.0 and torch.isnan(ratio[3])
    assert ratio.tolist()[:3] == pytest.approx([5.0, 5.0, 5.0])
    none = types.SimpleNamespace(configs=[types.SimpleNamespace(clip_rel=None)])
    assert clip_factors(none, parts[:, :1]) is None


def test_clipped_step_norm_is_clip_rel_times_the_grpo_step():
    """First step, same seed (same initial tables and rollouts): the GRPO run's Δz is Δz_GRPO, the unclipped O1
    run's (gate on, W 10) is Δz; clip_rel 1.5 must give Δz·1.5‖Δz_GRPO‖/‖Δz‖ — of norm 1.5‖Δz_GRPO‖ — and log the
    factor and the norm ratio; a clip above the ratio changes nothing."""
    grpo, _, _ = first_step(tiny(method="grpo"))
    o1, _, _ = first_step(tiny(method="o1", loss={"stare": GATE_ON}))
    g, d = float(grpo[0].norm()), float(o1[0].norm())
    assert d > 1.6 * g  # W 10 makes the step much longer than GRPO's, so 1.5 clips
    clipped, rows, _ = first_step(tiny(method="o1", clip_rel=1.5, loss={"stare": GATE_ON}))
    assert float(clipped[0].norm()) == pytest.approx(1.5 * g, rel=1e-12)
    assert torch.allclose(clipped[0], o1[0] * (1.5 * g / d), rtol=1e-12, atol=0)
    assert rows[0]["clip/factor"] == pytest.approx(1.5 * g / d, rel=1e-12)
    assert rows[0]["clip/norm_ratio"] == pytest.approx(d / g, rel=1e-12)
    # the first-order keys are of the clipped step: all scale with the factor
    _, rows_off, _ = first_step(tiny(method="o1", loss={"stare": GATE_ON}))
    for key in ("pred_entropy_change", "pred/d_grpo", "pred/d_lplus", "stare/push_first_order",
                "quadrant/pos_high/dH"):
        assert rows[0][key] == pytest.approx(rows_off[0][key] * 1.5 * g / d, rel=1e-9, abs=1e-15)
    loose, rows_loose, _ = first_step(tiny(method="o1", clip_rel=1.01 * d / g, loss={"stare": GATE_ON}))
    assert torch.equal(loose, o1) and rows_loose[0]["clip/factor"] == 1.0


def test_clip_off_is_unchanged(tmp_path):
    """A clip that never acts (clip_rel 1e9) gives the rows of no clip bit for bit, apart from its own keys; GRPO
    with clip_rel ≥ 1 is never clipped (its step is its GRPO step)."""
    run(tiny(method="c2", loss={"stare": GATE_ON}), tmp_path / "off")
    run(tiny(method="c2", clip_rel=1e9, loss={"stare": GATE_ON}), tmp_path / "huge")
    huge = rows_of(tmp_path / "huge")
    assert all(r["clip/factor"] == 1.0 for r in huge)
    assert rows_of(tmp_path / "off") == [{k: v for k, v in r.items() if not k.startswith("clip/")} for r in huge]
    run(tiny(method="grpo"), tmp_path / "grpo")
    run(tiny(method="grpo", clip_rel=1.0), tmp_path / "grpo_clip")
    clip_rows = rows_of(tmp_path / "grpo_clip")
    assert all(r["clip/factor"] == 1.0 and r["clip/norm_ratio"] in (1.0, None) for r in clip_rows)
    assert rows_of(tmp_path / "grpo") == [{k: v for k, v in r.items() if not k.startswith("clip/")}
                                          for r in clip_rows]


@pytest.mark.parametrize("mode", ["sampled", "expected"])
@pytest.mark.parametrize("knob, values", [("clip_rel", (1.2, None, 2.0, 1.0)), ("push_efficiency", (0.5, None, 0.25, 0.5))])
def test_knobs_batched_equal_one_at_a_time(tmp_path, mode, knob, values):
    """Runs with and without the knob in one batch give each run's rows bit for bit as run alone."""
    configs = [tiny(method=m, mode=mode, seed=i, steps=4, loss={"stare": GATE_ON_M}, **{knob: v})
               for i, (m, v) in enumerate(zip(("o1", "c2", "c2", "grpo"), values))]
    run_batch(configs, [tmp_path / "batch" / str(i) for i in range(len(configs))])
    for i, c in enumerate(configs):
        run(c, tmp_path / "single" / str(i))
        assert rows_of(tmp_path / "batch" / str(i)) == rows_of(tmp_path / "single" / str(i))
    if knob == "clip_rel":
        assert any(r["clip/factor"] < 1 for r in rows_of(tmp_path / "single" / "0"))


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
    full, rows_full, _ = first_step(tiny(method=method, loss={"stare": GATE_ON_M}))
    part, rows, _ = first_step(tiny(method=method, push_efficiency=0.3, loss={"stare": GATE_ON_M}))
    assert rows[0]["gate_on"] == 1
    assert float((full - grpo).norm()) > float(grpo.norm())  # W 10: the push is not small
    # ω is float32 in the loss: M = 0.2 is not exact there, so C2's Δz equals Δz_GRPO + push to ~1e-9
    assert torch.allclose(part, grpo + 0.3 * (full - grpo), rtol=0, atol=1e-8)
    for key in ("pred/d_grpo", "pred/d_lplus", "pred/d_lminus", "pred/w_star", "pred/d_ratio"):
        assert rows[0][key] == pytest.approx(rows_full[0][key], rel=1e-12)
    assert rows[0]["stare/push_first_order"] == pytest.approx(0.3 * rows_full[0]["stare/push_first_order"], rel=1e-12)


def test_gate_off_and_full_efficiency_are_unchanged(tmp_path):
    """e = 1 gives the rows of no push_efficiency bit for bit; with the gate off a step has no push to scale."""
    run(tiny(method="c2", loss={"stare": GATE_ON_M}), tmp_path / "none")
    run(tiny(method="c2", push_efficiency=1.0, loss={"stare": GATE_ON_M}), tmp_path / "one")
    assert rows_of(tmp_path / "none") == rows_of(tmp_path / "one")
    off, rows_off, _ = first_step(tiny(method="o1", loss={"stare": GATE_OFF_M}))
    low, rows_low, _ = first_step(tiny(method="o1", push_efficiency=0.3, loss={"stare": GATE_OFF_M}))
    assert rows_low[0]["gate_on"] == 0 and torch.equal(off, low)
