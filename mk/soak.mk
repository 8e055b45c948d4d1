# The chaos soak (tests/soak/test_chaos_soak.py): the stock Java client's consume-transform-produce through tc-server
# in front of the real broker, while tc-server is killed (-9), stopped and restarted on a seeded schedule; then every
# input's output exactly once, nothing of an abort visible, nothing left undelivered, the audit clean. ~12 min with
# the defaults (both --workers 1 and 2). Not part of `make test`. Optional: CHAOS_SEED, CHAOS_SECONDS,
# CHAOS_PROFILE=harsh, CHAOS_LOOKUP=direct, CHAOS_CONTROL=broker (the same load on Pulsar's own coordinator).

.PHONY: soak
soak: setup pulsar-broker interop-java
	TC_SOAK=1 $(PY) -m pytest -n 0 -p no:cacheprovider -q -s tests/soak $(PYTEST_ARGS)
export CHAOS_SEED CHAOS_SECONDS CHAOS_PROFILE CHAOS_LOOKUP CHAOS_CONTROL
