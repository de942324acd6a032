"""The simulators' one run driver: run directories, step numbering, checkpoint cadence, resume and interruption —
the same for the tabular and the transformer simulator (docs/design.md §4).

A simulator describes itself to the driver as a :class:`Simulator`: how to start a run afresh, how to rebuild it
from a checkpoint, how to advance several compatible runs together one step at a time (an :class:`Engine`; the
tabular simulator batches many runs in one tensor computation, the transformer advances one) and how to summarise a
finished run. :func:`drive` does the rest, for every simulator the same way:

* **Steps are numbered from 1**: the row of the k-th update has ``step = k``; a checkpoint records the number of
  completed steps, and ``config.yaml`` the resolved config.
* **Checkpoints** (``RUN/checkpoint/state.pt``: ``{"step", "config", "state"}``, written atomically) every
  ``checkpoint_every`` steps and after the last one.
* **Resume** (``resume=True``): a run with a checkpoint continues from it bit-exactly — its rows past the
  checkpoint are dropped (and recomputed), ``steps`` (and ``checkpoint_every``) may differ from the checkpoint's (to
  extend a finished run), any other difference of the resolved config is refused (:class:`RunError` naming the
  key); a run without a checkpoint starts afresh (its old rows are replaced). The rows up to the checkpoint must be
  exactly steps 1 … checkpoint step (:func:`check_resume`): a missing, damaged or repeated one cannot be recomputed
  from the checkpoint, so such a run is refused before any run is touched, never resumed with a gap. Without
  ``resume`` a directory that already holds a run is refused.
* **Interruption** (``KeyboardInterrupt``, an error): every row logged so far is on disk (one flushed line per
  step); the last checkpoint is what a resume continues from; a run that started afresh and completed no step
  removes what it wrote.
* A run whose step fails with a :class:`RunError` (e.g. a diverged update) stops alone; the others finish, then the
  first such error is raised.
* Rows are written with the run-format keys first (:data:`stare_lab.platform.runs.REQUIRED_KEYS`), then the rest sorted;
  the summary (``summary.json``) is the simulator's, from all of the run's rows.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Hashable, Protocol, Sequence

import torch

from stare_lab.errors import RunError
from stare_lab.platform.runs import REQUIRED_KEYS, RunWriter, read_run

__all__ = ["Simulator", "Engine", "drive", "check_resume", "CHECKPOINT_FILE", "RESUMABLE_CHANGES", "checkpoint_path"]

CHECKPOINT_FILE = "state.pt"
#: keys of the resolved config that may differ between a checkpoint and the resuming config
RESUMABLE_CHANGES = ("steps", "checkpoint_every", "versions")


class Engine(Protocol):
    """Compatible runs advanced together (the order of the runs given to :meth:`Simulator.engine`)."""

    def advance(self, step: int) -> list[dict[str, Any] | RunError]:
        """Step number ``step`` (from 1) of every active run: its metrics row (without ``step``), or the
        :class:`RunError` that stopped it — that run's update is not applied and it leaves the engine (the
        positions of the runs that remain shift down)."""

    def payload(self, j: int) -> dict[str, Any]:
        """The resume state of active run ``j`` (what :meth:`Simulator.restore` reads back)."""

    def state(self, j: int) -> Any:
        """The current state of active run ``j`` (passed to :meth:`Simulator.summarize`)."""


class Simulator(Protocol):
    """What a simulator gives the driver."""

    def fresh(self, config: Any, run_dir: Path) -> tuple[Any, dict[str, Any]]:
        """A run's initial state and its resolved config (``config.yaml``)."""

    def restore(self, config: Any, run_dir: Path, saved: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The state of a checkpoint (``saved``: ``{"step", "config", "state"}``) and the resolved config the run
        would have now (compared with ``saved["config"]``)."""

    def group(self, config: Any) -> Hashable:
        """Runs with equal keys (and equal completed steps) may share one :class:`Engine`."""

    def engine(self, configs: list[Any], states: list[Any]) -> Engine:
        """An engine advancing these runs (same :meth:`group`, same completed steps)."""

    def summarize(self, config: Any, rows: list[dict[str, Any]], state: Any) -> dict[str, Any]:
        """A finished run's ``summary.json`` from all its rows."""


def checkpoint_path(run_dir: str | os.PathLike) -> Path:
    """``RUN/checkpoint/state.pt``."""
    return Path(run_dir) / "checkpoint" / CHECKPOINT_FILE


def _save(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _load(path: Path) -> dict[str, Any]:
    try:
        saved = torch.load(path, weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a damaged checkpoint
        raise RunError(f"cannot read checkpoint {str(path)!r}: {err}") from None
    if not isinstance(saved, dict) or not {"step", "config", "state"} <= set(saved):
        raise RunError(f"cannot read checkpoint {str(path)!r}: not a checkpoint of this simulator version "
                       "(expected the keys step, config, state); rerun with --overwrite")
    return saved


def _row_steps(run_dir: Path, upto: int) -> list[int]:
    """The ``step`` of every row of ``RUN/metrics.jsonl`` with step ≤ ``upto``, in file order (:func:`read_run`
    skips a line cut by a crash; rows without an integer ``step`` are skipped too, as
    :meth:`stare_lab.platform.runs.RunWriter.truncate_after` drops them); [] without the file."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    steps = [row.get("step") for row in read_run(run_dir).metrics]
    return [s for s in steps if isinstance(s, int) and not isinstance(s, bool) and s <= upto]


def check_resume(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint a resume of ``run_dir`` continues from (``{"step", "config", "state"}``; None without one),
    after checking that ``metrics.jsonl`` holds exactly the rows of steps 1 … its step, in order. Rows past the
    checkpoint are allowed (the resume drops and recomputes them); a row up to it that is missing, damaged or
    repeated is not: the checkpoint cannot recompute it.

    Raises:
        RunError: an unreadable checkpoint, or rows that do not match it — naming the run directory, the checkpoint
            step, the last good row (the longest run of rows 1, 2, … k) and ``--overwrite`` to start it afresh.
    """
    run_dir = Path(run_dir)
    ckpt = checkpoint_path(run_dir)
    if not ckpt.is_file():
        return None
    saved = _load(ckpt)
    step = int(saved["step"])
    steps = _row_steps(run_dir, step)
    if steps != list(range(1, step + 1)):
        good = 0
        while good < len(steps) and steps[good] == good + 1:
            good += 1
        last = f"step {good}" if good else "none"
        raise RunError(
            f"cannot resume {str(run_dir)!r}: its checkpoint is at step {step} but metrics.jsonl does not hold exactly "
            f"the rows of steps 1..{step} (last good row: {last}; a lost row cannot be recomputed from the checkpoint); "
            "rerun with --overwrite to start the run afresh"
        )
    return saved


def _first_difference(saved: Any, current: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    """The first dotted key (in the current config's order) whose value differs, with both values."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in [*current, *(k for k in saved if k not in current)]:
            if not prefix and key in RESUMABLE_CHANGES:
                continue
            found = _first_difference(saved.get(key), current.get(key), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if saved == current else (prefix.rstrip("."), saved, current)


def _check_same(run_dir: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    found = _first_difference(saved, current)
    if found:
        key, old, new = found
        raise RunError(f"cannot resume {str(run_dir)!r}: {key}={new!r} differs from the checkpoint's {old!r}")


@dataclasses.dataclass
class _Run:
    config: Any
    dir: Path
    state: Any
    cfg_dict: dict[str, Any]
    writer: RunWriter
    start: int  # completed steps when opened (0: a fresh run)
    done: int = 0  # completed steps now
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the rows this drive wrote
    error: BaseException | None = None

    def abandon(self) -> None:
        """Close the writer; a fresh run that completed no step leaves nothing behind."""
        self.writer.close()
        if self.start == 0 and self.done == 0:
            for name in ("config.yaml", "metrics.jsonl", "summary.json"):
                (self.dir / name).unlink(missing_ok=True)
            try:
                self.dir.rmdir()
            except OSError:  # something else is in it: leave it
                pass


def _open(sim: Simulator, config: Any, run_dir: Path, resume: bool, saved: dict[str, Any] | None) -> _Run:
    """Open a run: from ``saved`` (its checkpoint, checked by :func:`check_resume`) when resuming, else afresh."""
    if resume and saved is not None:
        state, cfg_dict = sim.restore(config, run_dir, saved)
        _check_same(run_dir, saved["config"], cfg_dict)
        (run_dir / "config.yaml").unlink(missing_ok=True)  # rewritten with the (possibly extended) steps
        writer = RunWriter(run_dir, cfg_dict, resume=True)
        writer.truncate_after(int(saved["step"]))
        return _Run(config, run_dir, state, cfg_dict, writer, int(saved["step"]), int(saved["step"]))
    if not resume and (run_dir / "metrics.jsonl").exists():  # before any expensive set-up
        raise RunError(f"{str(run_dir)!r} already holds a run (metrics.jsonl); resume it or choose another directory")
    state, cfg_dict = sim.fresh(config, run_dir)
    return _Run(config, run_dir, state, cfg_dict, RunWriter(run_dir, cfg_dict, overwrite=resume), 0)


def _ordered(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in REQUIRED_KEYS}
    out.update({k: row[k] for k in sorted(row) if k not in out})
    return out


def _advance(sim: Simulator, runs: list[_Run], progress: Callable[[int], None] | None) -> None:
    """Step compatible runs (same group, same completed steps) to their ``steps``, logging rows and checkpoints."""
    engine = sim.engine([r.config for r in runs], [r.state for r in runs])
    steps, every = int(runs[0].config.steps), int(runs[0].config.checkpoint_every)
    step = runs[0].done
    active = list(range(len(runs)))
    while step < steps and active:
        results = engine.advance(step + 1)
        step += 1
        keep = []
        for j, res in enumerate(results):
            r = runs[active[j]]
            if isinstance(res, BaseException):
                r.error = res
                r.abandon()
                continue
            keep.append(j)
            row = _ordered({**res, "step": step})
            r.writer.log(row)
            r.rows.append(row)
            r.done = step
        active = [active[j] for j in keep]
        if step % every == 0 or step == steps:
            for j, i in enumerate(active):
                _save(checkpoint_path(runs[i].dir), {"step": step, "config": runs[i].cfg_dict,
                                                     "state": engine.payload(j)})
        if progress is not None and active:
            progress(len(active))
    for j, i in enumerate(active):
        runs[i].state = engine.state(j)


def _finish(sim: Simulator, r: _Run) -> dict[str, Any]:
    r.writer.close()
    # a fresh run's rows are exactly those this drive wrote; a resumed one also has the rows before its checkpoint
    rows = r.rows if r.start == 0 else read_run(r.dir).metrics
    summary = sim.summarize(r.config, rows, r.state)
    r.writer.write_summary(summary)
    return summary


def drive(
    sim: Simulator,
    configs: Sequence[Any],
    run_dirs: Sequence[str | os.PathLike],
    *,
    resume: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every config into its directory (module docstring) and return the summaries in order.

    Runs are advanced together where :meth:`Simulator.group` and their completed steps agree (one engine per such
    group, the groups one after the other). ``progress(n)`` is called after each step with the number of runs it
    advanced. Each config needs ``steps`` and ``checkpoint_every``.

    Raises:
        RunError: a directory that holds a run (without ``resume``) or cannot be written, a checkpoint that does not
            match its config or its rows (:func:`check_resume`) or cannot be read, or the first run that stopped with
            a RunError (after the others finished).
    """
    if len(configs) != len(run_dirs):
        raise ValueError("configs and run_dirs must have the same length")
    # every resumed run's checkpoint and rows are checked before any run directory is touched
    saved = [check_resume(d) if resume else None for d in run_dirs]
    runs: list[_Run] = []
    try:
        for c, d, s in zip(configs, run_dirs, saved):
            runs.append(_open(sim, c, Path(d), resume, s))
    except BaseException:
        for r in runs:
            r.abandon()
        raise
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault((sim.group(r.config), r.done), []).append(i)
    summaries: list[dict[str, Any] | None] = [None] * len(runs)
    try:
        for idx in groups.values():
            _advance(sim, [runs[i] for i in idx], progress)
            for i in idx:
                if runs[i].error is None:
                    summaries[i] = _finish(sim, runs[i])
    except BaseException:
        for r in runs:
            r.abandon()
        raise
    errors = [r.error for r in runs if r.error is not None]
    if errors:
        raise errors[0]
    return summaries  # type: ignore[return-value]
