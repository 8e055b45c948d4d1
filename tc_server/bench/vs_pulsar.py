"""tc-server against Pulsar's own transaction coordinator, side by side, on the same Java load.

    python -m tc_server.bench.vs_pulsar [--concurrency 16 --concurrency 64] [--duration-s 20]
                                        [--warmup-s 5] [--rounds 2] [--store embedded]

Starts a real Pulsar broker (standalone, 16 transaction coordinators; ``make pulsar-broker``) and one
tc-server (``--upstream-url`` the broker, so it stands where an operator would put it), then drives each
in turn with the official Java client's closed loop of newTransaction + commit (the ``pair-bench``
scenario of the interop harness, ``make interop-java``; NEW_TXN + END_TXN, no produce). Runs alternate
between the two servers, so a slow phase of the shared machine hits both. For every run it prints pairs/s,
pair latency p50/p99 and each server's CPU time per pair (read from /proc across exactly the counted
window: the broker's whole JVM, tc-server's process), then the medians and the ratios tc-server/Pulsar.
Both servers stay up for the whole benchmark; the load generator shares the machine's cores with them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tc_server.bench.process import ServerStartError, TcServerProcess, cpu_seconds_of
from tc_server.bench.pulsar_broker import REPO, BrokerStartError, PulsarBroker

HARNESS_JAR = REPO / "tests" / "interop" / "java" / "target" / "tc-interop.jar"
HARNESS_MAKE = "make interop-java"
BROKER_MAKE = "make pulsar-broker"
# Beyond warm-up + duration: the client's start, its 16 coordinator handlers, and draining the last pairs.
RUN_SLACK_S = 120.0


@dataclass
class Run:
    """One counted window of the Java load against one server."""

    server: str
    concurrency: int
    pairs_per_s: float
    pair_p50_ms: float
    pair_p99_ms: float
    server_cpu_us_per_pair: float
    client_cpu_us_per_pair: float
    errors: int


def private_harness(workdir: Path) -> Path:
    """A copy of the harness jar and its lib/ (the manifest's Class-Path) in ``workdir``: a `make
    interop-java` run by anyone during the benchmark replaces the jar under the running JVM, which then
    fails to load its own classes (NoClassDefFoundError) and hangs on the client's non-daemon threads."""
    dest = workdir / "harness"
    shutil.copytree(HARNESS_JAR.parent / "lib", dest / "lib")
    shutil.copy2(HARNESS_JAR, dest / HARNESS_JAR.name)
    return dest / HARNESS_JAR.name


def run_load(jar: Path, service_url: str, concurrency: int, duration_s: float, warmup_s: float,
             server_cpu: Callable[[], float], server: str) -> Run:
    """One ``pair-bench`` run of the Java harness ``jar`` against ``service_url``; ``server_cpu`` is read
    when the harness opens and closes its counted window. A run that outlives its bound is killed."""
    java = shutil.which("java")
    if java is None:
        raise SystemExit("java not found on PATH: the benchmark's load is the Java client (Java 17+)")
    argv = [java, "-jar", str(jar), "pair-bench", "--service-url", service_url,
            "--concurrency", str(concurrency), "--duration-ms", str(int(duration_s * 1000)),
            "--warmup-ms", str(int(warmup_s * 1000))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True)
    marks: dict[str, tuple[float, float]] = {}
    result: dict[str, Any] | None = None
    # Reading stdout blocks until the JVM exits; the watchdog bounds that.
    watchdog = threading.Timer(duration_s + warmup_s + RUN_SLACK_S, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind in ("measure-start", "measure-end"):
                marks[kind] = (server_cpu(), cpu_seconds_of(proc.pid))
            elif kind in ("result", "fatal"):
                result = event
        proc.wait(timeout=RUN_SLACK_S)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr is not None else ""
    if result is None or result.get("event") != "result" or len(marks) != 2:
        raise SystemExit(f"the Java load against {server} gave no result (exit {proc.returncode}): "
                         f"{result}\n{stderr[-3000:]}")
    pairs = max(1, int(result["pairs"]))
    (server_0, client_0), (server_1, client_1) = marks["measure-start"], marks["measure-end"]
    return Run(server=server, concurrency=concurrency, pairs_per_s=float(result["pairs_per_s"]),
               pair_p50_ms=float(result["pair_p50_ms"]), pair_p99_ms=float(result["pair_p99_ms"]),
               server_cpu_us_per_pair=(server_1 - server_0) / pairs * 1e6,
               client_cpu_us_per_pair=(client_1 - client_0) / pairs * 1e6, errors=int(result["errors"]))


def print_run(run: Run) -> None:
    print(f"{run.server:<10} {run.concurrency:>5} {run.pairs_per_s:>9,.0f} {run.pair_p50_ms:>9.2f} "
          f"{run.pair_p99_ms:>9.2f} {run.server_cpu_us_per_pair:>12.0f} {run.client_cpu_us_per_pair:>12.0f} "
          f"{run.errors:>6}", flush=True)


def summary(runs: list[Run], concurrencies: list[int], tc_name: str) -> None:
    """Medians per server and concurrency, and tc-server's ratio to Pulsar, as a Markdown table."""
    print("\n| in flight | server | pairs/s | pair p50 (ms) | pair p99 (ms) | server CPU/pair (us) |")
    print("|---|---|---|---|---|---|")
    for concurrency in concurrencies:
        medians: dict[str, list[float]] = {}
        for server in ("pulsar", tc_name):
            mine = [r for r in runs if r.server == server and r.concurrency == concurrency]
            medians[server] = [statistics.median(getattr(r, field) for r in mine) for field in
                               ("pairs_per_s", "pair_p50_ms", "pair_p99_ms", "server_cpu_us_per_pair")]
            rate, p50, p99, cpu = medians[server]
            label = "Pulsar 4.2.4 TC" if server == "pulsar" else f"tc-server {tc_name}"
            print(f"| {concurrency} | {label} (median of {len(mine)}) | {rate:,.0f} | {p50:.1f} | {p99:.1f} | "
                  f"{cpu:.0f} |")
        ratios = [t / p if p else float("nan") for t, p in zip(medians[tc_name], medians["pulsar"], strict=True)]
        print(f"| {concurrency} | tc-server / Pulsar | {ratios[0]:.2f}x | {ratios[1]:.2f}x | {ratios[2]:.2f}x | "
              f"{ratios[3]:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.vs_pulsar", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, action="append", help="transactions in flight (repeatable)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="counted window of each run")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="uncounted start of each run (JIT, connections)")
    parser.add_argument("--prime-s", type=float, default=10.0, help="uncounted first run per server (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and concurrency, alternated")
    parser.add_argument("--store", choices=["embedded", "memory"], default="embedded", help="tc-server's store")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tc-server run flag")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and data (printed path)")
    args = parser.parse_args(argv)
    concurrencies = args.concurrency or [16, 64]
    if not HARNESS_JAR.exists():
        raise SystemExit(f"the Java load harness is missing ({HARNESS_JAR}): run `{HARNESS_MAKE}`")

    workdir = Path(tempfile.mkdtemp(prefix="tc-vs-pulsar-"))
    broker = PulsarBroker(workdir / "broker")
    tc_name = args.store
    print(f"# tc-server vs Pulsar's coordinator: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; Java client pair-bench "
          f"(newTransaction + commit, no produce), {args.duration_s:.0f} s counted after {args.warmup_s:.0f} s "
          f"warm-up, {args.rounds} round(s) alternated; broker, tc-server and load on the same cores",
          flush=True)
    server: TcServerProcess | None = None
    try:
        jar = private_harness(workdir)
        try:
            broker.start()
        except BrokerStartError as exc:
            raise SystemExit(f"the Pulsar broker did not start (to install it: `{BROKER_MAKE}`): {exc}") from None
        server = TcServerProcess(workdir / "tc-data", "--upstream-url", broker.url, "--coordinators", "16",
                                 "--log-level", "warning", *args.server_arg, store=args.store,
                                 log_path=workdir / "tc-server.log")
        try:
            server.start()
        except ServerStartError as exc:
            raise SystemExit(str(exc)) from None
        targets: dict[str, tuple[str, Callable[[], float]]] = {
            "pulsar": (broker.url, broker.cpu_seconds),
            tc_name: (server.url, server.cpu_seconds),
        }
        print(f"{'server':<10} {'in fl.':>5} {'pairs/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'srv CPU/pair':>12} "
              f"{'cli CPU/pair':>12} {'errors':>6}   (CPU in us)", flush=True)
        if args.prime_s > 0:
            # One uncounted run per server first: the broker's JIT and both servers' caches warm up on
            # real load, so the first counted run of either is not its cold start.
            for name, (url, cpu) in targets.items():
                run_load(jar, url, max(concurrencies), args.prime_s, 0.0, cpu, name)
        runs: list[Run] = []
        for concurrency in concurrencies:
            for round_no in range(args.rounds):
                order = ["pulsar", tc_name] if round_no % 2 == 0 else [tc_name, "pulsar"]
                for name in order:
                    url, cpu = targets[name]
                    run = run_load(jar, url, concurrency, args.duration_s, args.warmup_s, cpu, name)
                    runs.append(run)
                    print_run(run)
        summary(runs, concurrencies, tc_name)
    finally:
        if server is not None:
            server.stop(timeout_s=30)
        broker.stop()
        if args.keep_workdir:
            print(f"(logs and data kept in {workdir})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
