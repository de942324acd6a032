"""The trainer's run-directory side (rank 0 only): metrics rows, amending a row with evaluation results, the
summary recomputed from ``metrics.jsonl``, the stable export ``OUT/final_model``; optional TensorBoard / W&B and a
progress bar.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError, RunError

logger = logging.getLogger(__name__)

__all__ = ["RunLogger", "summary_from_rows", "read_rows", "export_final_model", "FINAL_MODEL"]

#: ``OUT/final_model``: the trained model at the end of a run (HF format with the tokenizer).
FINAL_MODEL = "final_model"


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
    facts): the core's run summary (:func:`stare_lab.summary.run_summary`, the same keys and definitions as every
    other source; settings from ``config``, the resolved run config, via :func:`stare_lab.summary.summary_settings`:
    without it there is no target entropy and the band statistics are null) plus ``resumed_from`` (the step the
    last invocation started from). ``steps`` counts the rows; a count other than ``total_steps`` is logged."""
    from stare_lab.summary import run_summary, summary_settings

    summary = run_summary(rows, **summary_settings(config))
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
        from stare_lab.runs import RunWriter

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
        if s.progress_bar:
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
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{row['reward']:.3f}", H=f"{row['entropy'] or float('nan'):.3f}")

    def amend(self, step: int, extra: dict[str, Any]) -> None:
        """Add ``extra`` (e.g. the ``eval/…`` metrics computed after the row was written) to the row of ``step``.

        The file is rewritten atomically (temporary file + rename), so a crash leaves either the old or the new
        row, never none.
        """
        if not self.is_main or not extra:
            return
        import math

        from stare_lab.runs import RunWriter

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
