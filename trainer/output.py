"""What the trainer's commands show on the terminal: the per-step lines and the trainer's own logs, with the
engines' chatter (vLLM, DeepSpeed, transformers) hidden unless ``--verbose`` (:func:`configure_output`, used by
``stare-lab train`` and ``stare-lab plan``).
"""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_output", "ENGINE_LOGGERS"]

#: Loggers of the engines whose INFO/WARNING chatter (environment notices, per-call reports) is hidden unless
#: ``--verbose``: vLLM (through ``VLLM_LOGGING_LEVEL``, read when vLLM is imported) and DeepSpeed.
ENGINE_LOGGERS = ("DeepSpeed", "deepspeed", "torch.distributed", "transformers", "accelerate")
#: The logger of the per-step lines people read (:mod:`trainer.run.runlog`).
PROGRESS_LOGGER = "trainer.progress"


class _BelowLevel(logging.Filter):
    """Drop records below ``level`` from the loggers named ``names`` (and their children); a filter survives the
    engines' own ``setLevel`` calls at import."""

    def __init__(self, level: int, names: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.level, self.names = level, names

    def filter(self, record: logging.LogRecord) -> bool:
        if self.names and not any(record.name == n or record.name.startswith(n + ".") for n in self.names):
            return True
        return record.levelno >= self.level


class _DropRotaryReload(logging.Filter):
    """Drop vLLM's "RotaryEmbedding: Failed to load weights" of every weight sync: the rotary cos/sin cache is
    derived from the config, not a checkpoint tensor, so a reload has nothing to load for it and keeps the cache
    (harmless; the engine's log-probs equal the trainer's after each sync — tests/trainer/test_pipeline.py). Any
    other layer that fails to load still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.endswith("Failed to load weights") and msg.split(":", 1)[0].endswith("RotaryEmbedding"))


def configure_output(verbose: bool = False) -> None:
    """What ``stare-lab train`` shows: on rank 0 the per-step lines (:data:`PROGRESS_LOGGER`,
    printed as they are), the trainer's own INFO/WARNING lines and the end-of-run report; engine noise (vLLM and
    DeepSpeed INFO/WARNING logs, FutureWarnings, transformers' progress bars) only with ``verbose``; other ranks
    show warnings and errors only. vLLM's reload warning for rotary embeddings is always dropped
    (:class:`_DropRotaryReload`). Call it before vLLM is imported (its log level is read then)."""
    import os
    import warnings


    rank = int(os.environ.get("RANK", "0"))
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_DropRotaryReload())
    prog = logging.getLogger(PROGRESS_LOGGER)
    if not prog.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        prog.addHandler(handler)
    prog.propagate = False
    prog.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if verbose:
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in ENGINE_LOGGERS:
        logging.getLogger(name).addFilter(_BelowLevel(logging.ERROR))
    for handler in logging.getLogger().handlers:  # records that reach the root before vLLM configures its logger
        handler.addFilter(_BelowLevel(logging.ERROR, ("vllm", *ENGINE_LOGGERS)))
    warnings.filterwarnings("ignore", category=FutureWarning)
    if rank != 0:
        logging.getLogger("trainer").setLevel(logging.WARNING)
