"""tc-server against Pulsar's own transaction coordinator, side by side, on the same Java load.

    python -m tc_server.bench.vs_pulsar [--concurrency 16 --concurrency 64] [--duration-s 20]
                                        [--warmup-s 5] [--rounds 2] [--store embedded] [--baseline-src DIR]

Starts a real Pulsar broker (standalone, 16 transaction coordinators; ``make pulsar-broker``) and two
tc-servers (``--upstream-url`` the broker, so they stand where an operator would put them): one with one
worker, and one with a worker per core (``--workers`` the machine's core count, the issue's target shape;
left out on one core). Then it drives each in turn with the official Java client's closed loop of
newTransaction + commit (the ``pair-bench`` scenario of the interop harness, ``make interop-java``; NEW_TXN
+ END_TXN, no produce). Runs alternate between the servers, so a slow phase of the shared machine hits each.
For every run it prints pairs/s, pair latency p50/p99 and each server's CPU time per pair (read from /proc
across exactly the counted window: the broker's whole JVM, all of a tc-server's processes), then the
medians and each tc-server's ratios to Pulsar. All servers stay up for the whole benchmark; the load
generator shares the machine's cores with them. ``--baseline-src DIR`` adds a one-worker tc-server of
another source tree (e.g. ``git archive <commit> tc_server | tar -x -C DIR``), alternated with the others,
and prints this tree's one worker against it round by round: what a change gained, in one sitting.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tc_server.bench import java_load
from tc_server.bench.java_load import (
    BROKER_MAKE,
    HARNESS_JAR,
    HARNESS_MAKE,
    RUN_SLACK_S,
    Target,
    alternated,
    check_harness,
    load_parser,
    medians_of,
    private_harness,
    round_ratios_text,
    run_harness,
    start_broker,
    start_server,
    stop_all,
)
from tc_server.bench.process import TcServerProcess, baseline_env, baseline_src
from tc_server.bench.pulsar_broker import PulsarBroker
from tc_server.logs import configure_command_logging

# Where they stood before tc_server.bench.java_load held them (txn_java and scripts import them from here).
__all__ = ["BROKER_MAKE", "HARNESS_JAR", "HARNESS_MAKE", "RUN_SLACK_S", "Run", "main", "private_harness", "run_load"]


BASELINE = "baseline"  # the tc-server of --baseline-src
# The ratios shown round by round under the summary table.
ROUND_FIELDS = {"pairs_per_s": "pairs/s", "pair_p99_ms": "p99", "server_cpu_us_per_pair": "server CPU/pair"}


@dataclass
class Run(java_load.Run):
    """One counted window of the Java load against one server, with the client's CPU per pair."""

    client_cpu_us_per_pair: float


def run_load(jar: Path, service_url: str, concurrency: int, duration_s: float, warmup_s: float,
             server_cpu: Callable[[], float], server: str) -> Run:
    """One ``pair-bench`` run of the Java harness ``jar`` against ``service_url``; ``server_cpu`` is read
    when the harness opens and closes its counted window. A run that outlives its bound is killed."""
    done = run_harness(jar, ["pair-bench", "--service-url", service_url, "--concurrency", str(concurrency),
                             "--duration-ms", str(int(duration_s * 1000)), "--warmup-ms", str(int(warmup_s * 1000))],
                       duration_s + warmup_s, server_cpu, server)
    result = done.result
    return Run(server=server, concurrency=concurrency, pairs_per_s=float(result["pairs_per_s"]),
               pair_p50_ms=float(result["pair_p50_ms"]), pair_p99_ms=float(result["pair_p99_ms"]),
               server_cpu_us_per_pair=done.server_cpu_us_per_pair,
               client_cpu_us_per_pair=done.client_cpu_us_per_pair, errors=int(result["errors"]))


def alternated_runs(jar: Path, targets: dict[str, Target], order: list[str], concurrencies: list[int],
                    args: argparse.Namespace) -> list[Run]:
    """The counted ``pair-bench`` runs of ``targets`` (name -> service URL and CPU reader), alternated
    (java_load.alternated) with the run lengths of ``args`` (load_parser's), each shown as it ends."""
    print(f"{'server':<10} {'in fl.':>5} {'pairs/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'srv CPU/pair':>12} "
          f"{'cli CPU/pair':>12} {'errors':>6}   (CPU in us)", flush=True)

    def run(name: str, target: Target, concurrency: int, prime: bool) -> Run:
        url, cpu = target
        if prime:
            return run_load(jar, url, concurrency, args.prime_s, 0.0, cpu, name)
        return run_load(jar, url, concurrency, args.duration_s, args.warmup_s, cpu, name)

    return alternated(targets, order, concurrencies, args.rounds, args.prime_s, run, print_run)


def print_run(run: Run) -> None:
    print(f"{run.server:<10} {run.concurrency:>5} {run.pairs_per_s:>9,.0f} {run.pair_p50_ms:>9.2f} "
          f"{run.pair_p99_ms:>9.2f} {run.server_cpu_us_per_pair:>12.0f} {run.client_cpu_us_per_pair:>12.0f} "
          f"{run.errors:>6}", flush=True)


def summary(runs: list[Run], concurrencies: list[int], tc_names: list[str],
            against_baseline: str | None = None) -> None:
    """Medians per server and concurrency, and each tc-server's ratios to Pulsar, as a Markdown table; then
    the same ratios round by round (java_load.ratios_by_round), which show how far the shared machine moved
    them, and ``against_baseline``'s to the baseline tree's (--baseline-src)."""
    print("\n| in flight | server | pairs/s | pair p50 (ms) | pair p99 (ms) | server CPU/pair (us) |")
    print("|---|---|---|---|---|---|")
    by_round: list[str] = []  # the ratios round by round, under the table
    for concurrency in concurrencies:
        medians: dict[str, list[float]] = {}
        for server in ("pulsar", *tc_names):
            count, medians[server] = medians_of(runs, server, concurrency, (
                "pairs_per_s", "pair_p50_ms", "pair_p99_ms", "server_cpu_us_per_pair"))
            rate, p50, p99, cpu = medians[server]
            label = "Pulsar 4.2.4 TC" if server == "pulsar" else f"tc-server {server}"
            print(f"| {concurrency} | {label} (median of {count}) | {rate:,.0f} | {p50:.1f} | {p99:.1f} | "
                  f"{cpu:.0f} |")
        for name in tc_names:
            ratios = [t / p if p else float("nan") for t, p in zip(medians[name], medians["pulsar"], strict=True)]
            print(f"| {concurrency} | {name} / Pulsar | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {ratios[2]:.2f}x | "
                  f"{ratios[3]:.2f}x |")
            by_round.append(round_ratios_text(runs, name, "pulsar", concurrency, ROUND_FIELDS))
        if against_baseline is not None:
            by_round.append(round_ratios_text(runs, against_baseline, BASELINE, concurrency, ROUND_FIELDS))
    print("", *by_round, sep="\n")


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = load_parser("python -m tc_server.bench.vs_pulsar", __doc__,
                         "uncounted start of each run (JIT, connections)")
    parser.add_argument("--store", choices=["embedded", "memory"], default="embedded", help="tc-server's store")
    parser.add_argument("--baseline-src", type=baseline_src,
                        help="directory holding another tc_server/ package: one worker of it too, alternated "
                             "(before/after), its ratios to this tree's one worker under the table")
    args = parser.parse_args(argv)
    concurrencies = args.concurrency or [16, 64]
    check_harness()

    workdir = Path(tempfile.mkdtemp(prefix="tc-vs-pulsar-"))
    broker = PulsarBroker(workdir / "broker")
    tc_name = args.store
    print(f"# tc-server vs Pulsar's coordinator: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; Java client pair-bench "
          f"(newTransaction + commit, no produce), {args.duration_s:.0f} s counted after {args.warmup_s:.0f} s "
          f"warm-up, {args.rounds} round(s) alternated; broker, tc-server and load on the same cores",
          flush=True)
    # One worker, and one worker per core (the target shape; the same as one on a 1-core machine).
    worker_counts = sorted({1, os.cpu_count() or 1})
    servers: dict[str, TcServerProcess] = {}
    try:
        jar = private_harness(workdir)
        start_broker(broker)
        trees: list[tuple[str, int, dict[str, str] | None]] = [
            (tc_name if count == 1 else f"{tc_name} x{count}", count, None) for count in worker_counts]
        if args.baseline_src is not None:
            trees.append((BASELINE, 1, baseline_env(args.baseline_src)))
        for name, count, env in trees:
            tag = f"{count}" if env is None else BASELINE
            servers[name] = start_server(TcServerProcess(
                workdir / f"tc-data-{tag}", "--upstream-url", broker.url, "--coordinators", "16",
                "--workers", str(count), "--log-level", "warning", *args.server_arg, store=args.store,
                env=env, log_path=workdir / f"tc-server-{tag}.log"))
        targets: dict[str, Target] = {"pulsar": (broker.url, broker.cpu_seconds)}
        targets.update((name, (server.url, server.cpu_seconds)) for name, server in servers.items())
        runs = alternated_runs(jar, targets, list(targets), concurrencies, args)
        summary(runs, concurrencies, list(servers), tc_name if args.baseline_src is not None else None)
    finally:
        stop_all(list(servers.values()), broker, workdir, args.keep_workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
