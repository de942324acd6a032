#!/usr/bin/env bash
# One short GPU check of the trainer (see scripts/gpu_check.py): 2 colocated steps, vLLM (CUDA) + DeepSpeed ZeRO-3
# bf16, sync check, tokens/s. Installs nothing: run it in an environment with CUDA torch, the CUDA `vllm` build,
# deepspeed, transformers and math-verify (e.g. `pip install -e ".[trainer,gpu]"` done beforehand).
# Usage: bash scripts/gpu_check.sh [--model DIR] [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # in-process engine: the trainer syncs weights into it directly
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
"$PY" -c "import torch, vllm, deepspeed, transformers; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, 'vllm', vllm.__version__, 'deepspeed', deepspeed.__version__, \
torch.cuda.get_device_name(0))"
exec timeout 540 "$PY" scripts/gpu_check.py "$@"
