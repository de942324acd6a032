"""Grouping runs by method (and config keys) and the per-group tables of the report.

:func:`compare` is the notebook entry point: ``cmp = analysis.compare("runs/sweep")`` then
``cmp.summary_rows()``, ``cmp.prediction_fits()``, ``cmp.series(group, "entropy")``, or pass ``cmp`` to the
functions of :mod:`analysis.plots`. Seeds of one group are aggregated with :func:`analysis.stats.aggregate_seeds`
(mean and a 95% t band).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from stare_lab.errors import ConfigError

from . import stats
from .grouping import KIND_KEYS, check_group_by, fmt_value, group_key_value, setting_signature, split_labels
from .load import RunData, load_runs

logger = logging.getLogger(__name__)

__all__ = ["KNOWN_METHODS", "KIND_KEYS", "QUADRANTS", "Group", "Comparison", "compare"]

#: Method names used by simulators and trainer, in the order the report lists them.
KNOWN_METHODS = (
    "grpo",
    "grpo-ds",
    "o1",
    "c2",
    "o1-adaptive",
    "clip_cov",
    "kl_cov",
    "entropy_bonus",
    "forking_tokens",
)

#: The four quadrants of docs/theory.md §2 (advantage sign × surprisal above/below the critical value):
#: (key infix, description, expected sign of the first-order ΔH).
QUADRANTS = (
    ("pos_high", "Â>0, high surprisal", +1),
    ("pos_low", "Â>0, low surprisal", -1),
    ("neg_high", "Â<0, high surprisal", -1),
    ("neg_low", "Â<0, low surprisal", +1),
)

_PASS_RE = re.compile(r"^(eval/)?pass@\d+$")
_WALL_KEYS = ("wall_time_s", "wall_s", "time_s", "elapsed_s", "total_time_s", "time/total_s")


def _method_rank(method: str) -> tuple[int, str]:
    return (KNOWN_METHODS.index(method) if method in KNOWN_METHODS else len(KNOWN_METHODS), method)


@dataclasses.dataclass
class Group:
    """Runs that differ only by seed: one method (and source, and value of each ``group_by`` key).

    Attributes:
        label: how the report names the group (``o1``; ``o1 [trainer]`` when sources are mixed;
            ``c2 [transformer]`` / ``c2 (W=5)`` when runs of one method differ in their settings;
            ``o1 (reweight_w=1.2)`` with ``group_by``).
        method, source: shared by every run of the group.
        key_values: ``((dotted_key, value), …)`` of the ``group_by`` keys.
        runs: the runs (one per seed).
        settings: ``((dotted_key, value), …)`` the runs share (simulator kind/preset, ``loss.stare.*``, target
            entropy; see :func:`compare` ``split``); empty when not split.
        target_entropy: H_tgt (nats) of the runs (their mean if they disagree, e.g. a target set relative to each
            seed's initial entropy; each run's own target is still used for its fraction in band), None if unknown.
    """

    label: str
    method: str
    source: str
    key_values: tuple[tuple[str, Any], ...]
    runs: list[RunData]
    target_entropy: float | None
    settings: tuple[tuple[str, Any], ...] = ()
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def seeds(self) -> list[int | None]:
        """Seeds of the runs, in run order."""
        return [r.seed for r in self.runs]

    def has(self, key: str) -> bool:
        """True if any run of the group has a finite value of ``key``."""
        return any(r.has(key) for r in self.runs)


@dataclasses.dataclass
class Comparison:
    """Runs grouped for comparison plus the report settings. Build it with :func:`compare`.

    Attributes:
        groups: the groups, ordered by method (KNOWN_METHODS order, then by name), source and group values.
        band_half_width: half-width (nats) of the target band |H − H_tgt| < band_half_width.
        threshold: absolute entropy threshold (nats) for "steps to threshold", or None to use
            ``threshold_frac`` × each run's initial entropy.
        threshold_frac: relative threshold (default 0.1 = 10% of the initial entropy).
        confidence: confidence level of the seed bands (0.95).
        group_by: the dotted config keys that split methods into groups.
        warnings: warnings from reading and aggregating (the report lists them).
        left_out: ``str(run.path)`` → why the run is not sound evidence, in short (:mod:`analysis.progress`:
            unfinished, not measurable, damaged, a summary its rows do not reproduce); such runs are left out of
            the verdict's held / collapsed counts, which says so (:meth:`mark_left_out`).
        unread: ``"PATH (why)"`` of each run directory found that has no readable row: not drawn, and named first
            in the verdict.
    """

    groups: list[Group]
    band_half_width: float = 0.05
    threshold: float | None = None
    threshold_frac: float = 0.1
    confidence: float = 0.95
    group_by: tuple[str, ...] = ()
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    unread: list[str] = dataclasses.field(default_factory=list)

    def mark_left_out(self, planned: dict | None = None) -> None:
        """Find the runs that are not sound evidence (:func:`analysis.progress.left_out`: the evidence check of each
        run, and its steps against ``planned``, a sweep's steps per run directory) and add one warning per run
        (replacing an earlier one for the same run)."""
        from .progress import clause, left_out

        for path, problems in left_out(self.runs, planned).items():
            warning = f"{path}: {'; '.join(problems)}; left out of the verdict's held/collapsed counts"
            if warning in self.warnings:
                continue
            self.warnings[:] = [w for w in self.warnings
                                if not (w.startswith(f"{path}: ") and w.endswith("left out of the verdict's "
                                                                                 "held/collapsed counts"))]
            self.left_out[path] = clause(problems)
            self.warnings.append(warning)

    # ------------------------------------------------------------------------------------------------ basics
    @property
    def runs(self) -> list[RunData]:
        """All runs, group by group."""
        return [r for g in self.groups for r in g.runs]

    @property
    def sources(self) -> list[str]:
        """The distinct sources (``simulator``, ``trainer``, ``unknown``) present, sorted."""
        return sorted({g.source for g in self.groups})

    def group(self, label: str) -> Group:
        """The group with this label.

        Raises:
            ConfigError: if no group has that label (the message lists the labels).
        """
        for g in self.groups:
            if g.label == label:
                return g
        raise ConfigError(f"no group {label!r}; groups: {', '.join(g.label for g in self.groups)}")

    def _note(self, text: str | None) -> None:
        if text and text not in self.notes:
            self.notes.append(text)

    def _series_note(self, label: str, name: str, note: str) -> None:
        """One note per group and reason, listing the series it concerns (not one note per series)."""
        prefix = f"{label}: {note}; for "
        for i, n in enumerate(self.notes):
            if n.startswith(prefix):
                if name not in n[len(prefix):].split(", "):
                    self.notes[i] = f"{n}, {name}"
                return
        self.notes.append(prefix + name)

    # ------------------------------------------------------------------------------------------------ series
    def series(self, group: Group | str, key: str, smooth: int = 1) -> stats.SeedAggregate:
        """``key`` over steps aggregated over the group's seeds (mean and band); runs that never log ``key`` are
        left out. Different run lengths: aggregated on the common steps (recorded in :attr:`notes`).
        ``smooth`` > 1 applies :func:`analysis.stats.moving_average` to each run before aggregating (so the band
        is the band of the smoothed curves)."""
        g = self.group(group) if isinstance(group, str) else group
        ck = ("series", key, smooth)
        if ck not in g._cache:
            parts = [(r.steps, stats.moving_average(r.column(key), smooth)) for r in g.runs if r.has(key)]
            agg = stats.aggregate_seeds(parts, self.confidence)
            if agg.note:
                self._series_note(g.label, key, agg.note)
            g._cache[ck] = agg
        return g._cache[ck]

    def derived_series(
        self, group: Group | str, name: str, fn: Callable[[RunData], np.ndarray | None], title: str | None = None
    ) -> stats.SeedAggregate:
        """Like :meth:`series` for a per-run column computed by ``fn(run) -> [S] array`` (None: run left out);
        cached under ``name``; notes name it ``title`` (default ``name``)."""
        g = self.group(group) if isinstance(group, str) else group
        ck = ("derived", name)
        if ck not in g._cache:
            parts = []
            for r in g.runs:
                y = fn(r)
                if y is not None and np.isfinite(y).any():
                    parts.append((r.steps, y))
            agg = stats.aggregate_seeds(parts, self.confidence)
            if agg.note:
                self._series_note(g.label, title or name, agg.note)
            g._cache[ck] = agg
        return g._cache[ck]

    def quadrant_share(self, group: Group | str, quadrant: str, smooth: int = 1) -> stats.SeedAggregate:
        """Share of the tokens in ``quadrant`` (count / sum of the four counts) per step, aggregated over seeds
        (each run moving-averaged over ``smooth`` steps first)."""

        def share(r: RunData) -> np.ndarray | None:
            y = _quadrant_share(r, quadrant)
            return None if y is None else stats.moving_average(y, smooth)

        return self.derived_series(group, f"quadrant/{quadrant}/share/{smooth}", share,
                                   title=f"share of tokens in quadrant {quadrant}")

    def normalised_series(self, group: Group | str, key: str = "entropy", n_points: int = 201) -> stats.SeedAggregate:
        """``key`` / its initial value against the fraction of training (0…1), aggregated over seeds: the axes on
        which a simulator sweep and a trainer run can be compared although their absolute entropies differ."""
        g = self.group(group) if isinstance(group, str) else group
        ck = ("normalised", key, n_points)
        if ck not in g._cache:
            grid = np.linspace(0.0, 1.0, n_points)
            parts = []
            for r in g.runs:
                if not r.has(key):
                    continue
                y, reason = stats.normalised_curve(r.steps, r.column(key), grid)
                if reason:
                    self._note(f"{r.path}: {key} not normalisable ({reason}); left out of the cross-source plot")
                    continue
                parts.append((grid, y))
            g._cache[ck] = stats.aggregate_seeds(parts, self.confidence)
        return g._cache[ck]

    # ------------------------------------------------------------------------------------------------ tables
    def run_summary(self, run: RunData, extra_keys: Sequence[str] = ()) -> dict[str, Any]:
        """Per-run numbers of the summary table (None where the run lacks the data).

        The entropy, band and reward numbers are the core's run summary (:func:`analysis.stats.run_summary`, the
        definitions of every ``summary.json``) with this comparison's band and threshold fraction.
        Keys: ``n_steps``, ``initial_entropy``/``final_entropy`` (first finite; last finite plus its measured
        change, nats), ``threshold`` (nats), ``steps_to_threshold`` (first step with entropy below it, None if
        never), ``frac_in_band`` (|H − H_tgt| ≤ band), ``final_reward`` (mean over the last 10% of the steps), ``final/<key>`` (last finite value) for ``accuracy``, ``eval/accuracy``,
        every ``pass@k`` key and ``extra_keys``, and ``wall_time_s`` (sum of ``time/step_s``, else a wall-time entry of summary.json).
        """
        s = stats.run_summary(run, band=self.band_half_width, collapse_frac=self.threshold_frac)
        h0 = s["initial_entropy"]
        thr = self.threshold if self.threshold is not None else (None if h0 is None else self.threshold_frac * h0)
        out: dict[str, Any] = {
            "n_steps": run.n_steps,
            "initial_entropy": h0,
            "final_entropy": s["final_entropy"],
            "threshold": thr,
            "steps_to_threshold": (s["steps_to_collapse"] if self.threshold is None else
                                   stats.steps_to_threshold(run.steps, run.column("entropy"), thr)),
            "frac_in_band": s["time_in_band"],
            "final_reward": s["final_reward"],
        }
        keys = ["accuracy", "eval/accuracy"] + sorted(k for k in run.columns if _PASS_RE.match(k)) + list(extra_keys)
        for k in dict.fromkeys(keys):
            if run.has(k):
                out[f"final/{k}"] = stats.last_finite(run.column(k))
        wall = None
        if run.has("time/step_s"):
            wall = float(np.nansum(run.column("time/step_s")))
        elif isinstance(run.summary, dict):
            for k in _WALL_KEYS:
                v = run.summary.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    wall = float(v)
                    break
        out["wall_time_s"] = wall
        return out

    def summary_rows(self, extra_keys: Sequence[str] = ()) -> list[dict[str, Any]]:
        """One row per group. Every numeric field of :meth:`run_summary` becomes ``(mean, ci_halfwidth, n)`` over
        the seeds that have it; ``steps_to_threshold`` becomes ``(mean over the runs that crossed, n_crossed,
        n_runs)``. Also ``label``, ``method``, ``source``, ``n_runs``, ``target_entropy``."""
        rows = []
        for g in self.groups:
            per_run = [self.run_summary(r, extra_keys) for r in g.runs]
            row: dict[str, Any] = {
                "label": g.label,
                "method": g.method,
                "source": g.source,
                "n_runs": len(g.runs),
                "target_entropy": g.target_entropy,
            }
            fields = list(dict.fromkeys(k for pr in per_run for k in pr))
            for k in fields:
                vals = [pr.get(k) for pr in per_run]
                if k == "steps_to_threshold":
                    crossed = [v for v in vals if v is not None]
                    row[k] = (float(np.mean(crossed)) if crossed else None, len(crossed), len(vals))
                else:
                    row[k] = stats.mean_ci(vals, self.confidence)
            rows.append(row)
        return rows

    def predictor_keys(self) -> list[str]:
        """Predictor keys logged by any run (``pred_entropy_change`` first, then ``pred/<name>``). A key whose
        values equal an earlier key's in every run up to float rounding (:func:`_same_values`; e.g. ``pred/phi_tokens`` = ``pred_entropy_change``) is left
        out, with a note, so figures and tables do not repeat identical columns."""
        keys: dict[str, None] = {}
        for r in self.runs:
            keys.update(dict.fromkeys(r.predictor_keys()))
        ordered = sorted(keys, key=lambda k: (k != "pred_entropy_change", k))
        kept: list[str] = []
        for k in ordered:
            twin = next((j for j in kept if all(_same_values(r.column(k), r.column(j)) for r in self.runs)), None)
            if twin is None:
                kept.append(k)
            else:
                self._note(f"predictor `{k}` equals `{twin}` (to rounding) in every run; shown once as `{twin}`")
        return kept

    def has_measured_change(self) -> bool:
        """True if any run logs a finite measured ``entropy_change``."""
        return any(r.has("entropy_change") for r in self.runs)

    def prediction_pairs(self, group: Group, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps, predicted, measured)`` pooled over the group's seeds (non-finite pairs dropped)."""
        ck = ("pairs", key)
        if ck not in group._cache:
            runs = [r for r in group.runs if r.has(key) and r.has("entropy_change")]
            if runs:
                s = np.concatenate([r.steps for r in runs]).astype(np.float64)
                p = np.concatenate([r.column(key) for r in runs])
                m = np.concatenate([r.column("entropy_change") for r in runs])
                ok = np.isfinite(p) & np.isfinite(m)
                group._cache[ck] = (s[ok], p[ok], m[ok])
            else:
                e = np.zeros(0)
                group._cache[ck] = (e, e, e)
        return group._cache[ck]

    def prediction_fits(self) -> list[dict[str, Any]]:
        """For each group and predictor with data: ``{"label", "predictor", "fit": PredictionFit}`` of measured
        ``entropy_change`` on the predictor, pooled over seeds (see :func:`analysis.stats.fit_prediction`)."""
        out = []
        for key in self.predictor_keys():
            for g in self.groups:
                _, p, m = self.prediction_pairs(g, key)
                if p.size:
                    out.append({"label": g.label, "predictor": key, "fit": stats.fit_prediction(p, m)})
        return out

    def has_quadrants(self) -> bool:
        """True if any run logs a quadrant count (``quadrant/<q>/count``)."""
        return any(r.has(f"quadrant/{q}/count") for r in self.runs for q, _, _ in QUADRANTS)

    def quadrant_table(self) -> list[dict[str, Any]]:
        """Per group and quadrant: mean token count per step, share of the tokens of the four quadrants, mean ΔH
        contribution per step (nats) and its total over the run, each a mean over seeds; plus the expected sign
        of the contribution (docs/theory.md §2: sign(ΔH) = sign(Â)·sign(s − s*))."""
        rows = []
        for g in self.groups:
            runs = [r for r in g.runs if any(r.has(f"quadrant/{q}/count") for q, _, _ in QUADRANTS)]
            if not runs:
                continue
            for q, desc, sign in QUADRANTS:
                cnt, share, dh, dh_tot = [], [], [], []
                for r in runs:
                    c = r.column(f"quadrant/{q}/count")
                    d = r.column(f"quadrant/{q}/dH")
                    if np.isfinite(c).any():
                        cnt.append(float(np.nanmean(c)))
                        sh = _quadrant_share(r, q)
                        share.append(float(np.nanmean(sh)) if sh is not None and np.isfinite(sh).any() else math.nan)
                    if np.isfinite(d).any():
                        dh.append(float(np.nanmean(d)))
                        dh_tot.append(float(np.nansum(d)))
                rows.append(
                    {
                        "label": g.label,
                        "quadrant": q,
                        "description": desc,
                        "expected_sign": sign,
                        "count": stats.mean_ci(cnt, self.confidence),
                        "share": stats.mean_ci(share, self.confidence),
                        "dH_per_step": stats.mean_ci(dh, self.confidence),
                        "dH_total": stats.mean_ci(dh_tot, self.confidence),
                    }
                )
        return rows


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Same NaN pattern and values equal to rounding: |a − b| ≤ 1e-9·max|a| + 1e-15 (two sums of the same terms
    in a different order differ by ~1e-17 nats)."""
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    ok = ~np.isnan(a)
    if not ok.any():
        return True
    return bool(np.all(np.abs(a[ok] - b[ok]) <= 1e-9 * np.max(np.abs(a[ok])) + 1e-15))


def _quadrant_share(run: RunData, quadrant: str) -> np.ndarray | None:
    """``[S]`` share of the run's tokens in ``quadrant``: its count / the sum of the four counts (NaN where the sum
    is 0 or missing); None if the run never logs that quadrant's count."""
    if not run.has(f"quadrant/{quadrant}/count"):
        return None
    tot = np.nansum([run.column(f"quadrant/{q}/count") for q, _, _ in QUADRANTS], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, run.column(f"quadrant/{quadrant}/count") / tot, np.nan)


def compare(
    runs: str | os.PathLike | Iterable[str | os.PathLike | RunData],
    group_by: Sequence[str] = (),
    band_half_width: float = 0.05,
    threshold: float | None = None,
    threshold_frac: float = 0.1,
    confidence: float = 0.95,
    split: bool = True,
) -> Comparison:
    """Group runs for comparison.

    Args:
        runs: run/sweep directories (searched recursively) or already loaded :class:`RunData`.
        group_by: dotted config keys (e.g. ``loss.stare.reweight_w``) whose values split a method into groups.
        band_half_width: > 0, half-width (nats) of the target band around ``loss.stare.target_entropy``.
        threshold: absolute entropy threshold (nats, > 0) for steps-to-threshold; None → ``threshold_frac`` ×
            the run's initial entropy.
        threshold_frac: in (0, 1]; the relative threshold when ``threshold`` is None.
        confidence: in (0, 1); the level of the seed bands.
        split: True (default): runs of one method whose settings differ (sweep folder, simulator kind/preset, any
            ``loss.stare.*`` value, the target entropy — see :func:`analysis.grouping.setting_signature`) are separate groups,
            labelled e.g. ``c2 [transformer]`` or ``c2 (W=5)``, and :attr:`Comparison.notes` says so. False: they are
            averaged together (the report notes which settings were mixed).

    Returns:
        A :class:`Comparison`. Runs are grouped by (source, method, settings when ``split``, group_by values); the
        group label names the source only when several sources are present.

    Raises:
        ConfigError: on an out-of-range setting, or a ``group_by`` key that no run's config has (the message lists
            similar keys; a key only some runs have is a warning).
        RunError: if no run is found.
    """
    if not (isinstance(band_half_width, (int, float)) and band_half_width > 0 and math.isfinite(band_half_width)):
        raise ConfigError(f"band_half_width={band_half_width!r} must be a finite number > 0 (nats)")
    if threshold is not None and not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
        raise ConfigError(f"threshold={threshold!r} must be a finite number > 0 (nats) or None")
    if not (isinstance(threshold_frac, (int, float)) and 0 < threshold_frac <= 1):
        raise ConfigError(f"threshold_frac={threshold_frac!r} is outside (0, 1]")
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence={confidence!r} is outside (0, 1)")
    warnings: list[str] = []
    notes: list[str] = []
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    runs = list(runs)
    loaded = [r for r in runs if isinstance(r, RunData)]
    paths = [r for r in runs if not isinstance(r, RunData)]
    unread: list[str] = []
    if paths or not loaded:
        loaded += load_runs(paths, warnings, unread)
    for r in loaded:
        warnings.extend(r.warnings)

    check_group_by(loaded, group_by, warnings)

    buckets: dict[tuple, list[RunData]] = collections.OrderedDict()
    roots: dict = {}  # sweep_root's cache: folder -> holds a sweep summary.json
    for r in loaded:
        kv = tuple((k, group_key_value(r, k)) for k in group_by)
        sig = setting_signature(r, roots) if split else ()
        buckets.setdefault((r.source, r.method, sig, kv), []).append(r)
    mixed = len({k[0] for k in buckets}) > 1
    by_method: dict[tuple, dict[tuple, list[RunData]]] = collections.OrderedDict()
    for (source, method, sig, kv), members in buckets.items():
        by_method.setdefault((source, method), {}).setdefault(sig, []).extend(members)
    suffix: dict[tuple, str] = {}
    for (source, method), sigs in by_method.items():
        labels = split_labels(sigs, group_by)
        suffix.update({(source, method, sig): lab for sig, lab in labels.items()})
        if len(sigs) > 1:
            notes.append(
                f"{method}{f' [{source}]' if mixed else ''}: runs differ in their settings (sweep folder, simulator "
                f"kind/preset, `loss.stare.*` or target entropy), so they are {len(sigs)} separate groups:"
                f" {', '.join(method + lab for lab in labels.values())} (`--merge` averages them)"
            )
        elif not split:
            sig_dicts = [dict(setting_signature(r, roots)) for ms in sigs.values() for r in ms]
            differ = [k for k in dict.fromkeys(k for d in sig_dicts for k in d)
                      if len({repr(d.get(k)) for d in sig_dicts}) > 1]
            if differ:
                notes.append(f"{method}: runs with different {', '.join(f'`{k}`' for k in differ)} are averaged "
                             "together (--merge)")
    groups = []
    spread: list[str] = []
    for (source, method, sig, kv), members in buckets.items():
        label = method + (f" [{source}]" if mixed else "") + suffix[(source, method, sig)]
        if kv:
            label += " (" + ", ".join(f"{k.rsplit('.', 1)[-1]}={fmt_value(v)}" for k, v in kv) + ")"
        targets = [r.target_entropy for r in members if r.target_entropy is not None]
        target = float(np.mean(targets)) if targets else None
        if len(set(targets)) > 1:
            spread.append(f"{label} {min(targets):.4g}–{max(targets):.4g} (band at {target:.4g})")
        seeds = [r.seed for r in members if r.seed is not None]
        if len(seeds) != len(set(seeds)):
            warnings.append(f"{label}: duplicate seeds {sorted(seeds)}; each run still counts once")
        groups.append(Group(label, method, source, kv, members, target, sig))
    if spread:
        notes.append(
            "target entropies differ between the seeds of a group (e.g. set relative to each seed's initial entropy): "
            + "; ".join(spread) + " nats; the band is drawn at the group mean, each run's fraction in band uses its "
            "own target"
        )
    seen_labels: dict[str, int] = {}
    for g in groups:  # settings the label does not show (e.g. a non-stare key) could still collide
        n = seen_labels.get(g.label, 0)
        seen_labels[g.label] = n + 1
        if n:
            g.label += f" #{n + 1}"

    def value_rank(v: Any) -> tuple:
        num = isinstance(v, (int, float)) and not isinstance(v, bool)
        return (0, float(v), "") if num else (1, 0.0, str(v))

    def order(g: Group) -> tuple:
        return (_method_rank(g.method), g.source, tuple(value_rank(v) for _, v in g.settings),
                tuple(value_rank(v) for _, v in g.key_values))

    groups.sort(key=order)
    cmp = Comparison(
        groups=groups,
        band_half_width=float(band_half_width),
        threshold=None if threshold is None else float(threshold),
        threshold_frac=float(threshold_frac),
        confidence=float(confidence),
        group_by=tuple(group_by),
        warnings=warnings,
        notes=notes,
    )
    cmp.unread = unread
    cmp.mark_left_out()
    return cmp
