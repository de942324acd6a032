"""Helpers (not collected) for the trainer tests that run the real pipeline in subprocesses with a timeout:
the CPU environment, one run of ``python -m trainer.cli CONFIG`` (or a launcher), the metrics rows.

The tests run with ``--import-mode=importlib`` (this folder is not on ``sys.path``): load it with
``importlib.util.spec_from_file_location``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900


def env(**extra: str) -> dict:
    """The CPU environment of a trainer subprocess (no inherited launcher variables)."""
    out = dict(os.environ)
    out.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    out.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "STARE_LAB_FAULT"):
        out.pop(k, None)
    out.update(extra)
    return out


def run(cmd: list[str], *, cwd: Path = REPO, rc: int = 0, environ: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``; assert its exit code (the output tails in the message otherwise)."""
    proc = subprocess.run(cmd, cwd=cwd, env=environ or env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != rc:
        raise AssertionError(f"rc={proc.returncode} (expected {rc}): {' '.join(map(str, cmd))}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def train(cfg: dict, tmp: Path, *, launcher: list[str] | None = None, rc: int = 0,
          environ: dict | None = None) -> subprocess.CompletedProcess:
    """``[launcher] python -m trainer.cli CFG.yaml`` with ``cfg`` written to ``tmp``."""
    path = tmp / f"cfg_{abs(hash(json.dumps(cfg, sort_keys=True)))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return run((launcher or [sys.executable]) + ["-m", "trainer.cli", str(path)], rc=rc, environ=environ)


def rows(out: Path) -> list[dict]:
    """The metrics rows of run directory ``out``."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
