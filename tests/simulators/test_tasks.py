"""Tests of simulators/transformer/tasks.py: layouts, checkers (hand-built cases), demonstrations, splits, errors."""

import pytest
import torch

from stare_lab.config import from_dict
from stare_lab.errors import ConfigError, DataError
from simulators.transformer.tasks import BOS, EOS, PAD, SEP, TaskConfig, make_splits, make_task


def _prompt(digits):
    return torch.tensor([[BOS, *digits, SEP]])


def test_pick_checker_hand_cases():
    """Prompt digits 3 3 1 7 9: any 4 of them as a sub-multiset, in any order, then EOS (checked by hand)."""
    task = make_task(TaskConfig(name="pick", num_digits=5, answer_len=4))
    p = _prompt([3, 3, 1, 7, 9])
    cases = {
        (3, 3, 1, 7, EOS): 1.0,  # uses both 3s
        (9, 7, 3, 1, EOS): 1.0,  # any order
        (3, 3, 3, 1, EOS): 0.0,  # three 3s but the prompt has two
        (3, 1, 7, 2, EOS): 0.0,  # 2 is not in the prompt
        (3, 1, 7, 9, 9): 0.0,  # no EOS after 4 digits
        (3, 1, 7, EOS, PAD): 0.0,  # too short
        (3, 1, SEP, 9, EOS): 0.0,  # non-digit inside the answer
    }
    for resp, want in cases.items():
        got = task.check(p, torch.tensor([resp]))
        assert got.tolist() == [want], resp


def test_sort_checker_hand_cases():
    """Sort has exactly one correct answer: the ascending digits 1 3 3 7 9."""
    task = make_task(TaskConfig(name="sort", num_digits=5, answer_len=5))
    p = _prompt([3, 3, 1, 7, 9])
    assert task.check(p, torch.tensor([[1, 3, 3, 7, 9, EOS]])).item() == 1.0
    assert task.check(p, torch.tensor([[1, 3, 7, 3, 9, EOS]])).item() == 0.0
    assert task.check(p, torch.tensor([[1, 3, 3, 7, 9, 9]])).item() == 0.0


def test_pick_has_several_correct_answers():
    """For 5 distinct digits and k=4 the number of correct responses is 5·4·3·2 = 120 (enumerated)."""
    import itertools

    task = make_task(TaskConfig(name="pick", num_digits=5, answer_len=4))
    p = _prompt([0, 2, 4, 6, 8])
    answers = torch.tensor([[*a, EOS] for a in itertools.product(range(10), repeat=4)])
    rewards = task.check(p.expand(len(answers), -1), answers)
    assert int(rewards.sum()) == 120


def test_noise_free_demonstrations_are_correct_and_noise_rate():
    """demo_noise=0 ⇒ every demonstration is correct; demo_noise=1 ⇒ a digit is random, i.e. it equals the clean
    one with probability 1/10, so with p=0.5 about 0.5·0.9 = 45 % of digits differ from the clean answer (sort)."""
    for name, k in (("pick", 4), ("sort", 5)):
        task = make_task(TaskConfig(name=name, num_digits=5, answer_len=k, demo_noise=0.0))
        prompts = task.random_prompts(256, torch.Generator().manual_seed(0))
        demos = task.demonstrations(prompts, torch.Generator().manual_seed(1))
        assert demos.shape == (256, k + 1)
        assert task.check(prompts, demos).min().item() == 1.0
    noisy = make_task(TaskConfig(name="sort", num_digits=5, answer_len=5, demo_noise=0.5))
    prompts = noisy.random_prompts(4000, torch.Generator().manual_seed(2))
    demos = noisy.demonstrations(prompts, torch.Generator().manual_seed(3))
    clean = prompts[:, 1:-1].sort(dim=1).values
    frac = (demos[:, :5] != clean).float().mean().item()
    assert abs(frac - 0.45) < 0.02  # binomial sd ≈ 0.0035 over 20000 digits


def test_splits_are_deterministic_and_disjoint():
    task = make_task(TaskConfig(name="pick", train_size=500, eval_size=100))
    tr, ev = make_splits(task, seed=3)
    tr2, ev2 = make_splits(task, seed=3)
    assert torch.equal(tr, tr2) and torch.equal(ev, ev2)
    assert tr.shape == (500, 7) and ev.shape == (100, 7)
    rows = {tuple(r) for r in tr.tolist()}
    assert len(rows) == 500 and not rows & {tuple(r) for r in ev.tolist()}
    assert not torch.equal(make_splits(task, seed=4)[1], ev)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"task.name='add' is not one of"):
        from_dict(TaskConfig, {"name": "add"}, prefix="task")
    with pytest.raises(ConfigError, match=r"task.answer_len=6 is above task.num_digits=5"):
        from_dict(TaskConfig, {"answer_len": 6}, prefix="task")
    with pytest.raises(ConfigError, match=r"task.answer_len=4 must equal task.num_digits=5"):
        TaskConfig(name="sort", answer_len=4)
    with pytest.raises(ConfigError, match=r"num_digits=12 is outside"):
        TaskConfig(num_digits=12)
    with pytest.raises(ConfigError, match=r"task.train_size \+ task.eval_size = 70"):
        TaskConfig(num_digits=2, answer_len=2, train_size=60, eval_size=10)
    with pytest.raises(DataError, match=r"prompts must have shape \[B, 7\]"):
        make_task("pick").check(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))


def test_a_registered_task_is_selected_by_name():
    """A task defined outside the package (answer = the prompt's first k digits, then EOS) is selected by
    ``task.name``; its checker decides the rewards (by hand below); built-in names cannot be taken or removed."""
    import pytest
    import torch

    from simulators.transformer.tasks import Task, register_task, unregister_task
    from stare_lab.errors import ConfigError

    class Copy(Task):
        def check(self, prompts, responses):
            k = self.config.answer_len
            want = torch.cat([prompts[:, 1:1 + k], torch.full((prompts.shape[0], 1), EOS)], dim=1)
            return (responses[:, :k + 1] == want).all(dim=1).float()

    register_task("test_copy", Copy)
    try:
        task = make_task(TaskConfig(name="test_copy", num_digits=3, answer_len=2, train_size=64, eval_size=8))
        assert isinstance(task, Copy)
        prompts = torch.tensor([[BOS, 4, 1, 7, SEP], [BOS, 4, 1, 7, SEP]])
        responses = torch.tensor([[4, 1, EOS], [1, 4, EOS]])  # right; the right digits in the wrong order
        assert task.check(prompts, responses).tolist() == [1.0, 0.0]
        with pytest.raises(ConfigError, match="already registered"):
            register_task("test_copy", Copy)
    finally:
        unregister_task("test_copy")
    with pytest.raises(ConfigError, match=r"task.name='test_copy' is not one of"):
        TaskConfig(name="test_copy")
    with pytest.raises(ConfigError, match="built in"):
        unregister_task("pick")
    with pytest.raises(ConfigError, match="subclass"):
        register_task("x", object)
