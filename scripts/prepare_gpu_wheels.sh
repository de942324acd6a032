#!/usr/bin/env bash
# Prepare wheels/ (git-ignored) for scripts/gpu_check.sh on the GPU machine, which has no network and no DeepSpeed:
# DeepSpeed built here as a wheel (PyPI has only an sdist; ops are JIT-built, none are prebuilt) and the packages it
# imports that the GPU image (torch, transformers, accelerate, ...) may lack, as CPython 3.12 x86_64 Linux wheels,
# each pinned to the version this venv runs; and for the TRL check (gpu_check.sh --trl) TRL, datasets and the
# packages datasets imports that the image may lack. About 10 MiB in all (the GPU machine takes at most 64 MiB).
# Usage: bash scripts/prepare_gpu_wheels.sh [OUT_DIR]        (default: wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-wheels}
rm -rf "$OUT"
mkdir -p "$OUT"
PINS=$("$PY" - <<'PYEOF'
from importlib.metadata import version
names = ["deepspeed", "hjson", "py-cpuinfo", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
         "msgpack", "einops", "ninja", "psutil", "typing-extensions",
         "trl", "datasets", "dill", "multiprocess", "xxhash", "fsspec", "jinja2", "markupsafe"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PYEOF
)
DS=$(echo "$PINS" | tr ' ' '\n' | grep '^deepspeed==')
DEPS=$(echo "$PINS" | tr ' ' '\n' | grep -v '^deepspeed==' | tr '\n' ' ')
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$DS"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$OUT" $DEPS
ls -1 "$OUT"
du -sh "$OUT"
