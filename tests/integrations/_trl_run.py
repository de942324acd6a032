"""One TRL run of ``STAREGRPOTrainer`` (or plain ``GRPOTrainer`` with ``--plain``) on the tiny local model, for the
tests of tests/integrations/test_trl.py. Launch it with ``python`` (one process) or ``torchrun --nproc_per_node 2``
(gloo, CPU).

The rollouts are deterministic (a ``rollout_func``, TRL's public hook): the completion of the row at global index g
of a generation batch (process p holds rows p·n … p·n + n − 1) depends only on its prompt and j = g mod
num_generations, so 1 process and 2 processes see the same rows. Every prompt has 6 tokens and the j = 0
completion of every group has the maximum length, so no process pads differently from another; each j starts with
its own token, so no two rows share a context (no exact surprisal ties between rows).

With ``--dump`` every optimizer step's STARE preparation is saved to ``OUT/dump/step<s>_rank<r>.pt`` (this process's
step batch, ω, the decision and the row identities); ``--kill-after K`` ends every process with exit code 17 right
after checkpoint K is written (a barrier first, so every process has written its part); ``--resume CKPT`` resumes
and writes the controller state it loaded to ``OUT/resumed_controller_rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

NUM_GENERATIONS, PROMPT_LEN = 4, 6


def rollout(max_len: int, vocab: int, eos: int):
    def rollout_func(prompts, trainer):
        n, p = len(prompts), trainer.accelerator.process_index
        prompt_ids, completion_ids = [], []
        for i, prompt in enumerate(prompts):
            pid, j = int(prompt.split()[-1]), (p * n + i) % NUM_GENERATIONS
            rng = random.Random(1000 * pid + j)
            prompt_ids.append([10 + (pid * 7 + k) % (vocab - 20) for k in range(PROMPT_LEN)])
            length = max_len if j == 0 else rng.randint(3, max_len - 1)
            body = [20 + j] + [rng.randrange(30, vocab) for _ in range(length - 1)]
            if j % 2 == 1:
                body[-1] = eos
            completion_ids.append(body)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout_func


def reward(completions, completion_ids, **kwargs):
    """Deterministic, with spread inside a group: length mod 3 plus the parity of the second token."""
    return [float(len(ids) % 3) + 0.5 * (ids[1] % 2) for ids in completion_ids]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--per-device", type=int, default=8)
    ap.add_argument("--ga", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=12)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--variant", default="C2")
    ap.add_argument("--scope", default="global")
    ap.add_argument("--target", type=float, default=100.0)
    ap.add_argument("--schedule", default="paper", choices=["paper", "auto"], help="the adaptive W/M schedule")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--save-steps", type=int, default=1)
    ap.add_argument("--kill-after", type=int, default=0)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--dump", action="store_true")
    ap.add_argument("--plain", action="store_true", help="plain GRPOTrainer (same run without STARE)")
    ap.add_argument("--quadrant-every", type=int, default=1)
    ap.add_argument("--sstar-chunk-vocabs", type=int, default=0,
                    help="K > 0: bound the s* pass's logits blocks to K x V elements and record every block's shape "
                         "in OUT/sstar_chunks_rank<r>.json")
    args = ap.parse_args()

    from trl import GRPOConfig, GRPOTrainer

    from stare_lab.integrations import trl as stare_trl
    from stare_lab.integrations.trl import STAREGRPOConfig, STAREGRPOTrainer

    out = Path(args.out)
    tok = AutoTokenizer.from_pretrained(args.model)
    blocks: list[list[int]] = []
    if args.sstar_chunk_vocabs:
        import stare_lab.loss.entropy as entropy

        entropy.DEFAULT_CHUNK_ELEMENTS = args.sstar_chunk_vocabs * len(tok)
        inner = stare_trl.critical_surprisal

        def recording(logits, *a, **k):  # one call per block of the s* pass
            blocks.append(list(logits.shape))
            return inner(logits, *a, **k)

        stare_trl.critical_surprisal = recording
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": f"prompt {i}"} for i in range(16)])
    common = dict(output_dir=str(out), use_cpu=True, per_device_train_batch_size=args.per_device,
                  gradient_accumulation_steps=args.ga, num_generations=NUM_GENERATIONS,
                  max_completion_length=args.max_len, learning_rate=args.lr, optim="sgd", lr_scheduler_type="constant",
                  loss_type=args.loss_type, beta=0.0, max_steps=args.steps, logging_steps=1, report_to=[],
                  save_strategy="steps" if args.save_steps else "no", save_steps=max(args.save_steps, 1), seed=0,
                  bf16=False, disable_dropout=True, shuffle_dataset=False)
    if args.plain:
        cfg, cls = GRPOConfig(**common), GRPOTrainer
    else:
        cfg = STAREGRPOConfig(**common, variant=args.variant, top_p_ratio=0.2, reweight_w=1.2, reweight_m=0.8,
                              target_entropy=args.target, adaptive=True, schedule=args.schedule, alpha=0.05,
                              w_max=2.0, m_min=0.5,
                              scope=args.scope, quadrant_every=args.quadrant_every)
        cls = STAREGRPOTrainer

    class Dumping(cls):  # records what the tests compare
        def _stare_begin_step(self, micro):
            prep = super()._stare_begin_step(micro)
            if args.dump:
                (out / "dump").mkdir(parents=True, exist_ok=True)
                rows = [tuple(p.tolist()) + (-1,) + tuple(c[m.bool()].tolist()) for mb in micro
                        for p, c, m in zip(mb["prompt_ids"], mb["completion_ids"], mb["completion_mask"])]
                torch.save({"rows": rows, "logprobs": prep.batch.old_logprobs, "advantages": prep.batch.advantages,
                            "mask": prep.batch.response_mask, "entropy": prep.batch.entropy,
                            "weights": prep.token_weights, "gate_on": prep.gate_on, "w": prep.reweight_w,
                            "m": prep.reweight_m, "h_bar": prep.entropy,
                            "world_size": self.accelerator.num_processes},
                           out / "dump" / f"step{self.state.global_step + 1}_rank{self.accelerator.process_index}.pt")
            return prep

        def _stare_resume(self, checkpoint):
            super()._stare_resume(checkpoint)
            path = out / f"resumed_controller_rank{self.accelerator.process_index}.json"
            path.write_text(json.dumps(self.stare_controller.state_dict()))

    class Kill(TrainerCallback):
        def on_save(self, a, state, control, **kw):
            if state.global_step == args.kill_after:
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()
                os._exit(17)

    trainer = Dumping(model=model, processing_class=tok, reward_funcs=reward, args=cfg, train_dataset=ds,
                      rollout_func=rollout(args.max_len, len(tok), tok.eos_token_id), callbacks=[Kill()])
    trainer.train(resume_from_checkpoint=args.resume)
    if trainer.accelerator.is_main_process:
        trainer.save_state()
    if args.sstar_chunk_vocabs:
        (out / f"sstar_chunks_rank{trainer.accelerator.process_index}.json").write_text(json.dumps(blocks))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.exit(main())
