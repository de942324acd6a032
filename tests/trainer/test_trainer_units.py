"""Fast unit tests of the trainer's config, data, packing and reward wiring (no vLLM / DeepSpeed needed)."""

from __future__ import annotations

import json

import pytest

from stare_lab.errors import ConfigError, DataError
from trainer.config import TrainerConfig, load_trainer_config
from trainer.data import DataCursor, PromptEncoder, load_records
from trainer.engines.launch import deepspeed_json
from trainer.run.loop import compute_rewards, step_seed
from trainer.engines.policy import pack_micro_batches


def test_config_errors_name_the_dotted_key():
    with pytest.raises(ConfigError, match=r"rollout\.n=0"):
        load_trainer_config(None, ["rollout.n=0"])
    with pytest.raises(ConfigError, match=r"loss\.stare\.top_p_ratio=2"):
        load_trainer_config(None, ["loss.stare.top_p_ratio=2"])
    with pytest.raises(ConfigError, match="unknown config key optim.foo"):
        load_trainer_config(None, ["optim.foo=1"])
    with pytest.raises(ConfigError, match="needs loss.loss_mode='stare'"):
        load_trainer_config(None, ["method=o1", "loss.loss_mode=grpo"])  # a given setting must agree
    with pytest.raises(ConfigError, match="needs loss.stare.variant='O1', got 'C2'"):
        load_trainer_config(None, ["method=o1", "loss.stare.variant=C2"])
    cfg = load_trainer_config(None, ["method=c2", "loss.loss_mode=stare", "loss.stare.variant=c2"])
    assert cfg.loss.stare.variant == "C2"


def test_method_alone_selects_the_loss():
    """As in the simulators, the method fills in what it implies (stare_lab.loss.methods.METHODS): o1 → loss stare,
    variant O1, adaptive off; o1-adaptive → adaptive on; grpo-ds → dynamic sampling on; settings it does not fix
    (P, the gate) stay the config's."""
    cfg = load_trainer_config(None, ["method=o1", "loss.stare.top_p_ratio=0.3"])
    assert (cfg.loss.loss_mode, cfg.loss.stare.variant, cfg.loss.stare.adaptive) == ("stare", "O1", False)
    assert cfg.loss.stare.top_p_ratio == 0.3
    assert load_trainer_config(None, ["method=o1-adaptive"]).loss.stare.adaptive is True
    cfg = load_trainer_config({"method": "grpo-ds"})
    assert (cfg.loss.loss_mode, cfg.algorithm.dynamic_sampling) == ("grpo", True)
    assert load_trainer_config(None, ["method=kl_cov"]).loss.loss_mode == "kl_cov"
    with pytest.raises(ConfigError, match=r"needs loss\.entropy_coeff > 0"):  # the coefficient is the user's
        load_trainer_config(None, ["method=entropy_bonus"])
    assert load_trainer_config(None, ["method=entropy_bonus", "loss.entropy_coeff=0.01"]).loss.loss_mode == "grpo"


def test_missing_model_path_is_a_clear_error(tmp_path):
    cfg = TrainerConfig()
    with pytest.raises(ConfigError, match="model.path is empty"):
        cfg.require_model_and_data()
    cfg = load_trainer_config(None, [f"model.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="is not a directory"):
        cfg.require_model_and_data()


def test_deepspeed_json_is_caller_owned_accumulation():
    cfg = load_trainer_config(None, ["deepspeed.zero_stage=3", "optim.grad_clip=0.5",
                                     "deepspeed.overrides={zero_optimization: {reduce_bucket_size: 1000}}"])
    ds = deepspeed_json(cfg, world_size=4)
    assert ds["managed_gradient_accumulation"] is False and ds["gradient_accumulation_steps"] == 1
    assert ds["gradient_clipping"] == 0.5 and ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 3 and ds["zero_optimization"]["reduce_bucket_size"] == 1000


def test_records_missing_field_names_file_line_and_fields(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: record has no field 'problem' \(fields: question\)"):
        load_records([str(f)], "problem", "answer")
    with pytest.raises(DataError, match="does not exist"):
        load_records([str(tmp_path / "missing.jsonl")], "problem", "answer")
    f.write_text("{not json\n")
    with pytest.raises(DataError, match=r":1: not valid JSON"):
        load_records([str(f)], "problem", "answer")


class _Tok:
    """A stand-in tokenizer: one token per character (so lengths are known by hand)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_prompt_truncation_left_right_error():
    rec = {"prompt": "abcdefghij", "answer": "1", "id": 0}
    left = PromptEncoder(_Tok(), "{problem}", False, 4, "left").encode(rec, 0)
    right = PromptEncoder(_Tok(), "{problem}", False, 4, "right").encode(rec, 0)
    assert left.truncated and left.token_ids == [ord(c) for c in "ghij"]
    assert right.token_ids == [ord(c) for c in "abcd"]
    with pytest.raises(DataError, match="10 tokens > data.max_prompt_length=4"):
        PromptEncoder(_Tok(), "{problem}", False, 4, "error").encode(rec, 0)


def test_cursor_is_deterministic_and_resumable():
    a = DataCursor(10, seed=3)
    first = a.take(7)
    state = a.state_dict()
    rest = a.take(8)  # crosses into epoch 1
    b = DataCursor(10, seed=3)
    b.load_state_dict(state)
    assert b.take(8) == rest
    assert sorted(first + rest[:3]) == list(range(10))  # epoch 0 is a permutation


def test_pack_micro_batches_respects_budget_and_covers_all():
    lengths = [5, 9, 3, 12, 7, 7, 1]
    plan = pack_micro_batches(lengths, max_tokens=16)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:  # rows × longest ≤ budget (a single sequence may exceed it alone)
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 16


def test_step_seed_depends_on_step_round_rank_only():
    assert step_seed(0, 3, 1, 0) == step_seed(0, 3, 1, 0)
    assert len({step_seed(0, 3, 1, 0), step_seed(0, 4, 1, 0), step_seed(0, 3, 2, 0), step_seed(0, 3, 1, 1)}) == 4


def test_reward_function_that_raises_is_defined():
    cfg = load_trainer_config(None, []).reward

    def broken(*a, **k):
        raise RuntimeError("grader exploded")

    rewards, stats = compute_rewards(cfg, ["a", "b"], ["1", "2"], fn=broken)
    assert rewards == [0.0, 0.0] and stats["reward/errors"] == 1.0
    cfg_raise = load_trainer_config(None, ["reward.on_error=raise"]).reward
    with pytest.raises(DataError, match="grader exploded"):
        compute_rewards(cfg_raise, ["a"], ["1"], fn=broken)
    with pytest.raises(DataError, match="returned 1 values for 2 responses"):
        compute_rewards(cfg, ["a", "b"], ["1", "2"], fn=lambda *a, **k: [1.0])


def test_math_reward_through_math_verify(require):
    """Real grader: a right boxed answer gets 1, a wrong one 0, format bonus added on top (hand-checked)."""
    require("math_verify")
    cfg = load_trainer_config(None, ["reward.format_reward=0.1"]).reward
    rewards, stats = compute_rewards(cfg, ["so \\boxed{4}", "it is \\boxed{5}", "no answer"], ["4", "4", "4"])
    assert rewards == pytest.approx([1.1, 0.1, 0.0])
    assert stats["accuracy"] == pytest.approx(1 / 3)


def test_cli_errors_are_one_clean_line(tmp_path, capsys):
    """The front door turns trainer errors into one line and exit code 1 (no traceback), and the evaluate / promote
    subcommands are registered (delegated to trainer.evaluation.evaluate / trainer.planning.promote)."""
    from stare_lab.cli import build_parser, main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model:\n  path: {tmp_path / 'no_model'}\ndata:\n  train_files: [x.jsonl]\n")
    assert main(["train", str(cfg)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stare-lab train: error: model.path={str(tmp_path / 'no_model')!r} is not a directory"]
    assert main(["train", "--preset", "tiny-cpu"]) == 1
    assert "--train-data" in capsys.readouterr().err
    assert main(["train", str(cfg), "rollout.n=0"]) == 1
    assert "rollout.n=0" in capsys.readouterr().err
    choices = build_parser()._subparsers._group_actions[0].choices
    assert {"train", "evaluate", "promote"} <= set(choices)
