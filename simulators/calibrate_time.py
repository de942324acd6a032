"""How long ``stare-lab calibrate`` takes, and what it says while it runs (:mod:`simulators.calibrate`).

- :func:`measure` runs the fit's first slice for :data:`PILOT_STEPS` steps in a temporary folder and returns
  :class:`Cost`, the measured model *fixed + steps × step* of one slice; :meth:`Cost.estimate` turns it into the
  seconds of the fit and of the W sweep on this machine, as loaded as it is now.
- :class:`Budget` (``--max-minutes``): whether more work ends within it; the calibration is refused when its
  estimate does not, and stops before a slice of the fit (or the sweep) that would not (:class:`BudgetError`).
- :class:`Progress` writes to stderr: one updating line per phase on a terminal, else a line every 10 %.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

from tqdm import tqdm

from stare_lab.errors import StareLabError

__all__ = ["PILOT_STEPS", "BudgetError", "Cost", "measure", "Budget", "Progress", "minutes", "slices"]

#: steps of the pilot that measures a slice's cost (:func:`measure`)
PILOT_STEPS = 8
#: the fit runs in slices of about this share of its settings: progress, budget checks and partial results
SLICE_FRAC = 0.1
#: but a slice gives each worker at least this many runs (smaller batches cost more per run-step)
MIN_RUNS_PER_WORKER = 32


class BudgetError(StareLabError):
    """A calibration over its ``--max-minutes``: refused before it starts, or stopped with its partial fit."""


def minutes(seconds: float) -> str:
    """``"40 s"``, ``"3.5 min"``, ``"12 min"``."""
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    m = seconds / 60
    return f"{m:.1f} min" if m < 10 else f"{m:.0f} min"


def slices(n_settings: int, n_seeds: int, workers: int) -> list[range]:
    """The fit's slices of setting indices: about :data:`SLICE_FRAC` of the settings each, at least
    :data:`MIN_RUNS_PER_WORKER` runs per worker, in grid order."""
    size = max(1, math.ceil(SLICE_FRAC * n_settings), math.ceil(MIN_RUNS_PER_WORKER * workers / max(1, n_seeds)))
    return [range(a, min(a + size, n_settings)) for a in range(0, n_settings, size)]


@dataclasses.dataclass
class Cost:
    """A slice's measured cost: ``fixed`` seconds (processes, set-up, writing and reading the runs) + ``step``
    seconds per batched step of its ``runs`` runs; ``steps`` per run; ``pilot`` the steps measured."""

    fixed: float
    step: float
    runs: int
    steps: int
    pilot: int = PILOT_STEPS

    def seconds(self, runs: int) -> float:
        """A batch of ``runs`` runs of ``steps`` steps (the step time scaled by the runs)."""
        return self.fixed + self.steps * self.step * runs / self.runs

    def estimate(self, slice_runs: Sequence[int], sweep_runs: int) -> tuple[float, float]:
        """(seconds of the fit's slices of ``slice_runs`` runs, seconds of a W sweep of ``sweep_runs`` runs)."""
        return sum(self.seconds(r) for r in slice_runs), self.seconds(sweep_runs)


def measure(configs: list[Any], workers: int | None, read: Callable[[list[Path]], Any],
            steps: int = PILOT_STEPS) -> Cost:
    """Run ``configs`` (one slice) for ``steps`` steps into a temporary folder over ``workers`` processes, then
    ``read`` their run directories (as the fit reads its runs); returns the :class:`Cost` of the slice at the
    configs' own steps: the time per batched step from the progress between its first and last step, the rest
    fixed (reading too: it costs about the same per run whatever the steps)."""
    from simulators.parallel import run_many

    full = int(configs[0].steps)
    steps = max(1, min(steps, full))
    pilot = [dataclasses.replace(c, steps=steps, checkpoint_every=steps) for c in configs]
    marks: list[tuple[float, int]] = []
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        marks.append((time.perf_counter(), done[0]))

    runner_log = logging.getLogger("simulators.tabular.runner")
    level = runner_log.level
    runner_log.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="calibrate-pilot-") as tmp:
            dirs = [Path(tmp) / f"r{i}" for i in range(len(pilot))]
            t0 = time.perf_counter()
            run_many(pilot, dirs, workers=workers, progress=tick)
            t1 = time.perf_counter()
            read(dirs)
            t2 = time.perf_counter()
    finally:
        runner_log.setLevel(level)
    n = len(pilot)
    first = next((t for t, k in marks if k >= n), t0)
    step = (marks[-1][0] - first) / (steps - 1) if marks and marks[-1][0] > first else (t1 - t0) / steps
    fixed = max(0.0, (t1 - t0) - steps * step) + (t2 - t1)
    return Cost(fixed=fixed, step=step, runs=n, steps=full, pilot=steps)


class Budget:
    """``--max-minutes`` (None: no budget), counted from ``start`` (default now)."""

    def __init__(self, max_minutes: float | None, start: float | None = None) -> None:
        self.seconds = None if max_minutes is None else 60.0 * max_minutes
        self.start = time.perf_counter() if start is None else start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, seconds: float) -> bool:
        """Whether ``seconds`` more work ends within the budget (always without one)."""
        return self.seconds is None or self.elapsed() + seconds <= self.seconds


class Progress:
    """Progress of the calibration on ``stream`` (default stderr): :meth:`note` a line, :meth:`phase` a counter
    that is one updating line on a terminal (``tty``: default ``stream.isatty()``), else a line every 10 %."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self._bar: tqdm | None = None

    def note(self, line: str) -> None:
        (self._bar.write if self._bar is not None else lambda s, file=None: print(s, file=file, flush=True))(
            line, file=self.stream)

    @contextlib.contextmanager
    def phase(self, desc: str, total: int, unit: str, per: int) -> Iterator[Callable[[int], None]]:
        """A counter of ``total`` ``unit`` (settings, runs) of ``per`` run-steps each; yields ``update(run_steps)``."""
        done = [0]
        t0 = time.perf_counter()
        if self.tty:
            bar = _Bar(total=total, desc=desc, unit=unit, file=self.stream, leave=True, dynamic_ncols=True,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} " + unit
                                  + " [{elapsed} elapsed, {remaining} left]")
            self._bar = bar

            def update(n: int) -> None:
                done[0] += n
                bar.update(min(total, done[0] / per) - bar.n)
            try:
                yield update
            finally:
                bar.close()
                self._bar = None
            return
        shown = [0]

        def update(n: int) -> None:
            done[0] += n
            units = min(total, done[0] / per)
            tenth = int(10 * units / total) if total else 10
            if tenth > shown[0]:
                shown[0] = tenth
                took = time.perf_counter() - t0
                left = took * (total - units) / units if units else 0.0
                print(f"{desc}: {10 * tenth}% ({int(units + 1e-9)}/{total} {unit}), {minutes(took)} elapsed, "
                      f"about {minutes(left)} left", file=self.stream, flush=True)
        yield update


class _Bar(tqdm):
    """tqdm without its monitor thread: the fit forks worker processes while the bar is open."""

    monitor_interval = 0
