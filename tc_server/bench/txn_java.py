"""Transactions that carry a message: tc-server against Pulsar's own coordinator, on the same Java load.

    python -m tc_server.bench.txn_java [--concurrency 16 --concurrency 64] [--duration-s 20]
                                       [--warmup-s 5] [--rounds 2] [--partitions 4] [--baseline-src DIR]

Each pair is what an application does: newTransaction, send one message in it, commit. So each commit
costs the coordinator its decision and one END_TXN_ON_PARTITION to the broker, which must be
acknowledged before commit() returns (both coordinators wait for it). Starts a real Pulsar broker
(standalone, 16 coordinators; ``make pulsar-broker``) and two tc-servers in front of it (``--upstream-url``),
then runs the Java harness's ``txn-bench`` scenario (``make interop-java``) against each in turn, runs
alternated, each on a topic of its own. The two tc-servers differ in how the producer reaches the broker:
``tc-server`` relays it (the standalone broker answers LOOKUP with ``proxy_through_service_url``, and
tc-server's default ``--lookup-connections upstream`` follows that), ``tc-direct`` sends it to the broker
straight (``--lookup-connections direct``, what a broker started normally answers anyway), as the client
does with Pulsar's own coordinator. Prints pairs/s, pair and commit p50/p99 and each server's CPU per pair
(read from /proc across the counted window), then medians and the ratios to Pulsar as a Markdown table.
The load generator shares the machine's cores with the servers. The same loop without a produced
message is ``python -m tc_server.bench.vs_pulsar``.

``--baseline-src DIR`` adds another target: a tc-server run from another source tree (e.g.
``git archive <commit> tc_server | tar -x -C DIR``, put first on its PYTHONPATH), alternated with the
other two in each round, so a change is measured against its predecessor in one sitting on a shared,
noisy machine.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tc_server.bench import java_load
from tc_server.bench.java_load import Target
from tc_server.bench.process import TcServerProcess, baseline_env, baseline_src
from tc_server.bench.pulsar_broker import PulsarBroker
from tc_server.logs import configure_command_logging

PULSAR = "pulsar"
TC_SERVER = "tc-server"
TC_DIRECT = "tc-direct"
BASELINE = "baseline"
LABELS = {PULSAR: "Pulsar 4.2.4 (broker's own)",
          TC_SERVER: "tc-server, produce relayed by it (standalone's proxy_through_service_url)",
          TC_DIRECT: "tc-server, produce straight to the broker (--lookup-connections direct)",
          BASELINE: "tc-server baseline (--baseline-src)"}
# The ratios to Pulsar shown round by round under the summary table.
ROUND_FIELDS = {"pairs_per_s": "pairs/s", "pair_p99_ms": "p99", "commit_p99_ms": "commit p99"}


@dataclass
class Run(java_load.Run):
    """One counted window of the Java load against one server, with the commit's own latency."""

    commit_p50_ms: float
    commit_p99_ms: float


def run_load(jar: Path, service_url: str, topic: str, concurrency: int, duration_s: float, warmup_s: float,
             server_cpu: Callable[[], float], server: str) -> Run:
    """One ``txn-bench`` run of the harness ``jar``; ``server_cpu`` is read at the edges of the counted
    window the harness announces. A run that outlives its bound is killed."""
    done = java_load.run_harness(jar, ["txn-bench", "--service-url", service_url, "--topic", topic,
                                       "--concurrency", str(concurrency), "--duration-s", str(int(duration_s)),
                                       "--warmup-s", str(int(warmup_s)), "--op-timeout-ms", "30000"],
                                 duration_s + warmup_s, server_cpu, server)
    result = done.result
    return Run(server=server, concurrency=concurrency, pairs_per_s=float(result["pairs_per_s"]),
               pair_p50_ms=float(result["pair_p50_ms"]), pair_p99_ms=float(result["pair_p99_ms"]),
               commit_p50_ms=float(result["commit_p50_ms"]), commit_p99_ms=float(result["commit_p99_ms"]),
               server_cpu_us_per_pair=done.server_cpu_us_per_pair,
               errors=int(result["errors"]))


def print_run(run: Run) -> None:
    print(f"{run.server:<10} {run.concurrency:>5} {run.pairs_per_s:>9,.0f} {run.pair_p50_ms:>8.2f} "
          f"{run.pair_p99_ms:>8.2f} {run.commit_p50_ms:>8.2f} {run.commit_p99_ms:>8.2f} "
          f"{run.server_cpu_us_per_pair:>10.0f} {run.errors:>6}", flush=True)


def summary(runs: list[Run], concurrencies: list[int]) -> None:
    """Medians per server and concurrency as a Markdown table, then each tc-server's ratios to Pulsar
    round by round (java_load.ratios_by_round)."""
    fields = ("pairs_per_s", "pair_p50_ms", "pair_p99_ms", "commit_p50_ms", "commit_p99_ms",
              "server_cpu_us_per_pair")
    print("\n| in flight | coordinator | pairs/s | pair p50 / p99 (ms) | commit p50 / p99 (ms) "
          "| server CPU/pair (us) |")
    print("|---|---|---|---|---|---|")
    by_round: list[str] = []  # the ratios round by round, under the table
    for concurrency in concurrencies:
        medians = {}
        for server in (PULSAR, BASELINE, TC_DIRECT, TC_SERVER):
            count, values = java_load.medians_of(runs, server, concurrency, fields)
            if not count:
                continue
            medians[server] = values
            rate, p50, p99, c50, c99, cpu = values
            print(f"| {concurrency} | {LABELS[server]}, median of {count} | {rate:,.0f} | {p50:.1f} / {p99:.1f} | "
                  f"{c50:.1f} / {c99:.1f} | {cpu:.0f} |")
        for server in (TC_DIRECT, TC_SERVER):
            if server in medians and PULSAR in medians:
                rate, _, p99, _, c99, cpu = (ours / theirs if theirs else float("nan")
                                             for ours, theirs in zip(medians[server], medians[PULSAR], strict=True))
                print(f"| {concurrency} | **{server} / Pulsar** | {rate:.2f}x | p99 {p99:.2f}x | p99 {c99:.2f}x | "
                      f"{cpu:.2f}x (not like with like: tc-server's processes against the whole broker) |")
                by_round.append(java_load.round_ratios_text(runs, server, PULSAR, concurrency, ROUND_FIELDS))
    print("", *by_round, sep="\n")


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = java_load.load_parser("python -m tc_server.bench.txn_java", __doc__, "uncounted start of each run")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each benchmark topic")
    parser.add_argument("--baseline-src", type=baseline_src,
                        help="directory holding another tc_server/ package: run it too, alternated (before/after)")
    args = parser.parse_args(argv)
    concurrencies = args.concurrency or [16, 64]
    java_load.check_harness()

    workdir = Path(tempfile.mkdtemp(prefix="tc-txn-java-"))
    broker = PulsarBroker(workdir / "broker")
    print(f"# transactions with one produced message, tc-server vs Pulsar's coordinator: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; Java client txn-bench (newTransaction + 1 send + commit) on a "
          f"{args.partitions}-partition topic, {args.duration_s:.0f} s counted after {args.warmup_s:.0f} s "
          f"warm-up, {args.rounds} round(s) alternated; broker, tc-server and load on the same cores", flush=True)
    servers: list[TcServerProcess] = []
    try:
        jar = java_load.private_harness(workdir)
        java_load.start_broker(broker)
        targets: dict[str, Target] = {PULSAR: (broker.url, broker.cpu_seconds)}

        def start_tc_server(name: str, *extra: str, env: dict[str, str] | None = None) -> None:
            """One tc-server in front of the broker, its data and log named after the target."""
            server = TcServerProcess(workdir / f"{name}-data", "--upstream-url", broker.url, "--coordinators", "16",
                                     "--log-level", "warning", *args.server_arg, *extra, env=env,
                                     log_path=workdir / f"{name}.log")
            servers.append(server)
            java_load.start_server(server)
            targets[name] = (server.url, server.cpu_seconds)

        # The same tc-server code twice, to show both ways producers reach the broker: the standalone broker
        # asks clients to connect through their service URL (proxy_through_service_url), so by default
        # tc-server relays the produce traffic; brokers started normally do not ask it, and then clients
        # connect to the broker straight, as they do with Pulsar's own coordinator (README, One service URL).
        start_tc_server(TC_SERVER)
        start_tc_server(TC_DIRECT, "--lookup-connections", "direct")
        if args.baseline_src is not None:
            start_tc_server(BASELINE, env=baseline_env(args.baseline_src))
        topics = {}
        for name in targets:
            # A topic per coordinator: the other's open or pinned txns never share a partition with it.
            topic = f"persistent://public/default/txn-bench-{name}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, args.partitions)
            broker.wait_partitions_ready(topic, args.partitions)
            topics[name] = topic
        print(f"{'server':<10} {'in fl.':>5} {'pairs/s':>9} {'pair p50':>8} {'p99':>8} {'commit50':>8} "
              f"{'p99':>8} {'CPU/pair':>10} {'errors':>6}   (ms; CPU in us)", flush=True)

        def run(name: str, target: Target, concurrency: int, prime: bool) -> Run:
            url, cpu = target
            if prime:
                return run_load(jar, url, topics[name], concurrency, args.prime_s, 0.0, cpu, name)
            return run_load(jar, url, topics[name], concurrency, args.duration_s, args.warmup_s, cpu, name)

        runs = java_load.alternated(targets, [PULSAR, BASELINE, TC_DIRECT, TC_SERVER], concurrencies, args.rounds,
                                    args.prime_s, run, print_run)
        summary(runs, concurrencies)
    finally:
        java_load.stop_all(servers, broker, workdir, args.keep_workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
