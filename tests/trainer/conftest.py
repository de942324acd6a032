"""Shared fixtures of the trainer tests: a tiny random-init model and a GSM8K prompt file, built once per session."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from trainer.evaluation.benchmarks import GSM8K_TRAIN_SAMPLE as GSM8K  # bundled with the package (trainer/assets/)


def _require(*modules: str) -> None:
    """Skip when an optional dependency is missing — but fail in CI (env CI=true), never skip silently there."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        msg = f"missing trainer dependencies: {', '.join(missing)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def require():
    """``require("vllm", ...)``: skip when an optional dependency is missing — fail instead when CI=true."""
    return _require


@pytest.fixture(scope="session")
def gsm8k_digits(tmp_path_factory) -> Path:
    """GSM8K training records whose gold answer is a single digit (so that a random-init model sometimes gets a
    group with reward variance under the lenient last-number reward), 64 records."""
    if not GSM8K.is_file():
        pytest.fail(f"GSM8K data not found at {GSM8K}")
    out = tmp_path_factory.mktemp("data") / "gsm8k_digits.jsonl"
    rows = []
    with open(GSM8K, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["answer"].strip() in list("0123456789"):
                rows.append(line.strip())
            if len(rows) >= 64:
                break
    out.write_text("\n".join(rows) + "\n")
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    _require("transformers", "tokenizers")
    from trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, corpus_file=GSM8K)
