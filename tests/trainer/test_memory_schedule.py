"""The memory order of a colocated step and the weight-version check (trainer.engines.memory), on CPU with fakes.

The real ``trainer.step.runner.StepRunner.step`` runs with a fake rollout engine and a fake policy that record every
call, so the order checked is the loop's own: generation → engine sleep → cache freed → [DeepSpeed states reloaded] →
old log-probs → update → [states offloaded] → cache freed → wake weights → sync → wake KV cache → next generation;
and an engine that missed a sync refuses to generate.
"""

from __future__ import annotations

import pytest
import torch

from stare_lab.errors import RunError
from trainer.step.collect import Collector
from trainer.config import load_trainer_config
from trainer.data import DataCursor, EncodedPrompt
from trainer.engines.launch import DistInfo
from trainer.engines.memory import ColocatedSchedule, PhaseMemory, WeightVersions
from trainer.engines.rollout import RolloutOutput


class FakeEngine:
    """Sample j of every prompt answers "j" (so groups have reward variance against gold "1"); log-probs −1."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def generate(self, prompt_token_ids, sampling):
        self.events.append("generate")
        return [[RolloutOutput(prompt_index=i, prompt_token_ids=list(p), token_ids=[5, 6], logprobs=[-1.0, -1.0],
                               text=str(j), finish_reason="stop") for j in range(sampling.n)]
                for i, p in enumerate(prompt_token_ids)]

    def sleep(self):
        self.events.append("sleep")

    def wake_up(self, tags=None):
        self.events.append(f"wake:{','.join(tags) if tags else 'all'}")

    def sync_weights(self, named_tensors):
        for _ in named_tensors:
            pass
        self.events.append("sync")


class FakePolicy:
    """One rank: log-probs equal to the engine's; an update that only records itself."""

    device = "cpu"
    fusable = False  # the old-log-prob pass is its own phase here

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def release(self):
        pass

    def micro_plan(self, batch, comm):
        return [torch.arange(len(batch))]

    def compute_logprobs(self, batch, plan, keep_graph=False, entropy_grad=False):
        self.events.append("old_logprob")
        return batch.rollout_logprobs.clone(), torch.ones(batch.response_ids.shape)

    def update(self, batch, plan, prep, comm):
        self.events.append("update")
        return {"loss/total": 0.0, "grad_norm": 0.0}

    def iter_named_params(self, bucket_bytes, materialize=True):
        self.events.append("gather")
        yield "w", torch.zeros(1)

    def offload_states(self):
        self.events.append("offload")

    def reload_states(self):
        self.events.append("reload")


class Encoder:
    def encode(self, record, index):
        return EncodedPrompt(token_ids=[1, 2, 3], answer=record["answer"], truncated=False, index=index)


def _trainer(offload: bool, method: str = "c2", stare: dict | None = None):
    from stare_lab.loss.stare import STAREController
    from trainer.engines.comm import Comm
    from trainer.step.runner import StepRunner

    cfg = load_trainer_config({"method": method, "model": {"path": "unused"},
                               "rollout": {"n": 4, "max_response_length": 2},
                               "reward": {"kind": "gsm8k-lenient"},
                               "loss": {"loss_mode": "stare", "stare": stare or {"variant": "C2", "gate": "always"}},
                               "optim": {"train_batch_size": 2}})
    events: list[str] = []
    dist, comm = DistInfo(rank=0, world_size=1, local_rank=0), Comm()
    engine, policy = FakeEngine(events), FakePolicy(events)
    schedule = ColocatedSchedule(engine, policy, bucket_bytes=1.0, offload_during_rollout=offload,
                                 offloaded=offload, free=lambda: events.append("free"))
    records = [{"prompt": "p", "answer": "1", "id": i} for i in range(4)]
    collector = Collector(cfg, dist, engine, Encoder(), records, DataCursor(4, 0), comm,
                          check_fresh=schedule.before_generation)
    tr = StepRunner(cfg, dist, comm, policy, collector, STAREController(cfg.loss.stare), schedule, PhaseMemory(),
                    eos_id=0)
    return tr, events


STEP = ["generate", "sleep", "free", "old_logprob", "update", "free", "wake:weights", "gather", "sync",
        "wake:kv_cache"]


def test_step_order_without_offload():
    tr, events = _trainer(offload=False)
    rows = [tr.step(1), tr.step(2)]
    assert events == STEP + STEP
    assert all(r["skipped"] == 0 for r in rows)
    assert tr.schedule.versions.policy == tr.schedule.versions.engine == 2


def test_step_order_with_deepspeed_offload_during_rollout():
    """The states were offloaded before the engine was built: reloaded right after the engine sleeps, offloaded
    again after the update, before the engine wakes."""
    tr, events = _trainer(offload=True)
    tr.step(1)
    tr.step(2)
    step = ["generate", "sleep", "free", "reload", "old_logprob", "update", "offload", "free", "wake:weights",
            "gather", "sync", "wake:kv_cache"]
    assert events == step + step


def test_auto_schedule_adds_no_pass_to_the_step():
    """The real step runner with the auto schedule (``c2-auto``) makes exactly the calls of the same run with W fixed
    (``c2``), step after step: the same generation, old-log-prob pass, update and sync, nothing more — the schedule
    reads only the H̄ the step measures anyway (H̄ = 1 nat here, the gate on below H_tgt = 5). Its W does move."""
    stare = {"variant": "C2", "gate": "entropy", "target_entropy": 5.0}
    fixed, fixed_events = _trainer(offload=False, method="c2", stare=stare)
    auto, auto_events = _trainer(offload=False, method="c2-auto", stare=stare)
    rows = {"fixed": [fixed.step(s) for s in (1, 2, 3)], "auto": [auto.step(s) for s in (1, 2, 3)]}
    assert fixed_events == auto_events == STEP * 3
    assert [r["gate_on"] for r in rows["auto"]] == [1, 1, 1] == [r["gate_on"] for r in rows["fixed"]]
    assert [r["stare_w"] for r in rows["fixed"]] == [1.1] * 3
    w = [r["stare_w"] for r in rows["auto"]]
    assert w[0] < w[1] < w[2]


def test_engine_never_generates_from_stale_weights():
    """An update without the sync that must follow it: the next generation round raises before sampling."""
    tr, events = _trainer(offload=False)
    tr.step(1)
    tr.schedule.versions.updated()  # as if the optimizer stepped and the sync were skipped
    n = len(events)
    with pytest.raises(RunError, match="version 1 but the policy is at version 2"):
        tr.step(2)
    assert "generate" not in events[n:]


def test_weight_versions_counter():
    v = WeightVersions()
    v.check_fresh()
    v.updated()
    with pytest.raises(RunError, match="stale"):
        v.check_fresh()
    v.synced()
    v.check_fresh()
    assert (v.policy, v.engine) == (1, 1)
    resumed = WeightVersions(7)  # a resumed run: policy restored at step 7 and the engine synced to it
    resumed.check_fresh()
    assert resumed.policy == 7


def test_skipped_update_wakes_the_engine_without_a_sync():
    events: list[str] = []
    sch = ColocatedSchedule(FakeEngine(events), FakePolicy(events), bucket_bytes=1.0,
                            free=lambda: events.append("free"))
    sch.after_generation()
    sch.skipped_update()
    sch.before_generation()  # versions unchanged: fresh
    assert events == ["sleep", "free", "free", "wake:all"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_phase_memory_records_nothing_on_cpu():
    """CPU rows carry no memory/… keys (the GPU check reads them on CUDA)."""
    mem = PhaseMemory()
    mem.start("update")
    mem.stop("update")
    assert mem.row() == {}


def test_offload_during_rollout_needs_zero3_and_deepspeeds_adam():
    from stare_lab.errors import ConfigError
    from trainer.run.preflight import check_training

    with pytest.raises(ConfigError, match="offload_during_rollout=true needs deepspeed.zero_stage=3"):
        load_trainer_config({"deepspeed": {"zero_stage": 2, "offload_during_rollout": True}})
    cfg = load_trainer_config({"deepspeed": {"offload_during_rollout": True}})
    with pytest.raises(ConfigError, match="needs optim.optimizer=deepspeed_adamw"):
        check_training(cfg)
    check_training(load_trainer_config({"deepspeed": {"offload_during_rollout": True},
                                        "optim": {"optimizer": "deepspeed_adamw"}}))


def test_vllm_engine_sleep_levels_and_staged_wake_up():
    """VLLMEngine's thin GPU path against a recording stand-in for ``vllm.LLM`` (sleep is GPU-only in vLLM): the
    configured sleep level, weights woken before the sync and the KV cache after it, a sync into sleeping weights
    refused, repeated calls no-ops."""
    from trainer.engines.rollout import VLLMEngine

    calls = []

    class LLM:
        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags=None):
            calls.append(("wake_up", tuple(tags)))

        def collective_rpc(self, method, kwargs):
            calls.append((method, [n for n, _ in kwargs["weights_iterator"]]))

    eng = VLLMEngine.__new__(VLLMEngine)
    eng.llm, eng.enable_sleep_mode, eng.sleep_level, eng._asleep, eng.tied_embeddings = LLM(), True, 2, set(), True
    eng.sleep()
    eng.sleep()
    with pytest.raises(RuntimeError, match="weights are asleep"):
        eng.sync_weights(iter([("model.embed_tokens.weight", torch.zeros(1))]))
    eng.wake_up(["weights"])
    eng.sync_weights(iter([("model.embed_tokens.weight", torch.zeros(1))]))
    eng.wake_up(["kv_cache"])
    eng.wake_up(None)
    assert calls == [("sleep", 2), ("wake_up", ("weights",)),
                     ("reload_weights", ["model.embed_tokens.weight", "lm_head.weight"]), ("wake_up", ("kv_cache",))]
