"""Tool-use training through the real loop (trainer.run.loop with ``tool:`` configured), and the reward/tool statistics
the loop logs.

The end-to-end test runs ``trainer.run.loop.train`` in a subprocess (DeepSpeed ZeRO-3 fp32 on CPU, the real sandbox)
with a *scripted* policy injected through the engine interface (``trainer.engines.rollout.make_engine`` is replaced by a
factory of :class:`ScriptedEngine`): sample j of every prompt writes ``PLANS[j]`` — honouring stop strings like a
real engine — and reports teacher-forced log-probs of a tiny model that it keeps in sync with the trainer
(``sync_weights``). ``PolicyEngine.update`` is wrapped to record the batch the loss saw. Expected masks, counts and
rewards are derived by hand from the plans (token counts from the tokenizer), never from ``loss_mask``; the
measured entropy change (``schedule.measure_entropy_change``) is recomputed from the final HF export.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer.config import load_trainer_config
from trainer.run.loop import compute_rewards

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------- fast units


def test_compute_rewards_counts_grader_outcomes(require):
    """math_reward's per-response outcomes are counted under reward/…: here by hand 1 right, 1 wrong (answered),
    2 without a boxed answer → no_answer 2, timeout 0, grade_error 0, rejected 0; accuracy 1/4."""
    require("math_verify")
    cfg = load_trainer_config(None).reward
    rewards, stats = compute_rewards(cfg, ["so \\boxed{4}", "\\boxed{5}", "no answer", "4"], ["4"] * 4)
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert stats == {"reward/errors": 0.0, "reward/timeout": 0.0, "reward/no_answer": 2.0,
                     "reward/grade_error": 0.0, "reward/rejected": 0.0, "accuracy": 0.25}


def test_compute_rewards_passes_stats_to_the_grader():
    """The counts come from the ``stats`` dict the reward function fills (a stand-in grader reports 1 timeout and
    2 errors); the lenient reward takes no ``stats`` and logs no counts."""
    cfg = load_trainer_config(None).reward

    def grader(responses, golds, timeout_s, on_error, stats):
        stats.update(timeout=1, error=2, ok=1)
        return [0.0, 0.0, 0.0, 1.0]

    _, stats = compute_rewards(cfg, ["a"] * 4, ["1"] * 4, fn=grader)
    assert (stats["reward/timeout"], stats["reward/grade_error"], stats["reward/no_answer"]) == (1.0, 2.0, 0.0)
    lenient = load_trainer_config(None, ["reward.kind=gsm8k-lenient"]).reward
    _, stats = compute_rewards(lenient, ["a"], ["1"], fn=lambda r, g, timeout_s: [0.0])
    assert not any(k in stats for k in ("reward/timeout", "reward/no_answer", "reward/grade_error"))


def test_round_stats_combine_rounds_by_responses_and_calls():
    """Two generation rounds (4 and 2 responses). By hand: counts add (no_answer 1 + 3 = 4); per-response means are
    weighted by responses (calls/response (0.5·4 + 1.5·2)/6 = 5/6); error_frac by calls: round 1 made 2 calls
    (1 failed), round 2 made 3 (3 failed) → 4/5, not the response-weighted (0.5·4 + 1·2)/6 = 2/3. The names come
    from the config (math grader outcomes, tool metrics), the same on every rank; one that is not announced is an
    error, not a silently dropped number."""
    from stare_lab.errors import RunError
    from trainer.step.collect import Collector
    from trainer.engines.comm import Comm
    from trainer.engines.launch import DistInfo

    cfg = load_trainer_config({"reward": {"kind": "math"}, "tool": {"max_tool_calls": 2}})
    tr = Collector(cfg, DistInfo(rank=0, world_size=1, local_rank=0), None, None, [], None, Comm())
    tr.accumulate({"reward/no_answer": 1.0, "reward/errors": 0.0, "accuracy": 0.25,
                   "tool/calls_per_response": 0.5, "tool/error_frac": 0.5, "tool/timeout_frac": 0.0}, 4)
    tr.accumulate({"reward/no_answer": 3.0, "reward/errors": 1.0, "accuracy": 0.5,
                   "tool/calls_per_response": 1.5, "tool/error_frac": 1.0, "tool/timeout_frac": 0.0}, 2)
    for k, v in (("n_gen", 6), ("groups", 3), ("reward_sum", 2.0), ("kept_groups", 2)):
        tr.acc[k] = float(v)
    tr.rounds = 2
    out = tr.row(tr.comm.sum(tr.local_sums()))
    assert out["reward/no_answer"] == 4.0 and out["reward/timeout"] == 0.0
    assert out["tool/calls_per_response"] == pytest.approx(5 / 6)
    assert out["tool/error_frac"] == pytest.approx(4 / 5)
    assert out["tool/timeout_frac"] == 0.0 and out["tool/turns"] == 0.0  # never reported: 0, not missing
    assert out["reward/errors"] == 1.0 and out["accuracy"] == pytest.approx((0.25 * 4 + 0.5 * 2) / 6)
    assert out["kept_group_fraction"] == pytest.approx(2 / 3) and out["reward"] == pytest.approx(2 / 6)
    tr.acc["reward/surprise"] = 1.0
    with pytest.raises(RunError, match="reward/surprise"):
        tr.local_sums()


def _group_runner_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as tdist

    from trainer.run.loop import group_runner

    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = []

    def run(codes):  # a rank-dependent "sandbox": identical results on both ranks prove rank 0's were broadcast
        calls.append(list(codes))
        return [f"rank{rank}:{c}" for c in codes]

    runner = group_runner(run, tdist.new_group([0, 1]), src=0)
    results = [runner(["print(1)", "x"]), runner(["y"])]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"results": results, "calls": calls}))
    tdist.destroy_process_group()


def test_group_runner_broadcasts_the_source_ranks_results(tmp_path):
    """Two gloo processes (a TP group of 2): only rank 0 executes the code; both get rank 0's results, in order."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_group_runner_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    expected = [["rank0:print(1)", "rank0:x"], ["rank0:y"]]
    assert r0["results"] == r1["results"] == expected
    assert r0["calls"] == [["print(1)", "x"], ["y"]] and r1["calls"] == []


# ---------------------------------------------------------------------------------------------------- end to end

#: What sample j of every prompt writes (model text only). <code>…</code> tags: one model turn before the call,
#: one after. j0: a working call, right answer; j1: no tool, wrong answer; j2: the *interpreter* prints the right
#: boxed answer but the model's own text has none (graded on model text → 0, "no_answer"); j3: a failing call,
#: right answer. Rewards per group [1, 0, 0, 1].
PLANS = [
    "Compute.<code>print(6*7)</code>So the answer is \\boxed{42}.",
    "Guess: \\boxed{41}.",
    'Cheat.<code>print(chr(92) + "bo" + "xed{" + str(6*7) + "}")</code>I am not sure.',
    "Oops.<code>x = 1/0</code>Then \\boxed{42}.",
]

DRIVER = r'''
import json, re, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import trainer.engines.policy as policy_mod
import trainer.engines.rollout as rollout_mod
from stare_lab.loss.entropy import logprobs_from_logits
from trainer.config import load_trainer_config
from trainer.run.loop import train
from trainer.engines.rollout import RolloutOutput

cfg_path, plans, dump = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
INTERP = re.compile(r"\n<interpreter>\n.*?\n</interpreter>\n", re.S)


class ScriptedEngine:
    """Sample j writes plans[j]; a continuation (n=1) resumes the plan its context has started."""

    def __init__(self, model_dir):
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.prompts = []

    def _one(self, ctx, plan, sampling):
        prompt = max((p for p in self.prompts if ctx[: len(p)] == p), key=len)
        done = INTERP.sub("", self.tok.decode(ctx[len(prompt):], skip_special_tokens=True))
        if plan is None:
            plan = next(p for p in plans if p.startswith(done))
        rest = plan[len(done):]
        cuts = [rest.find(s) + len(s) for s in sampling.stop if s in rest]
        piece = rest[: min(cuts)] if cuts else rest
        ids = self.tok.encode(piece, add_special_tokens=False) + ([] if cuts else [self.tok.eos_token_id])
        reason = "stop"
        if len(ids) > sampling.max_tokens:
            ids, reason = ids[: sampling.max_tokens], "length"
        with torch.no_grad():
            logits = self.model(torch.tensor([ctx + ids])).logits[0, len(ctx) - 1 : -1]
        lps = logprobs_from_logits(logits, torch.tensor(ids), temperature=sampling.temperature).tolist()
        return RolloutOutput(0, list(ctx), ids, lps, self.tok.decode(ids, skip_special_tokens=True), reason)

    def generate(self, contexts, sampling):
        if sampling.n > 1:  # round 0 of a tool rollout: the prompts themselves
            self.prompts = [list(c) for c in contexts]
        out = []
        for i, ctx in enumerate(contexts):
            group = [self._one(list(ctx), plans[j] if sampling.n > 1 else None, sampling) for j in range(sampling.n)]
            for o in group:
                o.prompt_index = i
            out.append(group)
        return out

    def sync_weights(self, named_tensors):
        self.model.load_state_dict(dict(named_tensors), strict=False)

    def sleep(self):
        pass

    def wake_up(self, tags=None):
        pass


rollout_mod.make_engine = lambda cfg, model_dir, **kw: ScriptedEngine(str(model_dir))
records = []
orig_update = policy_mod.PolicyEngine.update


def update(self, batch, plan, prep, comm):
    """Record the batch the loss saw (padded tensors cut back to each row's lengths)."""
    rows = []
    for i in range(len(batch)):
        p, n = int(batch.prompt_lens[i]), int(batch.response_lens[i])
        rows.append((batch.input_ids[i, :p].tolist(), batch.response_ids[i, :n].tolist(),
                     batch.response_mask[i, :n].float().tolist(),
                     None if prep.token_weights is None else prep.token_weights[i, :n].tolist(),
                     prep.batch.entropy[i, :n].tolist()))
    prompt_ids, response_ids, masks, weights, ents = map(list, zip(*rows))
    records.append(dict(prompt_ids=prompt_ids, response_ids=response_ids, response_mask=masks,
                        advantages=batch.advantages.tolist(), weights=None if prep.token_weights is None else weights,
                        old_entropy=ents))
    with open(dump, "w") as fh:
        json.dump(records, fh)
    return orig_update(self, batch, plan, prep, comm)


policy_mod.PolicyEngine.update = update
train(load_trainer_config(cfg_path))
'''


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


@pytest.fixture(scope="module")
def tool_run(require, tiny_model, tmp_path_factory):
    """Two steps of C2 (gate forced on, P = 0.2) with tool calls through the real loop: 2 prompts × n = 4."""
    require("deepspeed", "math_verify", "transformers")
    from trainer.tools import sandbox

    ok, reason = sandbox.sandbox_available()
    if not ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"sandbox unavailable in CI: {reason}")
        pytest.skip(f"sandbox unavailable: {reason}")
    tmp = tmp_path_factory.mktemp("tool_run")
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": "42"}) + "\n"
                            for p in ("What is 6*7?", "Compute 6 times 7.")))
    out = tmp / "out"
    cfg = {
        "method": "c2", "seed": 0, "out_dir": str(out),
        "model": {"path": str(tiny_model)},
        "data": {"train_files": [str(data)], "max_prompt_length": 128},
        "rollout": {"engine": "hf", "n": 4, "max_response_length": 256},
        "reward": {"kind": "math"},
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "gate": "always", "top_p_ratio": 0.2}},
        "optim": {"lr": 1e-2, "train_batch_size": 2, "micro_batch_max_tokens": 4096},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 2, "save_freq": 0, "progress_bar": False, "measure_entropy_change": True},
        "tool": {"max_tool_calls": 2, "max_rounds": 4, "code_open": "<code>", "code_close": "</code>",
                 "sandbox": {"timeout_s": 5.0, "max_workers": 2}},
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    dump = tmp / "batches.json"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(path), json.dumps(PLANS), str(dump)], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, json.loads(dump.read_text()), out


def _expected_layout(tok, plan: str) -> tuple[list[int], list[int], int]:
    """By hand from the plan: (model turn A before the call incl. </code>, model turn B after it + eos, has_call).
    The scripted engine encodes each model turn on its own, so the response is A ‖ interpreter ‖ B."""
    if "</code>" not in plan:
        return tok.encode(plan, add_special_tokens=False) + [tok.eos_token_id], [], 0
    cut = plan.index("</code>") + len("</code>")
    return (tok.encode(plan[:cut], add_special_tokens=False),
            tok.encode(plan[cut:], add_special_tokens=False) + [tok.eos_token_id], 1)


@pytest.mark.slow
@pytest.mark.trainer
def test_tool_training_masks_interpreter_tokens(tool_run, tiny_model):
    """In the batch the loss saw: response = A ‖ interpreter turn ‖ B with response_mask 1 on A and B and 0 on the
    interpreter span; STARE (gate forced on) never weights an interpreter position, and its candidate counts are
    the *model* tokens only (|T+| = 2·(|j0| + |j3|), |T−| = 2·(|j1| + |j2|), k = ⌈P·|T±|⌉, docs/theory.md §4); the
    logged entropy is the token-mean over model tokens only; the trainer's log-probs at model positions equal the
    engine's (interleaved sequence aligned)."""
    from transformers import AutoTokenizer

    rows, batches, _ = tool_run
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    layouts = [_expected_layout(tok, p) for p in PLANS]
    model_tokens = [len(a) + len(b) for a, b, _ in layouts]
    assert len(rows) == len(batches) == 2
    for row, b in zip(rows, batches):
        assert len(b["response_ids"]) == 8  # 2 prompts × n = 4, in sample order
        ent_num = ent_den = ent_all = n_all = 0.0
        for i, (ids, mask) in enumerate(zip(b["response_ids"], b["response_mask"])):
            a, tail, call = layouts[i % 4]
            n_interp = len(ids) - len(a) - len(tail)
            assert ids[: len(a)] == a and ids[len(ids) - len(tail):] == tail
            assert (n_interp > 0) == bool(call)
            if call:
                span = tok.decode(ids[len(a): len(a) + n_interp])
                assert span.startswith("\n<interpreter>\n") and span.endswith("\n</interpreter>\n")
            expected = [1.0] * len(a) + [0.0] * n_interp + [1.0] * len(tail)
            assert mask == expected
            w = b["weights"][i]
            assert all(w[t] == 1.0 for t in range(len(ids)) if expected[t] == 0.0)  # never selected
            ent = b["old_entropy"][i]
            ent_num += sum(e * m for e, m in zip(ent, expected))
            ent_den += sum(expected)
            ent_all += sum(ent)
            n_all += len(ent)
        # rewards [1, 0, 0, 1] per group → advantages > 0 for j0, j3 and < 0 for j1, j2
        assert [a > 0 for a in b["advantages"]] == [True, False, False, True] * 2
        n_pos, n_neg = 2 * (model_tokens[0] + model_tokens[3]), 2 * (model_tokens[1] + model_tokens[2])
        assert row["stare/num_pos_candidates"] == n_pos and row["stare/num_neg_candidates"] == n_neg
        assert row["stare/num_pos_selected"] == math.ceil(0.2 * n_pos)
        assert row["stare/num_neg_selected"] == math.ceil(0.2 * n_neg)
        n_w = sum(abs(x - 1.1) < 1e-6 for r in b["weights"] for x in r)  # float32 ω: W = 1.1, M = 0.9
        n_m = sum(abs(x - 0.9) < 1e-6 for r in b["weights"] for x in r)
        assert (n_w, n_m) == (math.ceil(0.2 * n_pos), math.ceil(0.2 * n_neg))
        assert row["num_tokens"] == ent_den == n_pos + n_neg
        assert row["entropy"] == pytest.approx(ent_num / ent_den, rel=1e-6)  # (the loop sums rows in float32)
        assert row["entropy"] != pytest.approx(ent_all / n_all, rel=1e-6)  # control: interpreter tokens excluded
        assert row["gate_on"] == 1 and row["skipped"] == 0 and row["grad_norm"] > 0
        # step 1 samples with the initial weights, step 2 right after the sync: engine = trainer at model tokens
        assert row["rollout/logprob_diff_max"] <= 1e-4


@pytest.mark.slow
@pytest.mark.trainer
def test_tool_training_logs_tool_and_reward_metrics(tool_run):
    """By hand from PLANS: calls per response 3/4, 1 of 3 calls failed (j3), none timed out, turns (2+1+2+2)/4;
    rewards graded on the model's own text: [1, 0, 0, 1] → reward 0.5 (graded on the full text j2 would score, 0.75),
    and j2 has no answer of its own → reward/no_answer = 2 per step (one per prompt)."""
    rows, _, _ = tool_run
    for row in rows:
        assert row["tool/calls_per_response"] == 0.75
        assert row["tool/error_frac"] == pytest.approx(1 / 3) and row["tool/timeout_frac"] == 0.0
        assert row["tool/turns"] == 1.75 and row["tool/length_frac"] == 0.0
        assert row["tool/interpreter_tokens"] > 0
        assert row["tool/model_tokens"] + row["tool/interpreter_tokens"] == pytest.approx(row["tool/response_length"])
        assert row["reward"] == 0.5 and row["accuracy"] == 0.5
        assert row["reward/no_answer"] == 2.0 and row["reward/timeout"] == 0.0 and row["reward/grade_error"] == 0.0


@pytest.mark.slow
@pytest.mark.trainer
def test_measured_entropy_change(tool_run):
    """schedule.measure_entropy_change: entropy_change of the last step = H̄ after − H̄ before on that step's batch.
    Recomputed independently: the final HF export (checkpoint/step_2/hf, the weights after step 2's update) forwards
    the recorded batch (prompt ‖ response) and the token-mean of entropy_from_logits over the recorded
    response_mask gives H̄ after; H̄ before is the row's ``entropy`` (checked against the old entropies above).
    Step 1 is checked through step 2, whose batch repeats step 1's sequences."""
    import torch
    from transformers import AutoModelForCausalLM

    from stare_lab.loss.entropy import entropy_from_logits

    rows, batches, out = tool_run
    assert all(isinstance(r["entropy_change"], float) and isinstance(r["pred_entropy_change"], float) for r in rows)
    # step 1 (no momentum, no weight decay): ∇H̄·Δθ equals the split D_GRPO + (W − 1)·D_L+ + (M − 1)·D_L−
    # (trainer.step.prediction: the same linearisation of Adam, reached through three other gradients)
    r = rows[0]
    split = r["pred/d_grpo"] + 0.1 * r["pred/d_lplus"] - 0.1 * r["pred/d_lminus"]
    assert r["pred_entropy_change"] == pytest.approx(split, rel=1e-4, abs=1e-9)
    assert all(r["time/entropy_after_s"] > 0 for r in rows)
    model = AutoModelForCausalLM.from_pretrained(str(out / "checkpoint" / "step_2" / "hf"), dtype=torch.float32)
    b = batches[-1]
    num = den = 0.0
    with torch.no_grad():
        for p, r, m in zip(b["prompt_ids"], b["response_ids"], b["response_mask"]):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) - 1 + len(r)]
            num += float((entropy_from_logits(logits) * torch.tensor(m)).sum())
            den += sum(m)
    measured = num / den - rows[-1]["entropy"]
    assert rows[-1]["entropy_change"] == pytest.approx(measured, abs=1e-5)
    assert abs(measured) > 1e-3  # lr 1e-2 moves the entropy well beyond the tolerance: not 0 == 0
    # step 2's batch holds the same sequences as step 1's (both records, the same scripted responses), so its
    # pre-update entropy is step 1's plus step 1's measured change
    assert rows[1]["entropy"] == pytest.approx(rows[0]["entropy"] + rows[0]["entropy_change"], abs=1e-5)
