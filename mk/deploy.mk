# Container image checks that need no Docker engine (included by the Makefile).
#
#   make image-check  -- build the image's virtualenv exactly as the Dockerfile's builder stage does
#                        (deploy/install.sh on a copy of the build context), then start that tc-server
#                        on the memory store and check /healthz, /readyz and /metrics (deploy/smoke.py).
#
# A prerequisite of `make test`: it installs the runtime dependencies that uv.lock pins into a fresh
# venv, about 10 s on the 2-core machine kind with a cold cache (the budget for test prerequisites is 2 min).
# tests/deploy/test_install_script.py (marked slow) checks the same steps from pytest.
.PHONY: image-check
TEST_DEPS += image-check

# The paths .dockerignore admits into the build context; tests/deploy checks the two agree.
IMAGE_CONTEXT := pyproject.toml uv.lock uv-requirements.txt README.md LICENSE tc_server deploy/install.sh
# A copy of that build context in $$tmp/src (a temporary directory removed on exit), as the image's
# builder stage sees it: what image-check and floors-check install from.
COPY_IMAGE_CONTEXT = tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; mkdir -p "$$tmp/src"; \
	for path in $(IMAGE_CONTEXT); do \
	    if [[ -e "$$path" ]]; then cp -R --parents "$$path" "$$tmp/src/"; fi; \
	done; \
	find "$$tmp/src" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +

image-check:
	@set -euo pipefail; $(COPY_IMAGE_CONTEXT); \
	echo "image-check: deploy/install.sh into $$tmp/venv"; \
	PYTHON=$(PYTHON) "$$tmp/src/deploy/install.sh" "$$tmp/venv" "$$tmp/src"; \
	"$$tmp/venv/bin/python" deploy/smoke.py "$$tmp/venv/bin/tc-server"

# make floors-check -- the lowest versions pyproject.toml's floors allow really work: a throwaway venv gets
# the runtime dependencies at their floors (uv's --resolution lowest-direct), then imports the generated
# protobuf/gRPC code with them (both runtimes refuse generated code newer than themselves) and starts that
# tc-server on the memory store as the image check does. About 10 s with a warm uv cache.
.PHONY: floors-check
TEST_DEPS += floors-check
FLOOR_IMPORTS := import tc_server._proto.pulsar_tc_pb2, tc_server._proto.oxia_client_pb2, \
	tc_server._proto.oxia_client_pb2_grpc, tc_server.store.oxia, tc_server.app

floors-check: $(UV)
	@set -euo pipefail; $(COPY_IMAGE_CONTEXT); \
	$(UV) venv --quiet --python $(PYTHON) "$$tmp/venv"; \
	$(UV) pip install --quiet --python "$$tmp/venv/bin/python" --resolution lowest-direct "$$tmp/src"; \
	echo "floors-check: $$($(UV) pip freeze --quiet --python "$$tmp/venv/bin/python" | grep -iE '^(protobuf|grpcio|aiohttp|uvloop|structlog|prometheus-client|pyjwt|cryptography|xxhash|sortedcontainers)==' | tr '\n' ' ')"; \
	"$$tmp/venv/bin/python" -c "$(FLOOR_IMPORTS)"; \
	"$$tmp/venv/bin/python" deploy/smoke.py "$$tmp/venv/bin/tc-server"
