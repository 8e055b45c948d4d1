# Benchmarks that need more than the venv (the plain `make bench` is in the Makefile).
#   make bench-vs-pulsar -- tc-server against Pulsar's own transaction coordinator on the same Java load, both
#                           workloads in turn: bare pairs (newTransaction + commit, tc_server/bench/vs_pulsar.py),
#                           then transactions that produce one message and commit (tc_server/bench/txn_java.py);
#                           README, *Performance*; docs/performance.md. Not part of `make test`.
#   make bench-workers   -- tc-server --workers 1 vs 2 on the same Java load (tc_server/bench/workers.py;
#                           README, *Performance*; docs/performance.md). Not part of `make test`.
#   make bench-instructions -- tc-server's instructions per pair under valgrind's callgrind, which the shared
#                           machine's speed does not move: to compare two versions of the code
#                           (BENCH_INSTRUCTIONS_ARGS="--baseline-src DIR"; tc_server/bench/instructions.py;
#                           README, *Performance*; docs/performance.md). Needs valgrind (Debian). Not part of `make test`.
# BENCH_VS_PULSAR_ARGS passes the options both workloads share (--concurrency, --duration-s, --warmup-s,
# --prime-s, --rounds, --server-arg, --keep-workdir), e.g. `make bench-vs-pulsar BENCH_VS_PULSAR_ARGS="--rounds 3"`;
# BENCH_WORKERS_ARGS likewise (`--store memory`, `--workers 1 --workers 2 --workers 4`).

BENCH_VS_PULSAR_ARGS ?=
BENCH_WORKERS_ARGS ?=
BENCH_INSTRUCTIONS_ARGS ?=

.PHONY: bench-vs-pulsar
bench-vs-pulsar: setup pulsar-broker interop-java
	$(PY) -m tc_server.bench.vs_pulsar $(BENCH_VS_PULSAR_ARGS)
	$(PY) -m tc_server.bench.txn_java $(BENCH_VS_PULSAR_ARGS)

.PHONY: bench-workers
bench-workers: setup interop-java
	$(PY) -m tc_server.bench.workers $(BENCH_WORKERS_ARGS)

.PHONY: bench-instructions
bench-instructions: setup
	$(PY) -m tc_server.bench.instructions $(BENCH_INSTRUCTIONS_ARGS)
