"""``stare-lab plan CONFIG``: per-GPU peak memory by phase and a step-time estimate, before a launch.

The phases are those of a colocated step (:mod:`trainer.engines.memory`), each a sum of named components (GiB per GPU;
P = parameters, N = GPUs in the job, tp = tensor-parallel size, b = bytes of the training dtype, T = tokens of one
packed micro-batch = ``max(optim.micro_batch_max_tokens, max prompt + max response)`` since a longer sequence gets a
micro-batch of its own):

- ``rollout`` (vLLM generating): vLLM's pool ``rollout.gpu_memory_utilization × GPU memory`` (its weights
  ``b_r·P/tp``, activations and KV cache live inside it — vLLM sizes the KV cache to fill the pool, and refuses to
  start unless that much memory is free) + what DeepSpeed keeps on the GPU meanwhile (all its model states, or only
  the 16-bit partitions ``b·P/N`` with ``deepspeed.offload_during_rollout``) + the runtime (CUDA context, NCCL,
  cuBLAS workspaces: :data:`RUNTIME_GIB`). With ``rollout.engine=hf``: the engine's full model copy ``b_r·P``
  + its KV cache for ``rollout.n`` sequences of the maximum length + the float32 scores transformers' ``generate``
  returns for every step, with the engine's stacked copy and log-softmax (``3·n·max_response·V·4``).
- ``old_logprob`` (engine asleep): DeepSpeed's model states + a no-grad forward of one micro-batch: the logits of
  all positions and their gathered response rows (``2·b·T·V``), the chunk workspaces of the log-prob/entropy
  functions (3 × 128 MiB, ``stare_lab.loss.entropy``) and one layer's working set.
- ``update``: DeepSpeed's model states + saved activations (with or without gradient checkpointing, both reported)
  + the logits term ``3·b·T·V`` (saved response logits, their gradient, and the gradient scattered into the full
  logits) + one layer's backward working set.
- ``wake_sync``: DeepSpeed's resident states + the engine's woken weights (``b_r·P/tp``) + two gathered sync
  buckets (the ZeRO-3 gather and its copy; ``rollout.sync_bucket_mb``, or the largest parameter if larger); the KV
  cache wakes only after the sync.

Model states are DeepSpeed's own estimate: ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``
(ZeRO-3; GPU part = 18·P/N + 4·largest layer, or with ``offload_optimizer`` / ``offload_param`` what it leaves on
the GPU) and ``stage_1_and_2.estimate_zero2_model_states_mem_needs`` (ZeRO-2), restated here
(:func:`zero3_model_states`, :func:`zero2_model_states`; tested equal to DeepSpeed's) so that a plan imports neither
DeepSpeed nor torch; ZeRO-0/1 by our arithmetic (18·P replicated, resp. 4·P + 14·P/N). They assume mixed precision
with Adam (the paper configs' setting).

Activations per token and decoder layer saved for backward (HF Qwen2/Qwen3 decoder layer with SDPA, worked out
from the modules' autograd: each RMSNorm keeps its float32 input, its b-byte output and a float32 1/rms; attention
keeps q, the GQA-expanded k and v, the output and its o_proj copy plus a float32 log-sum-exp per head; the SwiGLU MLP
keeps gate, SiLU output, up and their product):
``2·(4h + b·h + 4) + b·5·a·d + 4·a + 4·b·f`` (+ ``(4 + b)·(a + kv)·d + 4·(a + kv)`` for Qwen3's per-head q/k
norms). It equals, byte for byte, what autograd saves for Qwen2 and Qwen3 layers in bf16 and fp32
(tests/trainer/test_plan.py, measured with ``torch.autograd.graph.saved_tensors_hooks``). With gradient
checkpointing only each layer's input ``b·h`` is kept, plus one layer's activations during its recompute.

Step time: FLOPs per token ``2·P_matmul + 4·L·a·d·c̄`` forward (c̄ = mean causal context), ×3 for an update (×4 with
gradient checkpointing), every response at its maximum length (an upper bound), at a stated utilisation of the
GPU's peak (``--mfu`` for the trainer passes; ``--rollout-mfu`` for generation, which is memory-bound); one
generation round; the weight sync and the reward are not included.

Architecture: the model's ``config.json`` (``model.path``), or — for the paper configs, whose model directories are
local copies a user provides — the public ``config.json`` of the paper's models shipped in ``papers/*/models/``
(found by the model directory's name, or the longest shipped name it starts with). The parameter counts come from
the architecture itself: arithmetic on ``config.json`` for Qwen2, Qwen3 and Llama (:data:`COUNTED_FAMILIES`, equal
to the model's own count), else the model built on PyTorch's ``meta`` device (no weights, no memory; this imports
torch and transformers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError

from trainer.engines.launch import effective_zero_stage

logger = logging.getLogger(__name__)

__all__ = ["Arch", "Cluster", "load_arch", "plan", "plan_line", "format_plan", "check_fits", "smallest_fitting_nodes",
           "fit_hint", "MAX_NODES", "COUNTED_FAMILIES", "zero2_model_states", "zero3_model_states", "add_arguments",
           "main"]

GIB = 2**30
#: Per-process GPU memory outside PyTorch's allocator: CUDA context, NCCL buffers, cuBLAS workspaces (GiB; ours).
RUNTIME_GIB = 1.5
#: Default peak dense bf16 throughput of one GPU (TFLOP/s): an H100 SXM.
DEFAULT_GPU_TFLOPS = 989.0
#: Default utilisations of the peak for the trainer passes and for generation (decode is memory-bound).
DEFAULT_MFU = 0.35
DEFAULT_ROLLOUT_MFU = 0.10
#: The chunk workspaces of stare_lab.loss.entropy (DEFAULT_CHUNK_ELEMENTS float32 = 128 MiB each; three at most live).
CHUNK_WORKSPACE_BYTES = 3 * 2**25 * 4
PAPERS = Path(__file__).resolve().parents[2] / "papers"
PHASES = ("rollout", "old_logprob", "update", "wake_sync")


@dataclasses.dataclass
class Arch:
    """A decoder-only architecture: sizes from ``config.json``, parameter counts from the model on ``meta``."""

    name: str
    source: str
    params: int
    largest_layer_params: int
    largest_param: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool


@dataclasses.dataclass
class Cluster:
    """Where the job runs: ``nodes × gpus_per_node`` GPUs of ``gpu_memory_gib`` GiB and ``gpu_tflops`` peak."""

    nodes: int = 1
    gpus_per_node: int = 8
    gpu_memory_gib: float = 80.0
    gpu_tflops: float = DEFAULT_GPU_TFLOPS

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _find_config(model_path: str) -> Path:
    own = Path(model_path) / "config.json"
    if own.is_file():
        return own
    name = Path(model_path).name
    shipped = sorted(PAPERS.glob("*/models/*/config.json"))
    exact = [p for p in shipped if p.parent.name == name]
    prefix = sorted((p for p in shipped if name.startswith(p.parent.name)), key=lambda p: -len(p.parent.name))
    if exact or prefix:
        return (exact or prefix)[0]
    raise ConfigError(f"model.path={model_path!r} has no config.json and no architecture of that name is shipped in "
                      f"papers/*/models/ ({', '.join(p.parent.name for p in shipped) or 'none'}); give --arch FILE")


def load_arch(model_path: str, arch_file: str | None = None) -> Arch:
    """The architecture of ``model_path`` (or of ``arch_file``, a ``config.json``), see the module docstring: for the
    decoder families of :data:`COUNTED_FAMILIES` the parameter counts are arithmetic on ``config.json``
    (:func:`_counted_arch`; no torch, no transformers), for any other the model is built on torch's ``meta`` device.

    Raises:
        ConfigError: no ``config.json`` found or it is not a JSON object, or transformers cannot build the
            architecture.
    """
    from stare_lab.platform.files import read_json

    path = Path(arch_file) if arch_file else _find_config(model_path)
    if not path.is_file():
        raise ConfigError(f"--arch {str(path)!r} does not exist")
    hf = read_json(path, "architecture file", ConfigError)  # encoding, JSON: one line naming the file and line
    if not isinstance(hf, dict):
        raise ConfigError(f"architecture file {str(path)!r} holds a JSON {type(hf).__name__}, not an object")
    if hf.get("model_type") in COUNTED_FAMILIES:
        try:
            return _counted_arch(hf, path)
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"cannot read the architecture of {str(path)!r}: {type(err).__name__}: {err}") from None
    return _meta_arch(path)


#: the decoder families whose parameters :func:`_counted_arch` counts from ``config.json`` (transformers' modelling
#: code: Qwen2 has q/k/v biases; Qwen3 adds per-head q/k RMSNorms; Llama's biases follow ``attention_bias`` and
#: ``mlp_bias``); tests/trainer/test_plan.py checks each against the model built on the meta device
COUNTED_FAMILIES = ("qwen2", "qwen3", "llama")


def _counted_arch(hf: dict[str, Any], path: Path) -> Arch:
    """:class:`Arch` from a ``config.json`` of :data:`COUNTED_FAMILIES` by arithmetic: per decoder layer the
    q/k/v/o projections (h·a·d, h·kv·d, h·kv·d, a·d·h, plus their biases), the SwiGLU MLP (3·h·f, plus biases) and
    two RMSNorms (2·h), Qwen3's q/k norms (2·d); the embedding V·h, the final norm h and an untied LM head V·h.
    ``largest_layer_params`` is the largest module's own parameters (a Linear's weight and bias), as DeepSpeed's
    estimator takes it."""
    family = hf["model_type"]
    h, layers, heads = int(hf["hidden_size"]), int(hf["num_hidden_layers"]), int(hf["num_attention_heads"])
    kv = int(hf.get("num_key_value_heads") or heads)
    d = int(hf.get("head_dim") or h // heads)
    f, vocab = int(hf["intermediate_size"]), int(hf["vocab_size"])
    tied = bool(hf.get("tie_word_embeddings", False))
    qkv_bias = family == "qwen2" or bool(hf.get("attention_bias", False))
    o_bias = family != "qwen2" and bool(hf.get("attention_bias", False))
    mlp_bias = family == "llama" and bool(hf.get("mlp_bias", False))
    modules = {"q_proj": h * heads * d + (heads * d if qkv_bias else 0),
               "k_proj": h * kv * d + (kv * d if qkv_bias else 0),
               "v_proj": h * kv * d + (kv * d if qkv_bias else 0),
               "o_proj": heads * d * h + (h if o_bias else 0),
               "gate_proj": h * f + (f if mlp_bias else 0), "up_proj": h * f + (f if mlp_bias else 0),
               "down_proj": f * h + (h if mlp_bias else 0), "norms": 2 * h}
    qk_norm = family == "qwen3"
    if qk_norm:
        modules["qk_norms"] = 2 * d
    params = vocab * h + layers * sum(modules.values()) + h + (0 if tied else vocab * h)
    return Arch(
        name=path.parent.name, source=str(path), params=params,
        largest_layer_params=max(vocab * h, *(v for k, v in modules.items() if not k.endswith("norms"))),
        largest_param=max(vocab * h, h * heads * d, h * f), hidden=h, layers=layers, heads=heads, kv_heads=kv,
        head_dim=d, intermediate=f, vocab=vocab, tied=tied, qk_norm=qk_norm)


def _meta_arch(path: Path) -> Arch:
    """:class:`Arch` of any architecture transformers knows: the model built on torch's ``meta`` device."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as err:
        raise ConfigError(f"stare-lab plan builds the architecture of {str(path)!r} (not one of "
                          f"{', '.join(COUNTED_FAMILIES)}) with transformers, which cannot be imported ({err}): "
                          "`make install`, or pip install -e '.[trainer]'") from None
    try:
        hf = AutoConfig.from_pretrained(str(path.parent) if path.name == "config.json" else str(path))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"cannot build the architecture of {str(path)!r}: {err}") from None
    params = list(model.parameters())
    heads = int(hf.num_attention_heads)
    return Arch(
        name=path.parent.name, source=str(path), params=sum(p.numel() for p in params),
        largest_layer_params=max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        largest_param=max(p.numel() for p in params), hidden=int(hf.hidden_size), layers=int(hf.num_hidden_layers),
        heads=heads, kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(hf, "head_dim", None) or hf.hidden_size // heads),
        intermediate=int(hf.intermediate_size), vocab=int(hf.vocab_size),
        tied=bool(getattr(hf, "tie_word_embeddings", False)),
        qk_norm=any(n.endswith("q_norm.weight") for n, _ in model.named_parameters()))


def _dtype_bytes(name: str) -> int:
    return 4 if name in ("float32", "fp32") else 2


def zero3_model_states(total_params: int, largest_layer_params: int, gpus_per_node: int, nodes: int,
                       cpu_offload: bool, cpu_offload_params: bool, buffer_factor: float = 1.5) -> tuple[int, int]:
    """``(host bytes per node, GPU bytes per GPU)`` of the ZeRO-3 model states: DeepSpeed's
    ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``, with ``zero_init=True``)
    restated, so that the plan is arithmetic without importing DeepSpeed (tests/trainer/test_plan.py compares the
    two over a grid)."""
    total, per_node = nodes * gpus_per_node, 1 / nodes
    largest = 4 * largest_layer_params
    if cpu_offload and cpu_offload_params:
        return int(total_params * 18 * per_node * buffer_factor), int(largest)
    if cpu_offload:
        return int(total_params * 16 * per_node * buffer_factor), int(largest + int(2 * total_params / total))
    return int(largest_layer_params * 4 * gpus_per_node * buffer_factor), int(largest + int(18 * total_params / total))


def zero2_model_states(total_params: int, gpus_per_node: int, nodes: int, cpu_offload: bool,
                       buffer_factor: float = 1.5) -> tuple[int, int]:
    """``(host bytes per node, GPU bytes per GPU)`` of the ZeRO-2 model states: DeepSpeed's
    ``estimate_zero2_model_states_mem_needs`` (``deepspeed/runtime/zero/stage_1_and_2.py``) restated (see
    :func:`zero3_model_states`)."""
    total = nodes * gpus_per_node
    if cpu_offload:
        return int(total_params * max(4 * total, 16) * buffer_factor), int(2 * total_params)
    return (int(total_params * 4 * gpus_per_node * buffer_factor),
            int(2 * total_params + int(18 * total_params / total)))


def _states(cfg: Any, arch: Arch, cluster: Cluster) -> tuple[int, int]:
    """``(host bytes per node, GPU bytes per GPU)`` of DeepSpeed's model states for the ZeRO stage the run will use
    (:func:`trainer.engines.launch.effective_zero_stage`); ZeRO-0/1 by our arithmetic, no host part."""
    ds = cfg.deepspeed
    P, N = arch.params, cluster.gpus
    stage = effective_zero_stage(ds, N)
    if stage == 3:
        return zero3_model_states(P, arch.largest_layer_params, cluster.gpus_per_node, cluster.nodes,
                                  ds.offload_optimizer or ds.offload_param, ds.offload_param)
    if stage == 2:
        return zero2_model_states(P, cluster.gpus_per_node, cluster.nodes, ds.offload_optimizer)
    return 0, 18 * P if stage == 0 else 4 * P + (14 * P) // N


def model_states_bytes(cfg: Any, arch: Arch, cluster: Cluster) -> int:
    """DeepSpeed's estimate of the per-GPU model-state bytes (see the module docstring), for the ZeRO stage the run
    will use (:func:`trainer.engines.launch.effective_zero_stage`: stage 0 on one GPU without offload by default)."""
    return _states(cfg, arch, cluster)[1]


def _deepspeed_cpu_bytes(cfg: Any, arch: Arch, cluster: Cluster) -> int:
    """DeepSpeed's estimate of the host memory per node (ZeRO-3 / ZeRO-2 estimators; 0 for ZeRO-0/1)."""
    return _states(cfg, arch, cluster)[0]


def layer_activation_bytes(arch: Arch, b: int) -> int:
    """Bytes per token one decoder layer saves for backward (module docstring formula)."""
    h, a, d, f = arch.hidden, arch.heads, arch.head_dim, arch.intermediate
    out = 2 * (4 * h + b * h + 4) + b * 5 * a * d + 4 * a + 4 * b * f
    if arch.qk_norm:
        out += (4 + b) * (a + arch.kv_heads) * d + 4 * (a + arch.kv_heads)
    return out


def _micro_tokens(cfg: Any) -> int:
    return max(cfg.optim.micro_batch_max_tokens, cfg.data.max_prompt_length + cfg.rollout.max_response_length)


def plan(cfg: Any, cluster: Cluster, arch: Arch, *, mfu: float = DEFAULT_MFU,
         rollout_mfu: float = DEFAULT_ROLLOUT_MFU) -> dict[str, Any]:
    """The plan of ``cfg`` on ``cluster`` (JSON-able; keys ``phases``, ``peak_gib``, ``limiting_phase``, ``fits``,
    ``headroom_gib``, ``model_states_gib``, ``step_time_s``, ``layout``, ``arch``, ``cluster``, ``notes``).

    Raises:
        ConfigError: the tensor-parallel size does not divide the GPUs, or the batch does not split over the
            data-parallel groups.
    """
    r, o, ds = cfg.rollout, cfg.optim, cfg.deepspeed
    N, tp = cluster.gpus, r.tensor_parallel_size
    if N % tp or tp > cluster.gpus_per_node:
        raise ConfigError(f"rollout.tensor_parallel_size={tp} must divide the {N} GPUs and fit one node "
                          f"({cluster.gpus_per_node} GPUs)")
    dp = N // tp
    if o.train_batch_size % dp:
        raise ConfigError(f"optim.train_batch_size={o.train_batch_size} is not divisible by the {dp} data-parallel "
                          "groups")
    P, V, L, h = arch.params, arch.vocab, arch.layers, arch.hidden
    b = _dtype_bytes(ds.precision)
    b_r = _dtype_bytes(r.dtype if r.dtype != "auto" else ("bfloat16" if ds.precision == "bf16" else "float32"))
    M = cluster.gpu_memory_gib * GIB
    T = _micro_tokens(cfg)
    seq_len = cfg.data.max_prompt_length + r.max_response_length
    runtime = RUNTIME_GIB * GIB
    states = model_states_bytes(cfg, arch, cluster)
    resident_rollout = (b * P) // N if ds.offload_during_rollout else states
    kv_per_token = 2 * L * arch.kv_heads * arch.head_dim * b_r
    notes: list[str] = []

    phases: dict[str, dict[str, float]] = {}
    if r.engine == "vllm":
        pool = r.gpu_memory_utilization * M
        weights = b_r * P / tp
        kv_cache = pool - weights - 0.05 * pool  # vLLM's profile run keeps some of the pool for activations
        phases["rollout"] = {"vllm_pool": pool, "deepspeed_resident": resident_rollout, "runtime": runtime}
        per_rank_seqs = o.train_batch_size // dp * r.n
        concurrent = kv_cache / (kv_per_token / tp * seq_len) if kv_cache > 0 else 0.0
        if kv_cache <= 0:
            notes.append(f"vLLM's pool ({pool / GIB:.1f} GiB) does not hold its weights ({weights / GIB:.1f} GiB): "
                         "raise rollout.gpu_memory_utilization or rollout.tensor_parallel_size")
        elif concurrent < min(per_rank_seqs, r.max_num_seqs):
            notes.append(f"the KV cache ({kv_cache / GIB:.1f} GiB) holds {concurrent:.0f} sequences of {seq_len} "
                         f"tokens at once, fewer than the {per_rank_seqs} per TP group: generation is slower, not OOM")
        engine_awake_weights = weights
        kv_info = {"vllm_weights_gib": weights / GIB, "kv_cache_gib": max(kv_cache, 0.0) / GIB,
                   "full_length_sequences_in_kv_cache": concurrent}
    else:
        weights = b_r * P
        kv = r.n * seq_len * kv_per_token
        # transformers' generate keeps float32 scores of every step (output_scores), and the engine stacks them and
        # takes their log-softmax: three [n, max_response, V] float32 tensors per prompt
        scores = 3 * r.n * r.max_response_length * V * 4
        phases["rollout"] = {"hf_engine_weights": weights, "hf_kv_cache": kv, "hf_scores": scores,
                             "deepspeed_resident": resident_rollout, "runtime": runtime}
        engine_awake_weights = weights
        kv_info = {"hf_kv_cache_gib": kv / GIB}
    layer_ws = T * b * (4 * h + 3 * arch.intermediate + 2 * arch.heads * arch.head_dim)
    phases["old_logprob"] = {"deepspeed_states": states, "logits": 2 * b * T * V,
                             "workspaces": CHUNK_WORKSPACE_BYTES + layer_ws, "runtime": runtime}
    per_layer = layer_activation_bytes(arch, b)
    final_norm = 4 * h + b * h
    act_full = T * (L * per_layer + final_norm)
    act_gc = T * (L * b * h + per_layer + final_norm)
    gc = cfg.model.gradient_checkpointing
    phases["update"] = {"deepspeed_states": states, "activations": act_gc if gc else act_full,
                        "logits": 3 * b * T * V, "backward_working_set": T * per_layer + CHUNK_WORKSPACE_BYTES,
                        "runtime": runtime}
    bucket = max(r.sync_bucket_mb * 2**20, b * arch.largest_param)
    phases["wake_sync"] = {"deepspeed_resident": resident_rollout, "engine_weights": engine_awake_weights,
                           "sync_buckets": 2 * bucket, "runtime": runtime}
    out_phases = {}
    for name, comps in phases.items():
        total = sum(comps.values())
        out_phases[name] = {"gib": total / GIB, "allocated_gib": (total - runtime) / GIB,
                            "components": {k: v / GIB for k, v in comps.items()}}
    limiting = max(out_phases, key=lambda k: out_phases[k]["gib"])
    peak = out_phases[limiting]["gib"]
    engine_ok = r.engine != "vllm" or kv_info["kv_cache_gib"] > 0
    host = {"deepspeed_cpu": _deepspeed_cpu_bytes(cfg, arch, cluster) / GIB,
            "vllm_sleep_backup": (cluster.gpus_per_node * b_r * P / tp / GIB
                                  if r.engine == "vllm" and r.enable_sleep_mode and r.sleep_level == 1 else 0.0),
            "rollout_offload": cluster.gpus_per_node * 16 * P / N / GIB if ds.offload_during_rollout else 0.0}
    if T > o.micro_batch_max_tokens:
        notes.append(f"one sequence ({seq_len} tokens) exceeds optim.micro_batch_max_tokens="
                     f"{o.micro_batch_max_tokens}: micro-batches of {T} tokens are planned")
    return {
        "config": None,
        "arch": {"name": arch.name, "source": arch.source, "params": P, "vocab": V, "layers": L, "hidden": h},
        "cluster": dataclasses.asdict(cluster),
        "layout": {"gpus": N, "tp": tp, "dp": dp, "zero_stage": effective_zero_stage(ds, N), "precision": ds.precision,
                   "gradient_checkpointing": gc, "micro_batch_tokens": T,
                   "offload_during_rollout": ds.offload_during_rollout},
        "phases": out_phases,
        "peak_gib": peak,
        "limiting_phase": limiting,
        "fits": peak <= cluster.gpu_memory_gib and engine_ok,
        "headroom_gib": cluster.gpu_memory_gib - peak,
        "model_states_gib": states / GIB,
        "activations_gib": {"with_checkpointing": act_gc / GIB, "without_checkpointing": act_full / GIB},
        "rollout": kv_info,
        "host_gib_per_node": {**host, "total": sum(host.values())},
        "step_time_s": _step_time(cfg, arch, cluster, dp, mfu, rollout_mfu),
        "notes": notes,
    }


def _step_time(cfg: Any, arch: Arch, cluster: Cluster, dp: int, mfu: float, rollout_mfu: float) -> dict[str, Any]:
    """Seconds per step per phase from FLOPs (module docstring); every response at its maximum length."""
    r = cfg.rollout
    p_len, resp = cfg.data.max_prompt_length, r.max_response_length
    p_matmul = arch.params - (0 if arch.tied else arch.vocab * arch.hidden)
    attn = 4 * arch.layers * arch.heads * arch.head_dim

    def fwd(tokens: float, ctx: float) -> float:
        return tokens * (2 * p_matmul + attn * ctx)

    # a TP group generates its DP share of the sequences (each GPU doing 1/tp of every token's FLOPs), and its
    # ranks then split those sequences for the trainer passes: both are (batch / dp) * n / tp per GPU
    seqs_per_gpu = cfg.optim.train_batch_size / dp * r.n / r.tensor_parallel_size
    seq_len = p_len + resp
    peak = cluster.gpu_tflops * 1e12
    # generation: the TP group's sequences, each GPU does 1/tp of every token's FLOPs
    gen = seqs_per_gpu * (fwd(p_len, p_len / 2) + fwd(resp, p_len + resp / 2))
    train_tokens_fwd = seqs_per_gpu * fwd(seq_len, seq_len / 2)
    update_factor = 4 if cfg.model.gradient_checkpointing else 3
    t = {"rollout": gen / (peak * rollout_mfu), "old_logprob": train_tokens_fwd / (peak * mfu),
         "update": update_factor * train_tokens_fwd / (peak * mfu)}
    t["total"] = sum(t.values())
    t.update(mfu=mfu, rollout_mfu=rollout_mfu, gpu_tflops=cluster.gpu_tflops)
    return t


def plan_line(p: dict[str, Any]) -> str:
    """One line: the limiting phase, its GiB against the GPU's, fits or not."""
    c = p["cluster"]
    verdict = "fits" if p["fits"] else "does NOT fit"
    return (f"peak {p['peak_gib']:.1f} GiB/GPU in phase {p['limiting_phase']} on {c['nodes']} x "
            f"{c['gpus_per_node']} GPUs of {c['gpu_memory_gib']:g} GiB: {verdict} "
            f"(headroom {p['headroom_gib']:+.1f} GiB)")


def format_plan(p: dict[str, Any]) -> str:
    """The human-readable plan (what ``stare-lab plan`` prints)."""
    a, lay = p["arch"], p["layout"]
    lines = [f"model: {a['name']} ({a['params'] / 1e9:.2f} B params, vocab {a['vocab']}; {a['source']})",
             f"layout: {lay['gpus']} GPUs, TP {lay['tp']} x DP {lay['dp']}; ZeRO-{lay['zero_stage']} "
             f"{lay['precision']}, gradient checkpointing {'on' if lay['gradient_checkpointing'] else 'off'}, "
             f"micro-batch {lay['micro_batch_tokens']} tokens, DeepSpeed offload during rollout "
             f"{'on' if lay['offload_during_rollout'] else 'off'}",
             f"{'phase':<12} {'GiB/GPU':>8}  components (GiB)"]
    for name, ph in p["phases"].items():
        comps = ", ".join(f"{k} {v:.1f}" for k, v in ph["components"].items())
        lines.append(f"{name:<12} {ph['gib']:>8.1f}  {comps}")
    act = p["activations_gib"]
    lines.append(f"model states (DeepSpeed's estimator): {p['model_states_gib']:.1f} GiB/GPU; activations at "
                 f"{lay['micro_batch_tokens']} tokens: {act['with_checkpointing']:.1f} GiB with gradient "
                 f"checkpointing, {act['without_checkpointing']:.1f} GiB without")
    if "kv_cache_gib" in p["rollout"]:
        ro = p["rollout"]
        lines.append(f"vLLM: weights {ro['vllm_weights_gib']:.1f} GiB, KV cache ~{ro['kv_cache_gib']:.1f} GiB "
                     f"(~{ro['full_length_sequences_in_kv_cache']:.0f} full-length sequences at once)")
    st = p["step_time_s"]
    lines.append(f"step time <= {st['total']:.0f} s (rollout {st['rollout']:.0f} s at {st['rollout_mfu']:.0%} "
                 f"of {st['gpu_tflops']:g} TFLOP/s, old log-probs {st['old_logprob']:.0f} s and update "
                 f"{st['update']:.0f} s at {st['mfu']:.0%}; every response at its maximum length, one generation "
                 "round)")
    hst = p["host_gib_per_node"]
    lines.append(f"host memory per node: {hst['total']:.0f} GiB (DeepSpeed {hst['deepspeed_cpu']:.0f}, vLLM sleep "
                 f"backup {hst['vllm_sleep_backup']:.0f}, rollout offload {hst['rollout_offload']:.0f})")
    lines += [f"note: {n}" for n in p["notes"]]
    lines.append(plan_line(p))
    return "\n".join(lines)


#: The largest node count :func:`smallest_fitting_nodes` tries.
MAX_NODES = 128


def smallest_fitting_nodes(cfg: Any, cluster: Cluster, arch: Arch, **kw: Any) -> dict[str, Any] | None:
    """The plan on the smallest number of nodes (``cluster``'s GPUs per node and memory, from ``cluster.nodes`` up
    to :data:`MAX_NODES`) on which ``cfg`` fits, or None if none does. Node counts whose data-parallel groups do not
    divide ``optim.train_batch_size`` cannot run the config and are skipped. More nodes shrink the ZeRO partitions
    and the per-GPU share of the batch; the vLLM weights and a micro-batch's activations stay."""
    for nodes in range(cluster.nodes, MAX_NODES + 1):
        try:
            p = plan(cfg, dataclasses.replace(cluster, nodes=nodes), arch, **kw)
        except ConfigError:  # the batch does not split over this many data-parallel groups
            continue
        if p["fits"]:
            return p
    return None


def fit_hint(cfg: Any, cluster: Cluster, arch: Arch, **kw: Any) -> str:
    """One sentence: the smallest node count that fits (:func:`smallest_fitting_nodes`) or that none up to
    :data:`MAX_NODES` does."""
    best = smallest_fitting_nodes(cfg, cluster, arch, **kw)
    per = f"{cluster.gpus_per_node} GPUs of {cluster.gpu_memory_gib:g} GiB"
    if best is None:
        return (f"it fits on no node count up to {MAX_NODES} (nodes of {per}): the limit does not shrink with more "
                "GPUs (e.g. the vLLM weights or one micro-batch's activations)")
    return (f"the smallest node count that fits: --nodes {best['cluster']['nodes']} (nodes of {per}; peak "
            f"{best['peak_gib']:.1f} GiB/GPU in phase {best['limiting_phase']})")


def check_fits(cfg: Any, cluster: Cluster, arch_file: str | None = None) -> dict[str, Any]:
    """The plan of ``cfg`` on ``cluster``; raises :class:`ConfigError` with :func:`plan_line` and :func:`fit_hint`
    if it does not fit."""
    arch = load_arch(cfg.model.path, arch_file)
    p = plan(cfg, cluster, arch)
    if not p["fits"]:
        raise ConfigError(f"stare-lab plan: {plan_line(p)}; {fit_hint(cfg, cluster, arch)}; or lower "
                          "optim.micro_batch_max_tokens, raise "
                          "rollout.tensor_parallel_size, set deepspeed.offload_during_rollout=true or use more GPUs "
                          "(STARE_LAB_SKIP_PLAN=1 launches anyway)")
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="trainer YAML config")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optim.micro_batch_max_tokens=8192")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU in GiB (default 80)")
    p.add_argument("--gpu-tflops", type=float, default=DEFAULT_GPU_TFLOPS,
                   help=f"peak dense bf16 TFLOP/s of one GPU (default {DEFAULT_GPU_TFLOPS:g}, an H100 SXM)")
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="utilisation of the trainer passes (default 0.35)")
    p.add_argument("--rollout-mfu", type=float, default=DEFAULT_ROLLOUT_MFU,
                   help="utilisation of generation (default 0.10)")
    p.add_argument("--arch", help="a config.json to take the architecture from (default: model.path, or papers/)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def main(args: argparse.Namespace) -> int:
    """``stare-lab plan``: exit 0 if the run fits, 1 if not (the plan is printed either way)."""
    from stare_lab.config import load_yaml
    from trainer.output import configure_output
    from trainer.config import load_trainer_config

    configure_output(verbose=bool(getattr(args, "verbose", False)))  # DeepSpeed's import-time notices off

    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    for name in ("gpu_memory_gib", "gpu_tflops"):
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be a number > 0")
    for name in ("mfu", "rollout_mfu"):
        if not 0 < getattr(args, name) <= 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be in (0, 1]")
    overrides = list(args.overrides or []) + list(getattr(args, "extra_overrides", None) or [])
    if not load_yaml(args.config):  # not the defaults of every key: a plan of nothing
        raise ConfigError(f"config file {str(args.config)!r} is empty (no keys): give a trainer config YAML, e.g. "
                          "papers/stare_2606.19236/configs/<setting>.yaml")
    cfg = load_trainer_config(args.config, overrides)
    if not str(cfg.model.path or "").strip() and not args.arch:
        raise ConfigError(f"{args.config}: model.path is not set: give the model's folder (model.path=DIR, with its "
                          "config.json) or the architecture (--arch config.json)")
    cluster = Cluster(args.nodes, args.gpus_per_node, args.gpu_memory_gib, args.gpu_tflops)
    arch = load_arch(cfg.model.path, args.arch)
    p = plan(cfg, cluster, arch, mfu=args.mfu, rollout_mfu=args.rollout_mfu)
    p["config"] = str(args.config)
    if not p["fits"]:
        best = smallest_fitting_nodes(cfg, cluster, arch, mfu=args.mfu, rollout_mfu=args.rollout_mfu)
        p["smallest_fitting_nodes"] = None if best is None else best["cluster"]["nodes"]
    text = json.dumps(p, indent=2) if args.json else format_plan(p)
    if not p["fits"] and not args.json:
        text += "\n" + fit_hint(cfg, cluster, arch, mfu=args.mfu, rollout_mfu=args.rollout_mfu)
    print(text)
    return 0 if p["fits"] else 1


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="python -m trainer.planning.plan")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
