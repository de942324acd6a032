#!/usr/bin/env bash
# The trainer's GPU check (scripts/gpu_check.py), sized for one GPU machine call: one H200, <= 8 minutes, no
# network. The machine's image has torch (CUDA), transformers, accelerate, safetensors, tokenizers, pyarrow, but no
# DeepSpeed and no vLLM: DeepSpeed and the packages it imports come from wheels/ (prepared on a machine with a
# registry by `bash scripts/prepare_gpu_wheels.sh`, ~6 MiB, git-ignored, carried along with the check); a wheel is
# unpacked onto the path only when the image lacks that package or has an older version. vLLM's CUDA build
# (hundreds of MB) cannot travel, so the check trains with the HF rollout engine (docs/trainer.md).
# With --trl first, it runs the TRL integration's check instead (scripts/gpu_check_trl.py: TRL + STARE on a
# Qwen2.5-0.5B-shaped model; TRL and datasets come from wheels/ too).
# Usage: bash scripts/gpu_check.sh [--trl] [--dry-run] [--out DIR]     (--dry-run: the same check, small, on CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=scripts/gpu_check.py
if [ "${1:-}" = --trl ]; then CHECK=scripts/gpu_check_trl.py; shift; fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python  # here; the GPU image has no .venv
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 DS_BUILD_OPS=0
SITE=$(mktemp -d)/site
if [ -d wheels ]; then
  "$PY" - "$SITE" wheels <<'PYEOF'
import sys, zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from packaging.version import Version

site, wheels = Path(sys.argv[1]), Path(sys.argv[2])
site.mkdir(parents=True, exist_ok=True)
for whl in sorted(wheels.glob("*.whl")):
    name, ver = whl.name.split("-")[:2]
    try:
        have = version(name.replace("_", "-"))
    except PackageNotFoundError:
        have = None
    if have is not None and Version(have) >= Version(ver):
        print(f"wheels: {name} {have} already installed (wheel {ver} not used)")
        continue
    zipfile.ZipFile(whl).extractall(site)
    print(f"wheels: {name} {ver} unpacked" + (f" (image has {have})" if have else ""))
PYEOF
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$PY" = .venv/bin/python ]; then  # the dry run here: reuse the venv's op builds (DeepSpeed's shm op, ~60 s)
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}
else
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$(dirname "$SITE")/torch_extensions}
fi
exec timeout 480 "$PY" "$CHECK" "$@"
