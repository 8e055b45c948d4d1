"""Store micro-benchmark: single conditional puts issued concurrently, then single gets.

    python -m tc_server.bench.store --store memory --store embedded [--ops N] [--concurrency C]

Each of C workers awaits one ``put(key, value, expected_version=EXPECT_ABSENT)`` at a time, the way
concurrent NEW_TXN requests each await their header CAS. With the embedded store this is what group
commit buys: C waiting puts share one fsync. Prints throughput and latency percentiles per store.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tc_server.logs import configure_command_logging
from tc_server.store import LOCAL_STORE_KINDS, open_store
from tc_server.store.api import EXPECT_ABSENT, MetadataStore
from tc_server.store.embedded import EmbeddedStore

# Roughly a transaction header's JSON.
VALUE = b'{"state":"OPEN","timeoutMs":60000,"createdMs":1700000000000,"finalizedMs":0,"owner":null}'


@dataclass(frozen=True)
class Result:
    ops: int
    seconds: float
    latencies: list[float]

    def line(self, store: str, what: str) -> str:
        q = statistics.quantiles(self.latencies, n=1000, method="inclusive")
        ms = [x * 1000 for x in (q[499], q[989], q[998])]
        return (f"{store:<9} {what:<4} {self.ops / self.seconds:>10.0f} ops/s   "
                f"p50 {ms[0]:7.3f} ms   p99 {ms[1]:7.3f} ms   p999 {ms[2]:7.3f} ms")


async def _run(ops: int, concurrency: int, one: Callable[[int], Awaitable[object]]) -> Result:
    latencies: list[float] = []
    counter = iter(range(ops))

    async def worker() -> None:
        for i in counter:
            start = time.perf_counter()
            await one(i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(ops, time.perf_counter() - start, latencies)


async def bench(kind: str, ops: int, concurrency: int, data_dir: str) -> list[str]:
    store: MetadataStore = await open_store(kind, data_dir=data_dir)
    groups: list[int] = []
    if isinstance(store, EmbeddedStore):
        store.on_commit = groups.append
    try:
        puts = await _run(ops, concurrency,
                          lambda i: store.put(f"/bench/{i:010d}", VALUE, expected_version=EXPECT_ABSENT))
        commits = len(groups)
        gets = await _run(ops, concurrency, lambda i: store.get(f"/bench/{i:010d}"))
    finally:
        await store.close()
    lines = [puts.line(kind, "put"), gets.line(kind, "get")]
    if commits:
        lines.append(f"{kind:<9} {commits} commits, {ops / commits:.1f} puts per commit on average")
    return lines


def main(argv: list[str] | None = None) -> None:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.store",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--store", action="append", choices=LOCAL_STORE_KINDS,
                        help="a backend to measure (repeatable; default: all of them)")
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--data-dir", help="directory for the embedded store (default: a fresh temp dir)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as the server does")
    args = parser.parse_args(argv)
    if args.uvloop:
        import uvloop

        uvloop.install()
    print(f"{args.ops} ops, concurrency {args.concurrency}")
    for kind in args.store or LOCAL_STORE_KINDS:
        with tempfile.TemporaryDirectory(prefix="tc-bench-") as tmp:
            for line in asyncio.run(bench(kind, args.ops, args.concurrency, args.data_dir or tmp)):
                print(line, flush=True)


if __name__ == "__main__":
    main()
