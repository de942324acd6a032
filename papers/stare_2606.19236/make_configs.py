"""Write the trainer configs of the STARE paper's settings (one YAML per setting × method) into ``configs/``.

This script is the single source of the 18 files (6 settings × GRPO-ds / STARE-O1 / STARE-C2): the trainer's
config loader has no include mechanism, so the shared values live here once. Every leaf value carries a comment:
``# paper`` (docs/theory.md §4, the paper's stated training defaults) or ``# our choice`` (not published; ours).
Regenerate with ``python papers/stare_2606.19236/make_configs.py``; ``tests/trainer/test_evaluate_paper_configs.py``
checks that the committed files equal this script's output and load with ``trainer.config.load_trainer_config``.
Evaluation settings (Table 2 protocol) are in ``eval_short_cot.yaml`` / ``eval_long_cot.yaml`` /
``eval_tool_use.yaml`` (``trainer.evaluation.evaluate.EvalConfig``; the tool-use one carries the same ``tool`` section as the
tool-use training configs, so the TIR setting is evaluated with tools).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIG_DIR = HERE / "configs"

PAPER = "paper"
OURS = "our choice"

#: setting key → setting, model label, local model directory (its architecture for ``stare-lab plan``: ``models/``
#: here holds the public config.json of each), size class, max response tokens + note, TP size, and the memory
#: settings a setting needs to fit its cluster (``offload_during_rollout``, ``micro_batch_max_tokens``)
SETTINGS: dict[str, dict[str, Any]] = {
    "short_cot_qwen2.5-math-7b": {
        "setting": "short_cot", "model": "Qwen2.5-Math-7B", "path": "models/Qwen2.5-Math-7B", "large": False,
        "response": (3072, PAPER), "tp": 1, "eval": "eval_short_cot.yaml",
    },
    "short_cot_qwen2.5-14b-instruct": {
        "setting": "short_cot", "model": "Qwen2.5-14B-Instruct", "path": "models/Qwen2.5-14B-Instruct", "large": True,
        "response": (3072, PAPER), "tp": 2, "eval": "eval_short_cot.yaml",
    },
    "short_cot_qwen2.5-32b": {
        "setting": "short_cot", "model": "Qwen2.5-32B-Base", "path": "models/Qwen2.5-32B", "large": True,
        "response": (3072, PAPER), "tp": 4, "eval": "eval_short_cot.yaml",
        # stare-lab plan on 2 nodes x 8 x 80 GB: without these the rollout phase peaks at 78.7 GiB (DeepSpeed's
        # 37 GiB of model states next to vLLM's 40 GiB pool) and the update at 73.7 GiB; see docs/trainer.md
        "offload_during_rollout": True, "micro_batch_max_tokens": 8192,
    },
    "long_cot_r1-distill-qwen-1.5b": {
        "setting": "long_cot", "model": "DeepSeek-R1-Distill-Qwen-1.5B",
        "path": "models/DeepSeek-R1-Distill-Qwen-1.5B", "large": False, "response": (8192, OURS), "tp": 1,
        "eval": "eval_long_cot.yaml",
    },
    "long_cot_qwen3-8b-base": {
        "setting": "long_cot", "model": "Qwen3-8B-Base", "path": "models/Qwen3-8B-Base", "large": False,
        "response": (8192, OURS), "tp": 1, "eval": "eval_long_cot.yaml",
    },
    "tool_use_qwen2.5-7b-retool": {
        "setting": "tool_use", "model": "Qwen2.5-7B-Base-TIR (ReTool-2K cold start)",
        "path": "models/Qwen2.5-7B-ReTool-2K-SFT", "large": False, "response": (8192, OURS), "tp": 1,
        "eval": "eval_tool_use.yaml",
    },
}

#: method key → (trainer method label, loss_mode, STARE variant or None)
METHODS = {"grpo-ds": ("grpo-ds", "grpo", None), "stare-o1": ("o1", "stare", "O1"), "stare-c2": ("c2", "stare", "C2")}


def _scalar(v: Any) -> str:
    """YAML text of a scalar or list (floats like 1e-6 as ``1.0e-06``: PyYAML reads ``1e-06`` as a string)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != 0 and abs(v) < 1e-3:
        mant, exp = f"{v:e}".split("e")
        return f"{float(mant)!r}e{exp}"
    if isinstance(v, (str, list)):
        return json.dumps(v)
    return repr(v)


def build(setting_key: str, method_key: str) -> list[tuple[str, list[tuple[str, Any, str]]]]:
    """Sections of one config: ``[(section or "", [(key, value, note)])]``; note is ``paper`` or ``our choice``."""
    s = SETTINGS[setting_key]
    label, loss_mode, variant = METHODS[method_key]
    w, m = (1.05, 0.95) if s["large"] else (1.1, 0.9)
    top = [
        ("method", label, PAPER),
        ("seed", 0, OURS),
        ("out_dir", f"runs/stare_2606.19236/{setting_key}/{method_key}", OURS),
    ]
    model = [
        ("path", s["path"], OURS),  # a local copy of the Hugging Face checkpoint (runs never download)
        ("dtype", "bfloat16", OURS),
        ("gradient_checkpointing", True, OURS),
    ]
    data = [
        ("train_files", ["data/dapo-math-17k.parquet"], OURS),  # training set: not stated in the paper
        ("prompt_key", "prompt", OURS),  # verl's RL format: a chat list ...
        ("answer_key", "reward_model.ground_truth", OURS),  # ... and the nested gold answer
        ("use_chat_template", True, OURS),
        ("max_prompt_length", 1024, PAPER),
        ("truncation", "left", OURS),
    ]
    rollout = [
        ("engine", "vllm", PAPER),
        ("n", 8, PAPER),
        ("temperature", 1.0, PAPER),
        ("top_p", 1.0, PAPER),
        ("max_response_length", s["response"][0], s["response"][1]),
        ("tensor_parallel_size", s["tp"], OURS),
        ("gpu_memory_utilization", 0.5, OURS),
        ("enable_sleep_mode", True, OURS),
    ]
    algorithm = [
        ("advantage_estimator", "grpo", PAPER),
        ("adv_eps", 1e-6, PAPER),
        ("dynamic_sampling", True, PAPER),
        ("max_gen_rounds", 3, OURS),
        ("overlong", "keep", OURS),
    ]
    reward = [("kind", "math", PAPER), ("format_reward", 0.0, OURS), ("timeout_s", 5.0, OURS)]
    loss = [
        ("loss_mode", loss_mode, PAPER),
        ("clip_ratio_low", 0.2, PAPER),
        ("clip_ratio_high", 0.28, PAPER),
        ("clip_ratio_c", 10.0, PAPER),
        ("loss_agg_mode", "token-mean", PAPER),
        ("entropy_coeff", 0.0, PAPER),
        ("kl_coef", 0.0, PAPER),
    ]
    stare = []
    if variant is not None:
        stare = [
            ("variant", variant, PAPER),
            ("top_p_ratio", 0.1, PAPER),
            ("reweight_w", w, PAPER),
            ("reweight_m", m, PAPER),
            ("target_entropy", 0.3, PAPER),
            ("adaptive", False, PAPER),
            ("gate", "entropy", PAPER),
            ("scope", "global", OURS),  # the reference implementation selects per micro-batch ("microbatch")
        ]
    optim = [
        ("lr", 1e-6, PAPER),
        ("schedule", "constant", PAPER),
        ("warmup_steps", 0, OURS),
        ("weight_decay", 0.0, OURS),
        ("grad_clip", 1.0, PAPER),
        ("train_batch_size", 64, PAPER),
        ("micro_batch_max_tokens", s.get("micro_batch_max_tokens", 16384), OURS),
    ]
    deepspeed = [("zero_stage", 3, OURS), ("precision", "bf16", OURS)]
    if s.get("offload_during_rollout"):  # DeepSpeed offloads the states of its FusedAdam only
        optim.append(("optimizer", "deepspeed_adamw", OURS))
        deepspeed.append(("offload_during_rollout", True, OURS))
    schedule = [
        ("total_steps", 1000, OURS),
        ("save_freq", 50, OURS),
        ("eval_freq", 10, PAPER),
        ("eval_config", f"papers/stare_2606.19236/{s['eval']}", OURS),
    ]
    sections = [("", top), ("model", model), ("data", data), ("rollout", rollout), ("algorithm", algorithm),
                ("reward", reward), ("loss", loss)]
    if stare:
        sections.append(("loss.stare", stare))
    sections += [("optim", optim), ("deepspeed", deepspeed), ("schedule", schedule)]
    if s["setting"] == "tool_use":  # trainer.tools.tool_rollout.ToolUseConfig: ReTool's tags (paper), limits (ours)
        sections += [("tool", TOOL), ("tool.sandbox", TOOL_SANDBOX)]
    return sections


#: The ``tool`` section of the tool-use configs (training and evaluation): ReTool's tags (paper), limits (ours).
TOOL = [
    ("code_open", "<code>", PAPER),
    ("code_close", "</code>", PAPER),
    ("interpreter_template", "<interpreter>\n{output}\n</interpreter>\n", PAPER),
    ("max_tool_calls", 8, OURS),
    ("max_rounds", 16, OURS),
    ("max_output_chars", 1024, OURS),
]
TOOL_SANDBOX = [
    ("timeout_s", 10.0, OURS),
    ("memory_mb", 2048, OURS),
    ("max_output_bytes", 8192, OURS),
    ("workdir_mb", 64, OURS),
    ("site_packages", True, OURS),
    ("max_workers", 8, OURS),
]


def _section_lines(sections: list[tuple[str, list[tuple[str, Any, str]]]]) -> list[str]:
    """YAML lines of ``(section, [(key, value, note)])`` pairs (a nested ``a.b`` section directly after ``a``)."""
    lines = []
    for section, items in sections:
        indent = ""
        if section:
            parts = section.split(".")
            if len(parts) == 1:
                lines.append(f"{section}:")
                indent = "  "
            else:
                lines.append(f"  {parts[1]}:")
                indent = "    "
        for key, value, note in items:
            lines.append(f"{indent}{key}: {_scalar(value)}  # {note}")
    return lines


def render(setting_key: str, method_key: str) -> str:
    """The YAML text of one config (every leaf commented ``# paper`` or ``# our choice``)."""
    s = SETTINGS[setting_key]
    method = {"grpo-ds": "GRPO-ds (STARE disabled)", "stare-o1": "STARE-O1", "stare-c2": "STARE-C2"}[method_key]
    lines = [
        f"# STARE (arXiv 2606.19236) — {s['setting'].replace('_', ' ')}, {s['model']}, {method}.",
        "# Generated by papers/stare_2606.19236/make_configs.py (edit that script, not this file).",
        "# '# paper': docs/theory.md §4 (the paper's training defaults); '# our choice': not published, ours.",
    ]
    if s["setting"] == "tool_use":
        lines.append("# Tool use: multi-turn code-interpreter rollouts (trainer/tools/tool_rollout.py, the `tool` section): code")
        lines.append("# in <code>…</code> runs in the bubblewrap sandbox, its output comes back as an <interpreter> turn")
        lines.append("# that is masked out of the loss, the entropy statistics and the STARE selection.")
    lines += _section_lines(build(setting_key, method_key))
    return "\n".join(lines) + "\n"


EVAL_FILES = {
    "eval_short_cot.yaml": [
        "# Table 2 evaluation protocol (docs/theory.md §4-5): avg@32 for AIME24/25 and AMC23, avg@4 for MATH-500,",
        "# Minerva, OlympiadBench (n: null = these per-benchmark defaults), T = 1.0, top-p 0.7.",
        "# Format: trainer.evaluation.evaluate.EvalConfig (stare-lab evaluate --config FILE).",
        'benchmarks: ["aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"]  # paper',
        "n: null  # paper",
        "temperature: 1.0  # paper",
        "top_p: 0.7  # paper",
        "max_tokens: 3072  # paper (max response length of the Short CoT runs)",
        "max_prompt_length: 1024  # paper",
        "seed: 0  # our choice",
        "timeout_s: 5.0  # our choice",
    ],
    "eval_long_cot.yaml": [
        "# Table 2 evaluation protocol for Long CoT (max_tokens is our choice, as in the training configs).",
        'benchmarks: ["aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"]  # paper',
        "n: null  # paper",
        "temperature: 1.0  # paper",
        "top_p: 0.7  # paper",
        "max_tokens: 8192  # our choice",
        "max_prompt_length: 1024  # paper",
        "seed: 0  # our choice",
        "timeout_s: 5.0  # our choice",
    ],
}


EVAL_FILES["eval_tool_use.yaml"] = [
    "# Table 2 evaluation protocol for tool use (TIR): as eval_long_cot.yaml, with multi-turn tool rollouts — the",
    "# same `tool` section as the tool-use training configs (code in <code>…</code> runs in the sandbox).",
    *EVAL_FILES["eval_long_cot.yaml"][1:],
    *_section_lines([("tool", TOOL), ("tool.sandbox", TOOL_SANDBOX)]),
]


def all_files() -> dict[str, str]:
    """Relative path → text of every generated file."""
    out = {f"configs/{s}_{m}.yaml": render(s, m) for s in SETTINGS for m in METHODS}
    out.update({name: "\n".join(lines) + "\n" for name, lines in EVAL_FILES.items()})
    return out


def main() -> int:
    for rel, text in all_files().items():
        path = HERE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
