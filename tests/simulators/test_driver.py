"""The simulators' one run driver and one dynamic-sampling rule (issue 14): steps numbered from 1 in both
simulators, the checkpoint cadence, and a step where no group survives dynamic sampling skips its update and is
logged ``skipped=1`` (the trainer's key), leaving the policy and the STARE controller as they were."""

from __future__ import annotations

import json
import os

import pytest
import torch

from simulators.dynamic_sampling import select_groups
from simulators.tabular.runner import config_from_overrides, init_state, run

TINY = {"num_prompts": 4, "group_size": 4, "seq_len": 3, "vocab_size": 5, "num_correct": 2, "threshold": 2,
        "reward_noise": 0.0, "steps": 6}


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_select_groups_by_hand():
    """Groups of 2: round 0 rewards (1,1 | 0,1 | 0,0) keep group 1; round 1 (0,1 | 1,0 | 1,1) keeps groups 0 and 1,
    of which one is needed to reach 2 → picks [(0, [1]), (1, [0])], 2 rounds; all-equal rounds keep nothing."""
    rounds = [torch.tensor([1., 1, 0, 1, 0, 0]), torch.tensor([0., 1, 1, 0, 1, 1]), torch.zeros(6)]
    asked = []

    def rewards_of_round(i):
        asked.append(i)
        return rounds[i]

    sel = select_groups(rewards_of_round, group_size=2, num_groups=2, max_rounds=3)
    assert [(i, idx.tolist()) for i, idx in sel.picks] == [(0, [1]), (1, [0])]
    assert sel.rounds == 2 and sel.num_kept == 2 and not sel.skip and asked == [0, 1]  # round 2 never drawn
    none = select_groups(lambda i: torch.zeros(6), group_size=2, num_groups=3, max_rounds=4)
    assert none.skip and none.rounds == 4 and none.picks == []


@pytest.mark.parametrize("mode", ["sampled", "expected"])
def test_tabular_steps_are_numbered_from_1_and_checkpointed_on_cadence(tmp_path, mode, monkeypatch):
    import simulators.driver as driver

    saved = []
    real = driver._save
    monkeypatch.setattr(driver, "_save", lambda path, payload: (saved.append(payload["step"]), real(path, payload)))
    run(config_from_overrides({**TINY, "mode": mode, "steps": 7, "checkpoint_every": 3}), tmp_path / "r")
    rows = _rows(tmp_path / "r")
    assert [r["step"] for r in rows] == list(range(1, 8)) and all(r["skipped"] == 0 for r in rows)
    assert saved == [3, 6, 7]  # every 3 completed steps and after the last
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 7


def test_tabular_step_without_a_surviving_group_is_skipped(tmp_path):
    """Rewards Bernoulli(0): every group has zero reward variance, dynamic sampling keeps none → every step skips its
    update (logits unchanged, entropy change 0), is logged skipped=1, and the STARE controller is never updated
    (its W stays at the start value although the target of 100 nats is far above the entropy)."""
    cfg = config_from_overrides({**TINY, "method": "o1-adaptive", "dynamic_sampling": True, "reward": "random",
                                 "random_reward_p": 0.0, "steps": 3, "loss": {"stare": {"target_entropy": 100.0}}})
    run(cfg, tmp_path / "r")
    rows = _rows(tmp_path / "r")
    assert [r["skipped"] for r in rows] == [1, 1, 1] and [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["ds/kept_groups"] == 0 and r["ds/rounds"] == cfg.ds_max_rounds for r in rows)
    assert all(r["entropy_change"] == 0.0 and r["stare/gate_entropy"] is None for r in rows)
    assert all(r["stare_w"] == cfg.loss.stare.reweight_w and r["gate_on"] == 0 for r in rows)
    ckpt = torch.load(tmp_path / "r" / "checkpoint" / "state.pt", weights_only=False)
    assert torch.equal(ckpt["state"]["logits"], init_state(cfg).logits)
    assert ckpt["state"]["controller"]["reweight_w"] == cfg.loss.stare.reweight_w


def test_transformer_step_without_a_surviving_group_is_skipped(tmp_path, monkeypatch):
    """The transformer simulator under the same rule: a checker that marks everything wrong leaves no group with
    reward variance; the step skips its update (parameters and optimizer untouched: no AdamW step either), is logged
    skipped=1 with entropy null, and its steps are numbered from 1."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("transformers")
    from simulators.transformer import runner as T
    from simulators.transformer.tasks import Task

    tiny = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
            "model.num_kv_heads=1", "task.num_digits=4", "task.answer_len=1", "task.train_size=64",
            "task.eval_size=8", "warm_start.steps=5", "warm_start.batch_size=16", "steps=2", "prompts_per_step=2",
            "group_size=2", "eval_every=2", "eval_samples=2", "checkpoint_every=2", "ds_max_rounds=2",
            f"warm_start.cache_dir={tmp_path / 'cache'}"]
    monkeypatch.setattr(Task, "check", lambda self, prompts, responses: torch.zeros(len(prompts)))
    cfg = T.config_from_preset(None, tiny, method="grpo-ds")
    before = {}

    real_init = T._Simulation.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        before.update({n: p.detach().clone() for n, p in self.model.named_parameters()})

    monkeypatch.setattr(T._Simulation, "__init__", spy)
    T.run(cfg, tmp_path / "run")
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and [r["skipped"] for r in rows] == [1, 1]
    assert all(r["entropy"] is None and r["ds/kept_groups"] == 0 and r["ds/rounds"] == 2 for r in rows)
    ckpt = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=False)
    assert ckpt["step"] == 2 and ckpt["state"]["optimizer"]["state"] == {}
    assert all(torch.equal(ckpt["state"]["model"][n], p) for n, p in before.items())


def _write_rows(path, rows):
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_resume_refuses_rows_missing_before_the_checkpoint(tmp_path):
    """Fresh-user review: rows up to the checkpoint that are lost (the last row cut, a middle row deleted, a row
    repeated) cannot be recomputed from it, so resume refuses — naming the run, the checkpoint step, the last good
    row and --overwrite — before touching anything; extending the run is refused the same way (it would leave a gap
    in the step numbers)."""
    from simulators.driver import check_resume
    from stare_lab.errors import RunError

    cfg = config_from_overrides({**TINY, "steps": 4, "checkpoint_every": 2})
    d = tmp_path / "r"
    run(cfg, d)
    rows = _rows(d)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and check_resume(d)["step"] == 4
    cut = (d / "metrics.jsonl").read_text().splitlines()
    for lines, last in [(cut[:3], "step 3"), (cut[:3] + [cut[3][:20]], "step 3"), ([cut[0]] + cut[2:], "step 1"),
                        (cut[:2] + [cut[1]] + cut[2:], "step 2"), ([], "none")]:
        (d / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))
        before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
        for steps in (4, 6):  # resume as it is, and extend
            with pytest.raises(RunError) as err:
                run(config_from_overrides({**TINY, "steps": steps, "checkpoint_every": 2}), d, resume=True)
            msg = str(err.value)
            assert msg == (f"cannot resume {str(d)!r}: its checkpoint is at step 4 but metrics.jsonl does not hold "
                           f"exactly the rows of steps 1..4 (last good row: {last}; a lost row cannot be recomputed "
                           "from the checkpoint); rerun with --overwrite to start the run afresh")
            assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before  # nothing touched


def test_resume_drops_and_recomputes_rows_past_the_checkpoint(tmp_path):
    """Rows past the checkpoint (a run stopped after its last checkpoint; here the step-2 checkpoint put back
    after 4 steps, plus a half-written fifth line) are dropped and recomputed: the resumed run equals an
    uninterrupted one row for row (determinism), with steps 1..4 and no gap."""
    import shutil

    full, d = tmp_path / "full", tmp_path / "r"
    run(config_from_overrides({**TINY, "steps": 4, "checkpoint_every": 2}), full)
    run(config_from_overrides({**TINY, "steps": 2, "checkpoint_every": 2}), d)
    shutil.copy(d / "checkpoint" / "state.pt", tmp_path / "step2.pt")
    run(config_from_overrides({**TINY, "steps": 4, "checkpoint_every": 2}), d, resume=True)
    shutil.copy(tmp_path / "step2.pt", d / "checkpoint" / "state.pt")
    with open(d / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "entro')
    run(config_from_overrides({**TINY, "steps": 4, "checkpoint_every": 2}), d, resume=True)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert [r["step"] for r in _rows(d)] == [1, 2, 3, 4]
    assert strip(_rows(d)) == strip(_rows(full))
