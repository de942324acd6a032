"""Driver of the data-parallel evaluation test (``test_evaluate_dp.py``): run under ``torch.distributed.run``.

``python -m torch.distributed.run --nproc_per_node K _eval_dp.py OUT TP`` — every rank evaluates with a scripted
engine whose answer depends only on the problem and the sample index (not on the sampling seed), so the result must
equal the one-process result whatever the share. Each rank writes ``OUT/rank<r>.json`` with what it generated, the
seeds it was given and the result it got back; ``evaluate_engine`` writes its files to ``OUT/files_rank<r>``.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

import torch.distributed as tdist

from trainer.evaluation.evaluate import EvalConfig, evaluate_engine
from trainer.engines.launch import DistInfo
from trainer.engines.rollout import RolloutOutput


class Tok:
    """Characters as token ids (prompts are plain text: no chat template)."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


class Engine:
    """Sample j of a problem answers right iff (crc32(problem) + j) % 3 == 0 (a fixed, seed-free rule)."""

    def __init__(self, golds: dict[str, str]):
        self.golds = golds
        self.seen: list[str] = []
        self.seeds: list[int] = []

    def generate(self, prompts, sampling):
        self.seeds.append(sampling.seed)
        out = []
        for pi, ids in enumerate(prompts):
            text = "".join(map(chr, ids))
            self.seen.append(text)
            group = []
            for j in range(sampling.n):
                right = (zlib.crc32(text.encode()) + j) % 3 == 0
                resp = "\\boxed{" + (self.golds[text] if right else "-1") + "}"
                group.append(RolloutOutput(pi, ids, [1, 2], [0.0, 0.0], resp, "stop"))
            out.append(group)
        return out


def config() -> EvalConfig:
    # 7 and 5 problems: shares of unequal size on 2 groups (3+4, 2+3); batch_prompts 2: several chunks per share
    return EvalConfig(benchmarks=["aime24", "amc23"], n=3, use_chat_template=False, prompt_template="{problem}",
                      batch_prompts=2)


def problems():
    from trainer.evaluation.evaluate import load_problems

    cfg = config()
    return {"aime24": load_problems(cfg, "aime24")[:7], "amc23": load_problems(cfg, "amc23")[:5]}


def main() -> int:
    out, tp = Path(sys.argv[1]), int(sys.argv[2])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dist = None
    if world > 1:
        tdist.init_process_group("gloo")
        dist = DistInfo(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", "0")), tp=tp)
    probs = problems()
    golds = {p.problem: p.answer for ps in probs.values() for p in ps}
    engine = Engine(golds)
    res = evaluate_engine(engine, Tok(), config(), out_dir=out / f"files_rank{rank}", model_name="scripted",
                          problems=probs, dist=dist)
    (out / f"rank{rank}.json").write_text(json.dumps({"seen": engine.seen, "seeds": engine.seeds, "result": res}))
    if dist is not None:
        tdist.barrier()
        tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
