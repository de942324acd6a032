"""The simulators' output directories (the one ``--out`` policy of :mod:`stare_lab.platform.outdir`): for a sweep, what
``--out`` may hold, what ``--resume`` may continue, the runs of a previous sweep that ``--overwrite`` removes, and
their removal (only what a simulator run wrote); for a calibration, the same rules over what it writes.

A sweep records its request — preset, methods, seeds, steps, grid, overrides and the ``--plugin`` modules — in
``OUT/sweep.json`` when it starts (:func:`write_request`). ``--resume`` continues the sweep the folder holds: what
the resumed command does not give is taken from that record (:func:`recorded_request`; for a sweep written before
the record existed, from its ``summary.json`` or its runs' ``config.yaml``), and what it gives that extends the
sweep (methods, seeds, grid values, steps) is said on screen (:func:`resume_changes`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import yaml

from stare_lab.config import to_dict
from stare_lab.errors import RunError

logger = logging.getLogger(__name__)

__all__ = ["check_writable_dir", "check_out", "check_previous_sweep", "check_resumable", "stale_runs", "remove_run",
           "clear_run", "claim_calibration_out", "REQUEST_FILE", "write_request", "recorded_request", "resume_changes"]

#: the file in a sweep's folder that records its request (:func:`write_request`)
REQUEST_FILE = "sweep.json"


def check_writable_dir(out: Path) -> None:
    """Raise :class:`RunError` unless ``out`` is (or can be created as) a writable directory.

    The message names ``out`` and, when ``out`` does not exist yet, the existing ancestor that refused the new
    entry, e.g. ``cannot create output directory '/proc/x': '/proc' does not accept new entries (...)``.
    """
    probe = out
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise RunError(f"output path {str(out)!r} is not a directory ({str(probe)!r} is a file)")
    try:  # a real probe: os.access says yes to root even on read-only or virtual file systems
        fd, name = tempfile.mkstemp(prefix=".stare_lab_probe_", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        reason = err.strerror or str(err)
        if probe != out:
            raise RunError(
                f"cannot create output directory {str(out)!r}: {str(probe)!r} does not accept new entries ({reason})"
            ) from None
        raise RunError(f"output directory {str(out)!r} is not writable ({reason})") from None


def check_out(out: Path, resume: bool, overwrite: bool, candidates: Sequence[Path] = ()) -> None:
    """The part of the ``--out`` policy that needs no plan (torch-free, so a used ``--out`` is refused in well under a
    second): ``out`` holding another kind of output (a trainer or single run, an evaluation) is refused whatever
    the options, as is a directory inside a sweep that another process is writing; a previous sweep
    (``summary.json``) or a run at one of ``candidates`` (the run directories the request may write) is refused
    without ``--resume`` / ``--overwrite``.

    Raises:
        RunError: one line naming what ``out`` holds and what to do.
    """
    from stare_lab.platform.outdir import SWEEP, check_kind, check_outside_writers

    check_kind(out, SWEEP)
    check_outside_writers(out)
    if resume or overwrite:
        return
    summary = out / "summary.json"
    if summary.is_file():
        try:
            previous = json.loads(summary.read_text(encoding="utf-8"))
            listed = _previous_run_dirs(previous) if isinstance(previous, dict) else []
        except (OSError, ValueError, AttributeError):
            listed = []
        raise RunError(f"--out {str(out)!r} already holds a sweep (summary.json, {len(listed)} run(s)); pass --resume "
                       "to continue it or --overwrite to replace it, or choose another --out")
    taken = [d for d in candidates if (d / "metrics.jsonl").exists()]
    if taken:
        raise RunError(f"{str(taken[0])!r} already holds a run; pass --resume to continue or --overwrite to replace "
                       f"({len(taken)} run(s) in {str(out)!r})")


def check_previous_sweep(out: Path, run_dirs: dict[Any, Path], resume: bool, overwrite: bool) -> None:
    """The one ``--out`` policy at the sweep's level (:mod:`stare_lab.platform.outdir`): :func:`check_out`, and
    ``--resume`` must cover every run the previous sweep's ``summary.json`` lists (its summary would otherwise lose
    them), or for an interrupted sweep without a summary every simulator run directory under ``out``.

    Raises:
        RunError: one line naming what ``out`` holds and what to do.
    """
    check_out(out, resume, overwrite, list(run_dirs.values()))
    summary = out / "summary.json"
    if not summary.is_file():
        if resume:  # an interrupted sweep has no summary yet: its run directories say what it holds
            planned = {d.resolve() for d in run_dirs.values()}
            left = sorted(str(c.parent.relative_to(out)) for c in out.glob("**/config.yaml")
                          if c.parent != out and c.parent.resolve() not in planned and _simulator_run(c))
            if left:
                raise RunError(f"--resume: {str(out)!r} holds {len(left)} run(s) of an interrupted sweep this "
                               f"request leaves out (e.g. {left[0]}), which would stay unfinished beside it: resume "
                               "without --methods, --seeds and --sweep (the sweep's own are taken), or give them "
                               "all again, or --overwrite to replace it")
        return
    try:
        previous = json.loads(summary.read_text(encoding="utf-8"))
        listed = _previous_run_dirs(previous) if isinstance(previous, dict) else []
    except (OSError, ValueError, AttributeError):
        listed = []
    if resume:
        planned = {d.resolve() for d in run_dirs.values()}
        missing = [rel for rel in listed if (out / rel).resolve() not in planned and (out / rel).is_dir()]
        if missing:
            raise RunError(f"--resume: {str(out)!r} holds a sweep with {len(missing)} run(s) this request leaves out "
                           f"(e.g. {missing[0]}), which its summary would lose: resume without --methods, --seeds "
                           "and --sweep (the sweep's own are taken), or give them all again, or --overwrite to "
                           "replace it")


def _simulator_run(config_path: Path) -> bool:
    """Whether ``config_path`` is a simulator run's ``config.yaml`` (``source: simulator``)."""
    try:
        return (yaml.safe_load(config_path.read_text()) or {}).get("source") == "simulator"
    except (OSError, yaml.YAMLError, AttributeError):
        return False


def check_resumable(run_dir: Path, config: Any) -> None:
    """Before anything runs: a tabular run to resume must have been written with the same config (except
    ``steps`` / ``checkpoint_every``, and a target entropy resolved from ``target_entropy_rel``) — also a run
    interrupted before its first checkpoint, which a resume restarts: with another config its rows would be lost.

    Raises:
        RunError: naming the first differing key.
    """
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        return
    try:
        saved = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RunError(f"cannot resume {str(run_dir)!r}: config.yaml is not valid YAML ({err})") from None
    current = to_dict(config)
    if current.get("target_entropy_rel") is not None:
        current["loss"]["stare"].pop("target_entropy", None)
        saved.get("loss", {}).get("stare", {}).pop("target_entropy", None)

    def diff(a: Any, b: Any, prefix: str = "") -> str | None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a:
                if prefix == "" and k in ("steps", "checkpoint_every"):
                    continue
                found = diff(a[k], b.get(k), f"{prefix}{k}.") if k in b else f"{prefix}{k}"
                if found:
                    return found
            return None
        return None if a == b else prefix.rstrip(".")

    key = diff(current, saved)
    if key is not None:
        raise RunError(f"cannot resume {str(run_dir)!r}: {key} differs from the run's config.yaml")


def _previous_run_dirs(previous: dict[str, Any]) -> list[str]:
    """Relative run directories a previous ``summary.json`` lists (``run_dirs`` of each group; older summaries:
    the ``method/seed<k>`` names of ``config``)."""
    rels = [rel for entry in (previous.get("methods") or {}).values() if isinstance(entry, dict)
            for rel in (entry.get("run_dirs") or {}).values()]
    return rels or list((previous.get("config") or {}).keys())


def stale_runs(plan: Any) -> list[Path]:
    """Run directories under ``plan.out`` that the previous sweep there wrote (listed in its ``summary.json``, with
    a ``config.yaml`` whose ``source`` is ``simulator``) and that ``plan`` does not include. :func:`run_sweep`
    removes them when ``plan.overwrite`` is set; other runs under ``out`` are never touched."""
    path = plan.out / "summary.json"
    if not path.is_file():
        return []
    try:
        names = _previous_run_dirs(json.loads(path.read_text()))
    except (OSError, ValueError, AttributeError):
        return []
    planned = {d.resolve() for d in plan.run_dirs.values()}
    stale = []
    for name in names:
        parts = str(name).split("/")
        if len(parts) not in (2, 3) or not parts[-1].startswith("seed") or any(x in ("", ".", "..") for x in parts):
            continue
        run_dir = plan.out.joinpath(*parts)
        if run_dir.resolve() in planned or not (run_dir / "config.yaml").is_file():
            continue
        try:
            source = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("source")
        except (OSError, AttributeError, yaml.YAMLError):  # an unreadable config is not ours to delete
            continue
        if source == "simulator":
            stale.append(run_dir)
    return stale


def remove_run(run_dir: Path) -> None:
    """Remove the files a simulator run wrote in ``run_dir``, then ``run_dir`` and its empty parents up to the
    method folder."""
    clear_run(run_dir)
    for d in (run_dir, run_dir.parent, run_dir.parent.parent):
        try:
            d.rmdir()
        except OSError:  # not empty (foreign files, other runs) or already gone: stop
            break


def clear_run(run_dir: Path) -> None:
    """Remove the files a previous run wrote in ``run_dir`` (metrics, summary, config, checkpoint)."""
    for name in ("metrics.jsonl", "summary.json", "config.yaml"):
        (run_dir / name).unlink(missing_ok=True)
    ckpt = run_dir / "checkpoint"
    if ckpt.is_dir():
        shutil.rmtree(ckpt)


def claim_calibration_out(out: Path, overwrite: bool, outputs: Sequence[str]) -> None:
    """The ``--out`` policy (:mod:`stare_lab.platform.outdir`) for a calibration, under ``out``'s lock: another kind of output
    or a directory inside another live writer's is refused; a previous calibration without ``overwrite`` too, with
    it only what a calibration writes (``outputs``) is removed.

    Raises:
        RunError: one line naming what ``out`` holds and what to do.
    """
    from stare_lab.platform.outdir import CALIBRATION, check_kind, check_outside_writers

    check_kind(out, CALIBRATION)
    check_outside_writers(out)
    taken = [out / name for name in outputs if (out / name).exists() or (out / name).is_symlink()]
    if taken and not overwrite:
        if not (out / "calibration.json").is_file():  # fit or sweep runs without the result: stopped part-way
            raise RunError(f"--out {str(out)!r} holds a calibration that stopped before its calibration.json "
                           f"({', '.join(p.name for p in taken)}); pass --overwrite to start it again, or choose "
                           "another --out")
        raise RunError(f"--out {str(out)!r} already holds a calibration ({taken[0].name}); pass --overwrite to "
                       "replace it, or choose another --out")
    for path in taken:
        logger.info("--overwrite: removing %s", path)
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError as err:
            raise RunError(f"--overwrite: cannot remove {str(path)!r}: {err.strerror or err}") from None


def write_request(out: Path, request: dict[str, Any]) -> None:
    """Record a sweep's request in ``out/sweep.json`` (atomically): ``preset``, ``methods``, ``seeds`` (the list),
    ``steps`` (``--steps``, or None: the preset's or an override's), ``grid`` (``[[key, values], ...]``),
    ``overrides`` (normalised ``key=value`` items) and ``plugins`` (the ``--plugin`` modules loaded, as given)."""
    tmp = out / (REQUEST_FILE + ".tmp")
    tmp.write_text(json.dumps(request, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, out / REQUEST_FILE)


def recorded_request(out: Path) -> dict[str, Any] | None:
    """The request of the sweep ``out`` holds, with the keys of :func:`write_request` (None where unknown): its
    ``sweep.json``; for a sweep written before that record existed, what its ``summary.json`` says (preset,
    methods, seeds, grid, and the steps its runs share) or, interrupted before its summary, its runs'
    ``config.yaml`` (methods, seeds, steps). None when ``out`` holds no sweep; an unreadable record counts as none
    (the other checks of ``--resume`` still apply)."""
    empty: dict[str, Any] = dict.fromkeys(("preset", "methods", "seeds", "steps", "grid", "overrides"), None)
    empty["plugins"] = []
    try:
        data = json.loads((out / REQUEST_FILE).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("methods"), list):
            return {**empty, **{k: data.get(k) for k in empty if k in data}}
    except (OSError, ValueError):
        pass
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    if isinstance(summary, dict) and isinstance(summary.get("methods"), dict):
        groups = [e for e in summary["methods"].values() if isinstance(e, dict)]
        steps = {c.get("steps") for c in (summary.get("config") or {}).values() if isinstance(c, dict)}
        grid = (summary.get("sweep") or {}).get("grid") if isinstance(summary.get("sweep"), dict) else None
        return {**empty, "preset": summary.get("preset"),
                "methods": list(dict.fromkeys(str(e.get("method")) for e in groups if e.get("method"))) or None,
                "seeds": summary.get("seeds") if isinstance(summary.get("seeds"), list) else None,
                "steps": steps.pop() if len(steps) == 1 else None, "grid": grid or []}
    configs = []
    for path in sorted(out.glob("**/config.yaml")):
        if path.parent == out:
            continue
        try:
            cfg = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(cfg, dict) and cfg.get("source") == "simulator":
            configs.append(cfg)
    if not configs:
        return None
    steps = {c.get("steps") for c in configs}
    return {**empty, "methods": list(dict.fromkeys(str(c.get("method")) for c in configs)),
            "seeds": sorted({c.get("seed") for c in configs if isinstance(c.get("seed"), int)}),
            "steps": steps.pop() if len(steps) == 1 else None}


def resume_changes(recorded: dict[str, Any], request: dict[str, Any], saved_steps: Sequence[tuple[int, int]] = ()
                   ) -> list[str]:
    """What a resumed request adds to the sweep it continues, one phrase each (empty: it continues it as it is):
    methods, seeds, grid keys or values it adds, and runs it takes further (``saved_steps``: ``(steps in the run's
    config.yaml, steps planned)`` of the runs already there)."""
    out = []

    def added(key: str) -> list[Any]:
        before = recorded.get(key)
        return [] if before is None else [x for x in request.get(key) or [] if x not in before]

    if added("methods"):
        out.append(f"adds method(s) {', '.join(map(str, added('methods')))} (the sweep ran "
                   f"{', '.join(map(str, recorded['methods']))})")
    if added("seeds"):
        out.append(f"adds seed(s) {', '.join(map(str, added('seeds')))} (the sweep ran "
                   f"{', '.join(map(str, recorded['seeds']))})")
    if recorded.get("grid") is not None:
        before = {k: v for k, v in recorded["grid"]}
        for key, values in request.get("grid") or []:
            new = [v for v in values if v not in before.get(key, [])]
            if key not in before:
                out.append(f"adds the grid key {key} ({', '.join(map(str, values))})")
            elif new:
                out.append(f"adds {key} = {', '.join(map(str, new))} to the grid")
    longer = sorted({(a, b) for a, b in saved_steps if b > a})
    if longer:
        out.append(f"runs {len([1 for a, b in saved_steps if b > a])} run(s) on to "
                   f"{', '.join(str(b) for b in sorted({b for _, b in longer}))} steps (they had "
                   f"{', '.join(str(a) for a in sorted({a for a, _ in longer}))}; each continues from its last "
                   "checkpoint)")
    return out
