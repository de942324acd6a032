"""Helper of test_step_distributed.py: the step preparation on torch.distributed ranks (gloo, CPU).

Run as ``python -m torch.distributed.run --nproc_per_node 2 _step_gloo.py OUT_PREFIX``: every rank prepares each
case of :func:`cases` on its own rows with :class:`stare_lab.collective.TorchCollective`, computes the loss of its
rows and the gradient of a parameter θ shared by all ranks (summed over the ranks with ``all_reduce``), and saves
what it got to ``OUT_PREFIX.rank<R>.pt``. The test compares it with one process over the concatenated batch.
"""

from __future__ import annotations

import sys

import torch

from stare_lab.config import LossConfig, STAREConfig
from stare_lab.loss.step import StepBatch


def random_batch(seed: int, rows: int, width: int, per_token: bool, ties: bool) -> StepBatch:
    """A random step batch: a quarter of the tokens padding, a fifth of the advantages exactly 0, group ids."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, width, generator=g) > 0.25
    if ties:  # a coarse grid: many exact ties at every threshold
        lp = -torch.randint(0, 5, (rows, width), generator=g).float() * 0.25
        ent = torch.randint(0, 4, (rows, width), generator=g).float() * 0.5
    else:
        lp = -torch.rand(rows, width, generator=g) * 4
        ent = torch.rand(rows, width, generator=g) * 2
    adv = torch.randn(rows, width, generator=g) if per_token else torch.randn(rows, generator=g)
    adv = torch.where(torch.rand(adv.shape, generator=g) < 0.2, torch.zeros_like(adv), adv)  # some Â = 0
    return StepBatch(mask, adv, lp, entropy=ent, group_ids=torch.arange(rows) + 100 * seed)


def _stare(**kw) -> LossConfig:
    return LossConfig(loss_mode="stare", stare=STAREConfig(**{"gate": "always", **kw}))


def cases() -> dict[str, tuple[LossConfig, list[StepBatch]]]:
    """name → (config, the two ranks' batches; rank 1's is wider)."""
    out = {}
    for per_token in (False, True):
        for ties in (False, True):
            tag = f"{'token' if per_token else 'row'}{'-ties' if ties else ''}"
            parts = [random_batch(10, 6, 7, per_token, ties), random_batch(11, 5, 9, per_token, ties)]
            out[f"o1-{tag}"] = (_stare(variant="O1", top_p_ratio=0.2), parts)
            out[f"c2-{tag}"] = (_stare(variant="C2", top_p_ratio=0.3), parts)
    ties = [random_batch(12, 6, 7, False, True), random_batch(13, 5, 9, False, True)]
    out["forking-ties"] = (LossConfig(loss_mode="forking_tokens", top_entropy_quantile=0.3), ties)
    out["kl_cov"] = (LossConfig(loss_mode="kl_cov", kl_cov_ratio=0.0), ties)
    out["grpo"] = (LossConfig(), ties)
    out["gate-off"] = (LossConfig(loss_mode="stare", stare=STAREConfig(target_entropy=0.01)), ties)
    return out


def loss_and_grad(prepared, cfg: LossConfig, rows: slice | None = None) -> tuple[float, float]:
    """Loss of the prepared batch (all its rows) and its gradient with respect to θ, log π_θ = log π_old + θ·c
    (c a fixed function of the position, so ρ ≠ 1 and the clip is exercised)."""
    from stare_lab.loss.losses import compute_policy_loss

    b = prepared.batch
    theta = torch.tensor(0.7, requires_grad=True)
    cols = torch.arange(b.shape[1], dtype=torch.float32)
    lp = b.old_logprobs + theta * 0.3 * torch.sin(cols + b.old_logprobs)
    loss, _ = compute_policy_loss(cfg.loss_mode, prepared.inputs(lp), cfg)
    (grad,) = torch.autograd.grad(loss, theta)
    return float(loss.detach()), float(grad)


def main(prefix: str) -> None:
    import torch.distributed as dist

    from stare_lab.collective import TorchCollective
    from stare_lab.loss.stare import STAREController
    from stare_lab.loss.step import prepare_step

    dist.init_process_group("gloo")
    coll = TorchCollective()
    results = {}
    for name, (cfg, parts) in cases().items():
        p = prepare_step(parts[coll.rank], cfg, collective=coll, controller=STAREController(cfg.stare), step=2,
                         seed=9)
        loss, grad = loss_and_grad(p, cfg)
        summed = torch.tensor([loss, grad], dtype=torch.float64)
        dist.all_reduce(summed)
        results[name] = {
            "metrics": p.metrics(),
            "token_weights": p.token_weights,
            "global_stats": {k: v for k, v in p.global_stats.items() if k != "generator"},
            "loss_grad": summed.tolist(),
        }
    torch.save(results, f"{prefix}.rank{coll.rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
