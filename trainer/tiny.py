"""A tiny random-init Qwen2-style model and byte-level BPE tokenizer, built locally (never downloaded).

Used by the ``tiny-cpu`` preset, the CI tests and the benchmark. vLLM's CPU attention needs a head_dim in
{32, 64, 80, …} (16 is rejected: "Unsupported CPU attention configuration"), hence ``hidden_size=64`` with 2 heads
of 32.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["build_tiny_model", "TINY_CHAT_TEMPLATE"]

#: A small ChatML-like template (role tags + eos between turns; generation prompt opens the assistant turn).
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_SPECIAL = ["<|endoftext|>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]


def _corpus(gsm8k_file: str | Path | None, max_records: int) -> list[str]:
    texts = [
        "Please reason step by step, and put your final answer within \\boxed{}.",
        "The answer is \\boxed{42}. So 3 + 4 = 7 and 12 * 5 = 60.",
        "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) $ . , ?",
    ]
    if gsm8k_file is not None and Path(gsm8k_file).is_file():
        from trainer.data import DEFAULT_KEYS, load_records  # the trainer's reader: flat or verl records, file:line errors

        for rec in load_records([str(gsm8k_file)], *DEFAULT_KEYS, max_samples=max_records):
            prompt = rec["prompt"]
            text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
            texts.append(text + " " + rec["answer"])
    return texts


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    head_dim: int = 32,
    corpus_file: str | Path | None = None,
    corpus_records: int = 500,
    max_position_embeddings: int = 1024,
    num_kv_heads: int = 1,
) -> Path:
    """Build and save a random-init ``Qwen2ForCausalLM`` + ``PreTrainedTokenizerFast`` in ``out_dir``.

    The tokenizer is a byte-level BPE trained (deterministically) on a few fixed strings plus, if given, the first
    ``corpus_records`` records of a GSM8K-style JSONL (``problem``/``answer``); eos ``<|endoftext|>``, pad
    ``<pad>``, chat template :data:`TINY_CHAT_TEMPLATE`. Model: ``hidden_size`` with ``hidden_size // head_dim``
    query heads, ``num_kv_heads`` KV heads, tied embeddings, float32, weights from ``torch.manual_seed(seed)``.
    Tensor-parallel vLLM needs the query and KV heads divisible by the TP size (``num_kv_heads=2`` for TP 2).

    Args:
        out_dir: directory to write (created; existing files are overwritten).
        seed: initialisation seed (same seed ⇒ identical weights).
        vocab_size: target BPE vocabulary size (the trained tokenizer may be smaller; the model uses its length).
        head_dim: 32 or more for vLLM-CPU.
        num_kv_heads: KV heads (divides the query heads).

    Returns:
        ``Path(out_dir)``.

    Raises:
        ValueError: if ``hidden_size`` is not a multiple of ``head_dim``, or ``num_kv_heads`` does not divide the
            query heads.
        DataError: a line of ``corpus_file`` among the first ``corpus_records`` is not a JSON object.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % head_dim:
        raise ValueError(f"hidden_size={hidden_size} must be a multiple of head_dim={head_dim}")
    if (hidden_size // head_dim) % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} must divide the {hidden_size // head_dim} query heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(corpus_file, corpus_records), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>", bos_token=None, unk_token=None
    )
    hf_tok.chat_template = TINY_CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    n_vocab = len(hf_tok)
    cfg = Qwen2Config(
        vocab_size=n_vocab,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // head_dim,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=hf_tok.eos_token_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    logger.info("tiny model (%d params, vocab %d) saved to %s", model.num_parameters(), n_vocab, out)
    return out
