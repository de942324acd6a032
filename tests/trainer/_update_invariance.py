"""Helper for test_update_invariance.py (not collected): one DeepSpeed ZeRO-3 update of the tiny model on a fixed
synthetic batch of 8 sequences, split over the ranks of this launch and packed with a given micro-batch token
budget. Saves the gathered updated parameters (rank 0) to ``OUT``. Usage:
``[torchrun --nproc_per_node K] python _update_invariance.py MODEL_DIR OUT MICRO_BATCH_MAX_TOKENS``.
"""

import sys

import torch

from trainer.config import load_trainer_config
from trainer.launch import cpu_env_defaults, init_distributed
from trainer.policy import PolicyEngine, TrainBatch


def main() -> None:
    model_dir, out, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cpu_env_defaults()
    cfg = load_trainer_config(None, [f"model.path={model_dir}", "deepspeed.zero_stage=3", "deepspeed.precision=fp32",
                                     "optim.lr=1.0", "optim.eps=1.0", "optim.grad_clip=0", f"optim.micro_batch_max_tokens={budget}",
                                     "method=c2", "loss.loss_mode=stare", "loss.stare.variant=C2",
                                     "loss.stare.gate=always"])
    # AdamW's first step is lr·g/(|g| + eps): with eps = 1 ≫ |g| it is ≈ lr·g, linear in the gradient, so comparing
    # parameters compares gradients (with the default eps it would be ≈ lr·sign(g), ill-conditioned near g = 0)
    dist = init_distributed()
    g = torch.Generator().manual_seed(0)
    n = 8
    prompts = [torch.randint(5, 400, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    resps = [torch.randint(5, 400, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
             for _ in range(n)]
    advs = [1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 1.5]
    mine = list(range(dist.rank, n, dist.world_size))
    batch = TrainBatch([prompts[i] for i in mine], [resps[i] for i in mine], [[1.0] * len(resps[i]) for i in mine],
                       [advs[i] for i in mine], None)
    policy = PolicyEngine(cfg, model_dir, dist)
    old_lp, old_ent = policy.compute_logprobs(batch)
    # ω: a fixed per-token pattern (as if computed globally), so the test isolates the normalisation
    weights = [torch.tensor([1.1 if (i + t) % 3 == 0 else 1.0 for t in range(len(resps[i]))]) for i in mine]
    g_tok = float(sum(len(r) for r in resps))
    policy.update(batch, old_logprobs=[lp - 0.05 for lp in old_lp], old_entropy=old_ent, token_weights=weights,
                  loss_config=cfg.loss, global_num_tokens=g_tok, global_num_sequences=float(n),
                  loss_extras={"gate_on": True})
    sd = policy.full_state_dict()
    if dist.rank == 0:
        torch.save(sd, out)


if __name__ == "__main__":
    main()
