# `make test` and `make demo` work on a fresh CPU machine: they create the virtualenv, install the
# project (CPU torch first, so pip never pulls a CUDA build), fetch the offline data into the cache
# ($POPE_CACHE, default ~/.cache/pope, kept between runs) and run.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export POPE_CACHE ?= $(HOME)/.cache/pope

.PHONY: setup data lint test test-fast demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all]' triton==3.6.0
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

test: setup lint data
	$(PY) -m pytest -q --timeout=600 tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not data" tests

# Finished demo runs are reused from $(POPE_CACHE)/demo; DEMO_ARGS=--fresh retrains them.
DEMO_ARGS ?=
demo: setup data
	$(PY) -m pope.eval.demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info
