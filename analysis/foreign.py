"""Readers of the logs other training frameworks write, so their runs sit in the same figures and verdict as
stare_lab's own (docs/integrations.md, docs/integrations-verl.md). A reader turns one foreign run — a folder or a log
file — into a :class:`stare_lab.platform.runs.Run` whose rows carry the run-row keys of docs/design.md §4 (``step``,
``entropy``, ``reward``, ``gate_on``, ``stare_w``, ``stare_m``, ``pred_entropy_change``, ``entropy_change``; None
where the log has no such value) plus the log's other keys, namespaced.

:data:`READERS` is the table :mod:`analysis.load` consults (name → :class:`ForeignReader`): a path that is not a
stare_lab run directory is read by the first reader that claims it. A folder holding a stare_lab run directory at or
below it (the ``stare_run/`` that the TRL and verl integrations write) is left to that richer record.

* ``trl``: a TRL output folder — ``trainer_state.json``'s ``log_history`` (the folder's own file, else that of its
  latest ``checkpoint-N/``). Mapped: ``entropy`` → ``entropy``, ``reward`` → ``reward``, ``stare/gate_on`` →
  ``gate_on``, ``stare/w`` → ``stare_w``, ``stare/m`` → ``stare_m``, ``step_time`` → ``time/step_s``, ``loss`` →
  ``loss/total``; keys with a ``/`` keep their name (``stare/…``, ``quadrant/…``, ``clip_ratio/…``,
  ``rewards/…``, ``completions/…``); other plain keys go under ``trl/``; an evaluation entry's ``eval_<key>``
  joins its step's row as ``eval/<key>``. TRL's ``entropy`` is the token-mean entropy of the policy the step's
  loss saw (before its update, on-policy).
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
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from stare_lab.platform.runs import REQUIRED_KEYS, Run, find_runs, is_run_dir

logger = logging.getLogger(__name__)

__all__ = ["ForeignReader", "READERS", "SOURCES", "find_foreign_runs", "read_foreign_run"]

#: ``config.source`` of runs written by the framework integrations and read by these readers.
SOURCES = ("trl", "verl")

_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_SEED_RE = re.compile(r"seed[_-]?(\d+)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ForeignReader:
    """One framework's log reader.

    Attributes:
        name: the reader (``trl``, ``verl-file``).
        claims: whether a path (a folder or a file) is one run of this framework (no recursion).
        candidates: the paths at or below a root folder that may be runs (cheap: e.g. by file name).
        read: the path → a :class:`~stare_lab.platform.runs.Run` (warnings in ``Run.warnings``; never raises for damage).
    """

    name: str
    claims: Callable[[Path], bool]
    candidates: Callable[[Path], Iterable[Path]]
    read: Callable[[Path], Run]


# ----------------------------------------------------------------------------------------------------------------
# TRL: trainer_state.json's log_history
# ----------------------------------------------------------------------------------------------------------------

_TRL_KEYS = {"entropy": "entropy", "reward": "reward", "stare/gate_on": "gate_on", "stare/w": "stare_w",
             "stare/m": "stare_m", "step_time": "time/step_s", "loss": "loss/total"}
_TRL_SKIP = {"step", "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
             "total_flos"}


def _trl_state(folder: Path) -> Path | None:
    """The ``trainer_state.json`` that covers the most steps: the folder's own, else the latest checkpoint's."""
    own = folder / "trainer_state.json"
    if own.is_file():
        return own
    checkpoints = [(int(m.group(1)), p) for p in folder.glob("checkpoint-*")
                   if (m := _CHECKPOINT.search(p.name)) and (p / "trainer_state.json").is_file()]
    return max(checkpoints)[1] / "trainer_state.json" if checkpoints else None


def _trl_claims(folder: Path) -> bool:
    return not _CHECKPOINT.search(folder.name) and _trl_state(folder) is not None


def _trl_candidates(root: Path) -> Iterable[Path]:
    for state in root.rglob("trainer_state.json"):
        yield state.parent.parent if _CHECKPOINT.search(state.parent.name) else state.parent


def _trl_row(entry: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in entry.items():
        if key in _TRL_SKIP:
            continue
        row[_TRL_KEYS.get(key, key if "/" in key else f"trl/{key}")] = value
    return row


def _trl_read(folder: Path) -> Run:
    warnings: list[str] = []
    state_path = _trl_state(folder)
    rows: dict[int, dict[str, Any]] = {}
    try:
        history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", [])  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError) as err:
        warnings.append(f"{state_path}: unreadable ({err}); no rows")
        history = []
    if not isinstance(history, list):
        warnings.append(f"{state_path}: log_history is not a list; no rows")
        history = []
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        step = entry["step"]
        if any(k.startswith("eval_") for k in entry):
            rows.setdefault(step, {}).update({f"eval/{k[5:]}": v for k, v in entry.items() if k.startswith("eval_")})
        elif not _TRL_SKIP.intersection(entry) - {"step"}:
            rows.setdefault(step, {}).update(_trl_row(entry))
    metrics = []
    for step in sorted(rows):
        row = {"step": step, **dict.fromkeys(REQUIRED_KEYS[1:]), **rows[step]}
        metrics.append(row)
    seed = _SEED_RE.search(folder.name)
    method = folder.parent.name if seed and folder.parent.name else folder.name
    config = {"source": "trl", "framework": "trl", "method": method,
              "seed": int(seed.group(1)) if seed else None, "log": str(state_path)}
    if not metrics:
        warnings.append(f"{state_path}: no training log entries")
    return Run(path=folder, config=config, metrics=metrics, summary=None, warnings=warnings)


# ----------------------------------------------------------------------------------------------------------------
# verl: the file logger
# ----------------------------------------------------------------------------------------------------------------

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


def _verl_read(path: Path) -> Run:
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
    return Run(path=path, config=config, metrics=rows, summary=None, warnings=warnings)


def _verl_claims(path: Path) -> bool:
    return path.is_file() and _is_verl_file_log(path)


def _verl_candidates(root: Path) -> Iterable[Path]:
    return (f for f in root.rglob("*.jsonl") if f.name != "metrics.jsonl")


#: name → reader, consulted in order.
READERS: dict[str, ForeignReader] = {
    "trl": ForeignReader("trl", _trl_claims, _trl_candidates, _trl_read),
    "verl-file": ForeignReader("verl-file", _verl_claims, _verl_candidates, _verl_read),
}


def find_foreign_runs(roots: Iterable[str | Path]) -> list[Path]:
    """Paths at or below ``roots`` (folders, or log files themselves) that a reader claims, that hold no stare_lab
    run directory and are not inside one (sorted)."""
    found: set[Path] = set()
    for root in map(Path, roots):
        if root.is_file():
            found.update(root for reader in READERS.values() if reader.claims(root))
            continue
        if not root.is_dir():
            continue
        for reader in READERS.values():
            found.update(f for f in set(reader.candidates(root)) if not _inside_run(f, root)
                         and reader.claims(f) and (f.is_file() or not find_runs([f])))
    return sorted(found)


def _inside_run(path: Path, root: Path) -> bool:
    """True when a folder between ``path`` and ``root`` (both included) is a stare_lab run directory: its
    checkpoints and side files (e.g. ``checkpoint/step_N/trainer_state.json``) are no framework's log."""
    for folder in (path, *path.parents):
        if is_run_dir(folder):
            return True
        if folder == root:
            return False
    return False


def read_foreign_run(path: str | Path) -> Run | None:
    """The run a reader makes of ``path`` (a folder or a log file); None if it is a stare_lab run directory or no
    reader claims it."""
    p = Path(path)
    if not p.exists() or (p.is_dir() and is_run_dir(p)):
        return None
    for reader in READERS.values():
        if reader.claims(p):
            run = reader.read(p)
            for w in run.warnings:
                logger.warning(w)
            return run
    return None
