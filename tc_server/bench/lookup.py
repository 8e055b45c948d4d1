"""Lookup latency through tc-server's front door against the same requests sent straight to the broker.

    python -m tc_server.bench.lookup --broker-url pulsar://127.0.0.1:6650 [--requests 5000]
                                     [--connections 1] [--concurrency 1] [--topics 16]

The broker must be running already (any Pulsar broker; a standalone one is enough). This starts one
tc-server itself (the shared launcher, tc_server/bench/process.py) with ``--upstream-url`` naming it,
then sends the same LOOKUP and PARTITIONED_METADATA requests with our wire client (tc_server.client),
once through tc-server and once directly at the broker, and prints p50 / p99 / p99.9 and requests per
second for each, plus tc-server's own CPU time per forwarded request. What tc-server adds is one more
hop: it reads the client's request, writes it on its upstream connection, and relays the answer under
the client's request id (tc_server/server/upstream.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tc_server.bench.__main__ import bench_server, percentiles
from tc_server.client import Endpoint, TcClient, connect, error_of
from tc_server.logs import configure_command_logging
from tc_server.wire import Command

REQUEST_KINDS = ("LOOKUP", "PARTITIONED_METADATA")


@dataclass
class Run:
    """The outcome of one kind of request against one target."""

    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else float("nan")


def request_of(kind: str, client: TcClient) -> Callable[[str], Awaitable[Command]]:
    if kind == "LOOKUP":
        return client.lookup
    return client.partitioned_metadata


async def run_kind(host: str, port: int, kind: str, topics: list[str], requests: int, connections: int,
                   concurrency: int) -> Run:
    """``requests`` requests of ``kind`` over ``connections`` connections, ``concurrency`` in flight on each,
    cycling through ``topics``. Exits with a message naming the target when it cannot be reached."""
    try:
        clients = [await connect(host, port) for _ in range(connections)]
    except OSError as exc:
        raise SystemExit(f"cannot reach {host}:{port}: {exc}") from None
    run = Run()
    per_worker = max(1, requests // (connections * concurrency))

    async def worker(client: TcClient, offset: int) -> None:
        send = request_of(kind, client)
        for i in range(per_worker):
            topic = topics[(offset + i) % len(topics)]
            t0 = time.perf_counter()
            answer = await send(topic)
            elapsed = time.perf_counter() - t0
            failure = error_of(answer)
            if failure is not None:
                run.errors[failure[0].name] = run.errors.get(failure[0].name, 0) + 1
            else:
                run.latencies.append(elapsed)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(client, n * concurrency + w)
                               for n, client in enumerate(clients) for w in range(concurrency)))
    finally:
        run.seconds = time.perf_counter() - started
        for client in clients:
            client.close()
    return run


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.lookup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker-url", required=True, help="pulsar://HOST:PORT of a running broker")
    parser.add_argument("--requests", type=int, default=5_000, help="per request kind and target")
    parser.add_argument("--warmup", type=int, default=500, help="per request kind and target, not counted")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight per connection")
    parser.add_argument("--topics", type=int, default=16, help="distinct topics the requests cycle through")
    parser.add_argument("--namespace", default="public/default")
    args = parser.parse_args(argv)
    try:
        broker = Endpoint.parse(args.broker_url)
    except ValueError as exc:
        parser.error(f"--broker-url: {exc}")
    if broker.tls:
        parser.error("--broker-url: pulsar+ssl:// is not supported by this benchmark; give the plain pulsar:// URL")
    # Non-partitioned topics the broker creates on first lookup (allowAutoTopicCreation, on by default).
    topics = [f"persistent://{args.namespace}/bench-lookup-{i}" for i in range(args.topics)]
    import uvloop

    print(f"# lookup benchmark: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; broker {args.broker_url}; {args.requests} requests per kind "
          f"and target over {args.connections} connection(s) x {args.concurrency} in flight, "
          f"{args.topics} topics")
    print(f"{'request':<21} {'target':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
          f"{'errors':>7} {'tc-server CPU/req':>18}")
    with bench_server("embedded", ["--upstream-url", args.broker_url]) as server, \
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        targets = {"direct": (broker.host, broker.port), "tc-server": ("127.0.0.1", server.port)}
        for kind in REQUEST_KINDS:
            for name, (host, port) in targets.items():
                if args.warmup:
                    runner.run(run_kind(host, port, kind, topics, args.warmup, args.connections,
                                        args.concurrency))
                cpu_before = server.cpu_seconds()
                run = runner.run(run_kind(host, port, kind, topics, args.requests, args.connections,
                                          args.concurrency))
                cpu = (f"{(server.cpu_seconds() - cpu_before) / max(1, len(run.latencies)) * 1e6:.0f} us"
                       if name == "tc-server" else "")
                p50, p99, p999 = (x * 1000 for x in percentiles(run.latencies))
                errors = ",".join(f"{k}:{v}" for k, v in sorted(run.errors.items())) or "0"
                print(f"{kind:<21} {name:<10} {run.per_second:>8.0f} {p50:>8.2f} {p99:>8.2f} {p999:>9.2f} "
                      f"{errors:>7} {cpu:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
