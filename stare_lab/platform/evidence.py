"""Is a run's record sound evidence? The one check every reader of run evidence (``stare-lab analyze``, ``promote``,
``calibrate``) applies before it uses a run's numbers.

A run directory (docs/design.md §4) is sound evidence when

1. its ``config.yaml`` is a readable mapping (without it the method, the target and the steps are unknown);
2. its ``metrics.jsonl`` parses: it has rows, and every line is a JSON object — except a last line cut short (a crash
   mid-write loses at most one row; the completeness check then sees the missing step). Random bytes, a text file
   or a half-overwritten file are damage, however many rows survive; so is a step logged twice (a resume that kept
   the rows past its checkpoint: the statistics would count them twice);
3. it is complete (:func:`stare_lab.platform.completeness.run_status`): every step its config asks for is there,
   and as many as its sweep's ``summary.json`` planned (the sweep is found above the run: :func:`sweep_plan`);
4. its ``summary.json``, where there is one, agrees with what ``metrics.jsonl`` recomputes
   (:func:`stare_lab.platform.summary.run_summary` with the run's own
   :func:`~stare_lab.platform.summary.summary_settings`; "recomputable from metrics.jsonl", docs/design.md §4) on
   :data:`EVIDENCE_KEYS`: a ``summary.json`` left from another run or from before the rows were cut is not the
   record of these rows.

:func:`check_run` returns a :class:`RunEvidence`: the problems (none: sound) and the summary recomputed from the rows,
which a reader uses in place of ``summary.json``. A reader refuses a run with problems (one line naming the run and
why, :meth:`RunEvidence.reason`) or leaves it out and says so; it never uses it silently.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from stare_lab.errors import ConfigError
from stare_lab.platform.completeness import expected_steps, run_status
from stare_lab.platform.runs import SUMMARY_FILE, Run
from stare_lab.platform.summary import number, run_summary, summary_settings

__all__ = ["EVIDENCE_KEYS", "RunEvidence", "check_run", "summary_disagreement", "sweep_steps", "sweep_plan"]

#: The statistics of ``summary.json`` that must equal the rows' (what the readers act on: entropy, collapse, band,
#: reward). Other keys a source adds (its own accuracy, the D-term statistics) are not compared.
EVIDENCE_KEYS = ("steps", "initial_entropy", "final_entropy", "steps_to_collapse", "time_in_band",
                 "mean_abs_dev_second_half", "held", "final_reward")
#: numbers agree within this relative (and 1e-12 absolute) tolerance: JSON keeps a float exactly, so only a
#: different computation differs
REL_TOL = 1e-9
#: how many parent folders :func:`sweep_plan` looks through for the run's sweep (``SWEEP/<method>/<point>/seed<k>``
#: with up to two grid keys)
SWEEP_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class RunEvidence:
    """What :func:`check_run` found: ``problems`` (one short clause each; empty when the run is sound evidence),
    ``summary`` (:func:`~stare_lab.platform.summary.run_summary` of the rows with the run's settings; None when the
    config's settings are invalid) and ``warnings`` (what was repaired while reading and does not make the run
    unsound: a last line cut short)."""

    path: Path
    problems: tuple[str, ...]
    summary: dict[str, Any] | None
    warnings: tuple[str, ...] = ()

    @property
    def sound(self) -> bool:
        return not self.problems

    def reason(self) -> str:
        """``run PATH: problem; problem`` (the one line a refusal prints)."""
        return f"run {self.path}: " + "; ".join(self.problems)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b and type(a) is type(b)
    x, y = number(a), number(b)
    if x is None or y is None:
        return a == b
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12)


def _show(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary_disagreement(written: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[str]:
    """The :data:`EVIDENCE_KEYS` on which a ``summary.json`` (``written``) and the rows' summary (``recomputed``)
    differ, each as ``"held true there, false from the rows"``; a key ``written`` lacks is not compared."""
    return [f"{k} {_show(written[k])} there, {_show(recomputed.get(k))} from the rows"
            for k in EVIDENCE_KEYS if k in written and not _same(written[k], recomputed.get(k))]


def sweep_steps(sweep: Mapping[str, Any], root: str | os.PathLike) -> dict[Path, int]:
    """The steps a sweep summary (``stare-lab simulate``'s ``summary.json`` in folder ``root``) planned for each of
    its run directories (resolved paths): ``methods.<label>.run_dirs.<seed>`` (relative to ``root``) with the steps
    of ``config.<label>/<seed>``."""
    out: dict[Path, int] = {}
    configs = sweep.get("config") or {}
    for label, entry in (sweep.get("methods") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        for seed_key, rel in (entry.get("run_dirs") or {}).items():
            steps = expected_steps(configs.get(f"{label}/{seed_key}") if isinstance(configs, Mapping) else None)
            if steps is not None and isinstance(rel, str):
                out[(Path(root) / rel).resolve()] = steps
    return out


@functools.lru_cache(maxsize=64)
def _sweep_file(path: str, mtime_ns: int) -> dict[Path, int] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("methods"), dict):
        return None
    return sweep_steps(data, Path(path).parent)


def sweep_plan(run_dir: str | os.PathLike) -> int | None:
    """The steps the run's sweep planned for ``run_dir``: the first ``summary.json`` of a sweep (one with
    ``methods``) in the :data:`SWEEP_DEPTH` folders above the run that lists it; None when no sweep lists it."""
    run = Path(run_dir).resolve()
    for parent in list(run.parents)[:SWEEP_DEPTH]:
        f = parent / SUMMARY_FILE
        try:
            mtime = f.stat().st_mtime_ns
        except OSError:
            continue
        planned = _sweep_file(str(f), mtime)
        if planned is not None and run in planned:
            return planned[run]
    return None


def _metrics_problems(run: Run) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of ``metrics.jsonl`` (module docstring, item 2)."""
    bad = list(run.skipped)
    warnings = []
    if bad and bad[-1][0] == run.lines and bad[-1][1].startswith("not valid JSON"):
        warnings.append(f"metrics.jsonl: its last line ({run.lines}) is cut short; skipped")
        bad = bad[:-1]
    if not run.metrics and not bad:
        return ["metrics.jsonl has no rows" + (" (its only line is cut short)" if run.skipped else "")], []
    if bad:
        n, why = bad[0]
        total = len(bad) + len(run.metrics)
        return [f"metrics.jsonl is damaged: {len(bad)} of its {total} lines are not JSON rows (the first, line {n}: "
                f"{why})"], warnings
    return [], warnings


def check_run(run: Run, *, sweep_steps: int | None = None, find_sweep: bool = True) -> RunEvidence:
    """Check one run read with :func:`stare_lab.platform.runs.read_run` (the module docstring's four conditions).

    Args:
        run: the run.
        sweep_steps: the steps its sweep planned for it (None: find them, when ``find_sweep``, with
            :func:`sweep_plan`).
        find_sweep: look above the run for its sweep's ``summary.json`` when ``sweep_steps`` is None.

    Returns:
        A :class:`RunEvidence`.
    """
    problems: list[str] = []
    if run.config_error is not None:
        problems.append(f"config.yaml is {run.config_error}")
    metric_problems, warnings = _metrics_problems(run)
    problems += metric_problems
    if sweep_steps is None and find_sweep:
        sweep_steps = sweep_plan(run.path)
    rows = run.metrics
    numbered = [s for s in (r.get("step") for r in rows) if isinstance(s, int) and not isinstance(s, bool)]
    steps = set(numbered)
    if len(numbered) > len(steps):  # its statistics would count those steps twice
        problems.append(f"metrics.jsonl repeats {len(numbered) - len(steps)} step(s) (a resume that did not drop "
                        "the rows past its checkpoint?)")
    has_entropy = any(number(r.get("entropy")) is not None for r in rows)
    if rows and not metric_problems and run.config_error is None:
        status = run_status(run.config, max(steps) if steps else None, len(steps), has_entropy=has_entropy,
                            sweep_steps=sweep_steps)
        if status is not None:
            problems.append(status)
    try:
        recomputed = run_summary(rows, **summary_settings(run.config))
    except ConfigError as err:  # the config's band / collapse_frac is out of range
        problems.append(f"its summary settings are invalid ({err})")
        recomputed = None
    if run.summary_error is not None:
        problems.append(f"summary.json is {run.summary_error}")
    elif run.summary is not None and recomputed is not None and not metric_problems and run.config_error is None:
        differ = summary_disagreement(run.summary, recomputed)
        if differ:
            more = f" (and {len(differ) - 2} more)" if len(differ) > 2 else ""
            problems.append("summary.json does not match its metrics.jsonl: " + "; ".join(differ[:2]) + more)
    return RunEvidence(run.path, tuple(problems), recomputed, tuple(warnings))
