"""verl's real training step on CPU, driven by the tests in ``test_verl_real.py`` (a script, not collected: each
mode runs in its own process, because verl resolves its platform once per process at ``import verl``).

What is verl's own code here, unmodified: the v1 trainer's ``fit`` loop and ``step`` (dataloader, replay buffer,
batch balancing, old log-probs + entropy, GRPO advantages, the actor update, checkpoint save and resume, metrics),
TransferQueue on Ray, and the actor worker ``ActorRolloutRefWorker`` (role ``actor``) with its FSDP2 engine on a
tiny Qwen2 model (forward, backward, optimizer, checkpoint). verl's ``tqbridge`` turns each TransferQueue batch into
the worker's TensorDict exactly as in a Ray worker; with one process the worker is called in-process.

What stands in, because it cannot run on CPU (docs/integrations-verl.md "What runs on CPU"): the rollout (verl 0.9's
rollout is an LLM server replica, vLLM/SGLang/TRT-LLM) — :class:`ScriptedRollout` writes deterministic responses
and rewards into TransferQueue through verl's documented agent-loop-manager seam (``generate_sequences`` + outputs
in TransferQueue, as :class:`verl.experimental.agent_loop.AgentLoopOutput`); the weight sync to the replicas
(there are none); the Ray worker group (one process: the worker object itself).

Usage: ``python _verl_real.py WORKDIR RUN [RUN …]`` (:func:`main`). Prints one JSON line prefixed ``RESULT ``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import types
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
#: ``cpu`` (the tests) or ``cuda`` (scripts/verl_gpu_check.sh on one GPU)
DEVICE = os.environ.get("STARE_VERL_DEVICE", "cpu")
#: steps of a run; a checkpoint every ``STEPS // 2``
STEPS = int(os.environ.get("STARE_VERL_STEPS", "4"))
#: the model and batch: 2 prompts × 2 responses and a 2-layer 64-wide model on CPU; 8 × 4 and 8 layers × 512 on GPU
SIZES = {"cpu": {"prompts": 2, "n": 2, "model": {}},
         "cuda": {"prompts": 8, "n": 4, "model": {"hidden_size": 512, "num_layers": 8, "head_dim": 64,
                                                  "num_kv_heads": 2}}}[DEVICE]


def _env() -> None:
    """Before ``import verl``: on CPU the CPU platform (``_cpu_platform``); a one-process process group; on GPU
    deterministic kernels (the parity and resume checks compare parameters bit for bit)."""
    sys.path[:0] = [str(HERE), str(REPO)]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if DEVICE == "cpu":
        os.environ.update(VERL_PLATFORM="cpu", VERL_USE_EXTERNAL_MODULES="_cpu_platform", VERL_ENGINE_DEVICE="cuda")
    else:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def prepare(workdir: Path) -> tuple[Path, Path]:
    """The tiny model (trainer/tiny.py) and 4 steps' worth of prompts in verl's RL-dataset Parquet format."""
    import pandas as pd

    from trainer.tiny import build_tiny_model

    model = workdir / "tiny"
    if not (model / "config.json").is_file():
        build_tiny_model(model, seed=0, **SIZES["model"])
    data = workdir / "prompts.parquet"
    if not data.is_file():
        rows = [{"data_source": "synthetic", "prompt": [{"role": "user", "content": f"What is {a} + {a + 1}?"}],
                 "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * a + 1)},
                 "extra_info": {"index": a}} for a in range(4 * SIZES["prompts"])]
        pd.DataFrame(rows).to_parquet(data)
    return model, data


def overrides(workdir: Path, model: Path, data: Path, **settings: str) -> list[str]:
    """The documented STARE launch (``_verl_cases.STARE_OVERRIDES``) sized by :data:`SIZES` and :data:`STEPS` (a
    checkpoint every ``STEPS // 2``), fp32 weights, SDPA attention, FSDP2; ``settings`` override ``key=value``."""
    from _verl_cases import STARE_OVERRIDES

    base = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in STARE_OVERRIDES}
    base.update({
        "actor_rollout_ref.model.path": str(model),
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32",
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(SIZES["prompts"]),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": str(SIZES["prompts"]),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": str(SIZES["prompts"]),
        "actor_rollout_ref.rollout.n": str(SIZES["n"]),
        "actor_rollout_ref.rollout.calculate_log_probs": "False",
        "actor_rollout_ref.actor.optim.lr": "0.01",
        "actor_rollout_ref.actor.use_kl_loss": "False",
        "+actor_rollout_ref.actor.policy_loss.target_entropy": "10.0",
        "+actor_rollout_ref.actor.policy_loss.scope": "global",
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": "False",
        "data.train_files": f"['{data}']",
        "data.val_files": f"['{data}']",
        "data.train_batch_size": str(SIZES["prompts"]),
        "data.max_prompt_length": "64",
        "data.max_response_length": "8",
        "data.dataloader_num_workers": "0",
        "trainer.total_training_steps": str(STEPS),
        "trainer.save_freq": str(STEPS // 2),
        "trainer.test_freq": "-1",
        "trainer.val_before_train": "False",
        "trainer.logger": "['file']",
        "trainer.n_gpus_per_node": "1",
        "trainer.nnodes": "1",
        "trainer.resume_mode": "auto",
        "trainer.default_local_dir": str(workdir / "ckpt"),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": "1",
    })
    base.update(settings)
    return [f"{k}={v}" for k, v in base.items()]


class ScriptedRollout:
    """The rollout, scripted: for each prompt and session, response tokens drawn from a generator seeded by (prompt,
    session, step) — the same across runs and resumes — and reward 1 when the first response token is even. Written
    to TransferQueue as verl's agent loop writes its outputs (``verl/trainer/ppo/v1/agent_loop_tq.py``)."""

    def __init__(self, tokenizer, n: int) -> None:
        self.tokenizer, self.n = tokenizer, n

    def generate_sequences(self, batch) -> None:
        import torch
        import transfer_queue as tq
        from verl.experimental.agent_loop import AgentLoopOutput
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        step = int(batch["global_steps"])
        vocab = len(self.tokenizer)
        for i in range(len(batch)):
            uid = batch["uid"][i]
            messages = list(batch["raw_prompt"][i])
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            keys, fields, tags = [], [], []
            for session in range(self.n):
                seed = zlib.crc32(f"{messages}|{session}|{step}".encode())
                g = torch.Generator().manual_seed(seed)
                length = 3 + seed % 5
                response = torch.randint(5, vocab, (length,), generator=g).tolist()
                out = AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response, response_mask=[1] * length,
                                      reward_score=float(response[0] % 2 == 0), num_turns=2,
                                      metrics=AgentLoopMetrics(),
                                      extra_fields={"min_global_steps": step, "max_global_steps": step,
                                                    "reward_extra_info": {}})
                field = out.as_dict()
                input_ids = torch.cat([field["prompts"], field["responses"]])
                field.update(uid=uid, loss_mask=field["response_mask"], input_ids=input_ids,
                             attention_mask=torch.ones_like(input_ids), position_ids=torch.arange(len(input_ids)),
                             multi_modal_inputs={})
                field.pop("metrics", None)
                keys.append(f"{uid}_{session}_0")
                fields.append(field)
                tags.append({"status": "success", "prompt_len": len(prompt_ids), "response_len": length,
                             "seq_len": len(prompt_ids) + length, "global_steps": step,
                             "min_global_steps": step, "max_global_steps": step})
            tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train")
            tq.kv_batch_put(keys=[uid], partition_id="train",
                            tags=[{"is_prompt": True, "status": "finished", "global_steps": step}])


class InProcessActor:
    """verl's ``ActorRolloutRefWorker`` (role ``actor``: the FSDP2 engine, no rollout) called in this process where
    verl would call it through a Ray worker group; its methods carry verl's ``tqbridge``, so TransferQueue batches
    are converted exactly as in a worker. ``seen`` keeps the last TensorDict ``update_actor`` received."""

    def __init__(self, config) -> None:
        from verl.workers.engine_workers import ActorRolloutRefWorker

        self.worker = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
        self.worker.init_model()
        self._dispatch_info = {"actor": [0]}  # one data-parallel rank
        self.seen = None

    def set_loss_fn(self, loss_fn) -> None:
        self.worker.set_loss_fn(loss_fn)

    def compute_log_prob(self, batch):
        return self.worker.compute_log_prob(batch)

    def update_actor(self, batch):
        from verl.utils.transferqueue_utils import _meta_to_realdata

        self.seen = _meta_to_realdata(batch)
        return self.worker.update_actor(batch)

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.worker.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self.worker.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    def params(self) -> dict:
        """The actor's full parameters (FSDP2 DTensors gathered), detached copies."""
        out = {}
        for name, p in self.worker.actor.engine.module.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = full.detach().cpu().clone()
        return out


def harness(base: type) -> type:
    """``base`` (verl's ``PPOTrainerSync`` or :class:`STARETrainer`) with verl's ``_setup`` replaced by what runs in
    one CPU process: verl's own tokenizer, dataloader, dump executor and resource-pool spec, the in-process actor,
    no rollout replicas to sync, rewards from the scripted rollout, then verl's own ``_load_checkpoint``. Everything
    else — ``fit``, ``step``, the STARE hooks (its ``_setup`` installs the worker loss after this one) — is the
    class's own. ``kill=after_checkpoint:N`` ends the process with SIGKILL right after verl's checkpoint save of
    step N."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    class CPUSetup(PPOTrainer):
        def _setup(self):
            self._init_tokenizer()
            self._init_dataloader()
            self._init_dump_executor()
            self._init_resource_pool_mgr()  # the pool spec only: creating the pools needs Ray GPUs
            self.actor_rollout_wg = InProcessActor(self.config)
            self.reward_loop_manager = types.SimpleNamespace(reward_loop_worker_handles=[])
            self.checkpoint_manager = types.SimpleNamespace(update_weights=lambda *a, **k: None,
                                                            sleep_replicas=lambda *a, **k: None)
            self._load_checkpoint()

        def _save_checkpoint(self):
            super()._save_checkpoint()
            _maybe_kill(self, "after_checkpoint")

    class Run(base, CPUSetup):
        pass

    return Run


def _maybe_kill(trainer, point: str) -> None:
    want = os.environ.get("STARE_TEST_KILL", "")
    if want == f"{point}:{trainer.global_steps}":
        print(f"KILLED {want}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def run_fit(workdir: Path, name: str, trainer_name: str, settings: dict[str, str]) -> dict:
    """One training run of ``trainer_name`` (``stare`` or verl's ``sync``) in ``workdir/name`` to its end. Saves the
    actor's final parameters (``params.pt``), what the last ``update_actor`` received (``seen.pt``, padded) and verl's
    own metrics (its file logger: ``verl_metrics.jsonl``)."""
    import hashlib

    import torch
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from _verl_cases import compose
    from stare_lab.integrations.verl_trainer import STARETrainer

    model, data = prepare(workdir)
    out_dir = workdir / name
    args = overrides(out_dir, model, data, **settings)
    if trainer_name == "sync":  # verl's own trainer and loss: no plugin settings at all
        args = [a for a in args if "policy_loss" not in a and "trainer_mode" not in a]
        args += ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "trainer.v1.trainer_mode=sync"]
    cfg = compose(args)
    OmegaConf.resolve(cfg)
    trainer = harness(STARETrainer if trainer_name == "stare" else PPOTrainerSync)(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out_dir / "verl_metrics.jsonl")  # verl's own file logger
    trainer.init()
    trainer.fit(ScriptedRollout(trainer.tokenizer, int(cfg.actor_rollout_ref.rollout.n)))
    params = trainer.actor_rollout_wg.params()
    torch.save(params, out_dir / "params.pt")
    seen = trainer.actor_rollout_wg.seen
    keep = ["response_mask", "old_log_probs", "advantages", "stare_token_weights"]
    torch.save({k: (seen[k].to_padded_tensor(0.0) if seen[k].is_nested else seen[k]).cpu()
                for k in keep if k in seen.keys()}, out_dir / "seen.pt")
    digest = hashlib.sha256(b"".join(p.float().numpy().tobytes() for _, p in sorted(params.items()))).hexdigest()
    return {"params_sha256": digest, "global_steps": int(trainer.global_steps)}


def main() -> None:
    """``python _verl_real.py WORKDIR RUN [RUN …]``, each RUN ``name:trainer[:key=value,…]`` (``trainer`` is
    ``stare`` or ``sync``; ``kill=after_checkpoint:N`` among the settings); the runs share
    one Ray + TransferQueue and one gloo group."""
    _env()
    workdir = Path(sys.argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    runs = []
    for spec in sys.argv[2:]:
        name, trainer_name, *rest = spec.split(":", 2)
        settings = dict(kv.split("=", 1) for kv in rest[0].split(",")) if rest and rest[0] else {}
        runs.append((name, trainer_name, settings))
    import ray
    import torch.distributed as dist
    import transfer_queue as tq
    from omegaconf import OmegaConf

    if DEVICE == "cuda":
        import torch

        torch.cuda.set_device(0)
        torch.use_deterministic_algorithms(True, warn_only=True)
    dist.init_process_group("gloo" if DEVICE == "cpu" else "cpu:gloo,cuda:nccl", rank=0, world_size=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    results = {}
    try:
        for name, trainer_name, settings in runs:
            kill = settings.pop("kill", "")
            os.environ["STARE_TEST_KILL"] = kill
            results[name] = run_fit(workdir, name, trainer_name, settings)
    finally:
        tq.close()
        ray.shutdown()
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
