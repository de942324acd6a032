"""The trainer's run-directory side (rank 0 only): metrics rows, amending a row with evaluation results, the
summary recomputed from ``metrics.jsonl``, the stable export ``OUT/final_model``; optional TensorBoard / W&B; and
the progress people read: one line per step (:func:`step_line`, logged at INFO on the ``trainer.progress`` logger)
or, with ``schedule.progress_bar`` on a terminal, a tqdm bar carrying the same numbers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError, RunError

from trainer.output import PROGRESS_LOGGER

logger = logging.getLogger(__name__)

__all__ = ["RunLogger", "summary_from_rows", "read_rows", "export_final_model", "FINAL_MODEL", "RUN_OUTPUTS",
           "step_line", "PROGRESS_LOGGER"]

#: ``OUT/final_model``: the trained model at the end of a run (HF format with the tokenizer).
FINAL_MODEL = "final_model"
#: What a training run writes in its directory: any of them there means "OUT holds a run"; ``stare-lab train
#: --overwrite`` removes exactly these (:func:`stare_lab.platform.outdir.claim_out`).
RUN_OUTPUTS = ("config.yaml", "metrics.jsonl", "metrics.jsonl.tmp", "metrics.jsonl.amend", "summary.json",
               "summary.json.tmp", "checkpoint", FINAL_MODEL, FINAL_MODEL + ".tmp", FINAL_MODEL + ".old", "eval",
               "tensorboard", "wandb")
#: The logger of the per-step lines (``stare-lab train`` prints its records as they are, without a prefix).
progress = logging.getLogger(PROGRESS_LOGGER)


def _hms(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def step_line(row: dict[str, Any], total_steps: int, eta_s: float | None) -> str:
    """The one-line progress of a metrics row: ``step N/total``, reward, accuracy, entropy (nats), the gate and
    W/M, rollout tokens/s, seconds per step and the ETA (``eta_s`` seconds; ``None`` = unknown)."""
    def num(key: str, fmt: str) -> str:
        v = row.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

    parts = [f"step {row['step']}/{total_steps}", f"reward {num('reward', '.3f')}", f"acc {num('accuracy', '.3f')}",
             f"entropy {num('entropy', '.3f')}",
             f"gate {'on' if row.get('gate_on') else 'off'} W {num('stare_w', '.3f')} M {num('stare_m', '.3f')}",
             f"{num('time/rollout_tokens_per_s', '.0f')} tok/s", f"{num('time/step_s', '.1f')} s/step"]
    if row.get("gen_rounds", 1) > 1 or row.get("kept_group_fraction", 1.0) < 1.0:
        parts.append(f"kept {num('kept_group_fraction', '.2f')} in {row.get('gen_rounds')} rounds")
    if row.get("skipped"):
        parts.append("update skipped")
    parts.append(f"ETA {_hms(eta_s) if eta_s is not None else '-'}")
    return " | ".join(parts)


def read_rows(out: str | Path) -> list[dict[str, Any]]:
    """The metrics rows of ``out/metrics.jsonl`` (a torn last line is skipped)."""
    path = Path(out) / "metrics.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def summary_from_rows(rows: list[dict[str, Any]], total_steps: int, resumed_from: int,
                      config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``summary.json`` of a trainer run from ALL its metrics rows (so a resumed or re-run command never drops
    facts): the core's run summary (:func:`stare_lab.platform.summary.run_summary`, the same keys and definitions as every
    other source; settings from ``config``, the resolved run config, via :func:`stare_lab.platform.summary.summary_settings`:
    without it there is no target entropy and the band statistics are null), the first-order decomposition
statistics (:func:`stare_lab.theory.critical.decomposition_summary`: critical W along the run, W* where the entropy first
falls below the target — null unless the rows carry the ``pred/d_…`` terms of ``schedule.measure_entropy_change``)
plus ``resumed_from`` (the step the
    last invocation started from). ``steps`` counts the rows; a count other than ``total_steps`` is logged."""
    from stare_lab.theory.critical import decomposition_summary
    from stare_lab.platform.summary import run_summary, summary_settings

    settings = summary_settings(config)
    summary = run_summary(rows, **settings)
    loss = (config or {}).get("loss") or {}
    stare = loss.get("stare") or {}
    c2 = loss.get("loss_mode") == "stare" and stare.get("variant") == "C2"
    m = float(stare.get("reweight_m", 1.0)) if c2 else 1.0
    # D terms summed over 5 % of the run per window, as stare-lab analyze does for sampled runs
    summary.update(decomposition_summary(rows, settings["target_entropy"], reweight_m=m,
                                         window=max(1, len(rows) // 20)))
    if summary["steps"] != total_steps:
        logger.warning("metrics.jsonl holds %d rows for %d steps", summary["steps"], total_steps)
    summary["resumed_from"] = resumed_from
    return summary


def export_final_model(ckpt: str | Path, out: str | Path) -> Path:
    """Publish the HF export of checkpoint ``ckpt`` (``ckpt/hf``: weights, config, tokenizer) as
    ``out/final_model``: files hard-linked when possible (no copy of the weights; deleting old checkpoints does not
    affect them), else copied; replaced atomically (a rename) if it exists. Rank 0 only.

    Raises:
        RunError: the checkpoint has no HF export or the files cannot be written.
    """
    src = Path(ckpt) / "hf"
    if not (src / "config.json").is_file():
        raise RunError(f"checkpoint {str(ckpt)!r} has no HF export (hf/config.json)")
    dst = Path(out) / FINAL_MODEL
    tmp = Path(out) / (FINAL_MODEL + ".tmp")
    old = Path(out) / (FINAL_MODEL + ".old")

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, copy_function=link_or_copy)
        if dst.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        raise RunError(f"cannot write {str(dst)!r}: {err}") from None
    return dst


class RunLogger:
    """RunWriter + optional TensorBoard / W&B + progress bar, rank 0 only (other ranks: every method is a no-op).

    Raises (constructor):
        ConfigError: ``schedule.wandb_project`` set without wandb installed.
        RunError: the run directory cannot be written.
    """

    def __init__(self, cfg: Any, out: Path, resume_step: int, is_main: bool) -> None:
        self.is_main = is_main
        self.out, self.cfg = Path(out), cfg
        self.writer = self.tb = self.wandb = self.bar = None
        if not is_main:
            return
        from stare_lab.platform.runs import RunWriter

        self.writer = RunWriter(out, cfg.to_dict(), resume=resume_step > 0, overwrite=False)
        if resume_step > 0:
            self.writer.truncate_after(resume_step)
        s = cfg.schedule
        if s.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tensorboard"))
        if s.wandb_project:
            try:
                import wandb
            except ImportError as err:
                raise ConfigError("schedule.wandb_project is set but wandb is not installed") from err
            self.wandb = wandb.init(project=s.wandb_project, config=cfg.to_dict(), dir=str(out))
        self.total_steps, self.step_times = s.total_steps, []
        if s.progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=s.total_steps, initial=resume_step, desc="train", dynamic_ncols=True)

    def _scalars(self, row: dict[str, Any], step: int) -> None:
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def log(self, row: dict[str, Any]) -> None:
        """Append ``row`` to metrics.jsonl (flushed) and the optional sinks."""
        if not self.is_main:
            return
        self.writer.log(row)
        self._scalars(row, row["step"])
        if isinstance(row.get("time/step_s"), (int, float)):
            self.step_times.append(float(row["time/step_s"]))
        left = self.total_steps - int(row["step"])
        eta = left * sum(self.step_times) / len(self.step_times) if self.step_times else None
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(step_line(row, self.total_steps, eta).split(" | ", 1)[1])
        else:
            progress.info(step_line(row, self.total_steps, eta))

    def amend(self, step: int, extra: dict[str, Any]) -> None:
        """Add ``extra`` (e.g. the ``eval/…`` metrics computed after the row was written) to the row of ``step``.

        The file is rewritten atomically (temporary file + rename), so a crash leaves either the old or the new
        row, never none.
        """
        if not self.is_main or not extra:
            return
        import math

        from stare_lab.platform.runs import RunWriter

        extra = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in extra.items()}
        rows = read_rows(self.out)
        hit = [i for i, r in enumerate(rows) if r.get("step") == step]
        if not hit:
            logger.warning("no metrics row of step %d to add %s to", step, sorted(extra))
            return
        rows[hit[-1]].update(extra)
        self.writer.close()
        path = self.out / "metrics.jsonl"
        tmp = path.with_suffix(".jsonl.amend")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows), encoding="utf-8")
        os.replace(tmp, path)
        self.writer = RunWriter(self.out, self.cfg.to_dict(), resume=True)
        self._scalars(extra, step)

    def close(self, summary: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.writer.write_summary(summary)
        self.writer.close()
        for h in (self.bar, self.tb):
            if h is not None:
                h.close()
        if self.wandb is not None:
            self.wandb.finish()
