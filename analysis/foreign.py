"""Readers of the logs other training frameworks write, so their runs sit in the same figures and verdict as
stare_lab's own (docs/integrations.md). A reader turns one foreign run folder into a :class:`stare_lab.runs.Run`
whose rows carry the run-row keys of docs/design.md §4 (``step``, ``entropy``, ``reward``, ``gate_on``,
``stare_w``, ``stare_m``, ``pred_entropy_change``, ``entropy_change``; None where the log has no such value) plus
the log's other keys, namespaced.

:data:`READERS` is the table :mod:`analysis.load` consults (name → :class:`ForeignReader`): a folder that is not a
stare_lab run directory is read by the first reader that claims it. A folder holding a stare_lab run directory
at or below it (e.g. the ``stare_run/`` that ``STAREGRPOTrainer`` writes) is left to that richer record.

* ``trl``: a TRL output folder — ``trainer_state.json``'s ``log_history`` (the folder's own file, else that of its
  latest ``checkpoint-N/``). Mapped: ``entropy`` → ``entropy``, ``reward`` → ``reward``, ``stare/gate_on`` →
  ``gate_on``, ``stare/w`` → ``stare_w``, ``stare/m`` → ``stare_m``, ``step_time`` → ``time/step_s``, ``loss`` →
  ``loss/total``; keys with a ``/`` keep their name (``stare/…``, ``quadrant/…``, ``clip_ratio/…``,
  ``rewards/…``, ``completions/…``); other plain keys go under ``trl/``; an evaluation entry's ``eval_<key>``
  joins its step's row as ``eval/<key>``. TRL's ``entropy`` is the token-mean entropy of the policy the step's
  loss saw (before its update, on-policy).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from stare_lab.runs import REQUIRED_KEYS, Run, find_runs, is_run_dir

logger = logging.getLogger(__name__)

__all__ = ["ForeignReader", "READERS", "find_foreign_runs", "read_foreign_run"]

_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_SEED_RE = re.compile(r"seed[_-]?(\d+)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ForeignReader:
    """One framework's log reader.

    Attributes:
        name: the framework (recorded as ``config.framework``).
        claims: whether a folder is one run of this framework (no recursion).
        candidates: the folders at or below a root that may be runs (cheap: e.g. parents of a log file name).
        read: the folder → a :class:`~stare_lab.runs.Run` (warnings in ``Run.warnings``; never raises for damage).
    """

    name: str
    claims: Callable[[Path], bool]
    candidates: Callable[[Path], Iterable[Path]]
    read: Callable[[Path], Run]


# ----------------------------------------------------------------------------------------------------------------
# TRL
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
    config = {"source": "trainer", "framework": "trl", "method": method,
              "seed": int(seed.group(1)) if seed else None, "log": str(state_path)}
    if not metrics:
        warnings.append(f"{state_path}: no training log entries")
    return Run(path=folder, config=config, metrics=metrics, summary=None, warnings=warnings)


#: name → reader, consulted in order.
READERS: dict[str, ForeignReader] = {"trl": ForeignReader("trl", _trl_claims, _trl_candidates, _trl_read)}


def find_foreign_runs(roots: Iterable[str | Path]) -> list[Path]:
    """Folders at or below ``roots`` that a reader claims and that hold no stare_lab run directory (sorted)."""
    found: set[Path] = set()
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for reader in READERS.values():
            found.update(f for f in set(reader.candidates(root)) if reader.claims(f) and not find_runs([f]))
    return sorted(found)


def read_foreign_run(path: str | Path) -> Run | None:
    """The run a reader makes of folder ``path``; None if it is a stare_lab run directory or no reader claims it."""
    folder = Path(path)
    if is_run_dir(folder) or not folder.is_dir():
        return None
    for reader in READERS.values():
        if reader.claims(folder):
            run = reader.read(folder)
            for w in run.warnings:
                logger.warning(w)
            return run
    return None
