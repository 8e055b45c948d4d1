# Interop harnesses: the official Java and Go Pulsar clients, run against tc-server by tests/interop/.
#   make interop-java   -- tests/interop/java/target/tc-interop.jar (+ target/lib/)
#   make interop-go     -- tests/interop/go/bin/tc-interop-go
#   make interop-admin  -- tests/interop/admin-java/target/tc-interop-admin.jar: the Java admin client (PulsarAdmin)
#   make test-interop   -- build both and run only the interop tests
# Each harness is rebuilt only when one of its sources is newer than the built file, so a second
# `make test` runs neither Maven nor Go. A missing toolchain is an error, never a skip (docs/architecture.md §9).

INTEROP_JAVA_DIR := tests/interop/java
INTEROP_JAVA_JAR := $(INTEROP_JAVA_DIR)/target/tc-interop.jar
INTEROP_JAVA_SRC := $(INTEROP_JAVA_DIR)/pom.xml $(shell find $(INTEROP_JAVA_DIR)/src -type f 2>/dev/null)
INTEROP_ADMIN_DIR := tests/interop/admin-java
INTEROP_ADMIN_JAR := $(INTEROP_ADMIN_DIR)/target/tc-interop-admin.jar
INTEROP_ADMIN_SRC := $(INTEROP_ADMIN_DIR)/pom.xml $(shell find $(INTEROP_ADMIN_DIR)/src -type f 2>/dev/null)
INTEROP_GO_DIR := tests/interop/go
INTEROP_GO_BIN := $(INTEROP_GO_DIR)/bin/tc-interop-go
INTEROP_GO_SRC := $(INTEROP_GO_DIR)/go.mod $(INTEROP_GO_DIR)/go.sum $(wildcard $(INTEROP_GO_DIR)/*.go)

.PHONY: interop-java interop-admin interop-go test-interop
interop-java: $(INTEROP_JAVA_JAR)
interop-admin: $(INTEROP_ADMIN_JAR)
interop-go: $(INTEROP_GO_BIN)
TEST_DEPS += interop-java interop-admin interop-go

# Both Java harnesses: $< is the module's pom.xml, its directory the Maven project.
$(INTEROP_JAVA_JAR): $(INTEROP_JAVA_SRC)
$(INTEROP_ADMIN_JAR): $(INTEROP_ADMIN_SRC)
$(INTEROP_JAVA_JAR) $(INTEROP_ADMIN_JAR):
	@command -v java >/dev/null || { echo "error: java not found; the interop tests need a Java 17+ JDK (Debian: apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
	@command -v mvn >/dev/null || { echo "error: mvn not found; the interop tests need Maven 3.8+ (Debian: apt-get install maven)" >&2; exit 1; }
	@v=$$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p'); \
	  [ "$${v%%.*}" -ge 17 ] 2>/dev/null || { echo "error: java is version '$$v'; the interop harness needs Java 17+" >&2; exit 1; }
	@# Maven 3.8's -q still writes bare colour resets (ESC[0m): its output goes to a log shown only on failure.
	@echo "interop: building $@"
	@mkdir -p $(dir $<)target
	@cd $(dir $<) && mvn -q -B -Dstyle.color=never package > target/build.log 2>&1 \
	    || { sed 's/\x1b\[[0-9;]*m//g' target/build.log >&2; echo "error: building $@ failed (log above, $(dir $<)target/build.log)" >&2; exit 1; }
	@touch $@

$(INTEROP_GO_BIN): $(INTEROP_GO_SRC)
	@command -v go >/dev/null || { echo "error: go not found; the interop tests need Go (https://go.dev/dl/, the version in $(INTEROP_GO_DIR)/go.mod)" >&2; exit 1; }
	@# Module downloads ("go: downloading ...") go to a log shown only on failure.
	@echo "interop-go: building $(INTEROP_GO_BIN)"
	@mkdir -p $(INTEROP_GO_DIR)/bin
	@cd $(INTEROP_GO_DIR) && go build -mod=readonly -o bin/tc-interop-go . > bin/build.log 2>&1 \
	    || { cat bin/build.log >&2; echo "error: building the Go interop harness failed (log above, $(INTEROP_GO_DIR)/bin/build.log)" >&2; exit 1; }
	@touch $@

test-interop: setup interop-java interop-admin interop-go
	$(PY) -m pytest tests/interop $(PYTEST_ARGS)
