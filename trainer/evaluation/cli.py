"""``stare-lab evaluate``: the command line of :mod:`trainer.evaluation.evaluate` (wired by ``trainer/cli.py``).

``stare-lab evaluate --model DIR [--benchmarks aime24,...|all] [--n K] [--temperature T] [--top-p P]
[--max-tokens N] [--config EVAL.yaml] [--limit N] [--data-dir DIR] [--file NAME=SOURCE ...] [--rel-tol R]
[--engine vllm|hf] [--out DIR] [--resume | --overwrite] [--verbose]``. Settings:
:class:`~trainer.evaluation.evaluate.EvalConfig` defaults < ``--config`` < options. ``--temperature 0`` decodes
greedily (one response per problem). A config with a ``tool`` section evaluates with multi-turn tool rollouts in
the sandbox (the engine of tool-use training). The problems come from the benchmark copies bundled with the
package unless ``--data-dir`` / ``--file`` say otherwise.

``--out`` follows the one policy of every command (:func:`stare_lab.platform.outdir.claim_out`), under the directory's lock
(:func:`stare_lab.platform.runlock.lock_dir`): an ``--out`` that holds an evaluation is refused (and left untouched) unless
``--overwrite`` (removes only an evaluation's files, :data:`EVAL_OUTPUTS`) or ``--resume`` (a finished evaluation
with the same model and settings is reported again, nothing is recomputed; other settings, or a model whose files
changed since (:func:`model_fingerprint`, recorded as ``model_fingerprint``), are refused; an unfinished one —
results are written at the end — is run again). Engine logs (vLLM, transformers) are hidden as
in ``stare-lab train`` unless ``--verbose`` (:func:`trainer.output.configure_output`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from stare_lab.config import from_dict, load_yaml, to_dict
from stare_lab.errors import ConfigError, RunError

from trainer.evaluation.benchmarks import BENCHMARKS, canonical_name, resolve_benchmarks
from trainer.evaluation.evaluate import EvalConfig, evaluate_engine, load_problems

__all__ = ["add_arguments", "config_from_args", "check_results_out", "model_fingerprint", "EVAL_OUTPUTS", "main"]

#: CLI option → EvalConfig field, for options that default to the config's value.
_CLI_FIELDS = {
    "n": "n", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_tokens",
    "max_prompt_length": "max_prompt_length", "seed": "seed", "limit": "limit", "data_dir": "data_dir",
    "timeout_s": "timeout_s", "problem_key": "problem_key", "answer_key": "answer_key", "rel_tol": "rel_tol",
}

#: Files of a finished evaluation in ``--out``.
RESULT_FILES = ("eval.json", "samples.jsonl")
#: What an evaluation writes in ``--out`` (``--overwrite`` removes exactly these).
EVAL_OUTPUTS = RESULT_FILES + ("eval.json.partial", "samples.jsonl.partial")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``stare-lab evaluate`` options to ``parser``.

    Settings come from the :class:`EvalConfig` defaults, then ``--config FILE.yaml`` (an EvalConfig mapping, e.g.
    ``papers/stare_2606.19236/eval_short_cot.yaml``), then the options given on the command line.
    """
    d = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    parser.add_argument("--model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model)")
    parser.add_argument("--config", default=None,
                        help="EvalConfig YAML (options below override it); a `tool` section evaluates with "
                             "multi-turn tool rollouts in the sandbox, e.g. papers/stare_2606.19236/eval_tool_use.yaml")
    parser.add_argument("--benchmarks", default=None,
                        help=f"comma-separated: {', '.join(BENCHMARKS)} (Table 2; 'all' = these six, the default), "
                             "gsm8k (GSM8K test), or any NAME given a source with --file NAME=SOURCE")
    parser.add_argument("--n", type=int, default=None,
                        help="samples per problem for every benchmark (default: 32 for AIME24/25, AMC23; 4 else)")
    parser.add_argument("--temperature", type=float, default=None, help=f"default {d['temperature']}")
    parser.add_argument("--top-p", type=float, default=None, help=f"default {d['top_p']}")
    parser.add_argument("--top-k", type=int, default=None, help=f"default {d['top_k']} (off)")
    parser.add_argument("--max-tokens", type=int, default=None, help=f"max new tokens (default {d['max_tokens']})")
    parser.add_argument("--max-prompt-length", type=int, default=None, help=f"default {d['max_prompt_length']}")
    parser.add_argument("--seed", type=int, default=None, help=f"default {d['seed']}")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    parser.add_argument("--data-dir", default=None,
                        help="directory with NAME/NAME.jsonl or NAME.jsonl files (default: $STARE_LAB_BENCHMARK_DIR if "
                             "set, else the copies bundled with the package, trainer/assets/benchmarks)")
    parser.add_argument("--file", action="append", default=[], metavar="NAME=SOURCE",
                        help="read benchmark NAME from SOURCE (JSONL, Parquet or hf:DATASET:SPLIT); any NAME — one "
                             "that is not built in must also be listed in --benchmarks; repeatable")
    parser.add_argument("--problem-key", default=None, help="record field of the problem (default problem)")
    parser.add_argument("--answer-key", default=None, help="record field of the gold answer (default answer)")
    parser.add_argument("--rel-tol", type=float, default=None,
                        help="also accept numbers within this relative distance, integers included (default: none — "
                             "math-verify's rules, as the STARE reference grades; e.g. 1e-4 as the Qwen2.5-Math "
                             "harness)")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="rollout engine (default vllm)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="engine dtype (default: bfloat16 on GPU, float32 on CPU)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallelism")
    parser.add_argument("--timeout-s", type=float, default=None, help=f"grading limit per item (default "
                                                                        f"{d['timeout_s']} s)")
    parser.add_argument("--no-chat-template", action="store_true", help="plain prompts even if a template exists")
    parser.add_argument("--out", default="runs/eval", help="output directory (eval.json, samples.jsonl)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results already in --out (without it such an --out is refused)")
    parser.add_argument("--resume", action="store_true",
                        help="an --out with a finished evaluation of the same model and settings: report it again "
                             "without recomputing (other settings are refused)")
    parser.add_argument("--verbose", dest="eval_verbose", action="store_true",
                        help="also show the engines' logs (vLLM, transformers), hidden by default as in train")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The :class:`EvalConfig` of a parsed command line (defaults < ``--config`` < explicit options).

    Raises:
        ConfigError: a bad config file or option value (naming the key), a malformed ``--file``.
    """
    data: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    for opt, field in _CLI_FIELDS.items():
        value = getattr(args, opt, None)
        if value is not None:
            data[field] = value
    for item in getattr(args, "file", None) or []:
        name, sep, source = item.partition("=")
        if not sep or not name.strip() or not source:
            raise ConfigError(f"--file {item!r} must look like NAME=SOURCE (e.g. aime24=data/aime24.parquet)")
        data.setdefault("files", {})[canonical_name(name)] = source
    if getattr(args, "benchmarks", None):
        data["benchmarks"] = resolve_benchmarks(args.benchmarks, custom=data.get("files", {}))
    if getattr(args, "no_chat_template", False):
        data["use_chat_template"] = False
    return from_dict(EvalConfig, to_dict(data), prefix="eval")


def model_fingerprint(model: str | Path) -> str:
    """sha256 over the sorted (name, size, mtime_ns) of the regular files at the top of the model directory
    (weights, config, tokenizer; an evaluation's own files and hidden files are left out). Cheap: nothing is read."""
    import hashlib

    h = hashlib.sha256()
    for entry in sorted(os.scandir(model), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name in EVAL_OUTPUTS or not entry.is_file():
            continue
        st = entry.stat()
        h.update(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def check_results_out(out: str | Path, overwrite: bool, resume: bool = False, model: str | None = None,
                      cfg: EvalConfig | None = None, fingerprint: str | None = None) -> dict[str, Any] | None:
    """The ``--out`` policy of an evaluation (module docstring; call it holding ``out``'s lock): refuse an ``--out``
    with an evaluation's files unless ``overwrite`` (they are removed) or ``resume``. Returns the finished
    ``eval.json`` to report again when ``resume`` finds one of the same ``model``, ``cfg`` and model
    ``fingerprint`` (:func:`model_fingerprint`), else None. An ``eval.json`` without ``model_fingerprint`` (written
    before it was recorded) is accepted on its path and settings alone.

    Raises:
        RunError: ``--out`` holds an evaluation and neither option is given (nothing is touched); ``resume`` of an
            evaluation with another model, other settings (naming the first differing setting) or a model whose
            files changed since.
        ConfigError: both options.
    """
    from stare_lab.platform.files import read_json
    from stare_lab.platform.outdir import claim_out

    mode = claim_out(out, EVAL_OUTPUTS, source=None, resume=resume, overwrite=overwrite)
    done = Path(out) / "eval.json"
    if mode != "resume" or not done.is_file():
        return None
    old = read_json(done, "evaluation results", RunError)
    old_settings = {k: v for k, v in (old.get("settings") or {}).items() if k not in ("wall_s", "dp_size")}
    new_settings = to_dict(cfg) if cfg is not None else {}
    new_settings["k"] = {b: cfg.samples_for(b) for b in cfg.benchmarks} if cfg is not None else None
    if model is not None and old.get("model") != model:
        raise RunError(f"--out {str(out)!r} holds the evaluation of model {old.get('model')!r}, not {model!r}; "
                       "pass --overwrite to replace it, or choose another --out")
    old_fp = old.get("model_fingerprint")
    if fingerprint is not None and old_fp is not None and old_fp != fingerprint:
        raise RunError(f"--resume: the model at {model!r} changed since the evaluation in {str(out)!r} (its files "
                       "differ): pass --overwrite to re-evaluate")
    for key in sorted(set(old_settings) | set(new_settings)):
        if old_settings.get(key) != new_settings.get(key):
            raise RunError(f"--out {str(out)!r} holds an evaluation with {key}={old_settings.get(key)!r}, this one "
                           f"has {key}={new_settings.get(key)!r}; pass --overwrite to replace it, or choose another "
                           "--out")
    return old


def _check_model(args: argparse.Namespace, cfg: EvalConfig) -> None:
    """Cheap checks of ``--model`` before anything is written or removed.

    Raises:
        ConfigError: not a directory, no ``config.json``, or (vLLM) lengths beyond the model's positions.
    """
    from trainer.paths import model_max_positions

    if not Path(args.model).is_dir():
        raise ConfigError(f"--model {args.model!r} is not a directory")
    model_max = model_max_positions(args.model, option="--model")
    max_len = cfg.max_prompt_length + cfg.max_tokens
    if args.engine != "hf" and model_max is not None and max_len > model_max:
        raise ConfigError(
            f"--max-prompt-length {cfg.max_prompt_length} + --max-tokens {cfg.max_tokens} = {max_len} exceeds the "
            f"model's max_position_embeddings={model_max}; lower one of them"
        )


def _make_engine(args: argparse.Namespace, cfg: EvalConfig) -> tuple[Any, Any]:
    import torch

    from trainer.engines.rollout import HFEngine, VLLMEngine

    tok = args.tokenizer or args.model
    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    if args.engine == "hf":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        engine = HFEngine(args.model, tok, device=device, dtype=dtype)
    else:
        max_len = cfg.max_prompt_length + cfg.max_tokens
        engine = VLLMEngine(args.model, tok, dtype=dtype, seed=cfg.seed, tensor_parallel_size=args.tensor_parallel_size,
                            max_model_len=max_len)
    return engine, engine.tokenizer


def main(args: argparse.Namespace) -> int:
    """Run ``stare-lab evaluate``; prints one line per benchmark and the average. Returns 0.

    Raises:
        ConfigError: bad options (naming the option and the allowed values), ``--model`` not a Hugging Face model
            directory (no ``config.json``), lengths beyond the model's positions.
        DataError: missing benchmark data.
        RunError: ``--out`` exists as a file or cannot be created, or already holds results without
            ``--overwrite`` (checked before the model is loaded; nothing is written then).
    """
    from stare_lab.platform.runlock import lock_dir

    from trainer.output import configure_output
    from trainer.paths import check_out_dir

    configure_output(bool(getattr(args, "eval_verbose", False) or getattr(args, "verbose", False)))
    cfg = config_from_args(args)
    check_out_dir(args.out, option="--out")  # a bad --out fails now, not after all the generation
    resume, overwrite = bool(getattr(args, "resume", False)), bool(getattr(args, "overwrite", False))
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other: --resume reports the finished evaluation "
                          "again, --overwrite replaces it")
    from stare_lab.platform.outdir import claim_out

    claim_out(args.out, EVAL_OUTPUTS, source=None, resume=resume, overwrite=overwrite, check_only=True)
    problems = {b: load_problems(cfg, b) for b in cfg.benchmarks}  # fail on bad data before loading the model
    _check_model(args, cfg)
    # one writer per --out; an --out created here is removed again if nothing was written (lock_dir)
    with lock_dir(args.out, command=f"stare-lab evaluate --out {args.out}", option="--out"):
        fingerprint = model_fingerprint(args.model)  # before loading: the files the evaluation reads
        result = check_results_out(args.out, overwrite, resume, model=str(args.model), cfg=cfg,
                                   fingerprint=fingerprint)
        if result is None:
            engine, tokenizer = _make_engine(args, cfg)
            result = evaluate_engine(engine, tokenizer, cfg, out_dir=args.out, model_name=str(args.model),
                                     problems=problems, model_fingerprint=fingerprint)
        else:
            print(f"{args.out} already holds this evaluation (same model and settings): not recomputed")
    for name, m in result["benchmarks"].items():
        k = m["k"]
        tools = f"  tool calls {m['tool_calls_per_response']:.2f}/response" if "tool_calls_per_response" in m else ""
        print(f"{name:14s} avg@{k} {100 * m['avg@k']:5.1f}  pass@{k} {100 * m['pass@k']:5.1f}  "
              f"maj@{k} {100 * m['maj@k']:5.1f}  tokens {m['mean_response_tokens']:7.1f}  "
              f"no-boxed {100 * m['frac_no_boxed']:5.1f}%  ({m['n_problems']} problems){tools}")
    if result["average"] is not None:
        print(f"{'average':14s} {100 * result['average']:5.1f}")
    print(f"wrote {Path(args.out) / 'eval.json'} and {Path(args.out) / 'samples.jsonl'}")
    return 0
