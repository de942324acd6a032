"""Synthetic verifiable tasks for the small-transformer simulator (simulators/transformer/runner.py).

Every task shares one tiny vocabulary and one sequence layout, so prompts never need padding:

```
prompt   = BOS d_1 … d_n SEP          (n = num_digits, fixed per task: every prompt has the same length)
response = a_1 … a_k EOS [PAD …]      (k = answer_len; the model may stop early or run on — the checker decides)
```

Token ids: digits ``0``–``9`` are ids 0–9, then ``BOS`` = 10, ``SEP`` = 11, ``EOS`` = 12, ``PAD`` = 13
(:data:`VOCAB_SIZE` = 14). A response is everything the policy sampled up to and including its first ``EOS``
(at most ``answer_len + 1`` tokens); ``PAD`` only fills the rest of the tensor and is never sampled-and-scored.

Tasks (``TaskConfig.name``):

* ``pick`` — *several correct answers per prompt*: any ``answer_len`` digits taken from the prompt's digits (as a
  sub-multiset, in any order), then ``EOS``. With 5 distinct prompt digits and k = 4 there are 5·4·3·2 = 120
  correct responses. This is the task on which token reweighting can act (docs/theory.md §6).
* ``sort`` — *one correct answer per prompt*: the prompt's digits in ascending order, then ``EOS``
  (``answer_len`` must equal ``num_digits``). On a single-answer task every token of a rewarded response is already
  the mode, so STARE's reweighting of high-surprisal tokens has nothing to act on (docs/theory.md §6); it is kept as the
  honest negative control.

A task of one's own: subclass :class:`Task` (override :meth:`Task.check` and :meth:`Task.demonstrations`; the
vocabulary and layout stay these) and :func:`register_task` it, e.g. from a plugin (``stare-lab --plugin``,
docs/extending.md); ``task.name=NAME`` then selects it.

Prompts are generated from a seed (:func:`make_splits`): a pool of distinct prompts, split into a train set and a
held-out eval set that share no prompt. Rewards are 1.0 (correct) or 0.0 (wrong), from :meth:`Task.check`.
Warm-start demonstrations (:meth:`Task.demonstrations`) are correct answers (uniformly random among the correct
ones for ``pick``) with each answer digit replaced by a uniformly random digit with probability ``demo_noise``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from stare_lab.config import check_choice, check_positive, check_range, config_prefix, join_key
from stare_lab.errors import ConfigError, DataError

if TYPE_CHECKING:  # torch is imported where a task computes: its config is validated without torch
    import torch

__all__ = [
    "BOS",
    "SEP",
    "EOS",
    "PAD",
    "VOCAB_SIZE",
    "TASKS",
    "TASK_CLASSES",
    "TaskConfig",
    "Task",
    "make_task",
    "register_task",
    "unregister_task",
    "make_splits",
]

BOS, SEP, EOS, PAD = 10, 11, 12, 13
VOCAB_SIZE = 14
#: The built-in tasks.
TASKS = ("pick", "sort")


@dataclasses.dataclass
class TaskConfig:
    """Which synthetic task and how big (see the module docstring for the layouts).

    Attributes:
        name: ``pick`` (several correct answers) or ``sort`` (one correct answer).
        num_digits: n ≥ 2 prompt digits (prompt length n + 2 tokens).
        answer_len: k ≥ 1 answer digits; ``pick`` needs k ≤ n, ``sort`` needs k = n.
        demo_noise: probability ∈ [0, 1] that a warm-start demonstration digit is replaced by a random digit.
        train_size: number of distinct train prompts (≥ 1).
        eval_size: number of distinct held-out prompts (≥ 1); train and eval never share a prompt.
        reward_noise: probability ∈ [0, 0.5) that the RL phase's verifier flips a verdict (a noisy verifier, as in
            the tabular ``collapse`` preset: it keeps reward variance in solved prompts, as hard prompts do in real
            training). :meth:`Task.check` itself is exact; the simulator applies the noise to training rewards only
            (accuracy, pass@k and held-out evaluation use the exact verdicts).
    """

    name: str = "pick"
    num_digits: int = 5
    answer_len: int = 4
    demo_noise: float = 0.3
    train_size: int = 4096
    eval_size: int = 128
    reward_noise: float = 0.0

    def __post_init__(self) -> None:
        p = config_prefix("task")
        check_choice(join_key(p, "name"), self.name, list(TASK_CLASSES))
        check_positive(join_key(p, "num_digits"), self.num_digits, integer=True)
        check_range(join_key(p, "num_digits"), self.num_digits, 2, 9)
        check_positive(join_key(p, "answer_len"), self.answer_len, integer=True)
        check_range(join_key(p, "demo_noise"), self.demo_noise, 0, 1)
        check_positive(join_key(p, "train_size"), self.train_size, integer=True)
        check_positive(join_key(p, "eval_size"), self.eval_size, integer=True)
        check_range(join_key(p, "reward_noise"), self.reward_noise, 0, 0.5, hi_open=True)
        if self.name == "pick" and self.answer_len > self.num_digits:
            raise ConfigError(
                f"{join_key(p, 'answer_len')}={self.answer_len} is above {join_key(p, 'num_digits')}="
                f"{self.num_digits}; task 'pick' takes answer_len <= num_digits digits from the prompt"
            )
        if self.name == "sort" and self.answer_len != self.num_digits:
            raise ConfigError(
                f"{join_key(p, 'answer_len')}={self.answer_len} must equal {join_key(p, 'num_digits')}="
                f"{self.num_digits} for task 'sort' (the answer is the sorted prompt)"
            )
        distinct = 10**self.num_digits
        if self.train_size + self.eval_size > distinct // 2:
            raise ConfigError(
                f"{join_key(p, 'train_size')} + {join_key(p, 'eval_size')} = {self.train_size + self.eval_size} "
                f"is above half the {distinct} distinct prompts of {self.num_digits} digits; use fewer prompts "
                "or more digits"
            )


class Task:
    """One synthetic task: prompt layout, checker and noisy demonstrations.

    Attributes:
        config: the :class:`TaskConfig`.
        prompt_len: tokens per prompt (``num_digits + 2``).
        max_response_len: tokens per response tensor (``answer_len + 1``: the answer and its ``EOS``).
    """

    def __init__(self, config: TaskConfig) -> None:
        self.config = config
        self.name = config.name
        self.prompt_len = config.num_digits + 2
        self.max_response_len = config.answer_len + 1

    # ------------------------------------------------------------------------------------------------ prompts
    def random_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` random prompts ``[n, prompt_len]`` long (digits uniform in 0–9; duplicates possible)."""
        import torch

        digits = torch.randint(0, 10, (n, self.config.num_digits), generator=generator)
        bos = torch.full((n, 1), BOS, dtype=torch.long)
        sep = torch.full((n, 1), SEP, dtype=torch.long)
        return torch.cat([bos, digits, sep], dim=1)

    def _digits(self, prompts: torch.Tensor) -> torch.Tensor:
        if prompts.dim() != 2 or prompts.shape[1] != self.prompt_len:
            raise DataError(
                f"prompts must have shape [B, {self.prompt_len}] for task {self.name!r} "
                f"(num_digits={self.config.num_digits}), got {list(prompts.shape)}"
            )
        return prompts[:, 1:-1]

    # ------------------------------------------------------------------------------------------------ checker
    def check(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Rewards ``[B]`` float32 in {0, 1}: 1 iff the response up to its first ``EOS`` is a correct answer.

        Args:
            prompts: ``[B, prompt_len]`` long.
            responses: ``[B, L]`` long, L ≥ 1; tokens after the first ``EOS`` are ignored. A response with no
                ``EOS``, the wrong number of digits or any non-digit before ``EOS`` is wrong.

        Raises:
            DataError: if the shapes do not match the task.
        """
        import torch

        digits = self._digits(prompts)
        if responses.dim() != 2 or responses.shape[0] != prompts.shape[0]:
            raise DataError(
                f"responses must have shape [B={prompts.shape[0]}, L], got {list(responses.shape)}"
            )
        k = self.config.answer_len
        if responses.shape[1] < k + 1:
            return torch.zeros(responses.shape[0], dtype=torch.float32)
        answer = responses[:, :k]
        ok = (answer <= 9).all(dim=1) & (responses[:, k] == EOS)
        if self.name == "sort":
            ok &= (answer == digits.sort(dim=1).values).all(dim=1)
        else:  # pick: the answer's digit counts must not exceed the prompt's
            ans_counts = torch.zeros(answer.shape[0], 14, dtype=torch.long)
            ans_counts.scatter_add_(1, answer.clamp(0, 13), torch.ones_like(answer))
            prm_counts = torch.zeros(answer.shape[0], 14, dtype=torch.long)
            prm_counts.scatter_add_(1, digits, torch.ones_like(digits))
            ok &= (ans_counts[:, :10] <= prm_counts[:, :10]).all(dim=1)
        return ok.to(torch.float32)

    # ------------------------------------------------------------------------------------------- demonstrations
    def demonstrations(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Noisy demonstration responses ``[B, answer_len + 1]`` long (answer digits then ``EOS``).

        ``pick``: a uniformly random ordered choice of ``answer_len`` prompt positions; ``sort``: the sorted
        digits. Then each answer digit is replaced by a uniform random digit with probability ``demo_noise``.
        """
        import torch

        digits = self._digits(prompts)
        b, n = digits.shape
        k = self.config.answer_len
        if self.name == "sort":
            answer = digits.sort(dim=1).values
        else:
            order = torch.rand(b, n, generator=generator).argsort(dim=1)[:, :k]
            answer = digits.gather(1, order)
        noise = torch.rand(b, k, generator=generator) < self.config.demo_noise
        random_digits = torch.randint(0, 10, (b, k), generator=generator)
        answer = torch.where(noise, random_digits, answer)
        return torch.cat([answer, torch.full((b, 1), EOS, dtype=torch.long)], dim=1)


#: task name → the :class:`Task` class that implements it (the built-ins and those added by :func:`register_task`)
TASK_CLASSES: dict[str, type[Task]] = {name: Task for name in TASKS}


def register_task(name: str, cls: type[Task]) -> None:
    """Make ``task.name=NAME`` select ``cls`` (a subclass of :class:`Task`), e.g. from a plugin.

    Raises:
        ConfigError: an empty or taken name, or ``cls`` not a subclass of :class:`Task`.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"task name {name!r} must be a non-empty string")
    if name in TASK_CLASSES:
        raise ConfigError(f"task {name!r} is already registered; choose another name")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task {name!r}: {cls!r} must be a subclass of simulators.transformer.tasks.Task")
    TASK_CLASSES[name] = cls


def unregister_task(name: str) -> None:
    """Remove a task added with :func:`register_task`.

    Raises:
        ConfigError: ``name`` is not registered, or is built in (:data:`TASKS`).
    """
    if name not in TASK_CLASSES:
        raise ConfigError(f"task {name!r} is not registered (one of {{{', '.join(TASK_CLASSES)}}})")
    if name in TASKS:
        raise ConfigError(f"task {name!r} is built in and cannot be unregistered")
    del TASK_CLASSES[name]


def make_task(config: TaskConfig | str) -> Task:
    """A :class:`Task` from a config (or a task name with default sizes): an instance of the class registered for
    ``config.name`` (:data:`TASK_CLASSES`).

    Raises:
        ConfigError: on an unknown task name (names the allowed ones) or invalid sizes.
    """
    if isinstance(config, str):
        config = TaskConfig(name=config)
    return TASK_CLASSES[config.name](config)


def make_splits(task: Task, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct train and held-out prompts for ``seed``: ``(train [train_size, P], eval [eval_size, P])`` long.

    Deterministic in ``seed``; the two sets share no prompt (drawn as one pool of distinct prompts, then split).
    """
    import torch

    cfg = task.config
    need = cfg.train_size + cfg.eval_size
    g = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    seen: dict[tuple[int, ...], None] = {}
    while len(seen) < need:
        batch = task.random_prompts(2 * (need - len(seen)) + 16, g)
        for row in batch.tolist():
            seen.setdefault(tuple(row), None)
            if len(seen) == need:
                break
    pool = torch.tensor(list(seen), dtype=torch.long)
    return pool[cfg.eval_size :], pool[: cfg.eval_size]
