"""The run directory: one format shared by simulators, trainer and analysis (docs/design.md §4).

```
RUN/
  config.yaml       fully resolved config: source (simulator|trainer), method, hyperparameters, seed, versions
  metrics.jsonl     one JSON object per step; append-only, flushed every step
  summary.json      final aggregates (written at the end; recomputable from metrics.jsonl)
  checkpoint/       resume state (owned by the writer of the run)
  figures/          PNGs written by analysis
```

Every metrics row holds :data:`REQUIRED_KEYS`; other keys are namespaced (``loss/…``, ``stare/…``,
``quadrant/…``, ``time/…``). Non-finite floats are written as JSON ``null`` (never a bare ``NaN`` token), so every
line is strict JSON.

Conventions every writer follows (analysis relies on them):

* ``config.yaml`` has top-level ``source`` (``simulator`` | ``trainer``), ``method`` (e.g. ``grpo``, ``o1``,
  ``c2``), ``seed`` and ``loss`` (the :class:`~stare_lab.config.LossConfig` as a dict, so the target entropy is at
  ``loss.stare.target_entropy``); anything else is free.
* ``entropy`` is the batch token-mean entropy before the update (nats); ``entropy_change`` the measured one-step
  change on the same states (or null); ``pred_entropy_change`` the primary first-order prediction. Further
  predictors go under ``pred/<name>`` (e.g. ``pred/grad_dot`` = ∇θH·Δθ, ``pred/phi_tokens`` = token-level Φ sum).
* Quadrants (docs/theory.md §2): ``quadrant/{pos,neg}_{high,low}/count`` (tokens with Â>0 / Â<0 and surprisal
  above / below the critical value) and ``quadrant/{pos,neg}_{high,low}/dH`` (their summed first-order ΔH
  contribution, nats).
* STARE selection: ``stare/frac_pos_selected``, ``stare/frac_neg_selected`` (|L±| / valid tokens).
* Held-out evaluation: ``eval/accuracy``, ``eval/pass@<k>`` (only on the steps that evaluate); sampled-batch
  ``accuracy`` and ``pass@<G>`` when the source has a verifier.
* Timing: ``time/step_s`` and ``time/<phase>_s``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from stare_lab.errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["REQUIRED_KEYS", "RunWriter", "Run", "read_run", "is_run_dir", "find_runs", "versions"]

#: Keys every metrics row must carry (docs/design.md §4). ``entropy_change`` may be ``None`` where the source
#: cannot measure it; ``pred_entropy_change`` may be ``None`` where no prediction is made.
REQUIRED_KEYS = (
    "step",
    "entropy",
    "reward",
    "gate_on",
    "stare_w",
    "stare_m",
    "pred_entropy_change",
    "entropy_change",
)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def _jsonable(value: Any) -> Any:
    """Convert tensors/numpy scalars/NaN to strict-JSON values (non-finite floats → None)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Path):
        return str(value)
    item = getattr(value, "item", None)  # torch / numpy scalars
    if callable(item):
        try:
            return _jsonable(item())
        except (ValueError, RuntimeError):
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _jsonable(tolist())
    raise TypeError(f"value of type {type(value).__name__} is not JSON-serialisable")


def versions() -> dict[str, str]:
    """Versions of Python, stare_lab and the installed key libraries, for ``config.yaml``."""
    out = {"python": platform.python_version()}
    try:
        from stare_lab import __version__
        out["stare_lab"] = __version__
    except ImportError:  # pragma: no cover
        pass
    for mod in ("torch", "numpy", "transformers", "deepspeed", "vllm"):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, "__version__"):
            out[mod] = str(m.__version__)
    return out


class RunWriter:
    """Writes one run directory: ``config.yaml`` once, ``metrics.jsonl`` one flushed line per step,
    ``summary.json`` at the end.

    Args:
        run_dir: the directory; created (with parents) if missing.
        config: the fully resolved config (a mapping or a dataclass); ``source`` (``"simulator"`` or
            ``"trainer"``), ``method`` and ``seed`` should be in it. Versions are added under ``versions``.
        resume: if False (default) the directory must not already hold a ``metrics.jsonl`` (raises
            :class:`RunError`; pass ``overwrite=True`` to start afresh). If True, existing rows are kept and
            new rows are appended; use :meth:`truncate_after` to drop rows past the checkpoint's step.
        overwrite: delete existing ``metrics.jsonl``/``summary.json`` and start afresh.

    Raises:
        RunError: if the directory cannot be created/written, or holds a run and neither ``resume`` nor
            ``overwrite`` is set.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: Mapping[str, Any] | Any,
        *,
        resume: bool = False,
        overwrite: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunError(f"cannot create run directory {str(self.run_dir)!r}: {err.strerror or err}") from None
        if not os.access(self.run_dir, os.W_OK):
            raise RunError(f"run directory {str(self.run_dir)!r} is not writable")
        self.metrics_path = self.run_dir / METRICS_FILE
        self.summary_path = self.run_dir / SUMMARY_FILE
        if self.metrics_path.exists() and not resume:
            if not overwrite:
                raise RunError(
                    f"{str(self.run_dir)!r} already holds a run (metrics.jsonl); resume it or choose another directory"
                )
            self.metrics_path.unlink()
            if self.summary_path.exists():
                self.summary_path.unlink()
        cfg = _jsonable(config)
        if not isinstance(cfg, dict):
            raise TypeError("config must be a mapping or a dataclass")
        cfg.setdefault("versions", versions())
        self.config = cfg
        if not resume or not (self.run_dir / CONFIG_FILE).exists():
            self._write_config(cfg)
        self._fh = open(self.metrics_path, "a", encoding="utf-8")
        self._closed = False

    def _write_config(self, cfg: dict) -> None:
        import yaml

        tmp = self.run_dir / (CONFIG_FILE + ".tmp")
        tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
        os.replace(tmp, self.run_dir / CONFIG_FILE)

    def log(self, row: Mapping[str, Any]) -> None:
        """Append one metrics row and flush it to disk.

        Raises:
            RunError: if a required key (:data:`REQUIRED_KEYS`) is missing, or the writer is closed.
        """
        if self._closed:
            raise RunError("RunWriter is closed")
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing:
            raise RunError(f"metrics row is missing required keys: {', '.join(missing)}")
        line = json.dumps(_jsonable(dict(row)), allow_nan=False)
        self._fh.write(line + "\n")
        self._fh.flush()

    def truncate_after(self, step: int) -> int:
        """Drop metrics rows whose ``step`` is greater than ``step`` (used on resume from a checkpoint).

        A truncated last line (crash mid-write) is dropped too. Returns the number of rows kept.
        """
        self._fh.close()
        kept = []
        if self.metrics_path.exists():
            for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                    kept.append(line)
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.metrics_path)
        self._fh = open(self.metrics_path, "a", encoding="utf-8")
        return len(kept)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Write ``summary.json`` atomically (write to a temporary file, then rename)."""
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_jsonable(dict(summary)), indent=2, allow_nan=False) + "\n")
        os.replace(tmp, self.summary_path)

    def close(self) -> None:
        """Close the metrics file (idempotent)."""
        if not self._closed:
            self._fh.close()
            self._closed = True

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclasses.dataclass
class Run:
    """A run directory read back: ``config`` (dict), ``metrics`` (list of row dicts), ``summary`` (dict or None)
    and ``warnings`` (what was skipped while reading). What the reader could not use, for
    :mod:`stare_lab.platform.evidence`: ``skipped`` (``(line number, why)`` of each ``metrics.jsonl`` line that is
    not a JSON object), ``lines`` (the number of the last non-empty line), ``config_error`` / ``summary_error`` (why
    ``config.yaml`` / ``summary.json`` was not read; None when it was, or for ``summary.json`` when there is none)."""

    path: Path
    config: dict
    metrics: list[dict]
    summary: dict | None
    warnings: list[str]
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    lines: int = 0
    config_error: str | None = None
    summary_error: str | None = None

    def column(self, key: str) -> list[Any]:
        """Values of ``key`` over the rows (``None`` where a row lacks it)."""
        return [row.get(key) for row in self.metrics]


def is_run_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory holding a ``metrics.jsonl``."""
    return (Path(path) / METRICS_FILE).is_file()


def find_runs(roots: Iterable[str | os.PathLike]) -> list[Path]:
    """All run directories at or below ``roots`` (sorted, deduplicated)."""
    found: set[Path] = set()
    for root in roots:
        root = Path(root)
        if is_run_dir(root):
            found.add(root)
        if root.is_dir():
            found.update(p.parent for p in root.rglob(METRICS_FILE) if p.is_file())
    return sorted(found)


def read_run(path: str | os.PathLike, *, log: bool = True) -> Run:
    """Read a run directory, tolerating damage: a truncated or non-JSON line in ``metrics.jsonl`` is skipped with a
    warning (recorded in ``Run.warnings`` and ``Run.skipped``; more than :data:`LINE_WARNINGS` such lines are one
    warning), a missing/invalid ``config.yaml`` or ``summary.json`` gives an empty dict / ``None`` with a warning.
    ``log``: log the warnings (a caller that reports them itself, e.g. through
    :func:`stare_lab.platform.evidence.check_run`, passes False).

    Raises:
        RunError: if ``path`` is not a directory or has no ``metrics.jsonl``.
    """
    p = Path(path)
    if not p.is_dir():
        raise RunError(f"run directory {str(p)!r} does not exist")
    metrics_path = p / METRICS_FILE
    if not metrics_path.is_file():
        raise RunError(f"{str(p)!r} is not a run directory (no metrics.jsonl)")
    warnings: list[str] = []
    config: dict = {}
    config_error = None
    cfg_path = p / CONFIG_FILE
    if cfg_path.is_file():
        try:
            import yaml

            loaded = yaml.safe_load(cfg_path.read_text(encoding="utf-8", errors="replace"))
            config = loaded if isinstance(loaded, dict) else {}
            if not isinstance(loaded, dict):
                config_error = f"not a mapping (a YAML {_yaml_kind(loaded)})"
        except yaml.MarkedYAMLError as err:  # one line naming line and column
            from stare_lab.platform.files import yaml_error_where

            line, column, what = yaml_error_where(err)
            where = f" at line {line}, column {column}" if line is not None else ""
            config_error = f"not valid YAML{where} ({what})"
        except Exception as err:  # noqa: BLE001 - any other failure is reported, not raised
            config_error = f"unreadable ({err})"
    else:
        config_error = "missing"
    if config_error is not None:
        warnings.append(f"{cfg_path}: {config_error}" + ("" if config_error == "missing" else "; config ignored"))
    metrics: list[dict] = []
    skipped: list[tuple[int, str]] = []
    last = 0
    with open(metrics_path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            last = lineno
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                why = "not valid UTF-8" if "\ufffd" in line else "not valid JSON (truncated write?)"
                skipped.append((lineno, why))
                continue
            if not isinstance(row, dict):
                skipped.append((lineno, "not a JSON object"))
                continue
            metrics.append(row)
    if len(skipped) <= LINE_WARNINGS:
        warnings += [f"{metrics_path}:{n}: {why}; skipped" for n, why in skipped]
    else:
        n, why = skipped[0]
        warnings.append(f"{metrics_path}: {len(skipped)} lines are not JSON objects (the first, line {n}: {why}); "
                        "skipped")
    summary = None
    summary_error = None
    sum_path = p / SUMMARY_FILE
    if sum_path.is_file():
        try:
            loaded = json.loads(sum_path.read_text(encoding="utf-8"))
            summary = loaded if isinstance(loaded, dict) else None
            if summary is None:
                summary_error = "not a JSON object"
        except (ValueError, OSError) as err:  # ValueError: JSON and UTF-8 errors
            summary_error = f"unreadable ({err})"
        if summary_error is not None:
            warnings.append(f"{sum_path}: {summary_error}; ignored")
    if log:
        for w in warnings:
            logger.warning(w)
    return Run(path=p, config=config, metrics=metrics, summary=summary, warnings=warnings, skipped=skipped,
               lines=last, config_error=config_error, summary_error=summary_error)


#: more unreadable ``metrics.jsonl`` lines than this are one warning (a file of random bytes is not 1000 warnings)
LINE_WARNINGS = 3


def _yaml_kind(value: Any) -> str:
    return {list: "list", str: "string", type(None): "empty document"}.get(type(value), type(value).__name__)
