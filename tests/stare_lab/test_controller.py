"""The STARE controller's auto schedule (stare_lab.loss.controller, docs/theory.md §9) on a closed-form toy.

The toy is the first-order picture of theory §7 with the D terms held constant: per step the entropy moves by
ΔH = D_GRPO + gate·(W − 1)·D_L+ (+ noise, optionally through a momentum-like lag), so the critical W is known in
closed form, W* = 1 − D_GRPO/D_L+, and over any stretch of steps the push that held is
mean gate·(W − 1) = (H_end − H_start − n·D_GRPO) / (n·D_L+) exactly (a telescoping sum). The controller sees only H̄.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from stare_lab.config import ConfigError, STAREConfig
from stare_lab.errors import DataError
from stare_lab.loss.controller import STAREController
from stare_lab.platform.summary import held_band, run_summary, summary_settings


def auto(target: float = 0.7, **kw) -> STAREController:
    return STAREController(STAREConfig(adaptive=True, schedule="auto", target_entropy=target, **kw))


def toy_rows(ctl: STAREController, *, d_grpo: float, w_star: float, steps: int, h0: float, noise: float = 0.0,
             lag: float = 0.0, seed: int = 0, d_lplus: float | None = None) -> list[dict]:
    """Metrics rows of the toy: H̄ measured (with noise) before each update; the push through a lag filter."""
    rng = random.Random(seed)
    d_lplus = -d_grpo / (w_star - 1.0) if d_lplus is None else d_lplus
    h, push, rows = h0, 0.0, []
    for step in range(1, steps + 1):
        gate = ctl.update(h + rng.gauss(0.0, noise) if noise else h)
        rows.append({"step": step, "entropy": h, "gate_on": int(gate), "stare_w": ctl.reweight_w,
                     "stare_m": ctl.reweight_m, "reward": 0.0})
        push = lag * push + (1.0 - lag) * (float(gate) * (ctl.reweight_w - 1.0))
        h = h + d_grpo + push * d_lplus
    return rows


@pytest.mark.parametrize("w_star", [1.1, 1.3, 3.0, 7.0, 12.0])
def test_auto_finds_the_closed_form_balance_and_holds_the_band(w_star):
    """Without noise or lag: the band holds, the balance W equals W* = 1 − D_GRPO/D_L+ to within the telescoping
    term (H_end − H_mid)/(n·D_L+), and the band is reached within 10 % of the run after the crossing."""
    target, d_grpo, steps = 0.7, -0.01, 600
    rows = toy_rows(auto(target), d_grpo=d_grpo, w_star=w_star, steps=steps, h0=1.5)
    s = run_summary(rows, target_entropy=target)
    assert s["held"] is True
    half = rows[steps // 2:]
    d_lplus = -d_grpo / (w_star - 1.0)
    h_end = half[-1]["entropy"] + d_grpo + float(half[-1]["gate_on"]) * (half[-1]["stare_w"] - 1) * d_lplus
    exact = w_star + (h_end - half[0]["entropy"]) / (len(half) * d_lplus)
    assert s["balance_w"] == pytest.approx(exact, rel=1e-9)
    assert abs(s["balance_w"] - w_star) <= 0.03 * (w_star - 1.0) + 1e-3
    assert s["crossing_step"] is not None and s["steps_to_band"] <= 0.1 * steps


@pytest.mark.parametrize("w_star", [1.3, 3.0, 7.0])
def test_auto_holds_through_measurement_noise_and_a_lagged_push(w_star):
    """H̄ measured with noise (σ = 0.6 of the band) and the push acting through a lag of ~5 steps (as Adam's
    momentum does on the small transformer): still held on every seed, balance W within 25 % of W* − 1."""
    target = 0.7
    for seed in range(3):
        rows = toy_rows(auto(target), d_grpo=-0.02, w_star=w_star, steps=300, h0=1.45, noise=0.03, lag=0.8,
                        seed=seed)
        s = run_summary(rows, target_entropy=target)
        assert s["held"] is True, (seed, s["mean_abs_dev_second_half"])
        assert abs(s["balance_w"] - w_star) <= 0.25 * (w_star - 1.0), (seed, s["balance_w"])


def noisy_toy(ctl: STAREController, *, d: float, p: float, steps: int, h0: float, sigma: float,
              seed: int = 0) -> tuple[list[dict], float, list[float]]:
    """The toy H_{t+1} = H_t + d + gate_t·(W_t − 1)·p + ξ_t with ξ_t ~ U[−σ, σ] (bounded process noise), the
    controller's decisions fed back. Returns the rows (H before each update), the entropy after the last update and
    the noise drawn."""
    rng = random.Random(seed)
    h, rows, noise = h0, [], []
    for step in range(1, steps + 1):
        gate = ctl.update(h)
        rows.append({"step": step, "entropy": h, "gate_on": int(gate), "stare_w": ctl.reweight_w,
                     "stare_m": ctl.reweight_m})
        noise.append(rng.uniform(-sigma, sigma))
        h = h + d + float(gate) * (ctl.reweight_w - 1.0) * p + noise[-1]
    return rows, h, noise


def settings(ctl: STAREController) -> dict:
    """The summary settings of a run with the controller's STARE config, read as from its ``config.yaml``."""
    return summary_settings({"loss": {"stare": dataclasses.asdict(ctl.config)}})


#: the toy of the balance tests: drift d per step, noise bound σ (a tenth of the band), 800 steps, H_tgt 0.7
D, SIGMA, STEPS, TARGET, H0 = -0.02, 0.005, 800, 0.7, 1.2


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("w_star", [1.1, 8.0])
def test_auto_reaches_the_closed_form_balance_under_bounded_noise(w_star, variant):
    """The toy H_{t+1} = H_t + d + gate·(W − 1)·p + ξ, |ξ| ≤ σ, has the balance W* = 1 − d/p (the mean push that
    cancels the drift). Over the n rows of the second half the entropy changes by n·d + p·n·(balance_w − 1) + Σξ
    (a telescoping sum), so balance_w − W* = (H_end − H_mid − Σξ)/(n·p) exactly. The tolerance follows from it:
    with every entropy of the second half (and the final one) within 2 held bands (2·0.05 nats) of H_tgt — asserted —
    and |Σξ| ≤ σ·√(2n·ln(2/δ)) (Hoeffding, δ = 1e-6: ≈ 0.54 nats at n = 400, σ = 0.005),
    |balance_w − W*| ≤ (0.2 + 0.54)/(n·p) = 0.74/(n·|d|)·(W* − 1) ≈ 9.3 % of W* − 1, for W* = 1.1 and W* = 8 alike
    (the schedule acts on ln(W − 1)). The band held (summary ``held``) with W below its cap, and was reached within
    10 % of the run after the crossing; C2 carries M = 1/W on every row and the same W as O1 (the variant does not enter the schedule), and
    its ``balance_m`` is 1 − mean gate·(1 − 1/W) over the second half, by hand."""
    p = -D / (w_star - 1.0)
    ctl = auto(TARGET, variant=variant)
    rows, h_end, noise = noisy_toy(ctl, d=D, p=p, steps=STEPS, h0=H0, sigma=SIGMA)
    s = run_summary(rows, **settings(ctl))
    assert s["target_entropy"] == TARGET and s["band"] == 0.05
    half = rows[STEPS // 2:]
    n, band = len(half), held_band(0.05, TARGET)
    assert max(abs(r["entropy"] - TARGET) for r in half) <= 2 * band and abs(h_end - TARGET) <= 2 * band
    # the cap does not bind in the hold (the acquisition may touch it briefly: the share counts from the crossing)
    assert s["held"] is True and all(r["stare_w"] < ctl.config.auto_w_max for r in half) and s["w_cap_share"] < 0.1
    hoeffding = SIGMA * math.sqrt(2 * n * math.log(2 / 1e-6))
    assert abs(sum(noise[STEPS // 2:])) <= hoeffding
    tol = (4 * band + hoeffding) / (n * p)
    assert tol <= 0.1 * (w_star - 1.0)
    assert abs(s["balance_w"] - w_star) <= tol, (s["balance_w"], w_star, tol)
    assert s["crossing_step"] is not None and 0 <= s["steps_to_band"] <= 0.1 * STEPS
    if variant == "C2":
        assert all(r["stare_m"] == 1.0 / r["stare_w"] for r in rows)
        o1_rows, _, _ = noisy_toy(auto(TARGET, variant="O1"), d=D, p=p, steps=STEPS, h0=H0, sigma=SIGMA)
        assert [r["stare_w"] for r in rows] == [r["stare_w"] for r in o1_rows]
        assert s["balance_m"] == pytest.approx(1 - sum(r["gate_on"] * (1 - 1 / r["stare_w"]) for r in half) / n)


def test_auto_at_its_cap_when_the_balance_is_above_it():
    """W* = 30 > auto_w_max = 20 (the same toy, bounded noise): no W the schedule may take cancels the drift. W goes
    to the cap and stays; the gate is on throughout the second half (H below H_tgt), so the second half's entropy
    falls by exactly n·(d + (w_max − 1)·p) + Σξ (closed form), balance_w = w_max, W is at the cap on more than 90 %
    of the steps (all but the few of the acquisition after the crossing), and the band is not held."""
    w_star, w_max = 30.0, 20.0
    p = -D / (w_star - 1.0)
    ctl = auto(TARGET, auto_w_max=w_max)
    rows, h_end, noise = noisy_toy(ctl, d=D, p=p, steps=STEPS, h0=H0, sigma=SIGMA)
    s = run_summary(rows, **settings(ctl))
    assert s["target_entropy"] == TARGET and s["band"] == 0.05
    half = rows[STEPS // 2:]
    # at the cap W = 1 + exp(ln(w_max − 1)), w_max to rounding (the summary's cap share allows 1e-9)
    assert all(r["gate_on"] == 1 and r["stare_w"] == pytest.approx(w_max, rel=1e-14) for r in half)
    assert h_end - half[0]["entropy"] == pytest.approx(len(half) * (D + (w_max - 1) * p) + sum(noise[STEPS // 2:]),
                                                       abs=1e-9)
    assert s["w_cap_share"] > 0.9 and s["balance_w"] == pytest.approx(w_max, rel=1e-12)
    assert s["held"] is False and s["steps_to_band"] is None


def test_a_push_that_does_nothing_drives_w_to_its_cap_and_the_summary_says_so():
    """D_L+ = 0: no W cancels the drift; W climbs to auto_w_max and stays; the summary's cap share is ~1."""
    ctl = auto(0.7, auto_w_max=10.0)
    rows = toy_rows(ctl, d_grpo=-0.005, w_star=2.0, steps=300, h0=1.0, d_lplus=0.0)
    s = run_summary(rows, target_entropy=0.7, w_max=ctl.config.w_cap)
    assert ctl.reweight_w == 10.0
    assert s["w_cap_share"] > 0.9 and s["held"] is False


def test_c2_auto_sets_m_to_one_over_w_and_o1_leaves_m_alone():
    c2 = auto(0.7, variant="C2")
    o1 = auto(0.7, variant="O1", reweight_m=0.9)
    for h in [1.0, 0.8, 0.6, 0.5, 0.4, 0.5, 0.6, 0.7, 0.8]:
        c2.update(h)
        o1.update(h)
        assert c2.reweight_m == pytest.approx(1.0 / c2.reweight_w, rel=1e-15)
        assert o1.reweight_m == 0.9


def test_before_the_crossing_auto_does_not_move_w_and_the_gate_is_off():
    ctl = auto(0.5)
    w0 = ctl.reweight_w
    for h in [2.0, 1.5, 1.0, 0.6, 0.5]:
        assert ctl.update(h) is False
        assert ctl.reweight_w == w0 and ctl.crossed_at == 0
    assert ctl.update(0.49) is True and ctl.crossed_at == 6


def test_auto_resume_from_state_dict_is_bit_exact():
    """Feed a controller the H̄ of a noisy toy run for 150 steps, rebuild a second one from its state, feed both the
    remaining 150: every later gate, W, M and the final state are identical, bit for bit, to the uninterrupted run."""
    full = auto(0.7, variant="C2")
    fed: list[float] = []
    orig_update = full.update

    def recording_update(h):
        fed.append(h)
        return orig_update(h)

    full.update = recording_update  # type: ignore[method-assign]
    rows = toy_rows(full, d_grpo=-0.02, w_star=5.0, steps=300, h0=1.45, noise=0.03, lag=0.5, seed=1)
    a = auto(0.7, variant="C2")
    for h in fed[:150]:
        a.update(h)
    b = auto(0.7, variant="C2")
    b.load_state_dict(a.state_dict())
    for h, row in zip(fed[150:], rows[150:]):
        gate = b.update(h)
        assert (int(gate), b.reweight_w, b.reweight_m) == (row["gate_on"], row["stare_w"], row["stare_m"])
    assert b.state_dict() == {**full.state_dict()}


def test_a_checkpoint_from_before_the_auto_schedule_loads():
    ctl = STAREController(STAREConfig(target_entropy=0.3))
    ctl.update(0.2)
    old = {k: v for k, v in ctl.state_dict().items() if k not in ("crossed_at", "auto_x")}
    fresh = STAREController(STAREConfig(target_entropy=0.3))
    fresh.load_state_dict(old)
    assert fresh.gate_on is True and fresh.crossed_at == 0 and fresh.auto_x is None
    with pytest.raises(DataError, match="crossed_at"):
        fresh.load_state_dict({**ctl.state_dict(), "crossed_at": -1})


def test_non_finite_entropy_leaves_the_auto_state_unchanged():
    ctl = auto(0.7)
    for h in [1.0, 0.6, 0.5]:
        ctl.update(h)
    before = ctl.state_dict()
    ctl.update(float("nan"))
    after = ctl.state_dict()
    assert {k: v for k, v in after.items() if k not in ("num_skipped", "last_update_skipped")} == \
        {k: v for k, v in before.items() if k not in ("num_skipped", "last_update_skipped")}


def test_schedule_config_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"stare.schedule='auto' adapts W: it needs stare.adaptive=true"):
        STAREConfig(schedule="auto")
    with pytest.raises(ConfigError, match=r"stare.schedule='fast' is not one of"):
        STAREConfig(schedule="fast")
    with pytest.raises(ConfigError, match=r"stare.auto_w_max=1 is outside \(1, inf\)"):
        STAREConfig(adaptive=True, schedule="auto", auto_w_max=1.0)
    # the paper schedule's bounds do not constrain auto
    assert STAREConfig(adaptive=True, schedule="auto", reweight_w=3.0).w_cap == 20.0
    assert STAREConfig(adaptive=True, reweight_w=1.2, w_max=1.5).w_cap == 1.5
    assert STAREConfig().w_cap is None


def test_summary_balance_crossing_and_time_to_band_by_hand():
    """balance_w = 1 + mean gate·(W − 1) and balance_m = 1 − mean gate·(1 − M) over rows ⌊n/2⌋…; crossing_step
    the first H < H_tgt; steps_to_band from there to the first step whose next 10 rows average within the band."""
    target = 1.0
    ent = [1.5, 1.2, 0.9, 0.6, 0.7] + [0.99] * 15
    gates = [0, 0, 1, 1, 1] + [1, 0] * 7 + [1]
    ws = [1.0, 1.0, 2.0, 3.0, 3.0] + [2.0, 4.0] * 7 + [2.0]
    ms = [1.0, 1.0, 0.5, 0.5, 0.5] + [0.8] * 15
    rows = [{"step": i + 1, "entropy": h, "gate_on": g, "stare_w": w, "stare_m": m}
            for i, (h, g, w, m) in enumerate(zip(ent, gates, ws, ms))]
    s = run_summary(rows, target_entropy=target, variant="C2")
    second = rows[10:]
    assert s["balance_w"] == pytest.approx(1 + sum(r["gate_on"] * (r["stare_w"] - 1) for r in second) / 10)
    assert s["balance_w"] == pytest.approx(1 + 5 * 1.0 / 10)  # rows 11..20: gate on at the 5 rows with W 2
    assert s["balance_m"] == pytest.approx(1 - 5 * 0.2 / 10)
    # windows of max(5, 20 // 10) = 5 rows over rows 11..20: 2 or 3 gated W-2 rows each → the largest 1 + 3/5
    assert s["balance_w_max"] == pytest.approx(1 + 3 / 5)
    assert s["crossing_step"] == 3
    # from row 3 (H 0.9): rows 3..12 average |H − 1| = (0.1 + 0.4 + 0.3 + 7·0.01)/10 = 0.087 > 0.05; row 4: 0.077;
    # row 5: (0.3 + 9·0.01)/10 = 0.039 < 0.05 → step 5, two steps after the crossing
    assert held_band(0.05, target) == 0.05
    assert s["steps_to_band"] == 2


def test_auto_w_at_its_cap_is_the_cap_exactly():
    """At the cap W equals auto_w_max (20.0), not 1 + exp(ln 19) rounded below it: H falls 0.001 a step from 0.5
    under H_tgt 0.7, so the acquisition raises ln(W − 1) by 0.6 a step until it is clipped at ln 19."""
    from stare_lab.config import STAREConfig
    from stare_lab.loss.controller import STAREController

    ctl = STAREController(STAREConfig(variant="O1", adaptive=True, schedule="auto", target_entropy=0.7))
    for i in range(40):
        ctl.update(0.5 - 0.001 * i)
    assert ctl.reweight_w == 20.0
