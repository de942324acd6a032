"""``stare-lab plan`` (trainer.planning.plan): the activation formula against what autograd saves, every phase of a small
config against numbers computed here by hand, the 18 paper configs on their documented cluster, the CLI's JSON,
the preflight refusal, and the docs table."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from stare_lab.errors import ConfigError
from trainer.config import load_trainer_config
from trainer.planning.plan import (CHUNK_WORKSPACE_BYTES, GIB, RUNTIME_GIB, Arch, Cluster, check_fits, layer_activation_bytes,
                          load_arch, plan)

REPO = Path(__file__).resolve().parents[2]
PAPER_CONFIGS = sorted((REPO / "papers" / "stare_2606.19236" / "configs").glob("*.yaml"))
PAPER_CLUSTER = Cluster(nodes=2, gpus_per_node=8, gpu_memory_gib=80.0)

SMALL = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 704,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "vocab_size": 1000, "tie_word_embeddings": False, "max_position_embeddings": 4096}


def _saved_bytes_per_token_layer(model_type: str, dtype, tokens: int = 128, batch: int = 2) -> float:
    """Bytes autograd saves per token and decoder layer (parameters excluded; storages counted once), from the
    difference between a 4-layer and a 2-layer model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def saved(layers: int) -> int:
        fields = {k: v for k, v in SMALL.items() if k not in ("model_type", "architectures")}
        cfg = AutoConfig.for_model(model_type, **{**fields, "num_hidden_layers": layers})
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).to(dtype)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                seen[st.data_ptr()] = st.nbytes()
            return t

        ids = torch.randint(0, SMALL["vocab_size"], (batch, tokens))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return sum(seen.values())

    return (saved(4) - saved(2)) / 2 / (batch * tokens)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_activation_formula_equals_what_autograd_saves(require, tmp_path, model_type, dtype_name):
    require("transformers")
    import torch

    path = tmp_path / "config.json"
    arch_name = "Qwen3ForCausalLM" if model_type == "qwen3" else "Qwen2ForCausalLM"
    path.write_text(json.dumps({**SMALL, "model_type": model_type, "architectures": [arch_name]}))
    arch = load_arch("unused", str(path))
    assert arch.qk_norm == (model_type == "qwen3")
    b = 2 if dtype_name == "bfloat16" else 4
    measured = _saved_bytes_per_token_layer(model_type, getattr(torch, dtype_name))
    assert layer_activation_bytes(arch, b) == measured


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(SMALL))
    cfg = load_trainer_config({
        "method": "grpo", "model": {"path": str(path.parent), "gradient_checkpointing": True},
        "data": {"max_prompt_length": 256}, "rollout": {"n": 4, "max_response_length": 256, "sync_bucket_mb": 1.0,
                                                        "gpu_memory_utilization": 0.5},
        "optim": {"train_batch_size": 8, "micro_batch_max_tokens": 1024},
        "deepspeed": {"zero_stage": 3, "precision": "bf16"}})
    return cfg, load_arch(cfg.model.path)


def test_small_config_by_hand(small):
    """Every component of every phase for 1 node x 2 GPUs x 8 GiB, typed in from the formulas by hand."""
    cfg, arch = small
    # parameters: embed + lm_head 2·1000·256, final norm 256; per layer q 256·256+256, k and v 256·128+128,
    # o 256·256, MLP 3·256·704, two norms 2·256
    per_layer = (256 * 256 + 256) + 2 * (256 * 128 + 128) + 256 * 256 + 3 * 256 * 704 + 2 * 256
    assert per_layer == 738304
    assert arch.params == 2 * 1000 * 256 + 256 + 4 * per_layer == 3465472
    assert arch.largest_layer_params == 256000 and arch.largest_param == 256000
    p = plan(cfg, Cluster(nodes=1, gpus_per_node=2, gpu_memory_gib=8.0, gpu_tflops=100.0), arch)
    runtime = 1.5 * GIB
    states = 4 * 256000 + 18 * 3465472 // 2  # DeepSpeed ZeRO-3: 4·largest layer + 18·P/N
    assert p["model_states_gib"] * GIB == pytest.approx(states, rel=1e-12)
    ph = {k: v["gib"] * GIB for k, v in p["phases"].items()}
    assert ph["rollout"] == pytest.approx(0.5 * 8 * GIB + states + runtime, rel=1e-12)
    T = 1024  # max(micro_batch_max_tokens 1024, 256 + 256)
    layer_ws = T * 2 * (4 * 256 + 3 * 704 + 2 * 4 * 64)
    assert ph["old_logprob"] == pytest.approx(states + 2 * 2 * T * 1000 + CHUNK_WORKSPACE_BYTES + layer_ws + runtime,
                                              rel=1e-12)
    per_layer_act = 2 * (4 * 256 + 2 * 256 + 4) + 2 * 5 * 4 * 64 + 4 * 4 + 4 * 2 * 704  # = 11288 B/token
    assert per_layer_act == 11288
    final_norm = 4 * 256 + 2 * 256
    act_gc = T * (4 * 2 * 256 + per_layer_act + final_norm)
    act_full = T * (4 * per_layer_act + final_norm)
    assert p["activations_gib"]["with_checkpointing"] * GIB == pytest.approx(act_gc, rel=1e-12)
    assert p["activations_gib"]["without_checkpointing"] * GIB == pytest.approx(act_full, rel=1e-12)
    assert ph["update"] == pytest.approx(states + act_gc + 3 * 2 * T * 1000 + T * per_layer_act
                                         + CHUNK_WORKSPACE_BYTES + runtime, rel=1e-12)
    assert ph["wake_sync"] == pytest.approx(states + 2 * 3465472 + 2 * 2**20 + runtime, rel=1e-12)
    assert p["limiting_phase"] == "rollout" and p["fits"] is True
    assert p["peak_gib"] == pytest.approx(ph["rollout"] / GIB) and p["headroom_gib"] == pytest.approx(8 - p["peak_gib"])
    # step time: 2 DP ranks, 16 sequences per GPU; forward FLOPs per token 2·(P − V·h) + 4·L·a·d·context
    fwd = lambda tokens, ctx: tokens * (2 * (3465472 - 256000) + 4 * 4 * 4 * 64 * ctx)  # noqa: E731
    st = p["step_time_s"]
    assert st["rollout"] == pytest.approx(16 * (fwd(256, 128) + fwd(256, 256 + 128)) / (100e12 * 0.10), rel=1e-12)
    assert st["old_logprob"] == pytest.approx(16 * fwd(512, 256) / (100e12 * 0.35), rel=1e-12)
    assert st["update"] == pytest.approx(4 * 16 * fwd(512, 256) / (100e12 * 0.35), rel=1e-12)  # ×4: checkpointing


def test_offload_and_the_fit_verdict(small):
    cfg, arch = small
    cfg.deepspeed.offload_during_rollout = True
    p = plan(cfg, Cluster(1, 2, 8.0), arch)
    assert p["phases"]["rollout"]["components"]["deepspeed_resident"] * GIB == pytest.approx(2 * 3465472 // 2)
    # 3 GiB GPUs: vLLM's pool (half of it) + the 1.5 GiB runtime + the 16-bit partitions exceed it
    tight = plan(cfg, Cluster(1, 2, 3.0), arch)
    assert tight["fits"] is False and tight["limiting_phase"] == "rollout"
    assert tight["peak_gib"] * GIB == pytest.approx(1.5 * GIB + 1.5 * GIB + 3465472)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_configs_fit_two_nodes_of_eight_80gb_gpus(path):
    """The documented cluster of every paper config: 2 nodes x 8 x 80 GB, with at least 10 % headroom."""
    cfg = load_trainer_config(path)
    p = plan(cfg, PAPER_CLUSTER, load_arch(cfg.model.path))
    assert p["fits"] and p["headroom_gib"] >= 8.0, (p["limiting_phase"], p["peak_gib"])
    assert p["rollout"]["kv_cache_gib"] > 0


def test_plan_cli_json_and_exit_code(capsys):
    from stare_lab.cli import main

    cfg = str(PAPER_CONFIGS[0])
    assert main(["plan", cfg, "--nodes", "2", "--gpus-per-node", "8", "--gpu-memory-gib", "80", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert {"phases", "peak_gib", "fits", "model_states_gib"} <= set(p)
    assert set(p["phases"]) == {"rollout", "old_logprob", "update", "wake_sync"} and p["fits"] is True
    assert main(["plan", cfg, "--nodes", "1", "--gpus-per-node", "1", "--gpu-memory-gib", "40"]) == 1
    text = capsys.readouterr().out
    assert "does NOT fit" in text.splitlines()[-2] and "smallest node count that fits" in text.splitlines()[-1]
    assert main(["plan", cfg, "optim.micro_batch_max_tokens=4096", "--gpu-memory-gib", "80", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layout"]["micro_batch_tokens"] == 9216  # one 1024 + 8192 sequence
    assert main(["plan", cfg, "--nodes", "0"]) == 1
    assert "--nodes=0 must be >= 1" in capsys.readouterr().err


def test_preflight_refuses_a_launch_that_cannot_fit():
    cfg = load_trainer_config(PAPER_CONFIGS[0])
    with pytest.raises(ConfigError, match=r"stare-lab plan: peak .* GiB/GPU in phase \w+ on 1 x 1 GPUs of 24 GiB: "
                                          r"does NOT fit"):
        check_fits(cfg, Cluster(nodes=1, gpus_per_node=1, gpu_memory_gib=24.0))


def test_unknown_architecture_is_a_clear_error():
    cfg = load_trainer_config({"model": {"path": "models/NoSuchModel-3B"}})
    with pytest.raises(ConfigError, match="no architecture of that name is shipped in papers/"):
        check_fits(cfg, PAPER_CLUSTER)


def test_docs_table_matches_the_plan():
    """docs/trainer.md's table of `stare-lab plan` on the 18 paper configs equals the planner's numbers."""
    text = (REPO / "docs" / "trainer.md").read_text()
    rows = {m.group(1): m for m in re.finditer(r"^\| `(\S+)\.yaml` \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                                                r"(\w+) \| (yes|no) \| ([\d.]+) \| (\d+) \|$", text, re.M)}
    assert set(rows) == {p.stem for p in PAPER_CONFIGS}
    for path in PAPER_CONFIGS:
        cfg = load_trainer_config(path)
        p = plan(cfg, PAPER_CLUSTER, load_arch(cfg.model.path))
        m = rows[path.stem]
        got = [float(m.group(i)) for i in (2, 3, 4, 5)]
        want = [round(p["phases"][k]["gib"], 1) for k in ("rollout", "old_logprob", "update", "wake_sync")]
        assert got == want, path.stem
        assert m.group(6) == p["limiting_phase"] and m.group(7) == ("yes" if p["fits"] else "no")
        assert float(m.group(8)) == round(p["model_states_gib"], 1)
        assert int(m.group(9)) == round(p["step_time_s"]["total"])


def test_train_preflight_applies_the_plan_on_a_gpu(monkeypatch):
    """stare-lab train's preflight (trainer.run.preflight.check_training) on a GPU job refuses a launch the plan says
    cannot fit, naming the plan's line; STARE_LAB_SKIP_PLAN=1 launches anyway; on CPU the plan is not applied."""
    from trainer.run import preflight

    cfg = load_trainer_config(PAPER_CONFIGS[0])
    preflight.check_training(cfg)  # CPU here: no GPU cluster, no plan
    monkeypatch.setattr(preflight, "gpu_cluster", lambda: Cluster(nodes=1, gpus_per_node=1, gpu_memory_gib=24.0))
    with pytest.raises(ConfigError, match=r"stare-lab plan: peak .* does NOT fit .*STARE_LAB_SKIP_PLAN=1"):
        preflight.check_training(cfg)
    monkeypatch.setenv("STARE_LAB_SKIP_PLAN", "1")
    preflight.check_training(cfg)


def test_plan_names_the_smallest_node_count_that_fits(capsys):
    """The 32B config does not fit one node of 8 x 80 GB; the plan itself says 2 nodes fit (the documented cluster,
    test above) and 1 does not, so the smallest is 2. On 24 GB GPUs no node count fits: a micro-batch's
    activations and the vLLM weights do not shrink with more GPUs (checked here: the plan on 128 nodes)."""
    from stare_lab.cli import main
    from trainer.planning.plan import MAX_NODES, smallest_fitting_nodes

    cfg_path = REPO / "papers" / "stare_2606.19236" / "configs" / "short_cot_qwen2.5-32b_stare-c2.yaml"
    cfg = load_trainer_config(cfg_path)
    arch = load_arch(cfg.model.path)
    one = Cluster(nodes=1, gpus_per_node=8, gpu_memory_gib=80.0)
    assert not plan(cfg, one, arch)["fits"] and plan(cfg, PAPER_CLUSTER, arch)["fits"]
    assert smallest_fitting_nodes(cfg, one, arch)["cluster"]["nodes"] == 2
    assert main(["plan", str(cfg_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "does NOT fit" in lines[-2]
    assert lines[-1].startswith("the smallest node count that fits: --nodes 2 (nodes of 8 GPUs of 80 GiB; peak ")
    small = Cluster(nodes=1, gpus_per_node=8, gpu_memory_gib=24.0)
    tp = cfg.rollout.tensor_parallel_size
    runnable = [n for n in range(1, MAX_NODES + 1) if cfg.optim.train_batch_size % (8 * n // tp) == 0]
    assert not plan(cfg, Cluster(nodes=max(runnable), gpus_per_node=8, gpu_memory_gib=24.0), arch)["fits"]
    assert smallest_fitting_nodes(cfg, small, arch) is None
    with pytest.raises(ConfigError, match=r"it fits on no node count up to 128"):
        check_fits(cfg, small)
    with pytest.raises(ConfigError, match=r"the smallest node count that fits: --nodes 2 "):
        check_fits(cfg, one)
    assert main(["plan", str(cfg_path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["smallest_fitting_nodes"] == 2


SHIPPED = sorted((REPO / "papers" / "stare_2606.19236" / "models").glob("*/config.json"))
VARIANTS = {  # the counted families with every bias and norm switch the arithmetic reads
    "qwen2_tied": {**SMALL, "tie_word_embeddings": True},
    "qwen3_bias": {**SMALL, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": True},
    "llama": {**SMALL, "model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "llama_bias": {**SMALL, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "attention_bias": True,
                   "mlp_bias": True, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("name", [p.parent.name for p in SHIPPED] + list(VARIANTS))
def test_counted_architecture_equals_the_model_built_on_meta(require, tmp_path, name):
    """Issue 29, item 7: plan counts parameters from config.json by arithmetic (no torch / transformers import);
    every count equals the model transformers builds on the meta device (the shipped paper models, and small
    configs with each bias / norm / tying switch)."""
    require("transformers")
    from trainer.planning.plan import _counted_arch, _meta_arch

    if name in VARIANTS:
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(VARIANTS[name]))
    else:
        path = next(p for p in SHIPPED if p.parent.name == name)
    counted, meta = _counted_arch(json.loads(path.read_text()), path), _meta_arch(path)
    assert counted == meta


def test_deepspeed_estimators_restated_exactly(require):
    """plan's ZeRO-2/3 model-state estimates (no DeepSpeed import) equal DeepSpeed's own functions over a grid of
    sizes, node counts and offload settings."""
    require("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from trainer.planning.plan import zero2_model_states, zero3_model_states

    for P, largest in ((3465472, 256000), (7_615_616_512, 544_997_376), (32_763_876_352, 778_567_680)):
        for gpn, nodes in ((1, 1), (8, 1), (8, 2), (4, 3)):
            for off, off_p in ((False, False), (True, False), (True, True)):
                ds = estimate_zero3_model_states_mem_needs(P, largest, num_gpus_per_node=gpn, num_nodes=nodes,
                                                           cpu_offload=off, cpu_offload_params=off_p, zero_init=True)
                assert zero3_model_states(P, largest, gpn, nodes, off, off_p) == ds[:2]
            for off in (False, True):
                ds = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=gpn, num_nodes=nodes, cpu_offload=off)
                assert zero2_model_states(P, gpn, nodes, off) == tuple(ds)


def test_an_empty_config_or_no_model_is_named_as_such(tmp_path, capsys):
    """Issue 29, item 7: `plan` on an empty YAML blamed `model.path`; now it says the file is empty. A config
    without model.path (and no --arch) says that, not "no architecture of that name"."""
    from stare_lab.cli import main

    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert main(["plan", str(empty)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"config file {str(empty)!r} is empty (no keys)" in err[0], err
    nomodel = tmp_path / "nomodel.yaml"
    nomodel.write_text("optim:\n  lr: 1.0e-6\n")
    assert main(["plan", str(nomodel)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.path is not set" in err[0], err
