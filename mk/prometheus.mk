# Prometheus for the alert rules' tests (included by the Makefile).
#
#   make prometheus-tools -- promtool and prometheus, from Debian's `prometheus` package (2.42 on Debian 12):
#                            tests/deploy/test_alerts.py checks deploy/prometheus/alerts.yml with
#                            `promtool check rules`, runs its unit tests (`promtool test rules`), and loads
#                            it into a real Prometheus that scrapes a real tc-server.
#
# A prerequisite of `make test`. Installed only where either command is missing (about 10 s), with sudo when
# not root; the package starts no daemon in a container without an init system.
.PHONY: prometheus-tools
TEST_DEPS += prometheus-tools
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

prometheus-tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
	    echo "setup: Debian's prometheus package (promtool, prometheus) for the alert rule tests"; \
	    { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	        --no-install-recommends prometheus >/dev/null; } || { \
	        echo "error: could not install Debian's prometheus package; tests/deploy/test_alerts.py needs promtool and prometheus on the PATH" >&2; exit 1; }; \
	fi
