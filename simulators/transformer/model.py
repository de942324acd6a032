"""The small-transformer simulator's model: a ``transformers`` Qwen2 (or Llama) causal LM with tiny dimensions, its
KV-cache sampler and the response logits of a rollout batch (each group's shared prompt computed once)."""

from __future__ import annotations

import torch

from simulators.transformer.config import ModelConfig
from simulators.transformer.tasks import EOS, PAD, VOCAB_SIZE

__all__ = ["build_model", "sample_responses", "response_logits"]


def build_model(config: ModelConfig, seed: int) -> torch.nn.Module:
    """A random-init causal LM (fp32, eval mode: no dropout) for the task vocabulary; deterministic in ``seed``
    (the global torch RNG is forked, not disturbed)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if config.arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    hf_config = cfg_cls(
        vocab_size=VOCAB_SIZE,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=64,
        initializer_range=config.init_std,
        tie_word_embeddings=True,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(hf_config).float()
    return model.eval()


@torch.no_grad()
def sample_responses(
    model: torch.nn.Module, prompts: torch.Tensor, max_len: int, temperature: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample responses with a KV cache: ``(responses [B, max_len] long, response_mask [B, max_len] bool)``.

    Prompts ``[B, P]`` have equal lengths (no padding). Tokens are drawn from softmax(logits / temperature) with
    ``generator`` (deterministic); a sequence stops after its first ``EOS``; later slots hold ``PAD`` with mask 0.
    """
    b = prompts.shape[0]
    responses = torch.full((b, max_len), PAD, dtype=torch.long)
    mask = torch.zeros(b, max_len, dtype=torch.bool)
    done = torch.zeros(b, dtype=torch.bool)
    out, last = _prompt_forward(model, prompts)
    for t in range(max_len):
        probs = torch.softmax((last if t == 0 else out.logits[:, -1]).float() / temperature, dim=-1)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        responses[:, t] = tok
        mask[:, t] = ~done
        done = done | (tok == EOS)
        if bool(done.all()) or t == max_len - 1:
            break
        out = model(input_ids=tok[:, None], past_key_values=out.past_key_values, use_cache=True)
    return responses, mask


def _prompt_forward(model: torch.nn.Module, prompts: torch.Tensor, params=None):
    """Forward of the prompts with a KV cache, each *distinct run* of equal consecutive prompts computed once (a
    rollout batch repeats every prompt G times) and the cache then indexed out to the whole batch:
    ``(output with .past_key_values for all B rows, logits [B, V] at the last prompt position)``. Differentiable;
    ``params`` as in :func:`response_logits`."""
    uniq, inverse = torch.unique_consecutive(prompts, dim=0, return_inverse=True)
    kwargs = {"input_ids": uniq, "use_cache": True}
    out = model(**kwargs) if params is None else torch.func.functional_call(model, params, (), kwargs)
    if len(uniq) < len(prompts):
        out.past_key_values.batch_select_indices(inverse)
    return out, out.logits[:, -1][inverse]


def response_logits(model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor, params=None):
    """Logits ``[B, L, V]`` (float32) that predicted each response token (differentiable): a forward of the
    distinct prompts (:func:`_prompt_forward`, shared by a group's G responses) and one of the responses on its KV
    cache — the same numbers as a full forward of prompt + response, up to float rounding, at ~half the cost.
    ``params`` (name → tensor) evaluates the model at other parameters (``torch.func.functional_call``)."""
    out, first = _prompt_forward(model, prompts, params)
    if responses.shape[1] == 1:
        return first[:, None].float()
    kwargs = {"input_ids": responses[:, :-1], "past_key_values": out.past_key_values, "use_cache": True}
    rest = (model(**kwargs) if params is None else torch.func.functional_call(model, params, (), kwargs)).logits
    return torch.cat([first[:, None], rest], dim=1).float()
