SHELL := /bin/bash
# veo-edge developer entry points. `make demo` and `make test` are the two README commands.
# Everything installs into a virtual environment of the checkout (.venv), so two checkouts (yours and
# CI's, say) never overwrite each other's editable install. BASE_PYTHON makes it; VENV moves it.
BASE_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip

.PHONY: setup demo plugins lint test arm64-check bench-tools

# Python writes the bytecode of what it imports, in every recipe: some machines (this one) set
# PYTHONDONTWRITEBYTECODE, and with it every process compiles from source again whatever it imports
# (veo_edge, torch, OpenVINO, ...; the caches are git-ignored). setup leaves compiling to the first import
unexport PYTHONDONTWRITEBYTECODE

$(PYTHON):
	$(BASE_PYTHON) -m venv $(VENV)

# torch is pinned: 2.13.0 is the CPU build that pip takes from the machine's local disk. --no-compile:
# pip byte-compiles every module of the 2.2 GB environment one by one (44 s of a 96 s install on a fast
# 2-core machine, ~100 s on a slow one), most of them never imported; the first import of each module
# that a run uses compiles and caches it instead (a few seconds, once)
setup: $(PYTHON)
	$(PIP) install --quiet --disable-pip-version-check --no-compile torch==2.13.0 -e '.[dev]'

# set up, then build the built-in default model (vit-digits, trained on real data) into ./vit-digits
# and show what the build proved (parity, plugin fusion, top-1 on the held-out test split)
demo: setup
	$(PYTHON) -m veo_edge build --force
	$(PYTHON) -m veo_edge inspect vit-digits
	@echo "veo-edge is installed in $(VENV): run '. $(VENV)/bin/activate' to put veo-edge on your PATH"

# the C++ half: memory pool + tests always, CUDA kernels where nvcc is, TensorRT glue where TensorRT is
plugins:
	mkdir -p build/plugins
	cmake -S plugins -B build/plugins -DCMAKE_BUILD_TYPE=Release
	set -o pipefail; cmake --build build/plugins -j2 2>&1 | tee build/plugins/build.log
	ctest --test-dir build/plugins --output-on-failure

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# three workers (pytest-xdist) on two cores: most tests wait on dockerd, servers and subprocesses; a test
# file stays on one worker, the Docker tests form two groups (tests/conftest.py); the ten slowest are printed.
# PYTHONDONTWRITEBYTECODE is lifted (above): with it every worker compiled all test modules and veo_edge
# again to collect them (21 s of CPU against 12 s with the caches), and every process a test starts
# compiled what it imports again
test: setup plugins lint
	$(PYTHON) -m pytest -q -n 3 --dist loadgroup --durations=10

# arm64 images under QEMU + Dockerfile.jetson and the A100 image against stand-in bases (needs root,
# Docker, network; ~30 min on 2 cores; not part of `make test`): tools/arm64-check.sh, docs/images.md
arm64-check:
	nice tools/arm64-check.sh

# the outside tools the serving benches compare against (docs/benchmarks.md), each in its own venv under
# .bench: perf_analyzer (the binary of the tritonclient 2.51.0 wheel, with the CUDA runtime it links to
# and Debian's libb64) and Triton through PyTriton 0.7 with this venv's OpenVINO; ~1.1 GB, ~1 min
BENCH ?= .bench
bench-tools: setup
	$(BASE_PYTHON) -m venv $(BENCH)/perf-analyzer
	$(BENCH)/perf-analyzer/bin/pip install --quiet --disable-pip-version-check 'tritonclient[all]==2.51.0' \
		nvidia-cuda-runtime-cu12
	$(BASE_PYTHON) -m venv $(BENCH)/pytriton
	$(BENCH)/pytriton/bin/pip install --quiet --disable-pip-version-check 'nvidia-pytriton==0.7.*' \
		"openvino==$$($(PYTHON) -c 'import openvino; print(openvino.__version__.split("-")[0])')"
	@/sbin/ldconfig -p | grep -q 'libb64\.so\.0d' || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null; } \
		|| { echo "perf_analyzer needs Debian's libb64-0d: sudo apt-get install libb64-0d"; exit 1; }
	@echo "perf_analyzer: $(BENCH)/perf-analyzer/bin/perf_analyzer (the bench scripts put its CUDA runtime on the library path; by hand: LD_LIBRARY_PATH=$$(echo $(BENCH)/perf-analyzer/lib/python3*/site-packages/nvidia/cuda_runtime/lib) $(BENCH)/perf-analyzer/bin/perf_analyzer ...); PyTriton's Python: $(BENCH)/pytriton/bin/python"
	@echo "e.g. $(PYTHON) bench/serve.py limit --perf-analyzer $(BENCH)/perf-analyzer/bin/perf_analyzer --pytriton $(BENCH)/pytriton/bin/python"
