"""Runs logged by other frameworks' own loggers, read as run rows (docs/design.md §4): a table of readers.

Each reader recognises a file by its first record and turns it into a :class:`ForeignRun` — a config and one row per
step with the run format's keys — which :mod:`analysis.load` reads like a ``metrics.jsonl``. Readers:

* ``verl-file``: verl's ``file`` logger (``trainer.logger='["console","file"]'``; ``$VERL_FILE_LOGGER_ROOT/<project>/
  <experiment>.jsonl`` or ``$VERL_FILE_LOGGER_PATH``), one ``{"step": N, "data": {metric: value}}`` per log call.
  ``entropy`` ← ``stare/entropy`` (the STARE trainer's token-mean H̄), else verl's ``actor/entropy`` (the same
  token-mean under ``loss_agg_mode=token-mean``); ``reward`` ← ``critic/score/mean``; ``gate_on``, ``stare_w``,
  ``stare_m`` ← ``stare/gate_on``, ``stare/w``, ``stare/m`` (a run without them is plain GRPO: 0, 1, 1);
  ``time/step_s`` ← ``timing_s/step``; every other key is kept under its own (already namespaced) name. verl
  measures no one-step entropy change and makes no first-order prediction: both are null. A record without training
  metrics (``val_before_train``'s) is no step: it is kept in the config as ``validation_only_records``. The method
  is ``stare``
  when the log has STARE metrics, else ``grpo``; the run directory the STARE trainer writes
  (``<trainer.default_local_dir>/stare_run``) carries the full config and is read as a run directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)

__all__ = ["ForeignRun", "READERS", "SOURCES", "detect", "read_foreign", "find_foreign"]

#: ``config.source`` of runs written by the framework integrations (the plugins' run directories, these readers).
SOURCES = ("verl", "trl")


@dataclasses.dataclass
class ForeignRun:
    """A foreign log read as a run: ``config`` (with ``source``, ``method``, ``seed``), ``rows`` (run-format rows,
    each with ``step``), ``warnings`` (lines skipped)."""

    path: Path
    config: dict
    rows: list[dict]
    warnings: list[str]


def _first_record(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    return json.loads(line)
    except (OSError, ValueError):
        return None
    return None


def _is_verl_file_log(path: Path) -> bool:
    rec = _first_record(path) if path.suffix == ".jsonl" and path.name != "metrics.jsonl" else None
    return isinstance(rec, dict) and set(rec) == {"step", "data"} and isinstance(rec["data"], dict)


#: a record with none of these prefixes is a validation-only record (verl's validation before training), not a step
_TRAINING_PREFIXES = ("actor/", "stare/", "critic/", "timing_s/")

#: run-format key ← verl metric keys, first present wins; the value when none is present
_VERL_KEYS: dict[str, tuple[tuple[str, ...], Any]] = {
    "entropy": (("stare/entropy", "actor/entropy"), None),
    "reward": (("critic/score/mean",), None),
    "gate_on": (("stare/gate_on",), 0),
    "stare_w": (("stare/w",), 1.0),
    "stare_m": (("stare/m",), 1.0),
    "time/step_s": (("timing_s/step",), None),
}


def _read_verl_file_log(path: Path) -> ForeignRun:
    rows, warnings, validation, stare = [], [], [], False
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                warnings.append(f"{path}:{lineno}: not valid JSON (truncated write?); skipped")
                continue
            data = rec.get("data") if isinstance(rec, dict) else None
            if not isinstance(data, dict):
                warnings.append(f"{path}:{lineno}: not a verl file-logger record; skipped")
                continue
            if not any(k.startswith(_TRAINING_PREFIXES) for k in data):  # validation before training: no step
                validation.append({"step": rec.get("step"), **data})
                continue
            stare = stare or "stare/gate_on" in data
            row: dict[str, Any] = {"step": rec.get("step"), "pred_entropy_change": None, "entropy_change": None}
            row.update(data)
            for key, (sources, default) in _VERL_KEYS.items():
                row[key] = next((data[s] for s in sources if data.get(s) is not None), default)
            if row["gate_on"] is not None:
                row["gate_on"] = int(round(float(row["gate_on"])))
            rows.append(row)
    config = {"source": "verl", "method": "stare" if stare else "grpo", "seed": None,
              "logger": {"kind": "verl-file", "file": str(path)}, "validation_only_records": validation}
    return ForeignRun(path=path, config=config, rows=rows, warnings=warnings)


#: reader name → (recognises the file, reads it)
READERS: dict[str, tuple[Callable[[Path], bool], Callable[[Path], ForeignRun]]] = {
    "verl-file": (_is_verl_file_log, _read_verl_file_log),
}


def detect(path: str | os.PathLike) -> str | None:
    """The name of the reader that recognises the file ``path``, or None."""
    p = Path(path)
    if not p.is_file():
        return None
    return next((name for name, (recognises, _) in READERS.items() if recognises(p)), None)


def read_foreign(path: str | os.PathLike) -> ForeignRun:
    """Read a foreign log with the reader that recognises it.

    Raises:
        ValueError: no reader recognises ``path``.
    """
    name = detect(path)
    if name is None:
        raise ValueError(f"{str(path)!r} is not a log any reader recognises ({', '.join(READERS)})")
    return READERS[name][1](Path(path))


def find_foreign(root: str | os.PathLike) -> list[Path]:
    """The foreign logs at or below ``root`` (a file, or a folder searched recursively), sorted."""
    p = Path(root)
    if p.is_file():
        return [p] if detect(p) else []
    if not p.is_dir():
        return []
    return sorted(f for f in p.rglob("*.jsonl") if f.name != "metrics.jsonl" and detect(f))
