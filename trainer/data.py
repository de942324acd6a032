"""Training prompts: reading JSONL/Parquet records, prompt templating + chat templates, truncation, and a
deterministic, resumable data cursor.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from stare_lab.errors import DataError

logger = logging.getLogger(__name__)

__all__ = ["load_records", "PromptEncoder", "DataCursor", "EncodedPrompt"]


def _read_file(path: str) -> list[dict]:
    if path.startswith("hf:"):
        try:
            import datasets
        except ImportError as err:  # pragma: no cover - datasets is a trainer extra
            raise DataError(f"{path}: reading a datasets dataset needs the `datasets` package") from err
        _, name, split = (path.split(":", 2) + ["train"])[:3]
        return [dict(r) for r in datasets.load_dataset(name, split=split)]
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {path!r} does not exist")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:  # pragma: no cover
            raise DataError(f"{path}: reading Parquet needs pyarrow") from err
        return pq.read_table(p).to_pylist()
    records = []
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{lineno}: a record must be a JSON object, got {type(rec).__name__}")
            rec["_where"] = f"{path}:{lineno}"
            records.append(rec)
    return records


def load_records(
    files: Sequence[str], prompt_key: str, answer_key: str, max_samples: int | None = None,
    answer_pattern: str | None = None,
) -> list[dict[str, Any]]:
    """Read the records of ``files`` (JSONL, ``.parquet``, or ``hf:NAME:SPLIT``) as ``{"prompt", "answer", ...}``.

    ``answer_pattern`` (a regular expression, ``data.answer_pattern``) keeps only records whose stripped answer
    fully matches it; ``max_samples`` counts the kept records.

    Raises:
        DataError: no files, a missing/unreadable file, a line that is not valid JSON or not an object (naming
            file:line), a record lacking ``prompt_key`` or ``answer_key`` (naming file:line and the fields it has),
            or no (matching) records at all.
    """
    import re

    if not files:
        raise DataError("no training data files given (data.train_files is empty)")
    pattern = re.compile(answer_pattern) if answer_pattern is not None else None
    out: list[dict[str, Any]] = []
    n_read = 0
    for f in files:
        for i, rec in enumerate(_read_file(f)):
            where = rec.pop("_where", f"{f}[{i}]")
            for key in (prompt_key, answer_key):
                if key not in rec or rec[key] is None:
                    fields = ", ".join(sorted(rec)) or "none"
                    raise DataError(f"{where}: record has no field {key!r} (fields: {fields})")
            n_read += 1
            if pattern is not None and not pattern.fullmatch(str(rec[answer_key]).strip()):
                continue
            out.append({"prompt": str(rec[prompt_key]), "answer": str(rec[answer_key]), "id": rec.get("id", where)})
            if max_samples is not None and len(out) >= max_samples:
                return out
    if not out:
        if pattern is not None and n_read:
            raise DataError(f"none of the {n_read} records in {', '.join(files)} has an answer matching "
                            f"data.answer_pattern={answer_pattern!r}")
        raise DataError(f"no records in {', '.join(files)}")
    return out


@dataclass
class EncodedPrompt:
    """A tokenized prompt: ``token_ids``, the ``answer`` it is graded against, and whether it was truncated."""

    token_ids: list[int]
    answer: str
    truncated: bool
    index: int


class PromptEncoder:
    """Record → prompt token ids: ``prompt_template.format(problem=...)``, then the tokenizer's chat template (as
    one user message with the generation prompt) if ``use_chat_template``, then truncation to
    ``max_prompt_length`` (``left`` keeps the end, ``right`` the start; ``error`` raises).

    Raises (from :meth:`encode`):
        DataError: a prompt longer than ``max_prompt_length`` with ``truncation="error"``, or an empty prompt.
    """

    def __init__(self, tokenizer: Any, template: str, use_chat_template: bool, max_prompt_length: int,
                 truncation: str) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.use_chat_template = use_chat_template and getattr(tokenizer, "chat_template", None) is not None
        if use_chat_template and not self.use_chat_template:
            logger.warning("tokenizer has no chat template; prompts are used as plain text")
        self.max_len = max_prompt_length
        self.truncation = truncation
        self.n_truncated = 0

    def encode(self, record: dict[str, Any], index: int) -> EncodedPrompt:
        text = self.template.format(problem=record["prompt"])
        if self.use_chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        ids = list(ids)
        if not ids:
            raise DataError(f"record {record.get('id')!r}: empty prompt after tokenization")
        truncated = len(ids) > self.max_len
        if truncated:
            if self.truncation == "error":
                raise DataError(
                    f"record {record.get('id')!r}: prompt has {len(ids)} tokens > data.max_prompt_length="
                    f"{self.max_len} (data.truncation=error; use left or right to truncate)"
                )
            self.n_truncated += 1
            logger.warning("record %r: prompt of %d tokens truncated (%s) to %d", record.get("id"), len(ids),
                           self.truncation, self.max_len)
            ids = ids[-self.max_len:] if self.truncation == "left" else ids[: self.max_len]
        return EncodedPrompt(token_ids=ids, answer=record["answer"], truncated=truncated, index=index)


class DataCursor:
    """Deterministic, resumable order over ``n`` records: epoch ``e`` is a permutation drawn from
    ``numpy.random.default_rng([seed, e])`` (or the identity without shuffle); :meth:`take` returns the next ``k``
    indices, wrapping into the next epoch. ``state_dict()`` = ``{"epoch", "pos"}``.
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True) -> None:
        if n <= 0:
            raise DataError("the dataset is empty")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._perm(0)

    def _perm(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        """The next ``k`` record indices (the same for every rank; callers shard them)."""
        out: list[int] = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch += 1
                self.pos = 0
                self._order = self._perm(self.epoch)
            m = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in self._order[self.pos: self.pos + m])
            self.pos += m
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm(self.epoch)
