# The transaction audit pipeline (tc_server/audit, docs/audit.md); included by the Makefile.
#   make audit-test    -- the audit tests only (a local Spark session; needs Java 17)
#   make audit-bench   -- generate (or reuse) a 10M-txn snapshot in ./audit-bench and time the audit
#   make audit-demo    -- a small snapshot with a few anomalies, audited; opens nothing, prints paths
AUDIT_BENCH_TXNS ?= 10000000
AUDIT_BENCH_DIR ?= audit-bench

.PHONY: audit-test audit-bench audit-demo
audit-test: setup
	$(PY) -m pytest tests/audit $(PYTEST_ARGS)

audit-bench: setup
	$(PY) -m tc_server.audit.bench --txns $(AUDIT_BENCH_TXNS) --workdir $(AUDIT_BENCH_DIR)

audit-demo: setup
	rm -rf $(AUDIT_BENCH_DIR)/demo
	$(VENV)/bin/tc-audit generate --txns 100000 --out $(AUDIT_BENCH_DIR)/demo/snapshot \
	    --anomalies open_past_deadline=5,gc_backlog=3,orphan_ops=2,late_ops=2,id_reuse_risk=2,illegal_headers=6
	$(VENV)/bin/tc-audit --input $(AUDIT_BENCH_DIR)/demo/snapshot --output $(AUDIT_BENCH_DIR)/demo/audit || \
	    test $$? -eq 1
