# A real Apache Pulsar broker for the tests and benchmarks (tc_server/bench/pulsar_broker.py starts it standalone).
#   make pulsar-broker   -- org.apache.pulsar:pulsar-broker and its runtime jars in .cache/pulsar-broker/lib
#   make pulsar-proxy    -- org.apache.pulsar:pulsar-proxy and its runtime jars in .cache/pulsar-proxy/lib
#   make test-broker     -- resolve it, build the interop harnesses, and run only the tests that start a broker
#                           (tests/broker, tests/e2e)
#
# Resolved by Maven from tests/broker/pom.xml, which imports Pulsar's own parent POM so that the class
# path holds the versions Pulsar ships with. Resolved again only when that POM changes (the stamp file);
# about 330 jars, 240 MB, once. A missing java or mvn is an error, never a skip (docs/architecture.md §9).

BROKER_POM := tests/broker/pom.xml
BROKER_CACHE := .cache/pulsar-broker
BROKER_LIB := $(BROKER_CACHE)/lib
BROKER_STAMP := $(BROKER_CACHE)/lib.stamp

.PHONY: pulsar-broker test-broker
pulsar-broker: $(BROKER_STAMP)
TEST_DEPS += pulsar-broker

$(BROKER_STAMP): $(BROKER_POM)
	@command -v java >/dev/null || { echo "error: java not found; the broker tests need a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
	@command -v mvn >/dev/null || { echo "error: mvn not found; resolving the Pulsar broker needs Maven 3.8+ (Debian: apt-get install maven)" >&2; exit 1; }
	@v=$$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p'); \
	  [ "$${v%%.*}" -ge 17 ] 2>/dev/null || { echo "error: java is version '$$v'; the Pulsar broker needs Java 17+" >&2; exit 1; }
	$(call resolve_broker_lib,$(BROKER_POM),$(BROKER_CACHE),$(BROKER_LIB),Pulsar broker,pulsar-broker)

# $(call resolve_broker_lib,POM,CACHE,LIB,what,name): a broker's runtime jars, resolved by Maven from POM
# into LIB, then the target's stamp touched (mk/broker5.mk uses it too). Into a fresh directory, then
# renamed: an interrupted download never looks like a complete one, and jars of an older POM never
# linger on the class path. Maven 3.8's -q still writes bare colour resets (ESC[0m) to the terminal, so
# its output goes to CACHE/mvn.log, shown only when it fails.
define resolve_broker_lib
rm -rf $(3) $(3).partial
@mkdir -p $(2)
@mvn -q -B -Dstyle.color=never -f $(1) package -Dbroker.lib.dir=$(abspath $(3).partial) \
    > $(2)/mvn.log 2>&1 || { sed 's/\x1b\[[0-9;]*m//g' $(2)/mvn.log >&2; \
    echo "error: resolving the $(4) with Maven failed (log above, $(2)/mvn.log)" >&2; exit 1; }
mv $(3).partial $(3)
@echo "$(5): $$(ls $(3) | wc -l) jars in $(3)"
@touch $@
endef

# The Pulsar proxy (pulsar-proxy 4.0.8, the newest on Maven Central) that tests/e2e/test_pulsar_proxy.py
# puts in front of tc-server; a class path of its own (tests/proxy/pom.xml), about 200 jars, once.
PROXY_POM := tests/proxy/pom.xml
PROXY_CACHE := .cache/pulsar-proxy
PROXY_LIB := $(PROXY_CACHE)/lib
PROXY_STAMP := $(PROXY_CACHE)/lib.stamp

.PHONY: pulsar-proxy
pulsar-proxy: $(PROXY_STAMP)
TEST_DEPS += pulsar-proxy

$(PROXY_STAMP): $(PROXY_POM) | $(BROKER_STAMP)
	$(call resolve_broker_lib,$(PROXY_POM),$(PROXY_CACHE),$(PROXY_LIB),Pulsar proxy,pulsar-proxy)

# tests/e2e drives the broker with the stock clients, so the interop harnesses are built too (mk/interop.mk).
test-broker: setup pulsar-broker pulsar-proxy interop-java interop-go
	$(PY) -m pytest tests/broker tests/e2e $(PYTEST_ARGS)
