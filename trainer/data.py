"""Training prompts: reading JSONL/Parquet records, prompt templating + chat templates, truncation, and a
deterministic, resumable data cursor.

Two record layouts load with no extra option, detected from the columns of each file:

- flat records (``problem`` / ``answer``, or the fields ``data.prompt_key`` / ``data.answer_key`` name);
- verl's RL dataset format (as written by verl's ``examples/data_preprocess`` scripts, e.g. DAPO-Math-17k):
  ``prompt`` is a chat list ``[{"role": "user", "content": ...}, ...]``, the gold answer is
  ``reward_model.ground_truth``, plus ``data_source``, ``ability`` and ``extra_info``. With the default keys such a
  file is read with ``prompt`` and ``reward_model.ground_truth``; ``data_source`` and ``extra_info`` are kept in the
  record.

Keys may be dotted paths into nested fields (``data.answer_key=reward_model.ground_truth``); a column whose name
itself contains the dots (a flattened table) is found first. A chat-list prompt is used as the conversation as is
(it carries its own instruction, as verl feeds it): ``data.prompt_template`` applies to string prompts only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from stare_lab.errors import DataError

logger = logging.getLogger(__name__)

__all__ = ["load_records", "PromptEncoder", "DataCursor", "EncodedPrompt", "get_field", "detect_keys", "is_chat"]


def _read_file(path: str) -> list[dict]:
    if path.startswith("hf:"):
        try:
            import datasets
        except ImportError as err:  # pragma: no cover - datasets is a trainer extra
            raise DataError(f"{path}: reading a datasets dataset needs the `datasets` package") from err
        _, name, split = (path.split(":", 2) + ["train"])[:3]
        return [dict(r) for r in datasets.load_dataset(name, split=split)]
    from stare_lab.platform.files import check_file, iter_jsonl

    if Path(path).suffix == ".parquet":
        p = check_file(path, "data file", DataError)
        with open(p, "rb") as fh:
            magic = fh.read(4)
        if magic != b"PAR1":
            raise DataError(f"data file {path!r} is not a Parquet file (it does not start with PAR1)")
        try:
            import pyarrow.parquet as pq
        except ImportError as err:  # pragma: no cover
            raise DataError(f"{path}: reading Parquet needs pyarrow") from err
        try:
            return pq.read_table(p).to_pylist()
        except Exception as err:  # noqa: BLE001 - pyarrow's many error types: one line naming the file
            raise DataError(f"data file {path!r} is not a readable Parquet file: {err}") from None
    records = []
    for lineno, rec in iter_jsonl(path, "data file", DataError):  # UTF-8, JSON objects, file:line errors
        rec["_where"] = f"{path}:{lineno}"
        records.append(rec)
    return records


#: The default ``data.prompt_key`` / ``data.answer_key`` (flat records), and verl's RL-format fields.
DEFAULT_KEYS = ("problem", "answer")
VERL_KEYS = ("prompt", "reward_model.ground_truth")
_MISSING = object()


def get_field(record: dict[str, Any], key: str) -> Any:
    """``record[key]``, or the nested value at the dotted path ``key`` (``"reward_model.ground_truth"``); a
    literal key holding the dots wins. Returns a sentinel (``_MISSING``) when absent or ``None``."""
    if key in record:
        return _MISSING if record[key] is None else record[key]
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return _MISSING
        node = node[part]
    return node


def is_chat(value: Any) -> bool:
    """A chat list: a non-empty list of ``{"role": str, "content": str}`` mappings."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))


def detect_keys(record: dict[str, Any], prompt_key: str, answer_key: str) -> tuple[str, str, str]:
    """The (prompt key, answer key, layout) to read a file whose first record is ``record``: the configured keys,
    except that a verl-format record (chat-list ``prompt`` and ``reward_model.ground_truth``) read with the
    default keys uses verl's (``layout`` is ``"verl"`` then, else ``"flat"``)."""
    verl = is_chat(record.get("prompt")) and get_field(record, "reward_model.ground_truth") is not _MISSING
    if verl and (prompt_key, answer_key) == DEFAULT_KEYS and get_field(record, prompt_key) is _MISSING:
        return (*VERL_KEYS, "verl")
    return prompt_key, answer_key, "verl" if verl else "flat"


def _answer_text(value: Any) -> str:
    """The gold answer as a string (a one-element list, as some verl datasets store it, gives its element)."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return str(value)


def load_records(
    files: Sequence[str], prompt_key: str, answer_key: str, max_samples: int | None = None,
    answer_pattern: str | None = None,
) -> list[dict[str, Any]]:
    """Read the records of ``files`` (JSONL, ``.parquet``, or ``hf:NAME:SPLIT``) as ``{"prompt", "answer", "id",
    ...}``: ``prompt`` a string or a chat list (verl format), ``answer`` a string; ``data_source`` and
    ``extra_info`` are carried over when present. Keys may be dotted paths; verl's format is detected per file
    (module docstring).

    ``answer_pattern`` (a regular expression, ``data.answer_pattern``) keeps only records whose stripped answer
    fully matches it; ``max_samples`` counts the kept records.

    Raises:
        DataError: no files, a missing/unreadable file, a line that is not valid JSON or not an object (naming
            file:line), a record lacking the prompt or answer field (naming file:line and the fields it has), a
            prompt that is neither a string nor a chat list, or no (matching) records at all.
    """
    import re

    if not files:
        raise DataError("no training data files given (data.train_files is empty)")
    pattern = re.compile(answer_pattern) if answer_pattern is not None else None
    out: list[dict[str, Any]] = []
    n_read = 0
    for f in files:
        keys = None
        for i, rec in enumerate(_read_file(f)):
            where = rec.pop("_where", f"{f}[{i}]")
            if keys is None:
                keys = detect_keys(rec, prompt_key, answer_key)
                if keys[2] == "verl":
                    logger.info("%s: verl RL format (prompt key %r, answer key %r)", f, keys[0], keys[1])
            values = []
            for key in keys[:2]:
                v = get_field(rec, key)
                if v is _MISSING:
                    fields = ", ".join(sorted(rec)) or "none"
                    raise DataError(f"{where}: record has no field {key!r} (fields: {fields})")
                values.append(v)
            prompt, answer = values[0], _answer_text(values[1])
            if not isinstance(prompt, str) and not is_chat(prompt):
                raise DataError(f"{where}: field {keys[0]!r} must be a string or a chat list of "
                                f"{{role, content}} messages, got {type(prompt).__name__}")
            n_read += 1
            if pattern is not None and not pattern.fullmatch(answer.strip()):
                continue
            item = {"prompt": prompt, "answer": answer, "id": rec.get("id", where)}
            for extra in ("data_source", "extra_info"):
                if rec.get(extra) is not None:
                    item[extra] = rec[extra]
            out.append(item)
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
    """Record → prompt token ids. A string prompt becomes the user message ``prompt_template.format(problem=...)``;
    a chat-list prompt (verl format) is the conversation as is. Then the tokenizer's chat template (with the
    generation prompt) if ``use_chat_template`` — without one, the messages' contents joined by newlines are the
    plain-text prompt — then truncation to ``max_prompt_length`` (``left`` keeps the end, ``right`` the start;
    ``error`` raises). Truncations are counted in :attr:`n_truncated` (the trainer logs them per step as
    ``prompts_truncated``) and logged once at WARNING, then at DEBUG.

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

    def messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        """The conversation of ``record`` (see the class docstring)."""
        prompt = record["prompt"]
        if isinstance(prompt, list):
            return [{"role": m["role"], "content": m["content"]} for m in prompt]
        return [{"role": "user", "content": self.template.format(problem=prompt)}]

    def encode(self, record: dict[str, Any], index: int) -> EncodedPrompt:
        msgs = self.messages(record)
        if self.use_chat_template:
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                     return_dict=False)
        else:
            ids = self.tokenizer("\n".join(m["content"] for m in msgs), add_special_tokens=True)["input_ids"]
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
            logger.log(logging.WARNING if self.n_truncated == 1 else logging.DEBUG,
                       "record %r: prompt of %d tokens truncated (%s) to data.max_prompt_length=%d%s",
                       record.get("id"), len(ids), self.truncation, self.max_len,
                       " (further truncations are counted in prompts_truncated)" if self.n_truncated == 1 else "")
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
