# Prometheus for the alert rules' tests (included by the Makefile).
#
#   make prometheus-tools -- promtool and prometheus, from Debian's `prometheus` package (2.42 on Debian 12):
#                            tests/deploy/test_alerts.py checks deploy/prometheus/alerts.yml with
#                            `promtool check rules`, runs its unit tests (`promtool test rules`), and loads
#                            it into a real Prometheus that scrapes a real tc-server.
#
# A prerequisite of `make test`. Installed only where either command is missing (about 10 s): as root, or with
# sudo that needs no password; otherwise it stops, naming the package to install. The package starts no daemon
# in a container without an init system.
.PHONY: prometheus-tools
TEST_DEPS += prometheus-tools
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo -n)
APT_GET = $(AS_ROOT) env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120

prometheus-tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
	    echo "setup: Debian's prometheus package (promtool, prometheus) for the alert rule tests"; \
	    { $(APT_GET) update -qq && $(APT_GET) install -y -qq --no-install-recommends prometheus >/dev/null; } || { \
	        echo "error: could not install Debian's prometheus package (as root: apt-get install prometheus);" \
	             "tests/deploy/test_alerts.py needs promtool and prometheus on the PATH" >&2; exit 1; }; \
	fi
