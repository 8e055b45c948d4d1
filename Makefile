# tc-server: every set-up step a fresh machine needs lives here.
#   make run    -- install the runtime dependencies into .venv and start the service on the embedded store
#   make test   -- install everything the tests need (dev set, interop harnesses) and run the whole suite
#   make lock   -- re-resolve uv.lock after changing the dependencies in pyproject.toml
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := $(CURDIR)/.tools
# uv installs every Python package, exactly as uv.lock pins it (README, *Requirements*). It lives in its
# own small venv, outside .venv, so that the service's venv holds the service's packages only.
UV_HOME := $(TOOLS)/uv
UV := $(UV_HOME)/bin/uv
# uv must never fetch a Python build of its own (pyproject [tool.uv] says the same).
export UV_PYTHON_DOWNLOADS := never
# Prerequisites of `make test` beyond the venv; the included mk/*.mk files add theirs.
TEST_DEPS :=
PYTEST_ARGS ?=

.PHONY: setup setup-runtime run test test-uvloop lint typecheck proto proto-check bench lock clean
# Two install sets from the one lock: the runtime dependencies (make run) and the dev extra on top of
# them (everything the tests, linters, code generator and audit job need).
setup-runtime: $(VENV)/.installed-runtime
setup: $(VENV)/.installed-dev

$(UV): uv-requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; tc-server needs Python 3.11" >&2; exit 1; }
	rm -rf $(UV_HOME)
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r uv-requirements.txt
	@touch $@

# --locked: a pyproject.toml changed without `make lock` is an error, not a silent re-resolve.
UV_SYNC = $(UV) sync --quiet --locked --python $(PYTHON)
LOCK_HINT = { echo "error: could not install from uv.lock; if pyproject.toml changed, run 'make lock' and commit uv.lock" >&2; exit 1; }

# --inexact: a venv that already holds the dev set keeps it.
$(VENV)/.installed-runtime: pyproject.toml uv.lock $(UV)
	@echo "setup: the runtime dependencies from uv.lock into $(VENV)"
	@$(UV_SYNC) --inexact || $(LOCK_HINT)
	@touch $@

$(VENV)/.installed-dev: pyproject.toml uv.lock $(UV)
	@echo "setup: the dev dependencies from uv.lock into $(VENV)"
	@$(UV_SYNC) --extra dev || $(LOCK_HINT)
	@touch $@

lock: $(UV)
	$(UV) lock

# The ports and every other setting but these two (the embedded store in ./data, as the README's first
# command promises, whatever TC_SERVER_STORE says): TC_SERVER_* variables, e.g.
# `TC_SERVER_LISTEN=0.0.0.0:6651 make run` (README, *Configuration*).
run: setup-runtime
	$(VENV)/bin/tc-server run --store embedded --data-dir ./data

include $(wildcard mk/*.mk)

# The in-process suites' asyncio tests once more on uvloop, the event loop production runs on (TC_TEST_LOOP
# in tests/conftest.py, which also leaves out the tests that are no coroutine: they run the same either way);
# about 2 min on the 2-core machine. The files that start tc-server processes are left out: those processes
# run on uvloop already.
UVLOOP_TESTS := tests/wire tests/coordinator tests/server tests/hostile tests/test_event_loop.py \
    --ignore=tests/server/test_fault_history.py --ignore=tests/server/test_kill_restart.py \
    --ignore=tests/server/test_workers.py \
    --ignore=tests/hostile/test_start_failures.py --ignore=tests/hostile/test_store_lock.py \
    --ignore=tests/hostile/test_fuzz_server.py --ignore=tests/hostile/test_fuzz_admin.py
PYTEST_UVLOOP = TC_TEST_LOOP=uvloop $(PY) -m pytest $(PYTEST_PROCESSES) $(UVLOOP_TESTS) $(PYTEST_ARGS)
# The suite runs on TEST_PROCESSES pytest processes (pytest-xdist); tests/conftest.py keeps together what must
# share one (the session's broker, Spark, a module's own fixtures). Most of its time is spent waiting on brokers,
# processes and timeouts, not computing: on the 2-core machine two processes took the fresh-clone CI run
# (.ci/run) from 29 to 19 min, the main pass from 27:02 to 15:51. TEST_PROCESSES=0: one process, as before.
# The groups only hold since 2026-12-02 (tests/conftest.py): the main pass then took 37:01 against 40:32 the same
# day, each process no longer starting its own session broker, Spark and module fixtures. A fresh clone's whole
# run took 27 min on a faster phase later that day (main pass 23:27), test brokers then on the client compiler only.
# Three processes since 2026-12-03: on one slow phase of a fresh machine, fresh clones of bcee47e one after the
# other, the main pass took 22:36 against 30:31 with two (uvloop pass 1:36 against 2:15, the whole run 26 against
# 34.5 min), the cores still 18 % idle over the run (/proc/stat): a third process fills the waits of the other two.
TEST_PROCESSES ?= 3
PYTEST_PROCESSES = $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadgroup)

test: setup proto-check lint $(TEST_DEPS)
	$(PY) -m pytest $(PYTEST_PROCESSES) $(PYTEST_ARGS)
	$(PYTEST_UVLOOP)

test-uvloop: setup
	$(PYTEST_UVLOOP)

lint: setup
	$(VENV)/bin/ruff check tc_server tests
	$(VENV)/bin/mypy tc_server tests

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
	rm -rf $(VENV) $(UV_HOME) .pytest_cache .mypy_cache .ruff_cache
