"""Reading run directories into numpy columns (docs/design.md §4; conventions in :mod:`stare_lab.platform.runs`).

Analysis reads run directories only: :func:`load_runs` finds them (recursively, via
:func:`stare_lab.platform.runs.find_runs`), reads each with :func:`stare_lab.platform.runs.read_run` and turns ``metrics.jsonl`` into
one float64 column per key, indexed by ``step``; other frameworks' logs (a TRL output folder) are read into the same
form by the readers of :mod:`analysis.foreign`. Damage is tolerated and reported, never fatal: a truncated last
line, null/NaN values, missing keys, duplicate or missing steps, a missing ``config.yaml``, a folder without runs —
each gives a warning (logged, and kept in :attr:`RunData.warnings` or the caller's ``warnings`` list).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from stare_lab.theory.critical import KEY_D_GRPO, KEY_D_LMINUS, KEY_D_LPLUS, KEY_D_RATIO, KEY_LPLUS_ABOVE, KEY_W_STAR
from stare_lab.errors import RunError
from stare_lab.platform.evidence import check_run
from stare_lab.platform.runs import find_runs, read_run

from .foreign import SOURCES as FOREIGN_SOURCES
from .foreign import READERS, find_foreign_runs, read_foreign_run

logger = logging.getLogger(__name__)

__all__ = ["RunData", "load_run", "load_runs", "config_get", "EVAL_FILE"]

#: Written next to ``metrics.jsonl`` by ``stare-lab evaluate``.
EVAL_FILE = "eval.json"

#: first-order decomposition terms and the calibration observables derived from them (stare_lab.theory.critical): parts
#: of a step's change, ratios and shares, not predictions of it
_DECOMPOSITION_KEYS = (KEY_D_GRPO, KEY_D_LPLUS, KEY_D_LMINUS, KEY_D_RATIO, KEY_LPLUS_ABOVE, KEY_W_STAR)

_SEED_RE = re.compile(r"seed[_-]?(\d+)$", re.IGNORECASE)


def _calibration_fit_run(run_dir: Path, root: Path) -> bool:
    """Whether ``run_dir`` is a fit run of a calibration strictly below ``root`` (in ``fit/`` of a folder holding
    ``calibration.json``); a ``root`` at or inside that ``fit/`` keeps them."""
    for parent in run_dir.parents:
        if parent == root:
            return False
        if parent.name == "fit" and (parent.parent / "calibration.json").is_file():
            return True
    return False


def config_get(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``config_get({"a": {"b": 1}}, "a.b") == 1``; ``default`` if any part of the dotted path is missing."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _find_key(node: Any, key: str, depth: int = 0) -> Any:
    """First value stored under ``key`` anywhere in a nested mapping (breadth-first by level, depth ≤ 6)."""
    if not isinstance(node, Mapping) or depth > 6:
        return None
    if key in node:
        return node[key]
    for value in node.values():
        found = _find_key(value, key, depth + 1)
        if found is not None:
            return found
    return None


def _as_target(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def _to_float_column(values: list[Any]) -> np.ndarray | None:
    """Values → float64 array; None/NaN/±inf/non-numbers → NaN; bools → 0/1. ``None`` if nothing is numeric."""
    try:
        arr = np.array(values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError
        if any(isinstance(v, str) for v in values):  # numpy parses "1.5"; a string metric is not a number
            raise ValueError
    except (TypeError, ValueError):
        arr = np.array(
            [float(v) if isinstance(v, (int, float)) else np.nan for v in values], dtype=np.float64
        )
    arr[~np.isfinite(arr)] = np.nan
    if not np.isfinite(arr).any():
        return None
    return arr


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclasses.dataclass
class RunData:
    """One run directory as numpy columns.

    Attributes:
        path: the run directory.
        config: ``config.yaml`` as a dict (``{}`` if missing).
        summary: ``summary.json`` as a dict, or None.
        eval: ``eval.json`` (from ``stare-lab evaluate``) as a dict, or None.
        method: ``config.method``; else inferred from the directory (``<method>/seed<k>``) with a warning.
        source: ``config.source`` (``"simulator"`` | ``"trainer"`` | a framework of :data:`analysis.foreign.SOURCES`),
            else ``"unknown"``.
        seed: ``config.seed``, else parsed from a ``seed<k>`` directory name, else None.
        target_entropy: H_tgt in nats from ``loss.stare.target_entropy`` (else a ``target_entropy`` key anywhere
            in the config), or None: then no target band is drawn for this run.
        steps: ``[S]`` int64, sorted, unique training steps.
        columns: key → ``[S]`` float64 values aligned with ``steps``; NaN where a row lacked the key or held
            null/NaN/±inf/a non-number. Keys with no numeric value at all are left out.
        warnings: what was skipped or assumed while reading.
        problems: why the run is not sound evidence (:func:`stare_lab.platform.evidence.check_run`: damaged metrics,
            unfinished against its config or its sweep, a ``summary.json`` its rows do not reproduce, an unreadable
            config); empty for a sound run. Such a run is drawn but left out of the verdict's counts.
    """

    path: Path
    config: dict
    summary: dict | None
    eval: dict | None
    method: str
    source: str
    seed: int | None
    target_entropy: float | None
    steps: np.ndarray
    columns: dict[str, np.ndarray]
    warnings: list[str]
    problems: tuple[str, ...] = ()

    @property
    def n_steps(self) -> int:
        """Number of (unique, valid) steps."""
        return int(self.steps.size)

    def column(self, key: str) -> np.ndarray:
        """``[S]`` float64 values of ``key`` (all NaN if the run never logged it as a number)."""
        col = self.columns.get(key)
        if col is None:
            return np.full(self.steps.shape, np.nan)
        return col

    def has(self, key: str) -> bool:
        """True if ``key`` has at least one finite value."""
        col = self.columns.get(key)
        return col is not None and bool(np.isfinite(col).any())

    def config_value(self, dotted: str, default: Any = None) -> Any:
        """A config value by dotted key (e.g. ``loss.stare.reweight_w``), ``default`` if absent."""
        return config_get(self.config, dotted, default)

    def predictor_keys(self) -> list[str]:
        """Keys of the first-order ΔH predictors this run logs: ``pred_entropy_change`` then each ``pred/<name>``
        (runs.py conventions) except the decomposition terms ``pred/d_grpo``, ``pred/d_lplus``, ``pred/d_lminus`` of
        :mod:`stare_lab.theory.critical` (parts of a step's change, not predictions of it) and the calibration
        observables ``pred/d_ratio``, ``pred/lplus_above_sstar``, ``pred/w_star``, only those with at least one
        finite value."""
        keys = ["pred_entropy_change"] + sorted(
            k for k in self.columns if k.startswith("pred/") and k not in _DECOMPOSITION_KEYS
        )
        return [k for k in keys if self.has(k)]

    def __repr__(self) -> str:  # the default would print every column
        return (
            f"RunData(path={str(self.path)!r}, method={self.method!r}, source={self.source!r}, seed={self.seed}, "
            f"steps={self.n_steps}, keys={len(self.columns)})"
        )


def _read_eval(path: Path, warnings: list[str]) -> dict | None:
    p = path / EVAL_FILE
    if not p.is_file():
        return None
    try:
        loaded = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        warnings.append(f"{p}: unreadable ({err}); ignored")
        return None
    if not isinstance(loaded, dict):
        warnings.append(f"{p}: not a JSON object; ignored")
        return None
    return loaded


def load_run(path: str | os.PathLike) -> RunData:
    """Read one run directory (or a folder an :mod:`analysis.foreign` reader claims) into a :class:`RunData`.

    Rows without a finite integer ``step`` are dropped; duplicate steps keep the last row (a resumed run that was
    not truncated); rows are sorted by step. Each such repair adds a warning.

    ``path`` may also be a file another framework's logger wrote (:mod:`analysis.foreign`, e.g. verl's file logger).

    Raises:
        RunError: if ``path`` is not a run directory (no ``metrics.jsonl``) nor a recognised foreign log, or holds no
            row with a valid step.
    """
    run = read_foreign_run(path)
    logged = 0 if run is None else len(run.warnings)  # a foreign reader logs its own warnings
    if run is None:
        if Path(path).is_file():
            raise RunError(f"{str(path)!r} is not a log any reader recognises (analysis.foreign: {', '.join(READERS)})")
        run = read_run(path, log=False)  # raises RunError for a non-run directory; its warnings are logged below
    evidence = check_run(run)  # the one evidence check (stare_lab.platform.evidence)
    if not run.metrics:
        raise RunError(evidence.reason())
    warnings = list(run.warnings)
    config = run.config if isinstance(run.config, dict) else {}
    data = _run_data(run.path, config, run.metrics, run.summary, warnings, logged)
    data.problems = evidence.problems
    return data


def _run_data(p: Path, config: dict, rows: list[dict], summary: dict | None, warnings: list[str],
              logged: int) -> RunData:
    """A :class:`RunData` from a run's config and rows (``warnings[:logged]`` were logged by the reader)."""
    method = config.get("method")
    if not isinstance(method, str) or not method:
        method = p.parent.name if _SEED_RE.search(p.name) and p.parent.name else p.name
        warnings.append(f"{p}: config has no 'method'; using {method!r} from the directory name")
    source = config.get("source")
    if source not in ("simulator", "trainer", *FOREIGN_SOURCES):
        warnings.append(f"{p}: config has no valid 'source' (got {source!r}); using 'unknown'")
        source = "unknown"
    seed = config.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        m = _SEED_RE.search(p.name)
        seed = int(m.group(1)) if m else None
    target = _as_target(config_get(config, "loss.stare.target_entropy"))
    if target is None:
        target = _as_target(_find_key(config, "target_entropy"))

    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    steps_raw = _to_float_column([row.get("step") for row in rows]) if rows else None
    if steps_raw is None:
        raise RunError(f"{str(p)!r}: metrics.jsonl has no row with a numeric 'step'")
    valid = np.isfinite(steps_raw) & (steps_raw == np.round(steps_raw))
    if not valid.all():
        warnings.append(f"{p}: {int((~valid).sum())} metrics row(s) without a valid integer 'step'; skipped")
    idx_valid = np.flatnonzero(valid)
    steps_v = steps_raw[idx_valid].astype(np.int64)
    # keep the LAST row of each step: unique over the reversed order gives the last occurrence
    uniq, first_in_rev = np.unique(steps_v[::-1], return_index=True)
    keep = idx_valid[steps_v.size - 1 - first_in_rev]
    if uniq.size < steps_v.size:
        warnings.append(
            f"{p}: {steps_v.size - uniq.size} duplicate step(s) (resumed without truncation?); kept the last row"
        )
    kept_rows = [rows[i] for i in keep]
    columns: dict[str, np.ndarray] = {}
    for key in keys:
        if key == "step":
            continue
        col = _to_float_column([row.get(key) for row in kept_rows])
        if col is not None:
            columns[key] = col
    if "entropy" not in columns:
        warnings.append(f"{p}: no finite 'entropy' values")
    bad = [row["entropy"] for row in kept_rows if "entropy" in row and not _is_finite_number(row["entropy"])]
    if bad:
        warnings.append(
            f"{p}: {len(bad)} of {len(kept_rows)} metrics rows have a non-numeric or non-finite 'entropy' "
            f"(first: {bad[0]!r}); those steps have no entropy"
        )
    for w in warnings[logged:]:
        logger.warning(w)
    return RunData(
        path=p,
        config=config,
        summary=summary,
        eval=_read_eval(p, warnings),
        method=method,
        source=source,
        seed=seed,
        target_entropy=target,
        steps=uniq,
        columns=columns,
        warnings=warnings,
    )


def load_runs(paths: str | os.PathLike | Iterable[str | os.PathLike], warnings: list[str] | None = None,
              unread: list[str] | None = None) -> list[RunData]:
    """Find every run directory at or below ``paths`` and read it.

    Args:
        paths: one path or several (run directories, sweep directories, or any folder above them; framework log
            files such as verl's file logger, or folders holding them: :mod:`analysis.foreign`).
        warnings: if given, warnings that concern no single run (a path that does not exist, a folder without
            runs, a run that could not be read) are appended to it; they are always logged.
        unread: if given, ``"PATH (why)"`` of each run directory that could not be read is appended to it (a run
            whose ``metrics.jsonl`` has no readable row: :func:`stare_lab.platform.evidence.check_run`).

    Returns:
        The runs, sorted by (method, seed, path). Per-run warnings are in :attr:`RunData.warnings`.

    Raises:
        RunError: if no readable run is found under any of ``paths`` (the message lists the paths).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    notes: list[str] = []
    dirs: list[Path] = []
    for root in paths:
        if not root.exists():
            notes.append(f"{root}: does not exist; skipped")
            continue
        found = (find_runs([root]) if root.is_dir() else []) + find_foreign_runs([root])
        fit = [d for d in found if _calibration_fit_run(d, root)]
        if fit:  # toys the calibration tried: not the calibrated toy's runs, not seeds of one setting
            found = [d for d in found if d not in fit]
            notes.append(f"{root}: {len(fit)} fit run(s) of a calibration (stare-lab calibrate's fit/) left out; "
                         "its sweep/ holds the calibrated toy (analyze the fit/ folder itself to see them)")
        if not found:
            notes.append(f"{root}: no run directories (no metrics.jsonl) nor framework logs (TRL trainer_state.json, "
                         "verl file logger) found; skipped")
        dirs.extend(found)
    runs: list[RunData] = []
    unreadable: list[str] = []
    for d in sorted(set(dirs)):
        try:
            runs.append(load_run(d))
        except (RunError, OSError) as err:
            unreadable.append(f"{d}: not readable as a run ({err})")
            if unread is not None:
                unread.append(f"{d} ({str(err).removeprefix(f'run {d}: ')})")
    notes += [f"{u}; skipped" for u in unreadable]
    if not runs:  # one line: why nothing was read (the notes are not printed before it)
        listed = ", ".join(str(p) for p in paths) or "(none given)"
        why = f"; {unreadable[0]}" + (f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else "") \
            if unreadable else ""
        raise RunError(f"no runs found under {listed} (a run directory holds a metrics.jsonl){why}")
    for n in notes:
        logger.warning(n)
    if warnings is not None:
        warnings.extend(notes)
    runs.sort(key=lambda r: (r.method, -1 if r.seed is None else r.seed, str(r.path)))
    return runs
