"""The paths a command reads and writes: the run's output directory and a model directory's limits. Shared by the
run (:mod:`trainer.run`) and evaluation (:mod:`trainer.evaluation`).
"""

from __future__ import annotations

import os
from pathlib import Path

from stare_lab.errors import ConfigError, RunError
from stare_lab.platform.files import read_json

__all__ = ["check_out_dir", "make_out_dir", "model_max_positions"]


def check_out_dir(out: str | Path, option: str = "out_dir") -> None:
    """Check that ``out`` is a directory or can be created, without creating anything.

    Raises:
        RunError: ``out`` exists and is not a directory, or its nearest existing parent is not a writable
            directory.
    """
    p = Path(out)
    if str(out) == "":
        raise RunError(f"{option} is empty; give a run directory")
    if p.exists():
        if not p.is_dir():
            raise RunError(f"{option}={str(out)!r} exists and is not a directory")
        return
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunError(f"{option}={str(out)!r} cannot be created: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunError(f"{option}={str(out)!r} cannot be created: {str(parent)!r} is not writable")


def make_out_dir(out: str | Path, option: str = "out_dir") -> Path:
    """Create ``out`` (with parents). Raises :class:`RunError` naming ``option`` if that fails."""
    check_out_dir(out, option)
    p = Path(out)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(f"{option}={str(out)!r} cannot be created: {err.strerror or err}") from None
    return p


def model_max_positions(model_dir: str | Path, option: str = "model.path") -> int | None:
    """``max_position_embeddings`` from ``model_dir/config.json`` (``None`` if absent or unreadable).

    Raises:
        ConfigError: ``model_dir`` has no ``config.json`` (not a Hugging Face model directory).
    """
    cfg_file = Path(model_dir) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{option}={str(model_dir)!r} has no config.json (not a Hugging Face model directory)")
    data = read_json(cfg_file, "model config", ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{str(cfg_file)!r} must hold a JSON object")
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if isinstance(data.get(key), int):
            return int(data[key])
    text_cfg = data.get("text_config")
    if isinstance(text_cfg, dict) and isinstance(text_cfg.get("max_position_embeddings"), int):
        return int(text_cfg["max_position_embeddings"])
    return None
