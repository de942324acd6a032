#!/usr/bin/env bash
# Prepare wheels-verl/ (git-ignored) for scripts/verl_gpu_check.sh: verl 0.9.1, Ray and the packages verl's v1
# trainer imports that the GPU image (torch 2.11, transformers, pandas, pyarrow, ...) lacks, as CPython 3.12 x86_64
# Linux wheels pinned to the versions .venv-verl runs (antlr4-python3-runtime ships only an sdist: built here). Prints
# the total and exits 3 when it exceeds the 64 MiB a call to the lent GPU machine carries — which it does, by Ray
# alone (measured 2026-12-02: ray-2.60.0-cp312 79321593 bytes, verl 1694325, the 16 others 3590406; 84606324 =
# 80.7 MiB in all).
# Usage: bash scripts/prepare_gpu_verl_wheels.sh [OUT_DIR]        (default: wheels-verl)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv-verl/bin/python}
OUT=${1:-wheels-verl}
LIMIT=$((64 * 1024 * 1024))
rm -rf "$OUT"
mkdir -p "$OUT"
PINS=$("$PY" - <<'PYEOF'
from importlib.metadata import version
names = ["verl", "ray", "transferqueue", "tensordict", "hydra-core", "omegaconf", "torchdata", "codetiming", "pyzmq",
         "msgspec", "datasets", "dill", "multiprocess", "pylatexenc", "orjson", "pyvers", "cachetools"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PYEOF
)
ANTLR=$("$PY" -c "from importlib.metadata import version; print(version('antlr4-python3-runtime'))")
"$PY" -m pip wheel -q --no-deps -w "$OUT" "antlr4-python3-runtime==$ANTLR"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$OUT" $PINS
ls -l "$OUT"
TOTAL=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
echo "total: $TOTAL bytes ($((TOTAL / 1048576)) MiB); the GPU machine takes at most $LIMIT bytes (64 MiB)"
if [ "$TOTAL" -gt "$LIMIT" ]; then
  echo "prepare_gpu_verl_wheels: $TOTAL bytes exceed 64 MiB (Ray's wheel alone: $(du -b "$OUT"/ray-*.whl | cut -f1)" \
       "bytes); verl cannot be carried to the lent GPU machine" >&2
  exit 3
fi
