# tc-server: every set-up step a fresh machine needs lives here.
#   make run    -- install into .venv and start the service on the embedded store
#   make test   -- install everything the tests need (venv, interop harnesses) and run the whole suite
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools
# Prerequisites of `make test` beyond the venv; the included mk/*.mk files add theirs.
TEST_DEPS :=
PYTEST_ARGS ?=

.PHONY: setup run test lint typecheck proto proto-check bench clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; tc-server needs Python 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

run: setup
	$(VENV)/bin/tc-server run --store embedded --data-dir ./data

include $(wildcard mk/*.mk)

test: setup proto-check lint $(TEST_DEPS)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check tc_server tests
	$(VENV)/bin/mypy tc_server

# Generated protobuf code is quarantined in tc_server/_proto and committed; CI checks it is current.
PROTO_OUT := tc_server/_proto
proto: setup
	$(PY) tools/gen_proto.py

proto-check: setup
	$(PY) tools/gen_proto.py --check

bench: setup
	$(PY) -m tc_server.bench --store memory --store embedded
	$(PY) -m tc_server.bench.store --store memory --store embedded

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
