# A real Apache Pulsar 5 broker (5.0.0-M1) for tests/v5: its own v5 coordinator and participants on the
# Oxia stand-in that tc-server uses (tests/v5/broker5.py starts it standalone with --metadata-url oxia://).
#   make pulsar-broker5   -- org.apache.pulsar:pulsar-broker:5.0.0-M1 and its runtime jars in .cache/pulsar-broker5/lib
#   make v5-harness       -- the v5 SDK harness (tests/v5/java: pulsar-client-v5 5.0.0-M1) in tests/v5/java/target
#   make test-broker5     -- resolve both and run tests/v5
#
# Resolved by Maven from tests/v5/pom.xml (which pins the netty, jackson and log4j BOMs: the 5.x POMs are
# flattened, so nearest-wins would mix versions); about 315 jars, once. Pulsar 5 needs Java 21+ (class
# version 65): a missing one is an error, never a skip (docs/architecture.md §9). TC_SERVER_JAVA21 names
# the java binary; otherwise the newest JDK under /usr/lib/jvm that is 21 or later is used.

BROKER5_POM := tests/v5/pom.xml
BROKER5_CACHE := .cache/pulsar-broker5
BROKER5_LIB := $(BROKER5_CACHE)/lib
BROKER5_STAMP := $(BROKER5_CACHE)/lib.stamp
V5_HARNESS_DIR := tests/v5/java
# Written only once the classes and every runtime jar are in place (tests/v5/harness5.py checks it).
V5_HARNESS_STAMP := $(V5_HARNESS_DIR)/target/harness.stamp

.PHONY: pulsar-broker5 v5-harness test-broker5
pulsar-broker5: $(BROKER5_STAMP) $(V5_HARNESS_STAMP)
v5-harness: $(V5_HARNESS_STAMP)
# tests/v5 takes a few minutes (one broker start), so `make test` runs it.
TEST_DEPS += pulsar-broker5

$(BROKER5_STAMP): $(BROKER5_POM)
	@command -v mvn >/dev/null || { echo "error: mvn not found; resolving the Pulsar 5 broker needs Maven 3.8+ (Debian: apt-get install maven)" >&2; exit 1; }
	@$(PY) -c 'from tests.v5.broker5 import find_java21; find_java21()' || exit 1
	$(call resolve_broker_lib,$(BROKER5_POM),$(BROKER5_CACHE),$(BROKER5_LIB),Pulsar 5 broker,pulsar-broker5)

# Compiled by the Java 21+ JDK the broker runs on (JAVA_HOME for Maven's compiler), quiet unless it fails.
$(V5_HARNESS_STAMP): $(V5_HARNESS_DIR)/pom.xml $(shell find $(V5_HARNESS_DIR)/src -name '*.java' 2>/dev/null)
	@command -v mvn >/dev/null || { echo "error: mvn not found; building the v5 SDK harness needs Maven 3.8+ (Debian: apt-get install maven)" >&2; exit 1; }
	@java=$$($(PY) -c 'from tests.v5.broker5 import find_java21; print(find_java21())') || exit 1; \
	rm -rf $(V5_HARNESS_DIR)/target; mkdir -p $(V5_HARNESS_DIR)/target; \
	JAVA_HOME=$$(dirname $$(dirname $$java)) mvn -q -B -Dstyle.color=never -f $(V5_HARNESS_DIR)/pom.xml package \
	    > $(V5_HARNESS_DIR)/target/mvn.log 2>&1 || { sed 's/\x1b\[[0-9;]*m//g' $(V5_HARNESS_DIR)/target/mvn.log >&2; \
	    echo "error: building the v5 SDK harness with Maven failed (log above, $(V5_HARNESS_DIR)/target/mvn.log)" >&2; exit 1; }
	@echo "v5-harness: $$(ls $(V5_HARNESS_DIR)/target/lib | wc -l) jars in $(V5_HARNESS_DIR)/target/lib"
	@touch $@

test-broker5: setup pulsar-broker5
	$(PY) -m pytest tests/v5 $(PYTEST_ARGS)
