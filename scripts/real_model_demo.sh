#!/usr/bin/env bash
# GRPO vs STARE with SmolLM2-135M-Instruct on GSM8K prompts, offline on CPU (see scripts/real_model_demo.py).
# Usage: bash scripts/real_model_demo.sh [--steps 10] [--out runs/real_demo] [--wheel FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} DS_ACCELERATOR=cpu VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
export VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}
PY=${PYTHON:-.venv/bin/python}
exec "$PY" scripts/real_model_demo.py "$@"
