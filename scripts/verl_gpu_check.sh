#!/usr/bin/env bash
# verl + STARE on one GPU in one short call (docs/integrations-verl.md "A GPU run"): verl 0.9.1's own fit loop,
# TransferQueue and FSDP2 actor worker on CUDA with a scripted rollout (no vLLM), 20 steps a run, an 8-layer model
# built locally: gate-off parity with verl's `vanilla` loss bit for bit, ω at the worker against a brute-force
# selection, and a SIGKILL right after a checkpoint then a resume (one row per step, parameters bit for bit) — the
# tests of tests/integrations/verl/test_verl_real.py with STARE_VERL_DEVICE=cuda STARE_VERL_STEPS=20.
#
# Needs verl 0.9.1, Ray, TransferQueue and their small dependencies importable. The lent GPU machine (torch 2.11,
# transformers 5.17, no network, at most 64 MiB carried) cannot get them: `import verl` imports Ray, and Ray's own
# wheel is 75.6 MiB (scripts/prepare_gpu_verl_wheels.sh measures the set: 80.7 MiB). There the script stops with
# that reason (exit 2). On a GPU machine with a package index: pip install "verl==0.9.1" transferqueue (no vLLM),
# then this script.
# Usage: bash scripts/verl_gpu_check.sh [--dry-run] [--out DIR] [-- PYTEST_ARGS…]
#   --dry-run: the same tests on CPU, 4 steps (what CI runs as tests/integrations/verl/test_verl_real.py)
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUT=.
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "verl_gpu_check: unknown argument $1 (usage: [--dry-run] [--out DIR] [-- PYTEST_ARGS])" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv-verl/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv-verl/bin/python  # here; the GPU image has no venv
if [ -d wheels-verl ]; then  # carried wheels (scripts/prepare_gpu_verl_wheels.sh), installed beside the image's
  SITE=$(mktemp -d)/site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" wheels-verl/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} HF_HUB_OFFLINE=1 \
       TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if ! why=$("$PY" -c "import ray, transfer_queue, verl" 2>&1 | tail -1); then
  echo "verl_gpu_check: cannot run: $why. verl imports Ray at 'import verl' (verl/__init__.py imports" \
       "verl/protocol.py, which imports ray); Ray's wheel (ray-2.60.0-cp312-manylinux2014_x86_64, 79321593 bytes =" \
       "75.6 MiB) alone exceeds the 64 MiB a call to the lent GPU machine carries (docs/integrations-verl.md" \
       "'A GPU run')" >&2
  exit 2
fi
if [ "$DRY" = 1 ]; then
  export STARE_VERL_DEVICE=cpu STARE_VERL_STEPS=4
else
  export STARE_VERL_DEVICE=cuda STARE_VERL_STEPS=20
fi
mkdir -p "$OUT"
set -o pipefail
# the setup test asserts where verl's _setup stops on a machine without GPUs, so it runs on CPU only
timeout 480 "$PY" -m pytest -q -p no:cacheprovider tests/integrations/verl/test_verl_real.py \
    -k "not real_setup" "$@" 2>&1 | tee "$OUT/verl_gpu_check.log"
