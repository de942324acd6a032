"""Helpers shared by the TRL integration's tests (test_trl.py, test_trl_adapter.py, test_trl_scale.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "trainer" / "assets" / "gsm8k_train_sample.jsonl"


def _require(*modules: str) -> None:
    """Skip when an optional dependency is missing — but fail under CI=true, never skip silently there."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = f"missing dependencies of the TRL integration: {', '.join(missing)} (pip install 'stare-lab[trl]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def _micro_batch(vocab: int, rows: int = 8, prompt_len: int = 5, max_len: int = 12) -> dict:
    """A fixed micro-batch: left-padded prompts, right-padded completions of lengths 3…12, advantages of both signs
    (one exactly 0), num_items_in_batch twice the batch's tokens (as if a second micro-batch of the same size
    followed)."""
    g = torch.Generator().manual_seed(0)
    lengths = [3, 12, 7, 5, 12, 9, 4, 10][:rows]
    prompt = torch.randint(30, vocab, (rows, prompt_len), generator=g)
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    prompt_mask[1, :2] = 0
    completion = torch.randint(30, vocab, (rows, max_len), generator=g)
    mask = (torch.arange(max_len) < torch.tensor(lengths)[:, None]).long()
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.5, 0.7, -0.2, 0.3])[:rows]
    return {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion, "completion_mask": mask,
            "advantages": adv, "num_items_in_batch": 2 * mask.sum()}
