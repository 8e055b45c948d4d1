# The real Oxia server, for the store conformance suite against Oxia itself.
#   make oxia            -- install Oxia v0.14.4 (binary `cmd`) into .tools/bin through the Go module proxy
#   make test-oxia-real  -- run tests/store with the real server (1 and 3 shards) besides the others
#
# Not part of `make test`: on this project's machines the Go module proxy answers
# "403 Forbidden: This module version is not available" for every version of github.com/oxia-db/oxia,
# so `make oxia` fails there, loudly. The suite runs the Oxia client against tests/oxia_standin instead.
OXIA_VERSION := v0.14.4
OXIA_BIN := $(TOOLS)/bin/cmd

.PHONY: oxia test-oxia-real
oxia: $(OXIA_BIN)

$(OXIA_BIN):
	@command -v go >/dev/null || { echo "error: go not found; installing Oxia needs Go" >&2; exit 1; }
	GOBIN=$(TOOLS)/bin go install -tags disable_trap github.com/oxia-db/oxia/cmd@$(OXIA_VERSION) || { \
	  echo "error: could not install Oxia $(OXIA_VERSION) from the Go module proxy (see mk/oxia.mk)" >&2; exit 1; }

test-oxia-real: setup oxia
	TC_SERVER_TEST_OXIA_BIN=$(OXIA_BIN) $(PY) -m pytest tests/store -k oxia-real $(PYTEST_ARGS)
