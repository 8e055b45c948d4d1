"""Coordinator benchmark: NEW_TXN + END_TXN pairs per second and latency percentiles.

    python -m tc_server.bench [--store memory --store embedded] [--pairs N] [--connections C]
                              [--concurrency K] [--warmup N] [--rounds R]

tc-server runs as its own process (as in production, so the load generator does not share its
core) on free loopback ports; the generator keeps C connections x K pairs in flight. ``--rounds R``
runs R rounds of N pairs against the same server, one line each with the server's RSS after the round:
whether throughput and memory stay flat as the store fills.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tc_server.bench.process import ServerStartError, TcServerProcess
from tc_server.client import ClientAuth, TcClient, connect_coordinators
from tc_server.logs import configure_command_logging
from tc_server.store import LOCAL_STORE_KINDS, STORE_KINDS


def percentiles(samples: list[float], points: tuple[float, ...] = (50, 99, 99.9)) -> list[float]:
    if not samples:
        return [float("nan")] * len(points)
    ordered = sorted(samples)
    return [ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] for p in points]


@contextmanager
def bench_server(store: str, extra: list[str]) -> Iterator[TcServerProcess]:
    """A started tc-server in a temporary directory, removed again with its data after the run."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tc-bench-{store}-"))
    server = TcServerProcess(workdir / "data", "--log-level", "warning", *extra, store=store,
                             log_path=workdir / "server.log")
    try:
        try:
            server.start()
        except ServerStartError as exc:
            raise SystemExit(str(exc)) from None
        yield server
    finally:
        server.stop(timeout_s=30)
        shutil.rmtree(workdir, ignore_errors=True)


async def _worker(routed: list[TcClient], tc_ids: int, count: int, new_lat: list[float], end_lat: list[float],
                  pair_lat: list[float], errors: list[str], offset: int) -> None:
    for i in range(count):
        tc_id = (offset + i) % tc_ids
        client = routed[tc_id]  # the connection to the process leading tc_id (--workers N: its worker)
        t0 = time.perf_counter()
        created = await client.new_txn(tc_id=tc_id, ttl_ms=60_000)
        t1 = time.perf_counter()
        if created.error is not None:
            errors.append(created.error.name)
            continue
        ended = await client.end_txn(created.most, created.least, commit=i % 2 == 0)
        t2 = time.perf_counter()
        if ended.error is not None:
            errors.append(ended.error.name)
        new_lat.append(t1 - t0)
        end_lat.append(t2 - t1)
        pair_lat.append(t2 - t0)


def auth_setup(kind: str) -> tuple[list[str], ClientAuth]:
    """Server flags and client credentials for ``--auth``: ``token`` turns token authentication on with
    an HS256 key made for this run only (docs/security.md), so every CONNECT carries and proves a JWT."""
    if kind == "none":
        return [], ClientAuth()
    import jwt

    secret = os.urandom(32)
    flags = ["--authentication-providers", "token",
             "--token-secret-key", "data:;base64," + base64.b64encode(secret).decode()]
    return flags, ClientAuth("token", jwt.encode({"sub": "bench"}, secret, algorithm="HS256").encode())


async def run_load(port: int, pairs: int, connections: int, concurrency: int, tc_ids: int,
                   auth: ClientAuth | None = None) -> dict[str, Any]:
    # Each "connection" finds its coordinators as Pulsar's clients do (LOOKUP at the service port), so
    # with --server-arg=--workers=N its pairs reach every worker; with one process it is one connection.
    clients = [await connect_coordinators("127.0.0.1", port, tc_ids, auth=auth or ClientAuth())
               for _ in range(connections)]
    per_worker = max(1, pairs // (connections * concurrency))
    new_lat: list[float] = []
    end_lat: list[float] = []
    pair_lat: list[float] = []
    errors: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(*(
        _worker(c, tc_ids, per_worker, new_lat, end_lat, pair_lat, errors, offset=w)
        for n, c in enumerate(clients) for w in range(n * concurrency, (n + 1) * concurrency)
    ))
    elapsed = time.perf_counter() - started
    for routed in clients:
        for c in {id(c): c for c in routed}.values():
            c.close()
    return {"pairs": len(pair_lat), "seconds": elapsed, "pairs_per_s": len(pair_lat) / elapsed,
            "new": percentiles(new_lat), "end": percentiles(end_lat), "pair": percentiles(pair_lat),
            "errors": len(errors)}


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", action="append", choices=list(STORE_KINDS))
    parser.add_argument("--pairs", type=int, default=40_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64, help="pairs in flight per connection")
    parser.add_argument("--coordinators", type=int, default=16)
    parser.add_argument("--server-arg", action="append", default=[], help="extra tc-server run flag")
    parser.add_argument("--auth", action="append", choices=["none", "token"],
                        help="none (default): authentication off; token: token authentication on, every "
                             "connection presents a JWT; give both to compare")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of --pairs on the same server")
    args = parser.parse_args(argv)
    stores = args.store or list(LOCAL_STORE_KINDS)
    import uvloop

    print(f"# tc-server benchmark: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; {args.connections} connections x {args.concurrency} "
          f"pairs in flight; {args.pairs} pairs (NEW_TXN then END_TXN, half commit, half abort)")
    print(f"{'store':<10} {'pairs/s':>9} {'pair p50':>9} {'p99':>8} {'p99.9':>8} {'NEW p50':>8} {'p99':>8} "
          f"{'END p50':>8} {'p99':>8} {'errors':>6} {'server CPU/pair':>16} {'RSS MiB':>8}")
    for store, auth_kind in [(store, kind) for store in stores for kind in args.auth or ["none"]]:
        auth_flags, auth = auth_setup(auth_kind)
        label = store if auth_kind == "none" else f"{store}+{auth_kind}"
        with bench_server(store, ["--coordinators", str(args.coordinators), *auth_flags, *args.server_arg]) \
                as server, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            if args.warmup:
                runner.run(run_load(server.port, args.warmup, args.connections, args.concurrency,
                                    args.coordinators, auth))
            for _ in range(args.rounds):
                cpu_before = server.cpu_seconds()
                r = runner.run(run_load(server.port, args.pairs, args.connections, args.concurrency,
                                        args.coordinators, auth))
                r["cpu_us_per_pair"] = (server.cpu_seconds() - cpu_before) / max(1, r["pairs"]) * 1e6
                ms = [f"{x * 1000:.2f}" for x in (*r["pair"], r["new"][0], r["new"][1], r["end"][0], r["end"][1])]
                print(f"{label:<10} {r['pairs_per_s']:>9.0f} {ms[0]:>9} {ms[1]:>8} {ms[2]:>8} {ms[3]:>8} "
                      f"{ms[4]:>8} {ms[5]:>8} {ms[6]:>8} {r['errors']:>6} {r['cpu_us_per_pair']:>13.0f} us "
                      f"{server.rss_bytes() / 2**20:>8.0f}", flush=True)
    print("(latencies in ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
