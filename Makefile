# Halcyon — every target bootstraps its own virtualenv (.venv) from nothing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf
TYPED := common gateway worker controller bench halcyon scripts clients/python
# KServe's model server, the OIP tests' real backend: its own virtualenv (kserve pins protobuf
# 6, which .venv's stubs cannot share). The stamp names the version, so a bump reinstalls.
KSERVE_VERSION := 0.21.0
KSERVE_VENV := .tools/kserve
KSERVE_STAMP := $(KSERVE_VENV)/.installed-$(KSERVE_VERSION)

.DEFAULT_GOAL := help

help: ## List targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## Create .venv and install Halcyon with its dev tools

$(KSERVE_STAMP):
	@test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KSERVE_VENV)/bin/python -m pip install --quiet 'kserve==$(KSERVE_VERSION)' onnxruntime numpy
	@touch $@

tools-kserve: $(KSERVE_STAMP) ## KServe's model server in .tools/kserve (the OIP tests' backend)

$(BUF):
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@$(BUF_VERSION)

proto: $(STAMP) ## Regenerate the committed gRPC stubs from proto/
	$(PY) scripts/genproto.py

lint: $(STAMP) $(BUF) ## ruff (lint + format check), mypy --strict on all code, buf lint, buf breaking vs HEAD~1
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(TYPED)
	$(BUF) lint
	bash scripts/buf_breaking.sh

fmt: $(STAMP) ## Format and autofix with ruff
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Three pytest workers, each taking a whole file at a time (module fixtures stay in one
# process): most tests wait on real processes, so on CI's 2 cores three workers use ~1.5 of
# them (main suite 9:28 on 2026-12-01; four workers took 8:48 but starved the tests that time
# a wedged loop or a slow device). PYTEST_JOBS= is serial.
PYTEST_JOBS ?= -n 3 --dist loadfile
# The lint and KServe's install are independent (the KServe virtualenv downloads for ~50 s while
# ruff and mypy run): two jobs, each one's output kept together. Both serving paths (ADR 0010)
# are covered by tests/serving/contract, which runs every hot-method contract over each path.
test: ## Lint, buf lint, stale-stub check, unit, property and end-to-end tests
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint $(KSERVE_STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_JOBS)

test-reliability: $(STAMP) ## Fault scenarios under real load (~4 min); prints one table of outcomes
	$(VENV)/bin/pytest -q -m reliability tests/reliability

STACK_ARGS ?=
stack: $(STAMP) ## Run controller, gateway and a heterogeneous fleet on loopback (Ctrl-C stops; STACK_ARGS=... adds flags)
	$(VENV)/bin/halcyon stack --canary $(STACK_ARGS)

bench: $(STAMP) ## Run the seeded batching benchmark (published workload)
	$(VENV)/bin/halcyon bench

loadtest: $(STAMP) ## 32 clients x 20 s against a running stack
	$(VENV)/bin/halcyon loadtest --clients 32 --seconds 20

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache

.PHONY: help venv tools-kserve proto lint fmt test test-reliability stack bench loadtest clean
