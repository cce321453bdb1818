# Two commands on a fresh machine:  `make demo`  (main job)  and  `make test`  (whole test suite).
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip
FLEETCTL := $(VENV)/bin/fleetctl
# torch: on a machine without an NVIDIA driver take the CPU build (2.13.0 lies on disk on our CPU
# machines); TORCH_SPEC/TORCH_PIP_ARGS override it, e.g. to point pip at a CPU wheel index.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: demo test test-fast install browser lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "no NVIDIA GPU: installing the CPU build of torch ($(TORCH_SPEC))"; \
		$(PIP) install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PIP) install --quiet -e '.[dev,ray]'
	touch $@

# the embedded fleet + demo traffic + console (headless with a summary when there is no terminal)
demo: install
	$(FLEETCTL) models pull smollm2-135m
	$(FLEETCTL) demo

test: install browser
	$(FLEETCTL) models pull smollm2-135m
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

# the developer's loop: no real-model tests, no worker processes (`make test` still runs everything)
test-fast: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q -m "not slow and not fleet"

# Debian's chromium for the web-console test (playwright drives it; nothing is downloaded by playwright)
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y -q chromium >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
		echo "no chromium (not root, or no apt): the web-console test will be skipped"

bench: install
	$(VENV)/bin/python scripts/bench_decode.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
