"""Helper for test_update_invariance.py (not collected): one DeepSpeed update of the tiny model on a fixed synthetic
batch of 8 sequences, split over the ranks of this launch and packed with a given micro-batch token budget, with
the step prepared by the core (C2, gate forced on: ω selected over the whole batch across the ranks). Saves the
gathered updated parameters and (with PROBE=1) the first-order predictions to ``OUT`` (rank 0). Usage:
``[torchrun --nproc_per_node K] python _update_invariance.py MODEL_DIR OUT MICRO_BATCH_MAX_TOKENS STAGE PROBE``
(STAGE: the ZeRO stage, used even on one process; PROBE: ``1`` = with the prediction probes (the default method:
a backward through the old-log-prob pass's graph with one micro-batch, else forward mode on ZeRO 0–2, gradients on
ZeRO-3), ``jvp`` = the probes in forward mode, ``backward`` = the probes with one gradient per D term, ``probe_only`` = the probe
of a step that is not taken (no update), ``fused`` = the old-log-prob forward kept for the update, ``never`` = STARE
with the gate off, ``grpo`` = the ``grpo`` loss, ``0`` = none of these).
"""

import os
import sys

import torch

from stare_lab.loss.step import prepare_step
from trainer.step.batch import RolloutBatch
from trainer.engines.comm import Comm
from trainer.config import load_trainer_config
from trainer.engines.launch import close_distributed, cpu_env_defaults, init_distributed
from trainer.engines.policy import PolicyEngine
from trainer.step.prediction import EntropyPrediction


def _batch(rows: list[int]) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    prompts, resps = [], []
    for _ in range(8):
        prompts.append(torch.randint(5, 400, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g))
        resps.append(torch.randint(5, 400, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g))
    advs = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 1.5])
    pad = torch.nn.utils.rnn.pad_sequence
    p, r = [prompts[i] for i in rows], [resps[i] for i in rows]
    return RolloutBatch(input_ids=pad([torch.cat([a, b]) for a, b in zip(p, r)], batch_first=True),
                        prompt_lens=torch.tensor([len(a) for a in p]), response_lens=torch.tensor([len(b) for b in r]),
                        response_ids=pad(r, batch_first=True),
                        response_mask=pad([torch.ones(len(b), dtype=torch.bool) for b in r], batch_first=True),
                        advantages=advs[rows], rollout_logprobs=pad([torch.zeros(len(b)) for b in r], batch_first=True),
                        group_ids=torch.tensor(rows) // 4, truncated=torch.zeros(len(rows), dtype=torch.bool))


def main() -> None:
    model_dir, out, budget, stage, probe = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    cpu_env_defaults()
    loss = {"grpo": ["method=grpo", "loss.loss_mode=grpo"],
            "never": ["method=c2", "loss.loss_mode=stare", "loss.stare.variant=C2", "loss.stare.gate=never"]}.get(
        probe, ["method=c2", "loss.loss_mode=stare", "loss.stare.variant=C2", "loss.stare.gate=always"])
    cfg = load_trainer_config(None, [f"model.path={model_dir}", f"deepspeed.zero_stage={stage}",
                                     "deepspeed.single_process_stage=null", "deepspeed.precision=fp32",
                                     "optim.lr=1.0", "optim.eps=1.0", "optim.grad_clip=0",
                                     f"optim.micro_batch_max_tokens={budget}", *loss, "loss.stare.top_p_ratio=0.3"])
    # AdamW's first step is lr·g/(|g| + eps): with eps = 1 ≫ |g| it is ≈ lr·g, linear in the gradient, so comparing
    # parameters compares gradients (with the default eps it would be ≈ lr·sign(g), ill-conditioned near g = 0)
    dist = init_distributed()
    comm = Comm()
    batch = _batch(list(range(dist.rank, 8, dist.world_size)))
    policy = PolicyEngine(cfg, model_dir, dist)
    plan = policy.micro_plan(batch, comm)
    method = {"1": "auto", "jvp": "jvp", "backward": "backward", "probe_only": "auto"}.get(probe)
    predictor = EntropyPrediction(policy, comm, cfg.loss, cfg.optim.grad_clip, method) if method else None
    grad_sum = None
    if predictor is not None and predictor.from_old_logprob:  # as the step runner: ∇θH̄ from this pass
        old_lp, old_ent, grad_sum = policy.logprobs_and_entropy_grad(batch, plan, predictor.keep_tangent)
    else:
        old_lp, old_ent = policy.compute_logprobs(batch, plan, keep_graph=probe == "fused")
    # old log-probs shifted by 0.05 so that ρ ≠ 1 and the clipping path is exercised
    step_batch = batch.step_batch(old_lp - 0.05 * batch.response_mask, old_ent)
    prep = prepare_step(step_batch, cfg.loss, collective=comm.collective, step=1, seed=0)
    if probe == "probe_only":
        preds = predictor.probe(batch, plan, prep, step_batch, grad_sum)
    else:
        probes = predictor.before_update(batch, plan, prep, step_batch, grad_sum) if predictor else None
        metrics = policy.update(batch, plan, prep, comm)
        preds = predictor.after_update(probes, metrics["grad_norm"]) if predictor else {}
    sd = policy.full_state_dict()
    if dist.rank == 0:
        torch.save({"params": sd, "preds": preds, "selected": prep.metrics().get("stare/num_pos_selected")}, out)
    close_distributed()


if __name__ == "__main__":
    main()
    # the results are saved and the groups closed: leave without the interpreter's teardown, where a native thread
    # of the CPU collectives still alive at exit aborted rank 0 now and then (exit -6, "terminate called without an
    # active exception"; seen in CI twice, once after close_distributed existed)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
