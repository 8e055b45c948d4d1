"""tc-server with ``--workers N`` against itself with fewer workers, on the same Java load.

    python -m tc_server.bench.workers [--workers 1 --workers 2] [--concurrency 16 --concurrency 64]
                                      [--duration-s 20] [--warmup-s 5] [--rounds 3] [--store embedded]

Starts one tc-server per ``--workers`` value (embedded store by default, 16 coordinators, no broker: the
load opens and commits transactions without producing), then drives each in turn with the official Java
client's closed loop of newTransaction + commit (``pair-bench`` of the interop harness, ``make
interop-java``), which finds each coordinator's worker by LOOKUP at the one service URL as any client
does. Runs alternate between the servers (tc_server/bench/java_load.py), so a slow phase of the shared
machine hits each. Per run: pairs/s, pair p50/p99 and tc-server's CPU per pair (the supervisor and all its
workers, from /proc, across the counted window); then the medians as a Markdown table, each against the
first ``--workers`` value. The load generator shares the machine's cores with the servers.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from pathlib import Path

from tc_server.bench.java_load import (
    Target,
    check_harness,
    load_parser,
    medians_of,
    private_harness,
    start_server,
)
from tc_server.bench.process import TcServerProcess, keep_or_remove
from tc_server.bench.vs_pulsar import Run, alternated_runs
from tc_server.logs import configure_command_logging

FIELDS = ("pairs_per_s", "pair_p50_ms", "pair_p99_ms", "server_cpu_us_per_pair")


def summary(runs: list[Run], concurrencies: list[int], names: list[str]) -> None:
    """Medians per server and concurrency, and each one's ratio to the first, as a Markdown table."""
    print("\n| in flight | tc-server | pairs/s | pair p50 (ms) | pair p99 (ms) | server CPU/pair (us) |")
    print("|---|---|---|---|---|---|")
    for concurrency in concurrencies:
        medians = {name: medians_of(runs, name, concurrency, FIELDS) for name in names}
        base = medians[names[0]][1]
        for name in names:
            count, (rate, p50, p99, cpu) = medians[name]
            print(f"| {concurrency} | {name} (median of {count}) | {rate:,.0f} ({rate / base[0]:.2f}x) | "
                  f"{p50:.1f} | {p99:.1f} | {cpu:.0f} |")


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = load_parser("python -m tc_server.bench.workers", __doc__,
                         "uncounted start of each run (JIT, connections)")
    parser.add_argument("--workers", type=int, action="append", help="a tc-server --workers value (repeatable)")
    parser.add_argument("--store", choices=["embedded", "memory"], default="embedded", help="tc-server's store")
    parser.set_defaults(rounds=3)
    args = parser.parse_args(argv)
    concurrencies = args.concurrency or [16, 64]
    counts = args.workers or [1, 2]
    check_harness()

    workdir = Path(tempfile.mkdtemp(prefix="tc-bench-workers-"))
    print(f"# tc-server --workers {' vs '.join(map(str, counts))}: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; Java client pair-bench "
          f"(newTransaction + commit, no produce), {args.store} store, {args.duration_s:.0f} s counted after "
          f"{args.warmup_s:.0f} s warm-up, {args.rounds} round(s) alternated; servers and load on the same cores",
          flush=True)
    servers: dict[str, TcServerProcess] = {}
    try:
        jar = private_harness(workdir)
        for count in counts:
            name = f"{count} worker" + ("s" if count > 1 else "")
            servers[name] = start_server(TcServerProcess(
                workdir / f"data-{count}", "--coordinators", "16", "--log-level", "warning",
                "--workers", str(count), *args.server_arg, store=args.store,
                log_path=workdir / f"tc-server-{count}.log"))
        targets: dict[str, Target] = {name: (server.url, server.cpu_seconds) for name, server in servers.items()}
        runs = alternated_runs(jar, targets, list(targets), concurrencies, args)
        summary(runs, concurrencies, list(targets))
    finally:
        for server in servers.values():
            server.stop(timeout_s=30)
        keep_or_remove(workdir, args.keep_workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
