"""Helpers shared by the TRL integration's tests (test_trl.py, test_trl_adapter.py, test_trl_scale.py)."""

from __future__ import annotations

import importlib.util
import math
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


def assert_weights_equal_core(dump_dir: Path, step: int, ranks: int) -> None:
    """ω of one step of a launched ``_trl_run.py --dump`` run (its STARE settings: C2, P = 0.2, adaptive) equals the
    core's ``stare_token_weights`` on the batch gathered from every process (rank 0's rows first), token for token,
    with |L+| = max(1, ⌈P·|T+|⌉)."""
    from stare_lab.config import STAREConfig
    from stare_lab.loss.stare import stare_token_weights

    cfg = STAREConfig(variant="C2", top_p_ratio=0.2, reweight_w=1.2, reweight_m=0.8, target_entropy=100.0,
                      adaptive=True, alpha=0.05, w_max=2.0, m_min=0.5)
    dumps = [torch.load(dump_dir / f"step{step}_rank{r}.pt", weights_only=False) for r in range(ranks)]
    width = max(d["mask"].shape[1] for d in dumps)
    pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]))  # noqa: E731
    lp, mask, w = (torch.cat([pad(d[k]) for d in dumps]) for k in ("logprobs", "mask", "weights"))
    adv = torch.cat([d["advantages"] for d in dumps])
    core, stats = stare_token_weights(lp, adv, mask, cfg, reweight_w=dumps[0]["w"], reweight_m=dumps[0]["m"])
    assert torch.equal(torch.where(mask, w, 1.0), core), step
    n_pos = int((mask & (adv[:, None] > 0)).sum())
    assert int(stats["stare/num_pos_selected"]) == max(1, math.ceil(0.2 * n_pos))
