# `make test` and `make demo` work on a fresh machine: they create the virtualenv, install the project, fetch the
# offline data into the cache ($POPE_CACHE, default ~/.cache/pope, kept between runs) and run.
# `make setup` (scripts/install.py) installs PyTorch's CPU build where no NVIDIA GPU is present (from
# https://download.pytorch.org/whl/cpu; where that index does not answer within seconds, from the default index and
# pip's find-links) and the CUDA build otherwise (TORCH=cpu or TORCH=cuda to choose); it says which build it took.
# Every extra is installed at the versions of constraints.txt, the ones the tests use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH ?= auto
export POPE_CACHE ?= $(HOME)/.cache/pope

.PHONY: setup data lint test test-fast demo clean

$(STAMP): pyproject.toml constraints.txt scripts/install.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) scripts/install.py --torch $(TORCH)
	touch $(STAMP)

setup: $(STAMP)

data: $(STAMP)
	$(PY) -m pope.data.offline fetch

# ruff (lint and format) and import-linter's contracts, as configured in pyproject.toml (docs/ARCHITECTURE.md).
LINT_PATHS := src tests scripts benchmarks examples
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/lint-imports

# The suite runs in TEST_WORKERS processes (pytest-xdist): most tests use one core, so two workers on a 2-core
# machine take it from about 17 to about 10 minutes. Each worker imports torch: keep it near the core count.
TEST_WORKERS ?= 2

test: setup lint data
	$(PY) -m pytest -q -n $(TEST_WORKERS) --timeout=600 tests

test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow and not data" tests

# Finished demo runs are reused from $(POPE_CACHE)/demo; DEMO_ARGS=--fresh retrains them.
DEMO_ARGS ?=
demo: setup data
	$(PY) -m pope.eval.demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info
