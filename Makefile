# Two commands on a fresh machine:  `make demo`  (main job)  and  `make test`  (whole test suite).
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip
FLEETCTL := $(VENV)/bin/fleetctl
# torch: on a machine without an NVIDIA driver take the CPU build (2.13.0 lies on disk on our CPU
# machines); TORCH_SPEC/TORCH_PIP_ARGS override it, e.g. to point pip at a CPU wheel index.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: demo test test-fast install browser prometheus lint bench clean upgrade-deps gpu-bundle

install: $(VENV)/.installed

# constraints.txt: exact versions of everything but torch/triton (the snapshot pictures depend on Textual's)
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		echo "no NVIDIA GPU: installing the CPU build of torch ($(TORCH_SPEC))"; \
		$(PIP) install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PIP) install --quiet -c constraints.txt -e '.[dev,ray]'
	$(VENV)/bin/python -c "from fleetctl.kernels import cpu_build; print('CPU kernels:', cpu_build.build())"
	touch $@

# Move the pins on purpose: resolve the newest releases in a scratch venv and write them to constraints.txt;
# then `make test` (a Textual release may move the snapshot pictures: review, then --snapshot-update).
upgrade-deps:
	rm -rf .venv-upgrade
	$(PYTHON) -m venv .venv-upgrade
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
		.venv-upgrade/bin/pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"; fi
	.venv-upgrade/bin/pip install --quiet '.[dev,ray]'
	{ sed -n '/^#/p' constraints.txt; .venv-upgrade/bin/pip freeze --exclude-editable | \
		grep -viE '^(fleetctl|torch|triton)([=@ ]|$$)'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-upgrade
	@git diff --stat constraints.txt 2>/dev/null || true

# the embedded fleet + demo traffic + console (headless with a summary when there is no terminal)
demo: install
	$(FLEETCTL) models pull smollm2-135m
	$(FLEETCTL) demo

# FLEET_REQUIRE_ALL=1: a test that skips for anything but CUDA fails (tests/support/require_all.py)
test: export FLEET_REQUIRE_ALL ?= 1
# every test: the in-process ones in 2 xdist processes (CI has 2 cores) of one torch/OpenMP thread each (two
# processes of 2 spinning OpenMP threads on 2 cores took twice as long, and a step 10x its time now and then),
# then the timing-bound fleet tests and the console's pictures one at a time, away from parallel load
test: install browser prometheus
	$(FLEETCTL) models pull smollm2-135m
	$(FLEETCTL) models pull gemma3-270m
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -m "not fleet and not pictures" -n 2 --durations=25 --durations-min=10
	$(VENV)/bin/pytest -q -m "fleet or pictures" --durations=25 --durations-min=10

# the developer's loop: no real-model tests, no worker processes (`make test` still runs everything); in 4 xdist
# processes (they mostly wait; one OpenMP thread each, as in `test`), then the console's pictures alone (a loaded
# machine draws a frame late)
test-fast: install
	$(VENV)/bin/ruff check .
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -m "not slow and not fleet and not pictures" -n 4
	$(VENV)/bin/pytest -q -m "pictures and not slow and not fleet"

# Debian's chromium for the web-console test (playwright drives it; nothing is downloaded by playwright).
# Without it `make test` stops here, saying why: the web console would otherwise go unchecked.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		command -v apt-get >/dev/null 2>&1 || { echo "make browser: no chromium and no apt-get: install chromium"; exit 1; }; \
		apt-get install -y -q chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }; }

# Debian's prometheus for the test that scrapes a fleet and runs the Grafana dashboard's queries
# (tests/server/test_prometheus.py); without it `make test` stops here, saying why.
prometheus:
	@command -v prometheus >/dev/null 2>&1 || { \
		command -v apt-get >/dev/null 2>&1 || { echo "make prometheus: no prometheus and no apt-get: install prometheus"; exit 1; }; \
		apt-get install -y -q prometheus >/dev/null || { apt-get update -q && apt-get install -y -q prometheus; }; }

bench: install
	$(VENV)/bin/python scripts/bench_decode.py

# The wheels the GPU device machine lacks (Python 3.12; never torch, triton, numpy, nvidia-*) and fleetctl's own, in
# .gpu-bundle/ for the device tool's `carry`; fails if what a run carries would pass 64 MiB (scripts/gpu_bundle.py).
gpu-bundle: install
	$(VENV)/bin/python scripts/gpu_bundle.py .gpu-bundle

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
