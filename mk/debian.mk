# Debian packages the tests use (included by the Makefile).
#
#   make debian-tools -- what `make test` needs from Debian beyond Python, Java and Maven:
#     prometheus (promtool, prometheus; 2.42 on Debian 12): tests/deploy/test_alerts.py checks
#       deploy/prometheus/alerts.yml with `promtool check rules`, runs its unit tests (`promtool test rules`),
#       and loads it into a real Prometheus that scrapes a real tc-server;
#     faketime (libfaketime): tests/server/test_clock_behind.py restarts a real tc-server with its system clock
#       an hour behind the records it wrote.
#
# A prerequisite of `make test`. Installed only where a command is missing (about 10 s): as root, or with sudo
# that needs no password; otherwise it stops, naming the packages to install. The prometheus package starts no
# daemon in a container without an init system.
.PHONY: debian-tools
TEST_DEPS += debian-tools
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo -n)
APT_GET = $(AS_ROOT) env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120
DEBIAN_TOOLS = prometheus faketime
# Where Debian's libfaketime puts the library the clock test preloads (tests/support/faketime.py, LIBFAKETIME).
LIBFAKETIME = /usr/lib/*/faketime/libfaketime.so.1

debian-tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! ls $(LIBFAKETIME) >/dev/null 2>&1; then \
	    echo "setup: Debian's $(DEBIAN_TOOLS) packages for the tests"; \
	    { $(APT_GET) update -qq && $(APT_GET) install -y -qq --no-install-recommends $(DEBIAN_TOOLS) >/dev/null; } || { \
	        echo "error: could not install Debian's packages (as root: apt-get install $(DEBIAN_TOOLS));" \
	             "the tests need promtool and prometheus on the PATH and $(LIBFAKETIME)" >&2; exit 1; }; \
	fi
